"""The train loop: restore or initialise, then step and run the hooks, until TRAIN_STEPS or a stop.

`train()` receives its collaborators (trainer, data, checkpointer, logger,
manifest) so tests can pass small ones (tests/training/test_loop.py drives it
with a few-parameter quadratic model). Everything that happens around a step
is a hook (training/hooks.py), run in this order after each step:

  refresh_assets   the assets due after this step, refreshed in the state (jitted, no recompile)
  step_callback    the caller's `step_callback(step, metrics)`, if any
  stop_signals     SIGTERM/SIGINT or a multi-host preemption: stop after this step
  nan_guard        keeps each step's loss for the checks below
  progress         tokens/s, the step counter, the first step's compile time
  check_losses     (logging steps) no non-finite loss is logged ...
  log              ... the mean metrics since the last row: metrics.jsonl, TensorBoard, progress line
  check_losses     (checkpoint steps, the last, a stop) ... or saved past
  check_update     the state to save and its loss on its own batch are finite
  checkpoint       state, data iterator, manifest, the assets' files
  evaluate         held-out metrics (not at a stop: a slow evaluation never costs the checkpoint)
  <caller's>       each `CheckpointHook` on its steps: runs on the finished checkpoint, logs its numbers

Determinism: the step RNG is `fold_in(key(seed), step)`, and the data
iterator's state and the assets are checkpointed with the train state, so a
resumed run reproduces the losses of an uninterrupted one. A checkpoint is
committed only when the losses up to its step and every float of the state it
holds are finite, so a blow-up never leaves a poisoned step to resume from.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import jax
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.run_spec import RunSpec
from flax_xalign.training import hooks as hooks_lib
from flax_xalign.training.batches import BatchFetcher, StopWhileFetching
from flax_xalign.training.checkpoints import (LOG_INTERVAL, Checkpointer, DamagedCheckpointError, make_meta,
                                              read_checkpoint_meta, warn_damaged)
from flax_xalign.training.metrics import MetricsLogger, Throughput
from flax_xalign.training.trainer import HostBatch, Trainer, TrainState


@dataclasses.dataclass
class TrainResult:
  """What `train` returns; `trace_counts` says how often each step function compiled."""

  state: TrainState
  last_step: int
  interrupted: bool
  stop_signal: int | None
  history: list[dict[str, Any]]
  trace_counts: dict[str, int] = dataclasses.field(default_factory=dict)


def train(
    *,
    trainer: Trainer,
    train_iterator: Iterator[Any],
    eval_batches: Callable[[], Iterable[HostBatch]] | None,
    checkpointer: Checkpointer,
    logger: MetricsLogger | Callable[[int], MetricsLogger],
    run: RunSpec,
    flops_per_step: float | Callable[[HostBatch], float],
    on_resume: Callable[[int], None] | None = None,
    step_callback: Callable[[int, Mapping[str, jax.Array]], None] | None = None,
    init_params: Callable[[Any], Any] | None = None,
    new_train_iterator: Callable[[], Iterator[Any]] | None = None,
    loop_record: Mapping[str, Any] | None = None,
    restore_iterator: bool = True,
    check_step: Callable[[int], None] | None = None,
    before_training: Callable[[int | None], None] | None = None,
    checkpoint_hooks: Sequence[hooks_lib.CheckpointHook] = (),
) -> TrainResult:
  """Runs (or resumes) training to `trainer.loop.train_steps`.

  Args:
    trainer: model, optimiser and sharded steps.
    train_iterator: a checkpointable iterator of host batches
      (`DataSource.batches`), whose position the checkpointer's
      `position` saves (the source's; by default a tf.data iterator's).
    eval_batches: returns a fresh iterable of held-out host batches.
    checkpointer: where state, iterator, manifest and assets are saved.
    logger: metrics sink, or a function of the resumed step (0 for a new
      run) that makes it once the checkpoint is restored.
    run: the run manifest, saved with every checkpoint with the assets'
      fingerprints at that step.
    flops_per_step: the model FLOPs of a step, for MFU: a function of this
      process's host batch (pretrain passes `batch_train_flops`: real
      tokens by models/flops.py's standard count), or one number for every step.
    on_resume: called with the restored step before training continues.
    step_callback: called as `(step, metrics)` after every step (progress bars,
      notebooks, tests); metrics are device arrays, fetching them syncs.
    init_params: maps the freshly initialised params to the starting params of
      a new run (a warm start); not called when resuming.
    new_train_iterator: makes a fresh iterator like `train_iterator`; needed to
      fall back to an older checkpoint when the newest is damaged.
    loop_record: the data loop saved in each checkpoint's meta
      (`checkpoints.loop_record`).
    restore_iterator: False resumes the model with `train_iterator` as it is
      (a new data order) instead of the checkpoint's iterator state.
    check_step: called with a step before it is restored (e.g. to compare the
      data loop of an older step reached by a fallback).
    before_training: called with the resumed step (None: a new run) once the
      state is restored or initialised, before the first step (writes the
      run's config: it then describes what the checkpoints hold).
    checkpoint_hooks: the caller's hooks, run after the checkpoints of their
      steps (their intervals must be multiples of the checkpoint interval).
  """
  latest, state, train_iterator = _restore_or_init(
      trainer, checkpointer, train_iterator, new_train_iterator, restore_iterator=restore_iterator,
      check_step=check_step, init_params=init_params, on_resume=on_resume)
  if not isinstance(logger, MetricsLogger) and callable(logger):
    logger = logger(latest or 0)
  if before_training is not None:
    before_training(latest)
  start = step = int(jax.device_get(state.step))
  interrupted = False
  with hooks_lib.StopSignals() as stop, trainer.mesh_context():
    hooks, saver, progress = _hooks(trainer, stop, eval_batches, checkpointer, logger, run, flops_per_step,
                                    step_callback, loop_record, train_iterator, latest, checkpoint_hooks)
    if latest is not None and restore_iterator:  # The steps the checkpoint saved but had not logged yet.
      progress.resume_pending(read_checkpoint_meta(os.fspath(checkpointer.directory), step=latest)[1]
                              .get(LOG_INTERVAL))
    # The fetch runs beside the main thread, so a stop request is heard while the pipeline is busy.
    fetcher = BatchFetcher(train_iterator, should_stop=stop.requested, convert=_to_host)
    for step in range(start + 1, trainer.loop.train_steps + 1):
      batch = _next_batch(fetcher, step, first=step == start + 1, resumed=latest if restore_iterator else None,
                          last_saved=saver.last_saved)
      if batch is None:
        interrupted, step = True, step - 1
        break
      if step == start + 1:
        print("compiling the train step...", flush=True)
      started = time.perf_counter()
      state, metrics = trainer.step(state, batch)
      info = hooks_lib.StepInfo(step=step, state=state, metrics=metrics, batch=batch, first=step == start + 1,
                                last=step == trainer.loop.train_steps, started=started)
      state = hooks.run(info)
      if info.stopping:
        interrupted = True
        print(f"stopped at step {step}; checkpoint saved. Rerun the same command to resume.", flush=True)
        break
  checkpointer.wait()
  logger.flush()
  return TrainResult(state=state, last_step=step, interrupted=interrupted, stop_signal=stop.signal,
                     history=progress.history, trace_counts=dict(trainer.trace_counts))


def _hooks(trainer: Trainer, stop: hooks_lib.StopSignals, eval_batches: Callable[[], Iterable[HostBatch]] | None,
           checkpointer: Checkpointer, logger: MetricsLogger, run: RunSpec,
           flops_per_step: float | Callable[[HostBatch], float],
           step_callback: Callable[[int, Mapping[str, jax.Array]], None] | None,
           loop_record: Mapping[str, Any] | None, train_iterator: Any, resumed: int | None,
           checkpoint_hooks: Sequence[hooks_lib.CheckpointHook] = (),
           ) -> tuple[hooks_lib.Hooks, hooks_lib.CheckpointSaver, hooks_lib.Progress]:
  """The loop's hooks in the order of the module docstring, on the schedules of `trainer.loop`."""
  loop, terms = trainer.loop, tuple(trainer.model.objectives)
  clock = Throughput(step_flops=flops_per_step, peak_flops=loop.peak_flops_per_device,
                     num_devices=jax.device_count())
  progress = hooks_lib.Progress(logger, clock, terms)
  saver = hooks_lib.CheckpointSaver(
      checkpointer, trainer.assets,
      lambda prints: {**make_meta(run, prints, loop_record), LOG_INTERVAL: progress.pending()},
      train_iterator, clock, last_saved=resumed, on_saved=logger.flush)
  guard = hooks_lib.NanGuard(trainer, last_saved=lambda: saver.last_saved)
  logs = dict(every=loop.log_every, last_step=loop.train_steps)
  saves = dict(every=loop.checkpoint_every, last_step=loop.train_steps, on_stop=True)
  hooks = hooks_lib.Hooks()
  hooks.add("refresh_assets", lambda info: trainer.refresh(info.state, info.step))
  if step_callback is not None:
    hooks.add("step_callback", lambda info: step_callback(info.step, info.metrics))
  hooks.add("stop_signals", stop)
  hooks.add("nan_guard", guard.record)
  hooks.add("progress", progress.record)
  hooks.add("check_losses", guard.check_losses, **logs)
  hooks.add("log", progress.write, **logs)
  hooks.add("check_losses", guard.check_losses, **saves)
  hooks.add("check_update", guard.check_update, **saves)
  hooks.add("checkpoint", saver, **saves)
  if eval_batches is not None and loop.eval_every > 0:
    evaluation = hooks_lib.Evaluation(trainer, eval_batches, logger, clock, terms)
    hooks.add("evaluate", evaluation, every=loop.eval_every, last_step=loop.train_steps, on_stop=False)
  for hook in checkpoint_hooks:
    hooks.add(hook.name, hooks_lib.AfterCheckpoint(hook, saver, checkpointer, logger, clock), every=hook.every,
              last_step=loop.train_steps, on_stop=False)
  return hooks, saver, progress


def _to_host(batch: Any) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in batch.items()}


