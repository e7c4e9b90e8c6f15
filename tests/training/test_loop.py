"""The train loop's behaviours with a fake model: no encoder, no seqio (as t5x's trainer_test mocks its model).

The model has one 3-vector parameter and a quadratic loss, scaled by an asset
(a counter refreshed every REFRESH_EVERY steps), on numpy batches served by a
tf.data iterator (checkpointable like the real pipeline). The trajectory is
checked against an independent optax loop written out here, so a batch fed
twice, a step skipped, a stale asset or a wrong resume point all show up as
different parameters.
"""

import json
import os
import shutil
import signal

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf

from flax_xalign import assets as assets_lib
from flax_xalign.assets.runtime import RunAssets
from flax_xalign.run_spec import RunSpec, VocabularySpec
from flax_xalign.training import hooks as hooks_lib
from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer
from flax_xalign.training.loop import train
from flax_xalign.training.metrics import MetricsLogger
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.partitioning import Partitioner, make_mesh
from flax_xalign.training.trainer import LoopConfig, NonFiniteLossError, Trainer
from tests.testlib import tiny_encoder_config

B, L, STEPS, REFRESH_EVERY, LR = 4, 5, 6, 2, 0.1
W0 = np.array([1.5, -2.0, 0.5], np.float32)
DATA = np.random.default_rng(0).normal(size=(B * STEPS + B, 3)).astype(np.float32)  # Rows of step s: (s-1)*B...


class Counter(assets_lib.Asset):
  """A capacity-padded int table whose refresh adds 1 (the loss reads entry 0)."""

  name = "counter"
  files = ("counter.npz",)
  refresh_every = REFRESH_EVERY

  def build(self, run):
    return {"count": np.zeros((5,), np.int32)}

  def refresh(self, params, value, run):
    return {"count": value["count"] + 1}

  def save(self, directory, value):
    np.savez(os.path.join(directory, "counter.npz"), **value)

  def load(self, directory):
    with np.load(os.path.join(directory, "counter.npz")) as data:
      return {"count": np.asarray(data["count"])}


def quadratic(w, x, count):
  """(1 + count) * mean over rows of |w - x|^2: the fake model's loss, shared with the reference."""
  return (1.0 + count.astype(jnp.float32)) * jnp.mean(jnp.sum(jnp.square(w - x), axis=-1))


class QuadraticModel:
  """The `TrainableModel` methods the Trainer calls, over params {"w": [3]}."""

  objectives = {"quadratic": 1.0}

  def init(self, rng, *, batch, length):
    return {"w": jnp.asarray(W0)}

  def loss_fn(self, params, batch, rng, assets, *, train):
    count = assets["counter"]["count"][0]
    loss = quadratic(params["w"], batch["x"], count)
    return loss, {"loss": loss, "quadratic": loss, "counter": count}

  def has_monitors(self, assets):
    return False

  def monitor(self, params, assets):
    return {}


def _run_spec():
  return RunSpec(task="fake", languages=("en",), task_feature_lengths={"tokens": L},
                 vocabulary=VocabularySpec(file="vocabulary.model", sha256="ab" * 32, size=61, pieces=61),
                 model=tiny_encoder_config(vocab_size=61), objectives={"quadratic": 1.0})


def _dataset():
  rows = {"x": DATA, "segment_ids": np.ones((len(DATA), L), np.int32)}
  return tf.data.Dataset.from_tensor_slices(rows).batch(B, drop_remainder=True).repeat()


def _train(model_dir, *, steps=STEPS, learning_rate=LR, callback=None, eval_every=0, checkpoint_every=2):
  """One invocation of the loop over `model_dir` (resumes what is there), as `pretrain` wires it."""
  run = _run_spec()
  asset = Counter()
  run_assets = RunAssets({"counter": asset}, {"counter": asset.build(run)}, run)
  trainer = Trainer(model=QuadraticModel(), optimizer=OptimizerConfig(learning_rate=learning_rate, warmup_steps=0),
                    partitioner=Partitioner(mesh=make_mesh(1)), assets=run_assets,
                    loop=LoopConfig(train_steps=steps, batch_size=B, length=L, log_every=1, checkpoint_every=checkpoint_every,
                                    eval_every=eval_every, eval_batches=1))
  checkpointer = Checkpointer(str(model_dir), CheckpointConfig(every_steps=checkpoint_every, keep=10, async_save=False))
  loggers = []

  def logger(resume_step):
    loggers.append(MetricsLogger(str(model_dir), resume_step=resume_step, total_steps=steps))
    return loggers[-1]

  dataset = _dataset()
  try:
    result = train(trainer=trainer, train_iterator=iter(dataset), new_train_iterator=lambda: iter(dataset),
                   eval_batches=lambda: iter(_dataset().take(1).as_numpy_iterator()), checkpointer=checkpointer,
                   logger=logger, run=run, flops_per_step=1.0, step_callback=callback)
  finally:
    checkpointer.close()
    for each in loggers:
      each.close()
  return result, trainer


