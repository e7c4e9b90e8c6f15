"""Registered evaluators run by the training loop (TRAIN_EVALS every TRAIN_EVALS_EVERY steps).

The hook is built at the edge (`flax_xalign.evaluation.during_training.evaluator_hook`, by the gin edge's `train_job`) and injected into `pretrain` as a
`CheckpointHook`; it opens the run at the step just checkpointed and logs `eval_<evaluator>_<key>` rows.
"""

import json

import numpy as np
import pytest

from flax_xalign import train as train_main

from tests.testlib import tiny_encoder_gin, user_mixture_gin

MLM_OPTIONS = "{'mlm': {'split': 'validation', 'batch_size': 6, 'max_batches': 2, 'baseline_batches': 2}}"


def _gin_file(tmp_path, corpus):
  tag = tmp_path.name.replace("-", "_")  # Task names are global in a process: one set per test.
  files = corpus["files"]
  user_tasks = user_mixture_gin(
      scope="te", en_name=f"{tag}_en", pair_name=f"{tag}_de_en", mixture_name=f"{tag}_mix",
      en_files={s: files[("en", s)] for s in ("train", "validation")},
      tsv_files={s: files[("de_en", s)] for s in ("train", "validation")}, vocab=corpus["vocab"])
  path = tmp_path / "run.gin"
  path.write_text(f"""
include 'runs/pretrain.gin'
{tiny_encoder_gin()}
{user_tasks}
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 1
CHECKPOINT_EVERY = 2
EVAL_EVERY = 0
TRAIN_STEPS = 4
""")
  return str(path)


def _train(gin_file, model_dir, *flags):
  return train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", *flags])


def _rows(model_dir):
  return [json.loads(line) for line in open(model_dir / "metrics.jsonl")]


@pytest.mark.slow  # Two runs of the entry point; tests/training/test_loop.py checks the hook with the fake model.
def test_train_evals_are_logged_at_their_steps_and_leave_the_losses_unchanged(tmp_path, tiny_corpus, capsys):
  gin_file = _gin_file(tmp_path, tiny_corpus)
  plain, evaluated = tmp_path / "plain", tmp_path / "evaluated"
  assert _train(gin_file, plain) == 0
  assert _train(gin_file, evaluated, "--gin.TRAIN_EVALS=['mlm']", "--gin.TRAIN_EVALS_EVERY=2",
                f"--gin.TRAIN_EVAL_OPTIONS={MLM_OPTIONS}") == 0
  assert "evaluators at step 2: mlm" in capsys.readouterr().out

  eval_rows = [r for r in _rows(evaluated) if any(k.startswith("eval_mlm_") for k in r)]
  assert [r["step"] for r in eval_rows] == [2, 4]
  for row in eval_rows:
    # The evaluator's own record of the step it read: the run was opened at the step just checkpointed.
    assert row["eval_mlm_step"] == row["step"] and row["eval_mlm_batches"] == 2
    for lang in ("de", "en"):
      assert 0.0 <= row[f"eval_mlm_languages_{lang}_accuracy"] <= 1.0
      assert row[f"eval_mlm_languages_{lang}_predictions"] > 0
    assert all(isinstance(v, (int, float)) for v in row.values())  # Non-scalars are left out.
  assert not any(k.startswith("eval_mlm_") for r in _rows(plain) for k in r)

  # The hook draws no random numbers and sees no train state: the same trajectory as without it.
  a = {r["step"]: r for r in _rows(plain) if "loss" in r}
  b = {r["step"]: r for r in _rows(evaluated) if "loss" in r}
  assert sorted(a) == sorted(b) == [1, 2, 3, 4]
  for step in a:
    for key in ("loss", "mlm", "tlm", "learning_rate"):
      np.testing.assert_array_equal(b[step][key], a[step][key], err_msg=f"{key} at step {step}")
  assert not (evaluated / "eval.json").exists()  # The loop logs; it does not write eval.json.


def _expect_refused(capsys, code, *needles):
  assert code == 2
  err = capsys.readouterr().err
  assert len([l for l in err.splitlines() if l.startswith("error:")]) == 1, err[-2000:]
  for needle in needles:
    assert needle in err, (needle, err[-2000:])


@pytest.mark.parametrize("flags, needles", [
    (["--gin.TRAIN_EVALS=['mlmm']", "--gin.TRAIN_EVALS_EVERY=2"], ["Unknown evaluator 'mlmm'", "'mlm'"]),
    (["--gin.TRAIN_EVALS=['mlm']", "--gin.TRAIN_EVALS_EVERY=2", "--gin.TRAIN_EVAL_OPTIONS={'mlm': {'splt': 'x'}}"],
     ["no option 'splt'", "split"]),
    (["--gin.TRAIN_EVALS=['mlm']"], ["TRAIN_EVALS_EVERY > 0"]),
    (["--gin.TRAIN_EVALS=['mlm']", "--gin.TRAIN_EVALS_EVERY=3"], ["TRAIN_EVALS_EVERY to a positive multiple of 2"]),
    (["--gin.TRAIN_EVAL=['mlm']"], ["--gin.TRAIN_EVAL", "TRAIN_EVALS"]),
])
def test_bad_train_evals_are_refused_before_model_dir_is_touched(tmp_path, tiny_corpus, capsys, flags, needles):
  model_dir = tmp_path / "m"
  _expect_refused(capsys, _train(_gin_file(tmp_path, tiny_corpus), model_dir, *flags), *needles)
  assert not model_dir.exists()
