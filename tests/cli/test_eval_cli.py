"""`python -m flax_xalign.eval` in-process (the contract tier): a smoke run on a copy of the session's shared
MODEL_DIR, and bad input as one `error:` line. The full refusal matrix is
tests/hardening/test_eval_align_assets_inputs.py; a fresh process reading the user's tasks from the run
manifest is tests/test_eval_user_data.py (subprocess tier)."""

import json

import pytest

from flax_xalign import eval as eval_main
from tests.hardening import harness

pytestmark = pytest.mark.contract


def test_eval_scores_the_shared_run(shared_run_copy, capsys):
  # eval.json lands in MODEL_DIR, hence the copy.
  assert eval_main.main([f"--gin.MODEL_DIR='{shared_run_copy}'", "--gin.SPLIT='validation'",
                         "--gin.BATCH_SIZE=6", "--gin.evaluate.baseline_batches=5"]) == 0
  results = json.loads((shared_run_copy / "eval.json").read_text())
  assert results["step"] == 4 and set(results["languages"]) == {"de", "en"}
  for stats in results["languages"].values():
    assert 0.0 <= stats["accuracy"] <= 1.0 and stats["predictions"] > 0
  assert "held-out masked-token accuracy" in capsys.readouterr().out


def test_eval_of_another_split_writes_its_own_file(shared_run_copy):
  assert eval_main.main([f"--gin.MODEL_DIR='{shared_run_copy}'", "--gin.SPLIT='validation'", "--gin.BATCH_SIZE=6",
                         "--gin.evaluate.baseline_batches=2", "--gin.evaluate.max_batches=1"]) == 0
  validation = (shared_run_copy / "eval.json").read_bytes()
  assert eval_main.main([f"--gin.MODEL_DIR='{shared_run_copy}'", "--gin.SPLIT='train'", "--gin.BATCH_SIZE=6",
                         "--gin.evaluate.baseline_batches=2", "--gin.evaluate.max_batches=1"]) == 0
  assert (shared_run_copy / "eval.json").read_bytes() == validation  # not overwritten by the train split
  assert json.loads((shared_run_copy / "eval.train.json").read_text())["split"] == "train"


def test_eval_of_missing_model_dir_creates_nothing(tmp_path, capfd):
  missing = tmp_path / "typo"
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{missing}'"])
  harness.assert_user_error(outcome, "no checkpoint", model_dir=missing, before=None)
  assert not missing.exists()