def _rows(model_dir):
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  return {r["step"]: r for r in rows if "loss" in r}


def _reference(steps, learning_rate=LR):
  """(loss of each step, final w) from a plain optax loop: AdamW without decay on 'w', linear decay, clipping."""
  tx = optax.chain(optax.clip_by_global_norm(1.0),
                   optax.adam(optax.linear_schedule(learning_rate, 0.0, steps), b1=0.9, b2=0.98, eps=1e-6))
  w, losses = jnp.asarray(W0), []
  opt_state = tx.init(w)
  for step in range(1, steps + 1):
    x = DATA[(step - 1) * B:step * B]
    count = jnp.int32((step - 1) // REFRESH_EVERY)  # Refreshed after steps 2, 4, ...: seen from the next one.
    loss, grad = jax.value_and_grad(quadratic)(w, x, count)
    updates, opt_state = tx.update(grad, opt_state, w)
    w = optax.apply_updates(w, updates)
    losses.append(float(loss))
  return losses, np.asarray(w)


def _counter_file(model_dir, step):
  with np.load(os.path.join(model_dir, "checkpoints", str(step), "assets", "counter.npz")) as data:
    return data["count"].tolist()


def test_uninterrupted_run_follows_the_reference_and_refresh_does_not_recompile(tmp_path):
  result, trainer = _train(tmp_path / "run", eval_every=3)
  losses, w = _reference(STEPS)
  rows = _rows(tmp_path / "run")
  assert sorted(rows) == list(range(1, STEPS + 1)) and not result.interrupted and result.last_step == STEPS
  np.testing.assert_allclose([rows[s]["loss"] for s in rows], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.state.params["w"]), w, rtol=1e-5, atol=1e-6)
  # The asset changed twice (after steps 2 and 4) while the step and the refresh compiled once each.
  assert [rows[s]["counter"] for s in rows] == [0, 0, 1, 1, 2, 2]
  assert np.asarray(result.state.assets["counter"]["count"]).tolist() == [3] * 5  # Refreshed after step 6 too.
  assert result.trace_counts["train_step"] == 1 and trainer.train_step._cache_size() == 1
  assert trainer.assets.trace_counts["counter"] == 1
  # Each checkpoint step holds that step's asset value as a file; the Orbax state item has no assets.
  assert [_counter_file(tmp_path / "run", s) for s in (2, 4, 6)] == [[1] * 5, [2] * 5, [3] * 5]
  with open(tmp_path / "run" / "checkpoints" / "6" / "state" / "_METADATA") as f:
    assert sorted({key.split(",")[0].strip("(')") for key in json.load(f)["tree_metadata"]}) == [
        "opt_state", "params", "step"]
  # The evaluation hook ran at steps 3 and 6 with the assets of those steps.
  evals = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if "eval_loss" in line]
  assert [(e["step"], e["eval_counter"]) for e in evals] == [(3, 1), (6, 3)]