def _next_batch(fetcher: BatchFetcher, step: int, *, first: bool, resumed: int | None,
                last_saved: int | None) -> HostBatch | None:
  """The batch of `step`, or None when a stop came while waiting for it (the newest checkpoint is kept)."""
  try:
    return fetcher.next()
  except StopWhileFetching as e:
    # The iterator is mid-read and cannot be saved with the state: keep the newest checkpoint.
    kept = (f"the checkpoint of step {last_saved} is kept" if last_saved is not None else
            "no checkpoint was written yet")
    redo = step - 1 - (last_saved or 0)
    print(f"stopped while waiting {e.waited_s:.0f} s for the input pipeline (before step {step}); "
          f"{kept}" + (f" and the {redo} step(s) after it will be trained again" if redo else "")
          + ". Rerun the same command to resume.", flush=True)
    return None
  except StopIteration:
    raise UserError("The training data ran out; use a repeating dataset (num_epochs=None).")
  except Exception as e:  # pylint: disable=broad-except
    if first and resumed is not None and not isinstance(e, UserError):
      # A restored iterator state from another pipeline fails only when read (e.g. another batch shape).
      raise _iterator_mismatch(resumed, e) from None
    raise


def _restore_or_init(trainer: Trainer, checkpointer: Checkpointer, iterator: Iterator[Any],
                     new_iterator: Callable[[], Iterator[Any]] | None, *, restore_iterator: bool,
                     check_step: Callable[[int], None] | None, init_params: Callable[[Any], Any] | None,
                     on_resume: Callable[[int], None] | None) -> tuple[int | None, TrainState, Iterator[Any]]:
  """(the step resumed from or None, the state with its assets attached, the train iterator)."""
  latest = checkpointer.latest_step()
  if latest is None:
    state = trainer.init_state()
    if init_params is not None:
      state = state.replace(params=init_params(state.params))
    return None, trainer.with_assets(state), iterator
  latest, state, iterator = restore(
      trainer, checkpointer, latest, iterator, new_iterator, restore_iterator=restore_iterator,
      on_damaged=checkpointer.config.on_damaged, check_step=check_step)
  print(f"resumed from {checkpointer.directory}/{latest}"
        + ("" if restore_iterator else " with a new data iterator"), flush=True)
  if on_resume:
    on_resume(latest)
  return latest, state, iterator


