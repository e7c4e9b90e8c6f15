"""The NaN guard commits only finite checkpoints (issue 14, item 2).

The losses up to step s say nothing about update s: a blow-up there used to be
checkpointed, and every rerun resumed from the poisoned step. Here a learning
rate that overflows float32 makes the update of a checkpoint step non-finite
while its loss is finite; the run must stop without saving that step, and a
rerun at a sane learning rate must resume from the last good one and finish.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from flax_xalign.training.trainer import NonFiniteLossError, TrainState, _all_finite

from tests import testlib


def _run(model_dir, *, steps, learning_rate=3e-3):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_en", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=steps, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=learning_rate, warmup_steps=0),
      checkpoint=CheckpointConfig(every_steps=1, keep=5, async_save=True), log_every=1, seed=3)


@pytest.mark.slow  # Three tiny-encoder runs; the unit tier has tests/training/test_loop.py's NaN-guard tests.
def test_non_finite_update_on_a_checkpoint_step_is_not_saved_and_the_run_resumes(tmp_path, tiny_corpus):
  model_dir = tmp_path / "run"
  _run(model_dir, steps=2)
  # 1e39 overflows float32: the update of step 3 is inf/NaN while the loss of step 3 (computed before it) is not.
  with pytest.raises(NonFiniteLossError) as info:
    _run(model_dir, steps=5, learning_rate=1e39)
  message = str(info.value)
  assert "at step 3" in message and "the last checkpoint (step 2) is intact" in message
  assert "OptimizerConfig.learning_rate" in message
  rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  assert np.isfinite([r["loss"] for r in rows if r["step"] == 3]).all(), "the loss of step 3 itself is finite"
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["1", "2"]
  # A sane rerun resumes from step 2 and finishes with finite losses.
  result = _run(model_dir, steps=5)
  assert result.last_step == 5 and not result.interrupted
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["1", "2", "3", "4", "5"]
  rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and np.isfinite([r["loss"] for r in rows]).all()


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
def test_all_finite_checks_every_float_leaf(bad):
  params = {"w": np.ones((3, 5), np.float32), "b": np.zeros((5,), np.float16)}
  opt = (np.ones((2,), np.float32), np.arange(4, dtype=np.int32))
  if bad is not None:
    opt[0][1] = bad  # Deep in the optimiser state, where the losses never look.
  state = TrainState(step=jnp.int32(3), params=params, opt_state=opt)
  expected = all(np.isfinite(leaf).all() for leaf in (params["w"], params["b"], opt[0]))
  assert bool(jax.jit(_all_finite)(state)) == expected == (bad is None)
