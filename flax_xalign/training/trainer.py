"""The Trainer: sharded train state, the jitted train/eval steps, and the assets' refresh.

The step is `train_step(state, batch, rng, assets)`: assets are arguments, so
refreshing one (after the steps its `refresh_every` names) reuses the compiled
program. The assets' current values travel in the train state
(`TrainState.assets`, a pytree `{name: {key: jax.Array}}`) and `refresh(state,
step) -> state` replaces the due ones with the output of their jitted
`refresh` (same shapes, dtypes and shardings). The Orbax `state` item of a
checkpoint holds `TrainState.checkpointed()` (step, params, optimiser state:
the tree every earlier run wrote); the assets are saved beside it as files.
Determinism: the step RNG is `fold_in(key(seed), step)`.

The loop that drives a Trainer (restore, hooks for logging, NaN guard,
checkpoints, evaluation, signals) is `training/loop.py`; the model is anything
with the `TrainableModel` methods (the encoder's `PretrainingModel`, or a few-
parameter fake in the loop's tests).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
from typing import Any, Iterable, Mapping, Protocol

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_xalign.assets.runtime import RunAssets
from flax_xalign.training.hooks import NonFiniteLossError  # noqa: F401  (its old import path)
from flax_xalign.training.optimizer import OptimizerConfig, make_optimizer
from flax_xalign.training.partitioning import Partitioner

HostBatch = Mapping[str, np.ndarray]
# The features of a batch, each [batch, length] int32 (data/feature_converter.py's
# MODEL_FEATURE_KEYS; not imported from there to keep TensorFlow out of the trainer).
BATCH_FEATURES = ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")


class TrainableModel(Protocol):
  """What the Trainer calls on a model (`objectives.PretrainingModel` is one).

  Attributes:
    objectives: loss-term names (metric keys shown on the progress line) -> weight.
  """

  objectives: Mapping[str, float]

  def init(self, rng: jax.Array, *, batch: int, length: int) -> Any:
    """Parameters (leaves may be logically boxed) for a [batch, length] input."""

  def loss_fn(self, params: Any, batch: Any, rng: jax.Array, assets: Any, *, train: bool) -> tuple[jax.Array, Any]:
    """(scalar loss, {metric: scalar}); `metrics["loss"]` is the loss."""

  def has_monitors(self, assets: Any) -> bool:
    """Whether `monitor` has anything to report (evaluation only)."""

  def monitor(self, params: Any, assets: Any) -> dict[str, jax.Array]:
    """Scalars to log beside the evaluation metrics."""


class CheckpointedState(flax.struct.PyTreeNode):
  """The Orbax `state` item: the tree every checkpoint holds (runs written before the assets joined the state)."""

  step: jax.Array
  params: Any
  opt_state: Any


class TrainState(flax.struct.PyTreeNode):
  """Step, parameters, optimiser state and the assets' current device values.

  `assets` is `{name: {key: jax.Array}}` of the on-device assets; {} for a
  state from `Trainer.init_state()` (the jitted steps take the assets as their
  own argument, so their state argument carries none).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  assets: Any = flax.struct.field(default_factory=dict)

  def checkpointed(self) -> CheckpointedState:
    """What the checkpoint's `state` item holds (the assets are saved as files beside it)."""
    return CheckpointedState(step=self.step, params=self.params, opt_state=self.opt_state)

  @classmethod
  def restored(cls, saved: CheckpointedState, assets: Any) -> "TrainState":
    return cls(step=saved.step, params=saved.params, opt_state=saved.opt_state, assets=assets)


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


class Trainer:
  """Builds the sharded state and the jitted train/eval steps for one model.

  The partitioner's mesh may span devices of a TPU topology that this machine
  does not have (`jax.experimental.topologies`, training/aot.py): give
  `abstract_assets` instead of `assets`, and the steps are lowered and compiled
  ahead of time (`lower_train_step`) but never run; nothing is placed.

  Attributes:
    assets: the run's assets and the values it starts from (built, loaded or
      restored); the current values are `TrainState.assets`.
    trace_counts: how often each step function was traced (= compiled); a
      refresh of an asset must not add to it.
    abstract_assets: the assets argument of the steps as ShapeDtypeStructs
      with their shardings.
  """

  def __init__(self, *, model: TrainableModel, optimizer: OptimizerConfig,
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
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.partitioner.mesh))
    stack.enter_context(nn.logical_axis_rules(self.partitioner.rules))
    return stack

  def init_state(self) -> TrainState:
    """A fresh state without assets attached (what the jitted steps take; `with_assets` adds them)."""
    return self._init(self._init_rng)

  def with_assets(self, state: TrainState) -> TrainState:
    """`state` carrying the device values `self.assets` holds now (initial, or set from a checkpoint)."""
    return state.replace(assets=self.assets.device)

  def _current(self, assets: Any) -> Any:
    # A state without assets attached (init_state(), benches) steps with the values the run starts from.
    return assets if assets or not self.assets.device_names else self.assets.device

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
    """One train step on a host batch with the state's assets (call inside `mesh_context`)."""
    new, metrics = self.train_step(state.replace(assets={}), self.shard(host_batch), self.base_rng,
                                   self._current(state.assets))
    return new.replace(assets=state.assets), metrics

  def refresh(self, state: TrainState, step: int) -> TrainState:
    """`state` with the assets due after train step `step` refreshed from its parameters.

    Each refresh is jitted with the asset's shardings and keeps its shapes, so
    neither it nor the train step compiles again (call inside `mesh_context`).
    """
    current = self._current(state.assets)
    values = self.assets.refresh(state.params, current, step)
    return state if values is current else state.replace(assets=values)

  def update_problem(self, state: TrainState, host_batch: HostBatch) -> str | None:
    """Why `state` must not be checkpointed, or None: a non-finite float in it, or a non-finite loss
    of its parameters on `host_batch` (the batch of its last update, scored without dropout).

    Call inside `mesh_context`; one forward pass and one reduction, so only at checkpoint steps.
    """
    rng = jax.random.fold_in(self.base_rng, 0xC4EC)
    finite, metrics = jax.device_get((self.state_is_finite(state.replace(assets={})),
                                      self.eval_step(state.params, self.shard(host_batch), rng,
                                                     self._current(state.assets))))
    if not bool(finite):
      return "the parameters or optimiser state became non-finite (NaN/inf) in the update"
    if not math.isfinite(float(metrics["loss"])):
      return (f"the updated parameters give a {float(metrics['loss'])} loss on the step's own batch (the update "
              "blew them up)")
    return None

  def shard(self, host_batch: HostBatch) -> dict[str, jax.Array]:
    return self.partitioner.shard_batch(dict(host_batch))

  def evaluate(self, params: Any, batches: Iterable[HostBatch], *, max_batches: int,
               assets: Any = None) -> dict[str, float] | None:
    """Mean metrics over up to `max_batches` batches with fixed masking RNGs, plus monitors.

    `assets` are the current device values (`TrainState.assets`; None: the
    values the run starts from). None when the batches hold no full batch (a
    split too small for BATCH_SIZE).
    """
    eval_rng = jax.random.fold_in(self.base_rng, 0x5EED)
    sums: dict[str, float] = {}
    count = 0
    assets = self._current(assets)
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
