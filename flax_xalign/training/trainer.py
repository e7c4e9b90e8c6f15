"""The train loop: sharded state, jitted step, assets, checkpoints, evaluation, signals.

`train()` receives its collaborators (model, partitioner, data, assets,
checkpointer, logger) so tests can pass small ones. The step is
`train_step(state, batch, rng, assets)`: assets are arguments, so refreshing
one (after the steps its `refresh_every` names) reuses the compiled program.
Determinism: the step RNG is `fold_in(key(seed), step)`, and the data
iterator's state and the assets are checkpointed with the train state, so a
resumed run reproduces the losses of an uninterrupted one.

A checkpoint is committed only when the losses up to its step and every float
of the state it holds are finite (one jitted reduction at checkpoint steps),
so a blow-up never leaves a poisoned step to resume from. The checkpoint of a
step is saved before that step's evaluation.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal
import sys
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_xalign.assets.runtime import RunAssets
from flax_xalign.errors import UserError
from flax_xalign.objectives.pretraining import PretrainingModel
from flax_xalign.run_spec import RunSpec
from flax_xalign.training.batches import BatchFetcher, StopWhileFetching
from flax_xalign.training.checkpoints import (Checkpointer, DamagedCheckpointError, make_meta,
                                              warn_damaged)
from flax_xalign.training.metrics import MetricsLogger, Throughput
from flax_xalign.training.optimizer import OptimizerConfig, make_optimizer
from flax_xalign.training.partitioning import Partitioner

HostBatch = Mapping[str, np.ndarray]
# The features of a batch, each [batch, length] int32 (data/feature_converter.py's
# MODEL_FEATURE_KEYS; not imported from there to keep TensorFlow out of the trainer).
BATCH_FEATURES = ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


class NonFiniteLossError(UserError):
  """The loss or the parameters became NaN/inf; the last good checkpoint is kept."""


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """What the loop does and how often."""

  train_steps: int
  batch_size: int
  length: int
  seed: int = 0
  log_every: int = 10
  eval_every: int = 0
  checkpoint_every: int = 100
  eval_batches: int = 20
  peak_flops_per_device: float | None = None


@dataclasses.dataclass
class TrainResult:
  """What `train` returns; `trace_counts` says how often each step function compiled."""

  state: TrainState
  last_step: int
  interrupted: bool
  stop_signal: int | None
  history: list[dict[str, Any]]
  trace_counts: dict[str, int] = dataclasses.field(default_factory=dict)


class _StopRequest:
  """Turns SIGTERM/SIGINT into a flag the loop checks after each step."""

  def __init__(self):
    self.signal: int | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> "_StopRequest":
    import threading

    # With several processes a SIGTERM is left to jax's preemption notifier: every
    # process then stops after the same step (`_reached_preemption`), where a
    # handler of our own would stop only the signalled one and the others would
    # wait for it in the next collective forever.
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


def _to_host(batch: Any) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in batch.items()}


class Trainer:
  """Builds the sharded state and the jitted train/eval steps for one model.

  The partitioner's mesh may span devices of a TPU topology that this machine
  does not have (`jax.experimental.topologies`, training/aot.py): give
  `abstract_assets` instead of `assets`, and the steps are lowered and compiled
  ahead of time (`lower_train_step`) but never run; nothing is placed.

  Attributes:
    trace_counts: how often each step function was traced (= compiled); a
      refresh of an asset must not add to it.
    abstract_assets: the assets argument of the steps as ShapeDtypeStructs
      with their shardings.
  """

  def __init__(self, *, model: PretrainingModel, optimizer: OptimizerConfig,
               partitioner: Partitioner, loop: LoopConfig, assets: RunAssets | None = None,
               abstract_assets: Mapping[str, Mapping[str, jax.ShapeDtypeStruct]] | None = None):
    if assets is not None and abstract_assets is not None:
      raise ValueError("give the Trainer either assets (to train) or abstract_assets (to compile), not both")
    self.model = model
    self.partitioner = partitioner
    self.loop = loop
    self.assets = assets if assets is not None else RunAssets.empty()
    self.trace_counts: collections.Counter[str] = collections.Counter()
    partitioner.check_batch_size(loop.batch_size)
    self.tx, self.schedule = make_optimizer(optimizer, loop.train_steps)
    self.base_rng = jax.random.key(loop.seed)
    init_rng = jax.random.fold_in(self.base_rng, -1 & 0x7FFFFFFF)

    def init_boxed(rng: jax.Array) -> TrainState:
      params = model.init(rng, batch=1, length=loop.length)
      return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params))

    # Initialisation runs without the mesh in context: parameter shardings come
    # from the logical boxes, and flax's DenseGeneral would otherwise apply its
    # n-d logical constraint to the flat kernel it initialises.
    abstract_boxed = jax.eval_shape(init_boxed, init_rng)
    self.state_shardings = partitioner.shardings_for(abstract_boxed)
    self.abstract_state = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        nn.meta.unbox(abstract_boxed), self.state_shardings)
    self._init = jax.jit(lambda rng: nn.meta.unbox(init_boxed(rng)), out_shardings=self.state_shardings)
    self._init_rng = init_rng
    if abstract_assets is None:
      self.assets.place(partitioner.logical_sharding)
      self.abstract_assets = self.assets.abstract()
    else:
      self.abstract_assets = {name: dict(value) for name, value in abstract_assets.items()}
    with self.mesh_context():
      batch_sharding = partitioner.data_sharding(2)
      replicated = partitioner.replicated()
      asset_shardings = jax.tree.map(lambda leaf: leaf.sharding, self.abstract_assets)
      self.train_step = jax.jit(
          self._train_step,
          in_shardings=(self.state_shardings, batch_sharding, replicated, asset_shardings),
          out_shardings=(self.state_shardings, replicated),
          donate_argnums=(0,),
      )
      self.eval_step = jax.jit(
          self._eval_step,
          in_shardings=(self.state_shardings.params, batch_sharding, replicated, asset_shardings),
          out_shardings=replicated,
      )
      self.monitor_step = jax.jit(self._monitor_step, in_shardings=(self.state_shardings.params, asset_shardings),
                                  out_shardings=replicated)
      self.state_is_finite = jax.jit(_all_finite, in_shardings=(self.state_shardings,), out_shardings=replicated)

  def mesh_context(self):
    """Mesh and logical rules in scope, so activation constraints resolve."""
    import contextlib

    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.partitioner.mesh))
    stack.enter_context(nn.logical_axis_rules(self.partitioner.rules))
    return stack

  def init_state(self) -> TrainState:
    return self._init(self._init_rng)

  def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The global batch the train step takes, [batch_size, length] int32 per feature, sharded on 'data'."""
    shape, sharding = (self.loop.batch_size, self.loop.length), self.partitioner.data_sharding(2)
    return {key: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=sharding) for key in BATCH_FEATURES}

  def lower_train_step(self) -> Any:
    """`train_step` lowered for abstract state, batch, RNG key and assets (`.compile()` the result).

    Every argument is a ShapeDtypeStruct with the sharding the step declares,
    so the program is the one `step` runs, on this mesh's devices or on a
    topology's (the assets stay inputs, never constants).
    """
    rng = jax.ShapeDtypeStruct(self.base_rng.shape, self.base_rng.dtype, sharding=self.partitioner.replicated())
    with self.mesh_context():
      return self.train_step.lower(self.abstract_state, self.abstract_batch(), rng, self.abstract_assets)

  def _train_step(self, state: TrainState, batch: Any, base_rng: jax.Array, assets: Any):
    self.trace_counts["train_step"] += 1  # Runs only while tracing.
    rng = jax.random.fold_in(base_rng, state.step)
    grad_fn = jax.value_and_grad(self.model.loss_fn, has_aux=True)
    (_, metrics), grads = grad_fn(state.params, batch, rng, assets, train=True)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=self.schedule(state.step), grad_norm=optax.tree.norm(grads))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def _eval_step(self, params: Any, batch: Any, rng: jax.Array, assets: Any):
    self.trace_counts["eval_step"] += 1
    _, metrics = self.model.loss_fn(params, batch, rng, assets, train=False)
    return metrics

  def _monitor_step(self, params: Any, assets: Any):
    return self.model.monitor(params, assets)

  def step(self, state: TrainState, host_batch: HostBatch) -> tuple[TrainState, dict[str, jax.Array]]:
    """One train step on a host batch with the current assets (call inside `mesh_context`)."""
    return self.train_step(state, self.shard(host_batch), self.base_rng, self.assets.device)

  def update_problem(self, state: TrainState, host_batch: HostBatch) -> str | None:
    """Why `state` must not be checkpointed, or None: a non-finite float in it, or a non-finite loss
    of its parameters on `host_batch` (the batch of its last update, scored without dropout).

    Call inside `mesh_context`; one forward pass and one reduction, so only at checkpoint steps.
    """
    rng = jax.random.fold_in(self.base_rng, 0xC4EC)
    finite, metrics = jax.device_get((self.state_is_finite(state),
                                      self.eval_step(state.params, self.shard(host_batch), rng, self.assets.device)))
    if not bool(finite):
      return "the parameters or optimiser state became non-finite (NaN/inf) in the update"
    if not math.isfinite(float(metrics["loss"])):
      return (f"the updated parameters give a {float(metrics['loss'])} loss on the step's own batch (the update "
              "blew them up)")
    return None

  def shard(self, host_batch: HostBatch) -> dict[str, jax.Array]:
    return self.partitioner.shard_batch(dict(host_batch))

  def evaluate(self, params: Any, batches: Iterable[HostBatch], *, max_batches: int) -> dict[str, float] | None:
    """Mean metrics over up to `max_batches` batches with fixed masking RNGs, plus monitors.

    None when the batches hold no full batch (a split too small for BATCH_SIZE).
    """
    eval_rng = jax.random.fold_in(self.base_rng, 0x5EED)
    sums: dict[str, float] = {}
    count = 0
    assets = self.assets.device
    with self.mesh_context():
      for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
          break
        metrics = jax.device_get(self.eval_step(params, self.shard(batch), jax.random.fold_in(eval_rng, i),
                                                assets))
        for k, v in metrics.items():
          sums[k] = sums.get(k, 0.0) + float(v)
        count += 1
    if not count:
      return None
    means = {k: v / count for k, v in sums.items()}
    if self.model.has_monitors(assets):
      with self.mesh_context():
        means.update({k: float(v) for k, v in jax.device_get(self.monitor_step(params, assets)).items()})
    return means