def restore(trainer: Trainer, checkpointer: Checkpointer, step: int, iterator: Any,
            new_iterator: Callable[[], Iterator[Any]] | None, *, restore_iterator: bool, on_damaged: str,
            check_step: Callable[[int], None] | None) -> tuple[int, TrainState, Iterator[Any]]:
  """(step, state, iterator) of the newest complete checkpoint from `step` down.

  The state's assets are the step's saved values (they become the trainer's
  starting values too). A damaged step is moved aside
  (`on_damaged="fallback"`) and the next older one tried with a new iterator
  (a failed restore may leave the old one half restored); with "error" its
  DamagedCheckpointError propagates.
  """
  while True:
    try:
      if check_step is not None:
        check_step(step)
      # Assets the caller already loaded from this step are not read twice.
      restore_assets = {} if trainer.assets.source_step == step else trainer.assets.assets
      with trainer.mesh_context():
        saved, values = checkpointer.restore(step, trainer.abstract_state.checkpointed(),
                                             iterator if restore_iterator else None, assets=restore_assets)
      damage = _agree_restored(checkpointer, step, None)
    except DamagedCheckpointError as e:
      damage = _agree_restored(checkpointer, step, e)
    except Exception:
      _agree_restored(checkpointer, step, "failed")
      raise
    if damage is None:
      trainer.assets.set_values(values)
      return step, trainer.with_assets(TrainState.restored(saved, {})), iterator
    if on_damaged != "fallback" or new_iterator is None:
      raise damage
    target = checkpointer.move_damaged(damage)
    older = checkpointer.latest_step()
    if older is None:
      raise UserError(f"no complete checkpoint is left in {checkpointer.directory} (step {damage.step}: "
                      f"{damage.what}; moved to {target}). Rerun to train from scratch, or move it back.")
    warn_damaged(damage, target, older)
    step, iterator = older, new_iterator()


