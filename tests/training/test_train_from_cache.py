"""Training from a packed cache: no TensorFlow in the process, exact resume after SIGKILL, refusals.

The child processes import through tests/training/no_tf_train.py, which refuses tensorflow,
tensorflow_text and seqio as a host without them would; the reference for the resumed run is the same
command run without interruption (losses compared bit for bit, as tests/hardening/test_faults.py does for
the seqio backend).
"""

import os
import time

import pytest

from tests import testlib
from tests.hardening import harness

STEPS = 6


@pytest.fixture(scope="module")
def cache_run(tiny_corpus, tmp_path_factory):
  """A tiny_mix cache (train: 90 rows, validation) and a gin file that trains from it."""
  from flax_xalign.cli import cache as cache_cli

  root = tmp_path_factory.mktemp("cache_run")
  cache = root / "cache"
  assert cache_cli.main(["--task=tiny_mix", f"--output={cache}", "--length=19", "--examples=90"]) == 0
  assert cache_cli.main(["--task=tiny_mix", "--split=validation", f"--output={cache}", "--length=19"]) == 0
  gin_file = root / "run.gin"
  gin_file.write_text(f"""include 'runs/pretrain.gin'
{testlib.tiny_encoder_gin()}
MIXTURE_OR_TASK_NAME = 'tiny_mix'
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
TRAIN_STEPS = {STEPS}
LOG_EVERY = 1
CHECKPOINT_EVERY = 1
EVAL_EVERY = 3
train.eval_batches = 2
OptimizerConfig.warmup_steps = 2
train.data = 'cache:{cache}'
""")
  return {"root": root, "cache": str(cache), "gin": str(gin_file)}


def _assert_no_tensorflow(output: str) -> None:
  assert "REFUSED IMPORT" not in output, output[-3000:]
  assert "TF MODULES: []" in output, output[-3000:]


@pytest.mark.subprocess  # Three training runs in child processes.
def test_train_from_a_cache_without_tensorflow_resumes_exactly_after_sigkill(cache_run, tmp_path):
  reference_dir = tmp_path / "reference"
  reference = harness.run_child("train_without_tf", harness.train_argv(cache_run["gin"], reference_dir),
                                timeout=300)
  assert reference.code == 0, reference.out[-3000:]
  _assert_no_tensorflow(reference.out)
  assert "eval: loss" in reference.out  # The cached validation split is evaluated.
  assert os.path.isfile(reference_dir / "vocabulary.model")
  # The position is the cache backend's checkpoint item (JSON), not a tf.train.Checkpoint.
  assert "process_0.json" in os.listdir(reference_dir / "checkpoints" / str(STEPS) / "data_iterator_cache")
  assert not os.path.exists(reference_dir / "checkpoints" / str(STEPS) / "data_iterator")
  expected = harness.metrics_losses(reference_dir)
  assert sorted(expected) == list(range(1, STEPS + 1))

  model_dir = tmp_path / "killed"
  argv = harness.train_argv(cache_run["gin"], model_dir)
  child = harness.Child("train_without_tf", argv)
  try:
    assert child.wait_for(rf"step 3/{STEPS}", timeout=240), child.output[-3000:]
    time.sleep(0.2)
  finally:
    child.kill()
  assert "REFUSED IMPORT" not in child.output, child.output[-3000:]  # Killed: no exit line to read.
  resumed = harness.run_child("train_without_tf", argv, timeout=300)
  assert resumed.code == 0, resumed.out[-3000:]
  assert "resum" in resumed.out.lower(), resumed.out[-2000:]
  _assert_no_tensorflow(resumed.out)
  losses = harness.metrics_losses(model_dir)
  assert sorted(losses) == sorted(expected)
  differ = {step: (values, expected[step]) for step, values in losses.items() if values != expected[step]}
  assert not differ, f"losses differ from the uninterrupted run: {differ}"


@pytest.mark.contract  # The MLM evaluator's `data` setting on a trained run (~10 s): the eval contract.
def test_a_run_is_evaluated_on_the_cached_split_as_on_seqios(tiny_corpus, tmp_path_factory, tmp_path):
  """The MLM evaluator reading DIR/validation scores the same rows as the seqio stream: the same accuracy."""
  from flax_xalign.cli import cache as cache_cli
  from flax_xalign.evaluation import mlm_eval
  from flax_xalign.runs import Run
  from tests.runs.tiny_run import tiny_mix_run

  model_dir = tiny_mix_run(tmp_path_factory, tiny_corpus, "eval_from_cache")
  cache = tmp_path / "cache"
  for split, extra in (("train", ["--examples=60"]), ("validation", [])):
    assert cache_cli.main(["--task=tiny_mix", f"--split={split}", f"--output={cache}", "--length=19", *extra]) == 0
  common = dict(split="validation", batch_size=6, max_batches=4, baseline_batches=3,
                output=None)
  from_seqio = mlm_eval.evaluate(Run.open(model_dir), **common)
  from_cache = mlm_eval.evaluate(Run.open(model_dir), **common, data=f"cache:{cache}")
  assert from_cache["batches"] == from_seqio["batches"] == 4
  assert from_cache["overall"]["accuracy"] == from_seqio["overall"]["accuracy"]
  for lang, scores in from_seqio["languages"].items():
    assert from_cache["languages"][lang]["predictions"] == scores["predictions"]
    assert from_cache["languages"][lang]["accuracy"] == scores["accuracy"]


def test_resuming_with_the_other_data_backend_is_refused():
  from flax_xalign.training import checkpoints

  loop = dict(batch_size=6, task_feature_lengths={"tokens": 19}, task="tiny_mix", data_shards=None, seed=0,
              train_steps=4)
  cache_run = checkpoints.loop_record(**loop, source="cache")
  seqio_run = checkpoints.loop_record(**loop)
  assert checkpoints.loop_differences(seqio_run, cache_run) == ['train.data="seqio", this run "cache"']
  old = {k: v for k, v in seqio_run.items() if k != "data"}  # Recorded before the setting existed: seqio.
  assert checkpoints.loop_differences(old, seqio_run) == []
  assert checkpoints.loop_differences(old, cache_run) == ['train.data="seqio", this run "cache"']
