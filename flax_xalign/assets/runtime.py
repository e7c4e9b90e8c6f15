"""A run's assets at training time: device values, shardings, jitted refresh.

`RunAssets` holds the asset objects of one run and their current values. The
trainer passes `device` (a dict `{name: {key: jax.Array}}` of the on-device
assets) to every step as an argument; the loop calls `refresh(params, step)`
after each step, which replaces the values of assets that are due with the
output of their jitted `refresh` (same shapes, dtypes and shardings, so the
train step's compiled program is reused); the checkpointer saves
`host_values()` with every checkpoint.
"""

from __future__ import annotations

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
  """Asset objects plus their current values (see the module docstring).

  Args:
    assets: name -> Asset.
    values: name -> host value (dict of numpy arrays).
    run: the run manifest (handed to `refresh`).
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
    self._stale: set[str] = set()  # Refreshed on device since the last host fetch.
    self._fingerprints: dict[str, dict[str, Any]] = {}
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
    self._device = {name: {k: jax.device_put(v, self._shardings[name][k]) for k, v in self._host[name].items()}
                    for name in self.device_names}

  @property
  def shardings(self) -> dict[str, dict[str, Any]]:
    return self._shardings

  @property
  def device(self) -> dict[str, Value]:
    """The step argument: {name: {key: jax.Array}} of the on-device assets."""
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

  def host_values(self) -> dict[str, Value]:
    """Current values as numpy (fetches the values refreshed on device since the last call)."""
    if self._stale:
      fetched = jax.device_get({name: self.device[name] for name in self._stale})
      for name, value in fetched.items():
        self._host[name] = {k: np.asarray(v) for k, v in value.items()}
        self._fingerprints.pop(name, None)
      self._stale.clear()
    return {name: dict(value) for name, value in self._host.items()}

  def set_values(self, values: Mapping[str, Value]) -> None:
    """Replaces values (a restored checkpoint's); re-places them if placed before."""
    for name, value in values.items():
      if name not in self.assets:
        continue
      self._host[name] = {k: np.asarray(v) for k, v in value.items()}
      self._fingerprints.pop(name, None)
      self._stale.discard(name)
    if self._device is not None:
      self._device = {name: {k: jax.device_put(v, self._shardings[name][k]) for k, v in self._host[name].items()}
                      for name in self.device_names}

  def fingerprints(self) -> dict[str, dict[str, Any]]:
    """Fingerprint of every asset's current value (cached until the value changes)."""
    values = self.host_values()
    for name in self.names:
      if name not in self._fingerprints:
        self._fingerprints[name] = self.assets[name].fingerprint(values[name])
    return {name: dict(self._fingerprints[name]) for name in self.names}

  # ---------------------------------------------------------------- refresh

  def due(self, step: int) -> tuple[str, ...]:
    """Assets whose refresh runs after train step `step`."""
    return tuple(n for n in self.device_names
                 if self.assets[n].refresh_every and step % self.assets[n].refresh_every == 0)

  def refresh(self, params: Any, step: int) -> tuple[str, ...]:
    """Refreshes the assets due after `step` from `params`; returns their names."""
    names = self.due(step)
    for name in names:
      if name not in self._refresh_fns:
        asset, run = self.assets[name], self.run
        self._refresh_fns[name] = jax.jit(lambda p, v, asset=asset: asset.refresh(p, v, run),
                                          out_shardings=self._shardings[name])
      before = jax.tree.map(lambda x: (x.shape, x.dtype), self.device[name])
      self.device[name] = self._refresh_fns[name](params, self.device[name])
      self._stale.add(name)
      after = jax.tree.map(lambda x: (x.shape, x.dtype), self.device[name])
      if after != before:
        raise ValueError(f"refreshing asset {name!r} changed its shapes/dtypes from {before} to {after}; "
                         "refresh must keep them (pad tables to a fixed capacity) so the step never recompiles")
    return names