def _agree_restored(checkpointer: Checkpointer, step: int, problem: Any) -> DamagedCheckpointError | None:
  """The damage all processes act on: a step one process cannot read is damaged for all of them.

  `problem` is this process's DamagedCheckpointError, None, or "failed" (another
  error, which this process raises after telling the others).
  """
  if jax.process_count() == 1:
    return problem if isinstance(problem, DamagedCheckpointError) else None
  from jax.experimental import multihost_utils

  code = 0 if problem is None else 1 if isinstance(problem, DamagedCheckpointError) else 2
  codes = np.asarray(multihost_utils.process_allgather(np.int32(code)))
  if code == 2:
    return None  # The caller re-raises its own error.
  if np.any(codes == 2):
    raise UserError(f"another process could not restore checkpoint step {step}; see its output.")
  if isinstance(problem, DamagedCheckpointError):
    return problem
  if np.any(codes == 1):
    return DamagedCheckpointError(checkpointer.directory / str(step), "unreadable on another process")
  return None


def _iterator_mismatch(step: int, error: Exception) -> UserError:
  from flax_xalign.training.checkpoints import fresh_iterator_advice

  first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
  return UserError(f"the data-iterator state restored from checkpoint step {step} does not fit this run's input "
                   f"pipeline ({type(error).__name__}: {first}); was BATCH_SIZE, TASK_FEATURE_LENGTHS or the "
                   f"task changed? {fresh_iterator_advice()}")
