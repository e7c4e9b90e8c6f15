"""A run's assets at training time: their objects, starting values, shardings and jitted refresh.

`RunAssets` is the host-side description of a run's assets: the asset
objects, the values the run starts from (built, loaded from MODEL_DIR, or
restored from a checkpoint step), their shardings and fingerprints. The
*current* device values live in the train state (`TrainState.assets`, a dict
`{name: {key: jax.Array}}` of the on-device assets) and are passed to every
step as an argument. `refresh(params, values, step)` returns the values with
those due after `step` replaced by the output of their jitted `refresh` (same
shapes, dtypes and shardings, so the train step's compiled program is reused);
the checkpointer saves `host_values(values)` with every checkpoint.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable, Mapping

import jax
import numpy as np

from flax_xalign.assets.base import Asset, Value

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

# (logical axis names, shape) -> a jax Sharding; the trainer's partitioner provides it.
# (logical axes, shape, *, name=, dtype=) -> sharding: Partitioner.logical_sharding.
ShardingFn = Callable[..., Any]


class ReadyValue(Asset):
  """An asset whose value is handed over in memory (benches, tests): nothing to build, save or load."""

  def __init__(self, name: str):
    self.name = name

  def build(self, run: "RunSpec") -> Value:
    raise NotImplementedError(f"asset {self.name!r} is a ready value; it has nothing to build")

  def save(self, directory: str, value: Value) -> None:
    raise NotImplementedError(f"asset {self.name!r} is a ready value; it is not saved")

  def load(self, directory: str) -> Value:
    raise NotImplementedError(f"asset {self.name!r} is a ready value; it is not loaded")


class RunAssets:
  """Asset objects plus the values a run starts from (see the module docstring).

  Args:
    assets: name -> Asset.
    values: name -> host value (dict of numpy arrays).
    run: the run manifest (handed to `refresh`).

  Attributes:
    trace_counts: how often each asset's refresh was traced (= compiled).
  """

  def __init__(self, assets: Mapping[str, Asset], values: Mapping[str, Value], run: "RunSpec"):
    missing = sorted(set(assets) - set(values))
    if missing:
      raise ValueError(f"no value for assets {missing}")
    self.assets = dict(assets)
    self.run = run
    self._host = {name: {k: np.asarray(v) for k, v in values[name].items()} for name in self.assets}
    self._device: dict[str, Value] | None = None
    self._shardings: dict[str, dict[str, Any]] = {}
    self._refresh_fns: dict[str, Callable] = {}
    self.trace_counts: collections.Counter[str] = collections.Counter()
    self._fingerprints: dict[str, dict[str, Any]] = {}  # Of the starting values.
    # name -> (device value, its host copy, its fingerprint or None): the last
    # current value fetched, so a value unchanged since is neither fetched nor
    # fingerprinted again (a refreshed value is a new dict, compared by identity).
    self._fetched: dict[str, tuple[Value, Value, dict[str, Any] | None]] = {}
    # The checkpoint step the values were loaded from, if any (the loop then
    # does not restore them a second time).
    self.source_step: int | None = None

  @classmethod
  def empty(cls, run: "RunSpec | None" = None) -> "RunAssets":
    return cls({}, {}, run)  # type: ignore[arg-type]

  @classmethod
  def of_values(cls, values: Mapping[str, Value], run: "RunSpec | None" = None) -> "RunAssets":
    """Static assets from values already in memory (`ReadyValue`s): for benches and tests."""
    return cls({name: ReadyValue(name) for name in values}, values, run)  # type: ignore[arg-type]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(sorted(self.assets))

  @property
  def device_names(self) -> tuple[str, ...]:
    return tuple(n for n in self.names if self.assets[n].on_device)

  # ---------------------------------------------------------------- placement

  def place(self, sharding_fn: ShardingFn) -> None:
    """Puts the on-device assets onto the mesh, sharded by their logical axes."""
    self._shardings = {}
    for name in self.device_names:
      value = self._host[name]
      axes = self.assets[name].logical_axes(value)
      self._shardings[name] = {k: sharding_fn(tuple(axes[k]), np.shape(v), name=f"{name}/{k}", dtype=np.asarray(v).dtype)
                             for k, v in value.items()}
    self._put()

  def _put(self) -> None:
    self._device = {name: {k: jax.device_put(v, self._shardings[name][k]) for k, v in self._host[name].items()}
                    for name in self.device_names}
    self._fetched = {name: (value, self._host[name], self._fingerprints.get(name))
                     for name, value in self._device.items()}

  @property
  def shardings(self) -> dict[str, dict[str, Any]]:
    return self._shardings

  @property
  def device(self) -> dict[str, Value]:
    """The starting values on device, {name: {key: jax.Array}}: the step argument until a refresh."""
    if self._device is None:
      raise RuntimeError("RunAssets.place() must run before the device values are used")
    return self._device

  def abstract(self) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
    """ShapeDtypeStructs (with shardings) of the step argument, for AOT compilation."""
    return {name: {k: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype,
                                           sharding=self._shardings.get(name, {}).get(k))
                   for k, v in self._host[name].items()}
            for name in self.device_names}

  # ---------------------------------------------------------------- values

  def host_values(self, current: Mapping[str, Value] | None = None) -> dict[str, Value]:
    """Values as numpy: the starting ones, with the on-device ones of `current` (`TrainState.assets`) over them.

    A device value is fetched once per refresh (not at every checkpoint).
    """
    values = {name: dict(value) for name, value in self._host.items()}
    for name, value in (current or {}).items():
      values[name] = dict(self._fetch(name, value)[1])
    return values

  def _fetch(self, name: str, value: Value) -> tuple[Value, Value, dict[str, Any] | None]:
    cached = self._fetched.get(name)
    if cached is None or cached[0] is not value:
      cached = (value, {k: np.asarray(v) for k, v in jax.device_get(dict(value)).items()}, None)
      self._fetched[name] = cached
    return cached

  def set_values(self, values: Mapping[str, Value]) -> None:
    """Replaces starting values (a restored checkpoint's); re-places them if placed before."""
    for name, value in values.items():
      if name not in self.assets:
        continue
      self._host[name] = {k: np.asarray(v) for k, v in value.items()}
      self._fingerprints.pop(name, None)
    if self._device is not None:
      self._put()

  def fingerprints(self, current: Mapping[str, Value] | None = None) -> dict[str, dict[str, Any]]:
    """Fingerprint of every asset's value (`current` as in `host_values`), cached until the value changes."""
    out = {}
    for name in self.names:
      if current is not None and name in current:
        value, host, fingerprint = self._fetch(name, current[name])
        if fingerprint is None:
          fingerprint = self.assets[name].fingerprint(host)
          self._fetched[name] = (value, host, fingerprint)
      else:
        if name not in self._fingerprints:
          self._fingerprints[name] = self.assets[name].fingerprint(self._host[name])
        fingerprint = self._fingerprints[name]
      out[name] = dict(fingerprint)
    return out

  # ---------------------------------------------------------------- refresh

  def due(self, step: int) -> tuple[str, ...]:
    """Assets whose refresh runs after train step `step`."""
    return tuple(n for n in self.device_names
                 if self.assets[n].refresh_every and step % self.assets[n].refresh_every == 0)

  def refresh(self, params: Any, values: Mapping[str, Value], step: int) -> Mapping[str, Value]:
    """`values` (the current device values) with the assets due after `step` refreshed from `params`.

    Returns `values` itself when none is due, else a new dict (the refreshed
    assets' entries new as well). Each asset's refresh is jitted once with its
    shardings; a refresh that changes shapes or dtypes is refused.
    """
    names = self.due(step)
    if not names:
      return values
    values = dict(values)
    for name in names:
      if name not in self._refresh_fns:
        self._refresh_fns[name] = jax.jit(self._refresh_fn(name), out_shardings=self._shardings[name])
      before = jax.tree.map(lambda x: (x.shape, x.dtype), values[name])
      values[name] = self._refresh_fns[name](params, values[name])
      after = jax.tree.map(lambda x: (x.shape, x.dtype), values[name])
      if after != before:
        raise ValueError(f"refreshing asset {name!r} changed its shapes/dtypes from {before} to {after}; "
                         "refresh must keep them (pad tables to a fixed capacity) so the step never recompiles")
    return values

  def _refresh_fn(self, name: str) -> Callable[[Any, Value], Value]:
    asset, run = self.assets[name], self.run

    def refresh(params: Any, value: Value) -> Value:
      self.trace_counts[name] += 1  # Runs only while tracing.
      return asset.refresh(params, value, run)

    return refresh
