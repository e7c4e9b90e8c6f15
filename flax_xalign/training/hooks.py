"""The train loop's hooks: what runs after a step, and after which steps.

    hooks = Hooks()
    hooks.add("log", progress.write, every=100, last_step=total)
    hooks.add("checkpoint", saver, every=500, last_step=total, on_stop=True)
    state = hooks.run(StepInfo(step=..., state=..., ...))   # after every step

A hook is a function of the step's `StepInfo`; it may return a new train
state (the asset refresh does), which the hooks after it see. Hooks run in the
order they were added, each on its schedule: `Hook` runs every N steps and
at the last step (as clu's `PeriodicAction`, without importing clu, whose
writers import TensorFlow) and also knows about stopping: `on_stop=True` runs it at the step a run stops
at (the checkpoint), `on_stop=False` never there (the evaluation). The stop
itself is a hook (`StopSignals`) that latches `info.stopping` for the hooks
after it, so every hook of one step sees the same decision.

The hooks here are the loop's concerns, one object each: `StopSignals`
(SIGTERM/SIGINT, multi-host preemption), `Progress` (throughput, the
progress line, metrics.jsonl rows), `NanGuard` (refuses to log or save past a
non-finite loss or update), `CheckpointSaver` (state, iterator, manifest and
assets' files) and `Evaluation` (held-out metrics). "Monitor X during
training" is one more `hooks.add`, not a loop edit; a caller of `pretrain`
injects its own as a `CheckpointHook` (run on the step's checkpoint, e.g.
the registered evaluators), without touching the loop.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from concurrent import futures
from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError


class NonFiniteLossError(UserError):
  """The loss or the parameters became NaN/inf; the last good checkpoint is kept."""


@dataclasses.dataclass
class StepInfo:
  """What the hooks of one step see.

  Attributes:
    step: the step just trained (1-based).
    state: the train state after it (hooks may replace it: `Hooks.run`).
    metrics: the step's metrics, device arrays (fetching them syncs).
    batch: the step's host batch.
    first: the first step of this invocation (it compiled the step).
    last: step == TRAIN_STEPS.
    started: perf_counter() before the step ran.
    stopping: the run stops after this step (set by `StopSignals`).
  """

  step: int
  state: Any
  metrics: Mapping[str, jax.Array]
  batch: Mapping[str, np.ndarray]
  first: bool = False
  last: bool = False
  started: float = 0.0
  stopping: bool = False


class Hook:
  """`fn(info)` after every `every`-th step and the step `last_step`; see the module docstring."""

  def __init__(self, name: str, fn: Callable[[StepInfo], Any], *, every: int | None = 1,
               last_step: int | None = None, on_stop: bool | None = None):
    # every=0 (e.g. EVAL_EVERY=0) means "not periodically".
    self.every, self.last_step = every or None, last_step
    self.name, self.fn, self.on_stop = name, fn, on_stop
    self._previous: int | None = None

  def due(self, info: StepInfo) -> bool:
    if self.on_stop is not None and info.stopping:
      return self.on_stop
    return bool(self.every and info.step % self.every == 0) or info.step == self.last_step

  def run(self, info: StepInfo) -> Any:
    """The hook's result at this step (None when it did not run).

    Raises ValueError when a step was skipped: a periodic hook must see every step.
    """
    if self.every and self._previous is not None and info.step != self._previous + 1:
      raise ValueError(f"hook {self.name!r} must run after every step once (every={self.every}, previous step "
                       f"{self._previous}, step {info.step}).")
    self._previous = info.step
    return self.fn(info) if self.due(info) else None


class Hooks:
  """An ordered list of hooks; `run(info)` runs the due ones and returns the (new) state."""

  def __init__(self):
    self.hooks: list[Hook] = []

  def add(self, name: str, fn: Callable[[StepInfo], Any], *, every: int | None = 1, last_step: int | None = None,
          on_stop: bool | None = None) -> Hook:
    self.hooks.append(Hook(name, fn, every=every, last_step=last_step, on_stop=on_stop))
    return self.hooks[-1]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(hook.name for hook in self.hooks)

  def run(self, info: StepInfo) -> Any:
    for hook in self.hooks:
      state = hook.run(info)
      if state is not None:
        info.state = state
    return info.state


# ---------------------------------------------------------------------------- stop signals


class StopSignals:
  """Turns SIGTERM/SIGINT into a stop after the current step; as a hook, latches `info.stopping`.

  With several processes a SIGTERM is left to jax's preemption notifier: every
  process then stops after the same step (`reached_preemption`), where a
  handler of our own would stop only the signalled one and the others would
  wait for it in the next collective forever.
  """

  def __init__(self):
    self.signal: int | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "StopSignals":
    self._multi = jax.process_count() > 1
    self._forwarded = False
    if threading.current_thread() is threading.main_thread():
      for sig in ((signal.SIGINT,) if self._multi else (signal.SIGTERM, signal.SIGINT)):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum: int, frame: Any) -> None:
    if (self.signal is not None or self._forwarded) and signum == signal.SIGINT:
      raise KeyboardInterrupt  # A second Ctrl-C stops at once.
    if self._multi:
      # Ctrl-C on one process of a job: turn it into the preemption SIGTERM all of them see.
      self._forwarded = True
      print("\nreceived SIGINT: all processes save a checkpoint at the next synchronised step "
            "(Ctrl-C again to stop without saving)", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGTERM)
      return
    self.signal = signum
    print(f"\nreceived {signal.Signals(signum).name}: saving a checkpoint after this step "
          "(Ctrl-C again to stop without saving)", file=sys.stderr, flush=True)

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def requested(self) -> bool:
    return self.signal is not None

  def __call__(self, info: StepInfo) -> None:
    # Every process asks at every step: the preemption sync point is a collective.
    info.stopping = self.signal is not None or (self._multi and reached_preemption(info.step))


def reached_preemption(step: int) -> bool:
  try:
    from jax.experimental import multihost_utils

    return bool(multihost_utils.reached_preemption_sync_point(step))
  except Exception:  # Preemption service not configured: nothing to sync.
    return False


# ---------------------------------------------------------------------------- progress and logging


class Progress:
  """Throughput, the step counter and the logged rows (metrics.jsonl, TensorBoard, the progress line).

  `record` runs after every step (it reads nothing from the device but the
  first step's loss); `write` at logging steps fetches the interval's metrics
  in one transfer and writes their means with tokens/s and MFU.
  """

  def __init__(self, logger: Any, throughput: Any, terms: tuple[str, ...]):
    self.logger, self.throughput, self.terms = logger, throughput, terms
    self.history: list[dict[str, Any]] = []
    self._interval: list[Mapping[str, jax.Array]] = []
    self._timed_from = (time.perf_counter(), 0)

  def record(self, info: StepInfo) -> None:
    self._interval.append(info.metrics)
    self.throughput.add_batch(info.batch)  # Real tokens and model FLOPs, counted on the host batch.
    if info.first:
      jax.block_until_ready(info.metrics["loss"])
      print(f"  compiled and ran the first step in {time.perf_counter() - info.started:.1f} s", flush=True)
      self.throughput.reset()  # Keep compilation out of tokens/s.
      self._timed_from = (time.perf_counter(), info.step)
    else:
      elapsed, steps = time.perf_counter() - self._timed_from[0], info.step - self._timed_from[1]
      self.logger.tick(info.step, elapsed / steps if steps else None)

  def pending(self) -> dict[str, Any]:
    """The metrics of the steps since the last row, as JSON (saved with a checkpoint: see `resume_pending`)."""
    fetched = jax.device_get(self._interval)
    if not fetched:
      return {"dtypes": {}, "rows": []}
    return {"dtypes": {k: str(np.asarray(v).dtype) for k, v in fetched[0].items()},
            "rows": [{k: np.asarray(v).item() for k, v in m.items()} for m in fetched]}

  def resume_pending(self, saved: Mapping[str, Any] | None) -> None:
    """Starts with the steps a checkpoint had not logged yet, in their dtypes: the first row after a resume
    is then the mean over the same steps, and the same number, as the uninterrupted run's."""
    if not saved or not saved.get("rows"):
      return
    dtypes = saved["dtypes"]
    self._interval = [{k: np.asarray(v, dtype=dtypes[k]) for k, v in row.items()} for row in saved["rows"]]

  def write(self, info: StepInfo) -> None:
    if not self._interval:
      return
    fetched = jax.device_get(self._interval)  # One transfer, not one per metric and step.
    means = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
    row = self.logger.write(info.step, {**means, **self.throughput.summary()})
    self.logger.progress(row, self.terms)
    self.history.append(row)
    self._interval.clear()
    self.throughput.reset()


# ---------------------------------------------------------------------------- NaN guard


class NanGuard:
  """Keeps non-finite numbers out of metrics.jsonl rows and checkpoints.

  `record` keeps each step's loss on device; `check_losses` (before a row is
  written and before a save) fetches them in one transfer and stops at the
  first non-finite one; `check_update` (before a save) asks the trainer
  whether the state itself, and the loss it gives on its own batch, are
  finite: the losses up to step s say nothing about update s.

  Args:
    trainer: has `update_problem(state, host_batch) -> str | None`.
    last_saved: the newest checkpoint step written so far (for the message).
  """

  def __init__(self, trainer: Any, last_saved: Callable[[], int | None]):
    self.trainer, self.last_saved = trainer, last_saved
    self._unchecked: list[tuple[int, jax.Array]] = []

  def record(self, info: StepInfo) -> None:
    self._unchecked.append((info.step, info.metrics["loss"]))

  def check_losses(self, info: StepInfo) -> None:
    values = jax.device_get([loss for _, loss in self._unchecked])  # One transfer for all steps.
    for (step, _), value in zip(self._unchecked, values):
      value = float(value)
      if not math.isfinite(value):
        raise self.error(f"the loss became {value}", step)
    self._unchecked.clear()

  def check_update(self, info: StepInfo) -> None:
    problem = self.trainer.update_problem(info.state, info.batch)
    if problem is not None:
      raise self.error(problem, info.step)

  def error(self, what: str, step: int) -> NonFiniteLossError:
    last_saved = self.last_saved()
    kept = (f"the last checkpoint (step {last_saved}) is intact and a rerun resumes from it"
            if last_saved is not None else "no checkpoint was written, so a rerun starts afresh")
    return NonFiniteLossError(
        f"{what} at step {step}; nothing was saved for it and training stopped: {kept}. Lower the learning "
        "rate (OptimizerConfig.learning_rate) or raise OptimizerConfig.warmup_steps, or check the data, "
        "then rerun the same command.")


# ---------------------------------------------------------------------------- checkpoints and evaluation


class CheckpointSaver:
  """Saves the step's state, data iterator, manifest (with asset fingerprints) and the assets' files.

  The assets' current values are split off the state (`TrainState.assets`)
  and written by each asset's `save` into checkpoints/<step>/assets/; the
  Orbax `state` item holds `state.checkpointed()`, the tree of earlier runs.

  Args:
    checkpointer: a `checkpoints.Checkpointer`.
    run_assets: the run's `RunAssets` (objects, fingerprints, host values).
    make_meta: (fingerprints) -> the `meta` item.
    iterator: the train iterator (saved with the state).
    clock: the throughput, reset after the synchronous part of a save.
    last_saved: the step the run resumed from, if any.
    on_saved: called after each save is started (the metrics logger's flush: in a bucket, the rows
      logged since the last checkpoint are uploaded then, which is all a preemption may lose).
  """

  def __init__(self, checkpointer: Any, run_assets: Any, make_meta: Callable[[Mapping[str, Any]], Any],
               iterator: Any, clock: Any, last_saved: int | None, on_saved: Callable[[], None] | None = None):
    self.checkpointer, self.run_assets, self.make_meta = checkpointer, run_assets, make_meta
    self.iterator, self.clock, self.last_saved = iterator, clock, last_saved
    self.on_saved = on_saved

  def __call__(self, info: StepInfo) -> None:
    storage.check_fence(os.fspath(self.checkpointer.directory))  # (the bucket lock was taken over: stop here)
    values = self.run_assets.host_values(info.state.assets)
    meta = self.make_meta(self.run_assets.fingerprints(info.state.assets))
    self.checkpointer.save(info.step, info.state.checkpointed(), self.iterator, meta,
                           assets=self.run_assets.assets, asset_values=values, force=True)
    self.last_saved = info.step
    if self.on_saved is not None:
      self.on_saved()
    self.clock.reset()  # Keep the synchronous part of saving out of tokens/s.


class Evaluation:
  """Held-out metrics, logged with an `eval_` prefix; turns itself off when the split has no full batch."""

  def __init__(self, trainer: Any, batches: Callable[[], Iterable[Any]], logger: Any, clock: Any,
               terms: tuple[str, ...]):
    self.trainer, self.batches, self.logger, self.clock, self.terms = trainer, batches, logger, clock, terms
    self.enabled = True

  def __call__(self, info: StepInfo) -> None:
    if not self.enabled:
      return
    trainer = self.trainer
    metrics = trainer.evaluate(info.state.params, self.batches(), max_batches=trainer.loop.eval_batches,
                               assets=info.state.assets)
    if metrics is None:
      self.enabled = False
      if jax.process_index() == 0:
        print(f"warning: the evaluation split produced no full batch of BATCH_SIZE={trainer.loop.batch_size} at "
              f"step {info.step}; evaluation is off for the rest of the run (add held-out data or set "
              "EVAL_EVERY=0)", file=sys.stderr, flush=True)
    else:
      row = self.logger.write(info.step, metrics, prefix="eval_")
      print("  eval: " + "  ".join(f"{k} {row['eval_' + k]:.4f}" for k in ("loss", *self.terms)), flush=True)
    self.clock.reset()


# ---------------------------------------------------------------------------- the caller's hooks


@dataclasses.dataclass(frozen=True)
class CheckpointHook:
  """A hook the caller of `pretrain` injects: `fn(step)` on the run as checkpointed at `step`.

  It runs after the checkpoint of every `every`-th step and of the last step
  is written and finished (never at a stop), so `fn` may open MODEL_DIR at
  that step (the entry point runs the registered evaluators this way: the
  training layer knows neither them nor the run handle). `fn` returns a
  (nested) dict or None; its numbers are logged to metrics.jsonl and
  TensorBoard as `<prefix><key>` (nested keys joined by "_"), anything else
  is left out. It sees no train state and draws no random numbers, so the
  run's trajectory is the same with or without it.

  Attributes:
    name: the hook's name in the loop (and in messages).
    fn: (step) -> results.
    every: steps between runs; a multiple of the checkpoint interval.
    prefix: prepended to every logged key (e.g. "eval_").
    setting: the user-facing setting of `every`, named when it is refused.
    check: called with the run's data source once the run is assembled,
      before MODEL_DIR is created or a step trained: a UserError there (e.g.
      an evaluator reading a split the task lacks) costs nothing.
  """

  name: str
  fn: Callable[[int], Mapping[str, Any] | None]
  every: int
  prefix: str = ""
  setting: str = "the hook's interval"
  check: Callable[[Any], None] | None = None


def scalars_of(results: Any, prefix: str = "") -> dict[str, float | int]:
  """The numbers of a nested dict, flattened to {'a_b': value}; strings, lists, bools and None are left out."""
  out: dict[str, float | int] = {}
  if not isinstance(results, Mapping):
    return out
  for key, value in results.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.update(scalars_of(value, prefix=name + "_"))
      continue
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
      value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      out[name] = value
  return out


class AfterCheckpoint:
  """Runs a `CheckpointHook` at a checkpointed step, once the save is finished, and logs its numbers."""

  def __init__(self, hook: CheckpointHook, saver: CheckpointSaver, checkpointer: Any, logger: Any, clock: Any):
    self.hook, self.saver, self.checkpointer, self.logger, self.clock = hook, saver, checkpointer, logger, clock

  def __call__(self, info: StepInfo) -> None:
    if self.saver.last_saved != info.step:
      return  # `pretrain` schedules these on checkpoint steps only; nothing on disk to read otherwise.
    self.checkpointer.wait()  # An async save is readable only once it is finished.
    # In a thread of its own: the loop's mesh and logical axis rules are thread-local and stay out of its
    # way (an evaluator builds its own mesh, which the train mesh in scope would clash with).
    with futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.hook.name) as pool:
      scalars = scalars_of(pool.submit(self.hook.fn, info.step).result())
    if scalars:
      row = self.logger.write(info.step, scalars, prefix=self.hook.prefix)
      if jax.process_index() == 0:
        shown = list(row.items())[1:9]
        print(f"  {self.hook.name}: " + "  ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown), flush=True)
    self.clock.reset()  # Keep the hook's time out of tokens/s.
