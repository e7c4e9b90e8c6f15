"""The device mesh, the logical-axis rules and the shardings derived from them.

One mesh with axes ('data', 'model') spans every device; `num_partitions` is
the size of 'model' and 'data' takes the rest. Parameters and activations carry
logical axis names (flax_xalign/models/axes.py); the rules below map those names
to mesh axes in one table. A logical dimension whose size does not divide its
mesh axis is replicated instead (with a note), so odd test sizes and vocabularies
never make a run fail.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from flax_xalign.errors import UserError

DATA_AXIS = "data"
MODEL_AXIS = "model"

# (logical axis, mesh axis or None). Order matters only for duplicate names.
STANDARD_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA_AXIS),
    ("vocab", MODEL_AXIS),
    ("mlp", MODEL_AXIS),
    ("heads", MODEL_AXIS),
    ("kv", None),
    ("embed", None),
    ("length", None),
    ("layers", None),
    ("positions", None),
    ("languages", None),
)


def logical_axis_rules(
    *, fsdp: bool = False, extra: Sequence[tuple[str, str | None]] = ()
) -> tuple[tuple[str, str | None], ...]:
  """The rules table; `fsdp=True` also shards `embed` over 'data' (ZeRO-3 style)."""
  rules = dict(STANDARD_RULES)
  if fsdp:
    rules["embed"] = DATA_AXIS
  rules.update(dict(extra))
  return tuple(rules.items())


def make_mesh(num_partitions: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'model') mesh over `devices` (default: all) with Auto axes."""
  devices = list(jax.devices() if devices is None else devices)
  if num_partitions < 1 or len(devices) % num_partitions:
    raise UserError(
        f"NUM_PARTITIONS={num_partitions} does not divide the {len(devices)} available "
        "devices; set --gin.NUM_PARTITIONS to a divisor of the device count."
    )
  shape = (len(devices) // num_partitions, num_partitions)
  return jax.make_mesh(
      shape, (DATA_AXIS, MODEL_AXIS), axis_types=(AxisType.Auto, AxisType.Auto), devices=devices
  )


@dataclasses.dataclass(frozen=True)
class Partitioner:
  """Mesh plus rules: turns logical annotations into NamedShardings."""

  mesh: Mesh
  rules: tuple[tuple[str, str | None], ...] = STANDARD_RULES

  @property
  def data_size(self) -> int:
    return self.mesh.shape[DATA_AXIS]

  def _fit(self, spec: P, shape: Sequence[int]) -> P:
    """Drops mesh axes that do not divide the dimension they shard."""
    fitted = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
      names = (axes,) if isinstance(axes, str) else tuple(axes or ())
      size = int(np.prod([self.mesh.shape[a] for a in names])) if names else 1
      if names and dim % size:
        logging.info("replicating a dimension of size %d instead of sharding it %d ways", dim, size)
        fitted.append(None)
      else:
        fitted.append(axes)
    return P(*fitted)

  def shardings_for(self, abstract_boxed_tree: Any) -> Any:
    """NamedShardings for a tree whose leaves may be logically boxed.

    Args:
      abstract_boxed_tree: e.g. `jax.eval_shape` of an init function, before
        `nn.meta.unbox`. Unannotated leaves are replicated.

    Returns:
      A tree of NamedSharding matching the unboxed tree.
    """
    logical_specs = nn.get_partition_spec(abstract_boxed_tree)
    mesh_specs = nn.logical_to_mesh(logical_specs, self.rules)
    shapes = nn.meta.unbox(abstract_boxed_tree)
    return jax.tree.map(
        lambda spec, leaf: NamedSharding(self.mesh, self._fit(spec, leaf.shape)),
        mesh_specs,
        shapes,
        is_leaf=lambda x: isinstance(x, P),
    )

  def logical_sharding(self, names: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
    """The sharding of one array with logical axis `names` (None: replicated dimension).

    The assets' shardings: they go through the same rules table as the
    parameters, with the same divisibility fallback.
    """
    spec = nn.logical_to_mesh_axes(tuple(names), self.rules)
    return NamedSharding(self.mesh, self._fit(spec, shape))

  def data_sharding(self, ndim: int = 2) -> NamedSharding:
    """Batch-major arrays: dim 0 over 'data', the rest replicated."""
    return NamedSharding(self.mesh, P(DATA_AXIS, *([None] * (ndim - 1))))

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, P())

  def shard_batch(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Places this host's part of a global batch onto the mesh."""
    return {
        key: jax.make_array_from_process_local_data(self.data_sharding(value.ndim), value)
        for key, value in host_batch.items()
    }

  def check_batch_size(self, global_batch_size: int) -> None:
    if global_batch_size % self.data_size:
      raise UserError(
          f"BATCH_SIZE={global_batch_size} is not divisible by the {self.data_size}-way "
          "'data' mesh axis; choose a multiple of it (or change NUM_PARTITIONS)."
      )
