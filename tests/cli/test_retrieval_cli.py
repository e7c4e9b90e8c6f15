"""`xalign retrieval` in-process (the contract tier): a smoke run on the session's shared
MODEL_DIR (tests/shared_run.py) and bad input as one `error:` line. The numbers themselves are checked
against brute force in tests/evaluation/test_retrieval.py."""

import json
import random

import pytest

from flax_xalign.cli import retrieval
from tests import testlib
from tests.hardening import harness

pytestmark = pytest.mark.contract

PAIRS = 12


@pytest.fixture
def tsv(tmp_path):
  pairs = testlib.sentences(random.Random(11), PAIRS)
  path = tmp_path / "de_en.tsv"
  path.write_text("".join(f"{de}\t{en}\n" for en, de in pairs), encoding="utf-8")
  return path


def test_retrieval_on_the_shared_run_prints_and_writes_the_json(shared_run, tsv, tmp_path, capsys):
  before = harness.tree_digest(shared_run["dir"])
  output = tmp_path / "r.json"
  code = retrieval.main([f"--model_dir={shared_run['dir']}", f"--tsv={tsv}", "--layers=0,2", "--method=cosine",
                         "--batch_size=5", f"--output={output}"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = json.loads(text.strip().splitlines()[-1])
  assert json.loads(output.read_text()) == result
  assert result["pairs"] == PAIRS and result["layers"] == [0, 2] and result["methods"] == ["cosine"]
  assert set(result["scores"]["cosine"]) == {"0", "2"}
  for scores in result["scores"]["cosine"].values():
    assert 0.0 <= scores["src_to_tgt"] <= 1.0 and 0.0 <= scores["tgt_to_src"] <= 1.0
  assert result["baselines"]["chance"] == pytest.approx(1 / PAIRS)
  assert harness.tree_digest(shared_run["dir"]) == before  # The command only reads the run.


@pytest.mark.parametrize("flags, keywords", [
    ([], ("exactly one of --tsv",)),
    (["--tsv=TSV", "--tgt_lang=fr"], ("fr", "languages")),
    (["--tsv=TSV", "--layers=5"], ("0..2",)),
    (["--tsv=TSV", "--method=dot"], ("--method",)),
], ids=["no_input", "unknown_language", "layer_too_deep", "unknown_method"])
def test_retrieval_refuses_bad_input(shared_run, tsv, capfd, flags, keywords):
  flags = [f.replace("TSV", str(tsv)) for f in flags]
  outcome = harness.run_main(capfd, "retrieval", [f"--model_dir={shared_run['dir']}", *flags])
  harness.assert_user_error(outcome, *keywords)


def test_retrieval_of_a_missing_model_dir_is_one_error(tmp_path, tsv, capfd):
  outcome = harness.run_main(capfd, "retrieval", [f"--model_dir={tmp_path / 'typo'}", f"--tsv={tsv}"])
  harness.assert_user_error(outcome, "typo", model_dir=tmp_path / "typo", before=None)
