"""A stop request while the input pipeline is busy (issue 14, item 1; contract C10), through `pretrain`.

The first batch of a real pipeline can take minutes (a shuffle buffer over long
lines); before the BatchFetcher, SIGTERM and Ctrl-C waited for it. Here the
pipeline is made to block on purpose: the train data of the resumed run blocks
before its second batch, and a timer thread sends this process SIGTERM a second
into that wait.
"""

import json
import os
import signal
import threading
import time

import pytest

from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from flax_xalign.training.seqio_source import SeqioSource

from tests import testlib

BLOCK_S = 60.0  # Longer than any test could wait: the stop must not wait for the batch.


def _run(model_dir, *, steps):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_en", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=steps, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=2, keep=3, async_save=True), log_every=1, seed=3)


class _BlockingAfter:
  """A train dataset whose iterator blocks (in `next`, as a busy tf.data pipeline does) after `good` batches."""

  def __init__(self, dataset, good):
    self._dataset, self._good = dataset, good

  def __iter__(self):
    def batches():
      iterator = iter(self._dataset)
      for _ in range(self._good):
        yield next(iterator)
      # The stop arrives while this fetch is blocked, whatever the machine's speed so far.
      threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
      time.sleep(BLOCK_S)
      yield next(iterator)

    return batches()


@pytest.mark.slow  # Two tiny-encoder runs; tests/training/test_loop.py has the fake-model twin.
@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs POSIX signals")
def test_sigterm_while_the_pipeline_is_busy_stops_at_once_keeping_the_checkpoint(tmp_path, tiny_corpus,
                                                                                  monkeypatch, capsys):
  model_dir = tmp_path / "run"
  assert _run(model_dir, steps=2).last_step == 2  # Checkpoint at step 2.
  rows_before = open(model_dir / "metrics.jsonl").read()

  original = SeqioSource.dataset

  def blocking(self, **kwargs):
    dataset = original(self, **kwargs)
    return _BlockingAfter(dataset, good=1) if kwargs.get("split", "train") == "train" else dataset

  monkeypatch.setattr(SeqioSource, "dataset", blocking)
  # The blocking wrapper is a plain generator (no tf.data state to restore): resume with a fresh iterator.
  capsys.readouterr()
  started = time.perf_counter()
  result = pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_en", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=6, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=2, keep=3, async_save=True), log_every=1, seed=3,
      fresh_data_iterator=True)
  elapsed = time.perf_counter() - started
  out = capsys.readouterr().out

  assert result.interrupted and result.stop_signal == signal.SIGTERM
  assert result.last_step == 3  # Step 3 ran on the one good batch; step 4's batch never came.
  assert elapsed < BLOCK_S / 2, f"the stop waited for the pipeline ({elapsed:.0f} s)"
  assert "stopped while waiting" in out and "the checkpoint of step 2 is kept" in out
  assert "1 step(s) after it will be trained again" in out
  # Nothing was saved for step 3 (the iterator was mid-read), and the old rows are untouched.
  steps = sorted(int(n) for n in os.listdir(model_dir / "checkpoints") if n.isdigit())
  assert steps == [2]
  rows = open(model_dir / "metrics.jsonl").read()
  assert rows.startswith(rows_before)
  assert [json.loads(line)["step"] for line in rows.splitlines()] == [1, 2, 3]
