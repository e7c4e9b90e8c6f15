"""`python -m flax_xalign.eval` in a FRESH process on models trained on the user's own data.

The evaluation process has not run the training gin file nor imported the
user's module: everything it needs comes from the run manifest. Each
subprocess costs a few seconds of imports, so the cases are few.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from flax_xalign import train as train_main
from tests.testlib import tiny_encoder_gin, user_mixture_gin

# The fresh process is the point: it has not parsed the training gin file nor imported the user's module.
pytestmark = pytest.mark.subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _eval(model_dir, *extra, env=None):
  """(exit status, stderr) of the eval entry point in a new process."""
  proc = subprocess.run(
      [sys.executable, "-m", "flax_xalign.eval", f"--gin.MODEL_DIR='{model_dir}'", "--gin.SPLIT='validation'",
       "--gin.BATCH_SIZE=6", "--gin.evaluate.baseline_batches=2", "--gin.evaluate.max_batches=2", *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})
  return proc.returncode, proc.stderr


def _gin_file(tmp_path, data, vocab):
  tag = tmp_path.name.replace("-", "_")
  en = {s: str(data / f"en.{s}.txt") for s in ("train", "validation")}
  tsv = {s: str(data / f"de_en.{s}.tsv") for s in ("train", "validation")}
  user_tasks = user_mixture_gin(
      scope="u", en_name=f"{tag}_en", pair_name=f"{tag}_de_en", mixture_name=f"{tag}_mix",
      en_files=en, tsv_files=tsv, vocab=vocab)
  text = f"""
include 'runs/pretrain.gin'
{tiny_encoder_gin()}
{user_tasks}
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 2
CHECKPOINT_EVERY = 2
EVAL_EVERY = 0
"""
  path = tmp_path / "run.gin"
  path.write_text(text)
  return str(path)


def _one_error_line(stderr):
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, stderr[-3000:]
  assert "Traceback" not in stderr, stderr[-3000:]  # The gin suffix is gin_cli's (C1), tested there.
  return errors[0]


def test_eval_of_moved_user_files_names_the_path_then_follows_relocate(tmp_path, tiny_corpus):
  data, vocab_dir = tmp_path / "data", tmp_path / "vocab"
  data.mkdir()
  vocab_dir.mkdir()
  files = tiny_corpus["files"]
  for split in ("train", "validation"):
    shutil.copy(files[("en", split)], data / f"en.{split}.txt")
    shutil.copy(files[("de_en", split)], data / f"de_en.{split}.tsv")
  shutil.copy(tiny_corpus["vocab"], vocab_dir / "spm.model")
  model_dir = tmp_path / "model"
  gin_file = _gin_file(tmp_path, data, vocab_dir / "spm.model")
  assert train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=2"]) == 0

  # The data moved and the vocabulary file is gone (the run keeps its own copy).
  moved = tmp_path / "moved_data"
  data.rename(moved)
  shutil.rmtree(vocab_dir)
  code, err = _eval(model_dir)
  line = _one_error_line(err)
  assert code == 2
  assert str(data / "en.train.txt") in line and "--gin.evaluate.relocate=" in line and str(data) in line

  code, err = _eval(model_dir, f"--gin.evaluate.relocate={{'{data}': '{moved}'}}")
  assert code == 0, err[-3000:]
  results = json.loads((model_dir / "eval.json").read_text())
  assert results["step"] == 2 and set(results["languages"]) == {"de", "en"}


def test_eval_of_tasks_registered_in_python_imports_their_module(tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.runs.checkpoints import read_run_spec
  from flax_xalign.training.checkpoints import CheckpointConfig
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.pretrain import pretrain
  from tests.evaluation import python_registered_tasks as mod

  train, vocab = tiny_corpus["files"][("en", "train")], tiny_corpus["vocab"]
  mod.register(train, vocab)
  model_dir = tmp_path / "model"
  pretrain(model_dir=str(model_dir), mixture_or_task_name=mod.MIXTURE, task_feature_lengths={"tokens": 19},
           batch_size=6, train_steps=2, encoder=tiny_encoder, objectives={"mlm": 1.0},
           optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
           checkpoint=CheckpointConfig(every_steps=2, keep=1), log_every=2)
  _, run, _ = read_run_spec(str(model_dir))
  assert run.task_definitions == ({"kind": "PythonModule", "args": {"module": mod.__name__}},)

  # The module registers its tasks when imported, as a user's module would.
  env = {mod.ENV: json.dumps({"train": train, "vocab": vocab})}
  code, err = _eval(model_dir, env=env)
  assert code == 0, err[-3000:]
  assert json.loads((model_dir / "eval.json").read_text())["task"] == mod.MIXTURE
