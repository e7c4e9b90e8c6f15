"""The train loop's behaviours with a fake model: no encoder, no seqio (as t5x's trainer_test mocks its model).

The model has one 3-vector parameter and a quadratic loss, scaled by an asset
(a counter refreshed every REFRESH_EVERY steps), on numpy batches served by a
tf.data iterator (checkpointable like the real pipeline). The trajectory is
checked against an independent optax loop written out here, so a batch fed
twice, a step skipped, a stale asset or a wrong resume point all show up as
different parameters.

These are the unit-tier twins of the integration runs with the tiny encoder
(tests/training/test_pretrain.py, test_nan_guard.py, test_stop_while_fetching.py,
test_resume_checks.py, test_train_evals.py, tests/assets/test_refresh.py; `slow`
tier); damaged checkpoints and a full disk are in test_loop_checkpoints.py.
"""

import json
import os
import signal
import threading
import time

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


def _train(model_dir, *, steps=STEPS, learning_rate=LR, callback=None, eval_every=0, checkpoint_every=2,
           on_damaged="fallback", async_save=False, eval_batches=None, train_iterator=None, restore_iterator=True,
           checkpoint_hooks=(), before_training=None, log_every=1):
  """One invocation of the loop over `model_dir` (resumes what is there), as `pretrain` wires it.

  `eval_batches` replaces the held-out batches (default: one batch of the train rows); `train_iterator`
  the train iterator (default: a fresh iterator of `_dataset()`, restored from the checkpoint).
  """
  run = _run_spec()
  asset = Counter()
  run_assets = RunAssets({"counter": asset}, {"counter": asset.build(run)}, run)
  trainer = Trainer(model=QuadraticModel(), optimizer=OptimizerConfig(learning_rate=learning_rate, warmup_steps=0),
                    partitioner=Partitioner(mesh=make_mesh(1)), assets=run_assets,
                    loop=LoopConfig(train_steps=steps, batch_size=B, length=L, log_every=log_every,
                                    checkpoint_every=checkpoint_every, eval_every=eval_every, eval_batches=1))
  checkpointer = Checkpointer(str(model_dir), CheckpointConfig(every_steps=checkpoint_every, keep=10,
                                                               async_save=async_save, on_damaged=on_damaged))
  loggers = []

  def logger(resume_step):
    loggers.append(MetricsLogger(str(model_dir), resume_step=resume_step, total_steps=steps))
    return loggers[-1]

  dataset = _dataset()
  if eval_batches is None:
    eval_batches = lambda: iter(_dataset().take(1).as_numpy_iterator())
  try:
    result = train(trainer=trainer, train_iterator=iter(dataset) if train_iterator is None else train_iterator,
                   new_train_iterator=lambda: iter(dataset), eval_batches=eval_batches, checkpointer=checkpointer,
                   logger=logger, run=run, flops_per_step=1.0, step_callback=callback,
                   restore_iterator=restore_iterator, checkpoint_hooks=checkpoint_hooks,
                   before_training=before_training)
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


def test_a_resumed_run_logs_the_rows_of_the_uninterrupted_one_at_log_every_above_one(tmp_path):
  """Stopped at step 3 with LOG_EVERY=4: the row of step 4 is still the mean over steps 1-4."""
  def stop_at_3(step, metrics):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  _train(tmp_path / "whole", log_every=4)
  whole = _rows(tmp_path / "whole")
  first, _ = _train(tmp_path / "run", log_every=4, callback=stop_at_3)
  assert first.interrupted and first.last_step == 3
  assert not os.path.exists(tmp_path / "run" / "metrics.jsonl") or _rows(tmp_path / "run") == {}
  _train(tmp_path / "run", log_every=4)
  resumed = _rows(tmp_path / "run")
  assert sorted(whole) == sorted(resumed) == [4, 6]
  losses, _ = _reference(STEPS)
  np.testing.assert_allclose(whole[4]["loss"], np.mean(losses[:4], dtype=np.float32), rtol=1e-5)
  for step in (4, 6):
    for key in ("loss", "counter", "grad_norm", "learning_rate"):
      if key in whole[step]:
        assert resumed[step][key] == whole[step][key], (step, key, resumed[step][key], whole[step][key])


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
  assert "OptimizerConfig.learning_rate" in message  # The fix.
  # A rerun at a sane learning rate resumes from step 2 and finishes with finite losses.
  result, _ = _train(model_dir, steps=STEPS, checkpoint_every=1)
  assert result.last_step == STEPS and not result.interrupted
  assert sorted(os.listdir(model_dir / "checkpoints"), key=int) == [str(s) for s in range(1, STEPS + 1)]
  rows = _rows(model_dir)
  assert sorted(rows) == list(range(1, STEPS + 1)) and np.isfinite([r["loss"] for r in rows.values()]).all()


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


