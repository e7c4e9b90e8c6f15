"""The device mesh, the logical-axis rules and the shardings derived from them.

One mesh with axes ('data', 'model') spans every device; `num_partitions` is
the size of 'model' and 'data' takes the rest. Parameters and activations carry
logical axis names (flax_xalign/models/axes.py); the rules below map those names
to mesh axes in one table.

A dimension whose size does not divide the mesh axes its rule names cannot be
sharded over them. A small array is replicated instead (a warning, once per
case), so odd test sizes keep working; an array that would then hold more than
`replicate_limit_bytes` on every device is refused with a UserError naming it
and the fix. A silent fallback there would put e.g. XLM-R's 250,002 x 1024
embedding and its two Adam moments on every chip of a pod; t5x's pjit refuses
such shapes outright, and models there pad the vocabulary to a multiple of the
'model' axis (`EncoderConfig.vocab_pad_multiple`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from flax_xalign.errors import UserError
from flax_xalign.models import axes as axes_lib

DATA_AXIS = "data"
MODEL_AXIS = "model"
# Above this many bytes per device, an array that its rule wants sharded is
# not silently replicated (`Partitioner.replicate_limit_bytes`).
DEFAULT_REPLICATE_LIMIT_BYTES = 64 * 2**20
# TPU lanes are 128 wide: a vocabulary padded to a multiple of 128 (and of the
# 'model' axis) keeps the logits matmul and the sharded table aligned.
_LANE = 128
_shown_fallbacks: set[tuple[Any, ...]] = set()
_log = logging.getLogger(__name__)


class Fallback(NamedTuple):
  """One dimension that its rule wants sharded but whose size the mesh axes do not divide."""

  name: str  # the array: a parameter path ("params/token_embed/embedding") or an asset key
  shape: tuple[int, ...]
  dim: int  # which dimension of `shape`
  logical: str | None  # its logical axis name, when known ("vocab")
  mesh_axes: tuple[str, ...]
  ways: int  # the product of those mesh axes' sizes
  bytes_per_device: int  # of the array once that dimension is replicated

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


def path_name(path: Sequence[Any]) -> str:
  """A jax.tree_util key path as "params/token_embed/embedding"."""
  parts = []
  for key in path:
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        parts.append(str(getattr(key, attr)))
        break
    else:
      parts.append(str(key))
  return "/".join(parts) or "the array"


def _format_bytes(n: int) -> str:
  for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
    if n >= size:
      return f"{n / size:.1f} {unit}"
  return f"{n} B"


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
  """Mesh plus rules: turns logical annotations into NamedShardings.

  Attributes:
    mesh: the ('data', 'model') device mesh.
    rules: logical axis name -> mesh axis (None: replicated).
    replicate_limit_bytes: the most bytes per device an array may hold when a
      dimension its rule wants sharded is replicated because the mesh axis
      does not divide it; a bigger one is a UserError (see the module
      docstring). 0 refuses every such fallback.
  """

  mesh: Mesh
  rules: tuple[tuple[str, str | None], ...] = STANDARD_RULES
  replicate_limit_bytes: int = DEFAULT_REPLICATE_LIMIT_BYTES

  @property
  def data_size(self) -> int:
    return self.mesh.shape[DATA_AXIS]

  def _fit(self, spec: P, shape: Sequence[int], *, name: str = "an array", itemsize: int = 4,
           logical: Sequence[str | None] = ()) -> tuple[P, list[Fallback]]:
    """Drops mesh axes that do not divide the dimension they shard; returns the spec and what was dropped."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    logical = tuple(logical) + (None,) * (len(shape) - len(logical))
    fitted, dropped = [], []
    for index, (dim, axes) in enumerate(zip(shape, entries)):
      names = (axes,) if isinstance(axes, str) else tuple(axes or ())
      ways = math.prod(self.mesh.shape[a] for a in names)
      if names and dim % ways:
        fitted.append(None)
        dropped.append((index, names, ways))
      else:
        fitted.append(axes)
    if not dropped:
      return P(*fitted), []
    kept_ways = math.prod(self.mesh.shape[a] for entry in fitted if entry is not None
                          for a in ((entry,) if isinstance(entry, str) else entry))
    per_device = math.prod(shape) * itemsize // kept_ways
    return P(*fitted), [Fallback(name, tuple(int(d) for d in shape), index, logical[index], names, ways, per_device)
                        for index, names, ways in dropped]

  def _check(self, fallbacks: Sequence[Fallback]) -> None:
    """Raises for fallbacks above the limit; logs each distinct smaller one once."""
    too_big = [f for f in fallbacks if f.bytes_per_device > self.replicate_limit_bytes]
    if too_big:
      raise UserError(self._refusal(too_big))
    for f in fallbacks:
      key = (f.shape, f.dim, f.logical, f.mesh_axes, f.ways)
      if key not in _shown_fallbacks:
        _shown_fallbacks.add(key)
        _log.warning("%s %s: dimension %d (%s, size %d) is not divisible by the %d-way mesh axis %s; "
                        "replicating it (%s per device)", f.name, f.shape, f.dim, f.logical or "unnamed",
                        f.shape[f.dim], f.ways, "/".join(f.mesh_axes), _format_bytes(f.bytes_per_device))

  def _refusal(self, too_big: Sequence[Fallback]) -> str:
    lines = [(f"{len(too_big)} array(s) cannot be sharded as the partitioning rules ask, and replicating "
              f"them would put more than {_format_bytes(self.replicate_limit_bytes)} on every device:")]
    for f in too_big[:8]:
      lines.append(f"  {f.name} {f.shape}: dimension {f.dim} ({f.logical or 'unnamed'}, size {f.shape[f.dim]}) "
                   f"is not divisible by the {f.ways}-way mesh axis {'/'.join(f.mesh_axes)} "
                   f"({_format_bytes(f.bytes_per_device)} per device if replicated)")
    if len(too_big) > 8:
      lines.append(f"  ... and {len(too_big) - 8} more")
    lines.append("Fix:")
    if any(f.logical == axes_lib.VOCAB for f in too_big):
      ways = math.lcm(*(f.ways for f in too_big if f.logical == axes_lib.VOCAB))
      lines.append(f"  * pad the vocabulary: --gin.EncoderConfig.vocab_pad_multiple={math.lcm(ways, _LANE)} "
                   f"(any multiple of {ways}; the padded rows are never predicted);")
    devices = self.mesh.devices.size
    for f in too_big:
      if MODEL_AXIS in f.mesh_axes:
        fits = [n for n in range(1, devices + 1) if devices % n == 0 and f.shape[f.dim] % n == 0]
        lines.append(f"  * or choose a NUM_PARTITIONS that divides {f.shape[f.dim]} and the {devices} devices: "
                     f"{', '.join(map(str, fits))} (now {self.mesh.shape[MODEL_AXIS]});")
        break
    if any(DATA_AXIS in f.mesh_axes for f in too_big):
      lines.append("  * or run without fsdp (the 'embed' -> 'data' rule), or on a device count whose "
                   "'data' axis divides the dimension;")
    lines.append(f"  * or accept the replication: raise --gin.train.replicate_limit_bytes "
                 f"(now {self.replicate_limit_bytes}).")
    return "\n".join(lines)

  def shardings_for(self, abstract_boxed_tree: Any) -> Any:
    """NamedShardings for a tree whose leaves may be logically boxed.

    Args:
      abstract_boxed_tree: e.g. `jax.eval_shape` of an init function, before
        `nn.meta.unbox`. Unannotated leaves are replicated.

    Returns:
      A tree of NamedSharding matching the unboxed tree.

    Raises:
      UserError: an array above `replicate_limit_bytes` that its rule wants
        sharded over a mesh axis that does not divide it (all of them named).
    """
    logical_specs = nn.get_partition_spec(abstract_boxed_tree)
    mesh_specs = nn.logical_to_mesh(logical_specs, self.rules)
    shapes = nn.meta.unbox(abstract_boxed_tree)
    fallbacks: list[Fallback] = []

    def fit(path: Any, spec: P, logical: P, leaf: Any) -> NamedSharding:
      itemsize = np.dtype(leaf.dtype).itemsize if hasattr(leaf, "dtype") else 4
      fitted, dropped = self._fit(spec, np.shape(leaf), name=path_name(path), itemsize=itemsize,
                                  logical=tuple(logical))
      fallbacks.extend(dropped)
      return NamedSharding(self.mesh, fitted)

    shardings = jax.tree_util.tree_map_with_path(fit, mesh_specs, logical_specs, shapes,
                                                 is_leaf=lambda x: isinstance(x, P))
    self._check(fallbacks)
    return shardings

  def logical_sharding(self, names: Sequence[str | None], shape: Sequence[int], *, name: str = "an asset array",
                       dtype: Any = np.float32) -> NamedSharding:
    """The sharding of one array with logical axis `names` (None: replicated dimension).

    The assets' shardings: they go through the same rules table as the
    parameters, with the same divisibility fallback and limit; `name` and
    `dtype` (for its size) say which array a refusal is about.
    """
    spec = nn.logical_to_mesh_axes(tuple(names), self.rules)
    fitted, dropped = self._fit(spec, shape, name=name, itemsize=np.dtype(dtype).itemsize, logical=tuple(names))
    self._check(dropped)
    return NamedSharding(self.mesh, fitted)

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