def test_stop_signal_keeps_the_newest_checkpoint_and_the_resumed_run_matches(tmp_path):
  def stop_at_3(step, metrics):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  model_dir = tmp_path / "run"
  first, _ = _train(model_dir, callback=stop_at_3)
  assert first.interrupted and first.last_step == 3 and first.stop_signal == signal.SIGTERM
  # Saved at the stop (step 3 is no checkpoint step) beside the periodic one, with the asset of step 3.
  assert sorted(os.listdir(model_dir / "checkpoints"), key=int) == ["2", "3"]
  assert _counter_file(model_dir, 3) == [1] * 5
  second, _ = _train(model_dir)
  assert second.last_step == STEPS and not second.interrupted and second.trace_counts["train_step"] == 1
  losses, w = _reference(STEPS)
  rows = _rows(model_dir)
  assert sorted(rows) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([rows[s]["loss"] for s in rows], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(second.state.params["w"]), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("damage", ["state deleted", "state truncated"])
def test_damaged_newest_step_falls_back_to_the_previous_one(tmp_path, capsys, damage):
  model_dir = tmp_path / "run"
  _train(model_dir, steps=4)  # Checkpoints 2 and 4 of a 4-step schedule ...
  step_dir = model_dir / "checkpoints" / "4"
  if damage == "state deleted":
    shutil.rmtree(step_dir / "state")
  else:
    largest = max((os.path.join(d, n) for d, _, names in os.walk(step_dir / "state") for n in names),
                  key=os.path.getsize)
    with open(largest, "r+b") as f:
      f.truncate(os.path.getsize(largest) // 2)
  capsys.readouterr()
  result, _ = _train(model_dir, steps=4)  # ... resumed: step 4 is damaged, so 3 and 4 are trained again.
  err = capsys.readouterr().err
  assert f"warning: checkpoint step 4 of {model_dir} is damaged (state/ is" in err
  assert "and resuming from step 2" in err
  assert os.path.isdir(model_dir / "checkpoints_damaged" / "4")
  losses, w = _reference(4)
  rows = _rows(model_dir)
  assert result.last_step == 4 and sorted(rows) == [1, 2, 3, 4]
  np.testing.assert_allclose([rows[s]["loss"] for s in rows], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.state.params["w"]), w, rtol=1e-5, atol=1e-6)
  assert _counter_file(model_dir, 4) == [2] * 5


def test_nan_guard_refuses_to_save_a_non_finite_update(tmp_path):
  model_dir = tmp_path / "run"
  _train(model_dir, steps=2, checkpoint_every=1)
  # 1e39 overflows float32: update 3 is inf while the loss of step 3 (computed before it) is finite.
  with pytest.raises(NonFiniteLossError) as info:
    _train(model_dir, steps=STEPS, learning_rate=1e39, checkpoint_every=1)
  message = str(info.value)
  assert "non-finite (NaN/inf) in the update at step 3" in message, message
  assert "the last checkpoint (step 2) is intact" in message
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["1", "2"]
  rows = _rows(model_dir)
  assert sorted(rows) == [1, 2, 3] and np.isfinite(rows[3]["loss"])  # Step 3's loss was logged, not saved.


def test_nan_guard_refuses_to_log_or_save_past_a_non_finite_loss(tmp_path):
  model_dir = tmp_path / "run"
  _train(model_dir, steps=2)
  # Checkpoints every 2 steps: the blown-up update 3 is not checked, the loss of step 4 it gives is.
  with pytest.raises(NonFiniteLossError, match="the loss became (nan|inf) at step 4; nothing was saved") as info:
    _train(model_dir, steps=STEPS, learning_rate=1e39)
  assert "the last checkpoint (step 2) is intact" in str(info.value)
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2"]
  assert sorted(_rows(model_dir)) == [1, 2, 3]


def test_hooks_run_in_order_on_their_schedules_and_see_the_stop():
  calls = []
  hooks = hooks_lib.Hooks()
  hooks.add("stop", lambda info: setattr(info, "stopping", info.step == 5))
  hooks.add("every_2", lambda info: calls.append(("every_2", info.step)), every=2, last_step=7)
  hooks.add("save", lambda info: calls.append(("save", info.step)), every=3, last_step=7, on_stop=True)
  hooks.add("eval", lambda info: calls.append(("eval", info.step)), every=5, last_step=7, on_stop=False)
  hooks.add("new_state", lambda info: info.state + 1, every=2)
  states = [hooks.run(hooks_lib.StepInfo(step=s, state=10 * s, metrics={}, batch={})) for s in range(1, 8)]
  assert calls == [("every_2", 2), ("save", 3), ("every_2", 4), ("save", 5), ("every_2", 6), ("save", 6),
                   ("every_2", 7), ("save", 7), ("eval", 7)]
  assert states == [10, 21, 30, 41, 50, 61, 70]
  assert hooks.names == ("stop", "every_2", "save", "eval", "new_state")