def _all_finite(state: TrainState) -> jax.Array:
  """Whether every float of the state (params and optimiser moments) is finite: one bool."""
  leaves = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.isfinite(leaf).all() for leaf in leaves])) if leaves else jnp.bool_(True)


def _non_finite(what: str, step: int, last_saved: int | None) -> NonFiniteLossError:
  kept = (f"the last checkpoint (step {last_saved}) is intact and a rerun resumes from it"
          if last_saved is not None else "no checkpoint was written, so a rerun starts afresh")
  return NonFiniteLossError(
      f"{what} at step {step}; nothing was saved for it and training stopped: {kept}. Lower the learning "
      "rate (OptimizerConfig.learning_rate) or raise OptimizerConfig.warmup_steps, or check the data, "
      "then rerun the same command.")


def _check_finite(losses: list[tuple[int, jax.Array]], last_saved: int | None) -> None:
  values = jax.device_get([loss for _, loss in losses])  # One transfer for all steps.
  for (step, _), value in zip(losses, values):
    value = float(value)
    if not math.isfinite(value):
      raise _non_finite(f"the loss became {value}", step, last_saved)


def _restore(trainer: Trainer, checkpointer: Checkpointer, step: int, iterator: Any,
             new_iterator: Callable[[], Iterator[Any]] | None, *, restore_iterator: bool, on_damaged: str,
             check_step: Callable[[int], None] | None) -> tuple[int, TrainState, Iterator[Any]]:
  """(step, state, iterator) of the newest complete checkpoint from `step` down.

  A damaged step is moved aside (`on_damaged="fallback"`) and the next older
  one tried with a new iterator (a failed restore may leave the old one half
  restored); with "error" its DamagedCheckpointError propagates.
  """
  while True:
    try:
      if check_step is not None:
        check_step(step)
      # Assets the caller already loaded from this step are not read twice.
      restore_assets = {} if trainer.assets.source_step == step else trainer.assets.assets
      with trainer.mesh_context():
        state, values = checkpointer.restore(step, trainer.abstract_state, iterator if restore_iterator else None,
                                             assets=restore_assets)
      damage = _agree_restored(checkpointer, step, None)
    except DamagedCheckpointError as e:
      damage = _agree_restored(checkpointer, step, e)
    except Exception:
      _agree_restored(checkpointer, step, "failed")
      raise
    if damage is None:
      trainer.assets.set_values(values)
      return step, state, iterator
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


