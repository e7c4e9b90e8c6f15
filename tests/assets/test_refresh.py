"""A toy asset refreshed every 3 steps: no recompilation, exact resume, per-step files.

The `test_counter` asset is a capacity-padded int table whose refresh adds 1
to every entry; the `test_counter_loss` objective scales a real loss by
(1 + counter) and logs the counter it saw, so every logged step says which
asset value it trained with, and a wrong value after resuming changes the
parameters and every later loss.
"""

import json
import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import assets as assets_lib
from flax_xalign.assets.runtime import RunAssets
from flax_xalign.objectives import base as objectives_base
from flax_xalign.training import partitioning
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

CAPACITY = 7
REFRESH_EVERY = 3


class CounterAsset(assets_lib.Asset):
  name = "test_counter"
  files = ("test_counter.npz",)
  refresh_every = REFRESH_EVERY

  def build(self, run):
    return {"count": np.zeros((CAPACITY,), np.int32)}

  def refresh(self, params, value, run):
    return {"count": value["count"] + 1}

  def save(self, directory, value):
    np.savez(os.path.join(directory, "test_counter.npz"), **value)

  def load(self, directory):
    with np.load(os.path.join(directory, "test_counter.npz")) as data:
      return {"count": np.asarray(data["count"])}


assets_lib.register("test_counter")(lambda run: CounterAsset())


@objectives_base.register("test_counter_loss")
class CounterLoss(objectives_base.ObjectiveBase):
  requires = ("test_counter",)

  def __call__(self, ctx):
    counter = ctx.assets["test_counter"]["count"][0].astype(jnp.float32)
    energy = jnp.mean(jnp.square(ctx.hidden.astype(jnp.float32)))
    return objectives_base.LossTerm(loss=(1.0 + counter) * energy, metrics={"counter": counter})


def _run(model_dir, *, steps, callback=None):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=steps, encoder=tiny_encoder_config(),
      objectives={"mlm": 1.0, "test_counter_loss": 0.1},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=2, keep=5, async_save=False),
      log_every=1, seed=7, step_callback=callback)


def _rows(model_dir):
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  return {r["step"]: r for r in rows if "loss" in r}


@pytest.mark.slow  # Three tiny-encoder runs; tests/training/test_loop.py is its fake-model twin.
def test_refresh_does_not_recompile_and_resume_restores_the_checkpointed_asset(tmp_path, tiny_corpus):
  full = tmp_path / "full"
  result = _run(full, steps=8)
  # One trace of the train step for 8 steps and two refreshes (after 3 and 6).
  assert result.trace_counts["train_step"] == 1
  rows = _rows(full)
  seen = [rows[s]["test_counter_loss_counter"] for s in range(1, 9)]
  assert seen == [0, 0, 0, 1, 1, 1, 2, 2]
  # Every step directory holds the asset value of its step.
  for step, expected in ((4, 1), (6, 2), (8, 2)):
    with np.load(full / "checkpoints" / str(step) / "assets" / "test_counter.npz") as data:
      np.testing.assert_array_equal(data["count"], np.full(CAPACITY, expected))
  # MODEL_DIR keeps the value the run started with.
  with np.load(full / "test_counter.npz") as data:
    np.testing.assert_array_equal(data["count"], np.zeros(CAPACITY))

  def stop_at_4(step, metrics):
    if step == 4:
      os.kill(os.getpid(), signal.SIGTERM)

  resumed = tmp_path / "resumed"
  first = _run(resumed, steps=8, callback=stop_at_4)
  assert first.interrupted and first.last_step == 4
  second = _run(resumed, steps=8)
  assert second.last_step == 8 and second.trace_counts["train_step"] == 1
  a, b = _rows(full), _rows(resumed)
  assert sorted(b) == list(range(1, 9))
  for step in range(1, 9):
    assert b[step]["test_counter_loss_counter"] == a[step]["test_counter_loss_counter"], step
    for key in ("loss", "mlm", "test_counter_loss"):
      np.testing.assert_allclose(b[step][key], a[step][key], rtol=1e-6, err_msg=f"{key} at step {step}")


def test_refresh_that_changes_shapes_is_refused():
  """Checked where every refresh runs (`RunAssets.refresh`, called by the train loop after a due step)."""

  class Growing(CounterAsset):
    name = "test_growing"

    def refresh(self, params, value, run):
      return {"count": jnp.concatenate([value["count"], value["count"][:1]])}

  growing = Growing()
  run_assets = RunAssets({"test_growing": growing}, {"test_growing": growing.build(None)}, run=None)
  run_assets.place(partitioning.Partitioner(mesh=partitioning.make_mesh(1)).logical_sharding)
  assert run_assets.refresh({}, run_assets.device, step=REFRESH_EVERY - 1) is run_assets.device  # Not due yet.
  with pytest.raises(ValueError, match=r"refreshing asset 'test_growing' changed its shapes/dtypes from .*\(7,\).* "
                                       r"to .*\(8,\).*pad tables to a fixed capacity"):
    run_assets.refresh({}, run_assets.device, step=REFRESH_EVERY)
