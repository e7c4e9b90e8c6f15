"""Smoke test of bench/word_alignment.py on a tiny checkpoint: the table and the JSON contract."""

import importlib.util
import json
import pathlib

import pytest

from flax_xalign.evaluation.word_alignment import statistical
from tests.evaluation.test_word_align import init_model, write_checkpoint

REPO = pathlib.Path(__file__).resolve().parents[2]
KEYS = ("ours_aer", "eflomal_aer", "diagonal_aer", "ratio", "rows", "pairs", "split", "eflomal")


def load_bench():
  spec = importlib.util.spec_from_file_location("bench_word_alignment", REPO / "bench" / "word_alignment.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory, tiny_corpus):
  """A demo MODEL_DIR holding only cold/: a random tiny model on the toy vocabulary, Greek-English manifest."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  root = tmp_path_factory.mktemp("demo")
  _, params = init_model()
  write_checkpoint(root / "cold", params, vocab.load_vocabulary(tiny_corpus["vocab"]), task="gone_bible",
                   languages=["en", "grc"])
  return root


def run_bench(capsys, argv):
  code = load_bench().main(argv)
  out = capsys.readouterr().out
  assert code == 0, out
  return out, json.loads(out.strip().splitlines()[-1])


def check_common(result, out, output):
  for key in KEYS:
    assert key in result, key
  assert result["pairs"] == 6 and result["split"] == "test"
  assert json.loads(output.read_text()) == result
  names = [(r["system"], r["name"]) for r in result["rows"]]
  assert names[0] == ("diagonal", "diagonal")
  assert [n for s, n in names if s == "ours"] == ["cold start argmax", "cold start itermax", "cold start sinkhorn"]
  ours = [r for r in result["rows"] if r["system"] == "ours"]
  assert result["ours_aer"] == min(r["aer"] for r in ours)
  assert all(r["layer"] in (0, 1, 2) and 0 <= r["aer"] <= 1 for r in ours)
  assert result["diagonal_aer"] == result["rows"][0]["aer"] and 0 < result["diagonal_aer"] < 1
  assert "Greek -> English word alignment, test books, 6 verse pairs" in out


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
def test_bench_without_eflomal(capsys, tmp_path, monkeypatch, bible_data_dir, demo_dir):
  monkeypatch.setattr(statistical, "eflomal_version", lambda: None)
  output = tmp_path / "wa.json"
  out, result = run_bench(capsys, [f"--demo_dir={demo_dir}", "--max_pairs=6", "--layers=0,1,2",
                                   f"--output={output}", "--batch_size=8"])
  check_common(result, out, output)
  assert result["eflomal_aer"] is None and result["ratio"] is None
  assert result["eflomal"]["available"] is False
  assert not [r for r in result["rows"] if r["system"] == "eflomal"]
  assert "not installed: pip install eflomal==2.0.0" in out


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
def test_bench_with_eflomal(capsys, tmp_path, bible_data_dir, demo_dir):
  pytest.importorskip("eflomal")
  output = tmp_path / "wa.json"
  out, result = run_bench(capsys, [f"--checkpoint=cold start={demo_dir / 'cold'}", "--max_pairs=6",
                                   "--layers=0,1,2", "--eflomal_corpus=split", f"--output={output}",
                                   "--batch_size=8"])
  check_common(result, out, output)
  rows = {r["name"]: r for r in result["rows"] if r["system"] == "eflomal"}
  assert list(rows) == ["forward", "reverse", "intersection", "union", "grow-diag-final-and"]
  assert result["eflomal_aer"] == rows["grow-diag-final-and"]["aer"]
  assert result["ratio"] == pytest.approx(result["eflomal_aer"] / result["ours_aer"])
  assert result["eflomal"]["corpus_pairs"] == 6 and result["eflomal"]["version"] == "2.0.0"
  assert rows["intersection"]["num_predicted"] <= rows["grow-diag-final-and"]["num_predicted"] <= (
      rows["union"]["num_predicted"])


def test_bench_rejects_bad_checkpoint_flags(capsys, tmp_path):
  bench = load_bench()
  assert bench.main(["--checkpoint=nodir", f"--output={tmp_path / 'x.json'}"]) == 2
  assert "expected NAME=MODEL_DIR" in capsys.readouterr().err
  assert bench.main([f"--demo_dir={tmp_path}", f"--output={tmp_path / 'x.json'}"]) == 2
  assert "has neither cold/ nor xlm_align/" in capsys.readouterr().err