def train(
    *,
    trainer: Trainer,
    train_iterator: Iterator[Any],
    eval_batches: Callable[[], Iterable[HostBatch]] | None,
    checkpointer: Checkpointer,
    logger: MetricsLogger | Callable[[int], MetricsLogger],
    run: RunSpec,
    flops_per_step: float,
    on_resume: Callable[[int], None] | None = None,
    step_callback: Callable[[int, Mapping[str, jax.Array]], None] | None = None,
    init_params: Callable[[Any], Any] | None = None,
    new_train_iterator: Callable[[], Iterator[Any]] | None = None,
    loop_record: Mapping[str, Any] | None = None,
    restore_iterator: bool = True,
    check_step: Callable[[int], None] | None = None,
    before_training: Callable[[int | None], None] | None = None,
) -> TrainResult:
  """Runs (or resumes) training to `trainer.loop.train_steps`.

  Args:
    trainer: model, optimiser and sharded steps.
    train_iterator: a checkpointable iterator of host batches (tf.data).
    eval_batches: returns a fresh iterable of held-out host batches.
    checkpointer: where state, iterator, manifest and assets are saved.
    logger: metrics sink, or a function of the resumed step (0 for a new
      run) that makes it once the checkpoint is restored.
    run: the run manifest, saved with every checkpoint with the assets'
      fingerprints at that step.
    flops_per_step: model FLOPs of one train step (for MFU).
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
  """
  loop = trainer.loop
  latest = checkpointer.latest_step()
  last_saved = None
  if latest is not None:
    latest, state, train_iterator = _restore(
        trainer, checkpointer, latest, train_iterator, new_train_iterator, restore_iterator=restore_iterator,
        on_damaged=checkpointer.config.on_damaged, check_step=check_step)
    last_saved = latest
    print(f"resumed from {checkpointer.directory}/{latest}"
          + ("" if restore_iterator else " with a new data iterator"), flush=True)
    if on_resume:
      on_resume(latest)
  else:
    state = trainer.init_state()
    if init_params is not None:
      state = state.replace(params=init_params(state.params))
  if not isinstance(logger, MetricsLogger) and callable(logger):
    logger = logger(latest or 0)
  if before_training is not None:
    before_training(latest)
  start = int(jax.device_get(state.step))
  terms = tuple(trainer.model.objectives)
  throughput = Throughput(flops_per_step=flops_per_step, peak_flops=loop.peak_flops_per_device,
                          num_devices=jax.device_count())
  history: list[dict[str, Any]] = []
  unchecked: list[tuple[int, jax.Array]] = []
  interval: list[dict[str, jax.Array]] = []
  interrupted = False
  evaluating = eval_batches is not None and loop.eval_every > 0
  step = start

  with _StopRequest() as stop, trainer.mesh_context():
    # The fetch runs beside the main thread, so a stop request is heard while the pipeline is busy.
    fetcher = BatchFetcher(train_iterator, should_stop=lambda: stop.signal is not None, convert=_to_host)
    for step in range(start + 1, loop.train_steps + 1):
      try:
        host_batch = fetcher.next()
      except StopWhileFetching as e:
        # The iterator is mid-read and cannot be saved with the state: keep the newest checkpoint.
        interrupted, step = True, step - 1
        kept = (f"the checkpoint of step {last_saved} is kept" if last_saved is not None else
                "no checkpoint was written yet")
        redo = step - (last_saved or 0)
        print(f"stopped while waiting {e.waited_s:.0f} s for the input pipeline (before step {step + 1}); "
              f"{kept}" + (f" and the {redo} step(s) after it will be trained again" if redo else "")
              + ". Rerun the same command to resume.", flush=True)
        break
      except StopIteration:
        raise UserError("The training data ran out; use a repeating dataset (num_epochs=None).")
      except Exception as e:  # pylint: disable=broad-except
        if step == start + 1 and latest is not None and restore_iterator and not isinstance(e, UserError):
          # A restored iterator state from another pipeline fails only when read (e.g. another batch shape).
          raise _iterator_mismatch(latest, e) from None
        raise
      if step == start + 1:
        print("compiling the train step...", flush=True)
        compile_started = time.perf_counter()
      state, metrics = trainer.step(state, host_batch)
      trainer.assets.refresh(state.params, step)
      unchecked.append((step, metrics["loss"]))
      if step_callback is not None:
        step_callback(step, metrics)
      interval.append(metrics)
      throughput.add(float((host_batch["segment_ids"] > 0).sum()) * jax.process_count())
      if step == start + 1:
        jax.block_until_ready(metrics["loss"])
        print(f"  compiled and ran the first step in {time.perf_counter() - compile_started:.1f} s", flush=True)
        throughput.reset()  # Keep compilation out of tokens/s.
        timed_from = (time.perf_counter(), step)
      else:
        elapsed, steps = time.perf_counter() - timed_from[0], step - timed_from[1]
        logger.tick(step, elapsed / steps if steps else None)

      last = step == loop.train_steps
      if (step % loop.log_every == 0 or last) and interval:
        _check_finite(unchecked, last_saved)
        unchecked.clear()
        fetched = jax.device_get(interval)  # One transfer, not one per metric and step.
        means = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]}
        row = logger.write(step, {**means, **throughput.summary()})
        logger.progress(row, terms)
        history.append(row)
        interval.clear()
        throughput.reset()
      preempted = jax.process_count() > 1 and _reached_preemption(step)
      stopping = stop.signal is not None or preempted
      if step % loop.checkpoint_every == 0 or last or stopping:
        _check_finite(unchecked, last_saved)
        unchecked.clear()
        # The losses say nothing about the update of this step: the state saved must be finite itself,
        # and so must the loss it gives (an update to huge but finite parameters overflows the next step).
        problem = trainer.update_problem(state, host_batch)
        if problem is not None:
          raise _non_finite(problem, step, last_saved)
        values = trainer.assets.host_values()
        checkpointer.save(step, state, train_iterator, make_meta(run, trainer.assets.fingerprints(), loop_record),
                          assets=trainer.assets.assets, asset_values=values, force=True)
        last_saved = step
        throughput.reset()  # Keep the synchronous part of saving out of tokens/s.
      # Evaluate after saving: a failing or slow evaluation never costs the step's checkpoint.
      if evaluating and not stopping and (step % loop.eval_every == 0 or last):
        eval_metrics = trainer.evaluate(state.params, eval_batches(), max_batches=loop.eval_batches)
        if eval_metrics is None:
          evaluating = False
          if jax.process_index() == 0:
            print(f"warning: the evaluation split produced no full batch of BATCH_SIZE={loop.batch_size} at "
                  f"step {step}; evaluation is off for the rest of the run (add held-out data or set "
                  "EVAL_EVERY=0)", file=sys.stderr, flush=True)
        else:
          row = logger.write(step, eval_metrics, prefix="eval_")
          print("  eval: " + "  ".join(f"{k} {row['eval_' + k]:.4f}" for k in ("loss", *terms)), flush=True)
        throughput.reset()
      if stopping:
        interrupted = True
        print(f"stopped at step {step}; checkpoint saved. Rerun the same command to resume.", flush=True)
        break
  checkpointer.wait()
  logger.flush()
  return TrainResult(state=state, last_step=step, interrupted=interrupted,
                     stop_signal=stop.signal, history=history, trace_counts=dict(trainer.trace_counts))


def _iterator_mismatch(step: int, error: Exception) -> UserError:
  from flax_xalign.training.checkpoints import fresh_iterator_advice

  first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
  return UserError(f"the data-iterator state restored from checkpoint step {step} does not fit this run's input "
                   f"pipeline ({type(error).__name__}: {first}); was BATCH_SIZE, TASK_FEATURE_LENGTHS or the "
                   f"task changed? {fresh_iterator_advice()}")


def _reached_preemption(step: int) -> bool:
  try:
    from jax.experimental import multihost_utils

    return bool(multihost_utils.reached_preemption_sync_point(step))
  except Exception:  # Preemption service not configured: nothing to sync.
    return False