def test_a_stop_while_the_pipeline_blocks_keeps_the_checkpoint_and_says_what_is_redone(tmp_path, capsys):
  """SIGTERM while the train iterator is stuck in `next` (a busy pipeline): the loop stops at once."""
  model_dir = tmp_path / "run"
  _train(model_dir, steps=2)  # Checkpoint at step 2.
  block_s = 60.0  # Longer than the test could wait: the stop must not wait for the batch.

  def blocking():
    yield next(iter(_dataset()))  # One good batch (step 3), then the fetch of step 4 hangs.
    threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGTERM)).start()
    time.sleep(block_s)
    yield next(iter(_dataset()))

  capsys.readouterr()
  started = time.perf_counter()
  result, _ = _train(model_dir, train_iterator=blocking(), restore_iterator=False)
  elapsed = time.perf_counter() - started
  out = capsys.readouterr().out
  assert result.interrupted and result.stop_signal == signal.SIGTERM and result.last_step == 3
  assert elapsed < block_s / 2, f"the stop waited for the pipeline ({elapsed:.0f} s)"
  assert "stopped while waiting" in out and "(before step 4); the checkpoint of step 2 is kept" in out
  assert "the 1 step(s) after it will be trained again" in out
  # Nothing saved for step 3 (the iterator was mid-read); its row was logged.
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2"] and sorted(_rows(model_dir)) == [1, 2, 3]


def test_checkpoint_hooks_log_at_their_steps_and_leave_the_trajectory_unchanged(tmp_path, capsys):
  """A `CheckpointHook` (the entry point's TRAIN_EVALS) reads the finished checkpoint of its step."""
  model_dir = tmp_path / "run"

  def probe(step):
    # Readable only once the checkpoint of `step` is written: its asset file.
    return {"step": step, "counter": {"first": _counter_file(model_dir, step)[0]}, "note": "not a number"}

  hook = hooks_lib.CheckpointHook(name="probe", fn=probe, every=2, prefix="eval_probe_")
  result, _ = _train(model_dir, checkpoint_hooks=[hook], async_save=True)
  assert "  probe: eval_probe_step 2" in capsys.readouterr().out
  rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  hooked = [r for r in rows if any(k.startswith("eval_probe_") for k in r)]
  assert [r["step"] for r in hooked] == [2, 4, 6]
  for row in hooked:
    assert row["eval_probe_step"] == row["step"]
    assert row["eval_probe_counter_first"] == row["step"] // 2  # The asset saved with that step.
    assert "eval_probe_note" not in row  # Non-numbers are left out.
  losses, w = _reference(STEPS)  # The hook sees no train state and draws no random numbers.
  np.testing.assert_allclose([r["loss"] for r in _rows(model_dir).values()], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.state.params["w"]), w, rtol=1e-5, atol=1e-6)


def test_an_eval_split_without_a_full_batch_warns_once_and_the_run_finishes(tmp_path, capsys):
  result, _ = _train(tmp_path / "run", steps=3, eval_every=1, eval_batches=lambda: iter(()))
  assert result.last_step == 3
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1 and f"no full batch of BATCH_SIZE={B} at step 1" in warnings[0]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]


def test_a_step_is_checkpointed_before_its_evaluation(tmp_path, monkeypatch):
  def failing(self, params, batches, *, max_batches, assets=None):
    raise RuntimeError("evaluation failed")

  monkeypatch.setattr(Trainer, "evaluate", failing)
  with pytest.raises(RuntimeError, match="evaluation failed"):
    _train(tmp_path / "run", steps=3, eval_every=3)
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]


def test_the_first_step_is_announced_and_timed_and_the_config_written_after_the_restore(tmp_path, capsys):
  model_dir = tmp_path / "run"
  seen = []

  def before_training(resumed):  # pretrain writes config.gin here: it then describes what the checkpoints hold.
    seen.append((resumed, "resumed from" in capsys.readouterr().out))

  _train(model_dir, steps=2, before_training=before_training)
  _train(model_dir, steps=3, before_training=before_training)
  assert seen == [(None, False), (2, True)]
  out = capsys.readouterr().out.splitlines()
  start = out.index("compiling the train step...")
  assert out[start + 1].startswith("  compiled and ran the first step in ") and out[start + 1].endswith(" s")
  assert out[start + 2].startswith("step 3/3")
