"""Ahead-of-time compilation of the train step for TPU topologies this machine does not have.

libtpu can describe a TPU slice (`jax.experimental.topologies`) and compile
for its devices on any Linux x86-64 host. `compile_train_step` builds the
trainer's own jitted step (`Trainer.train_step`: same function, in/out
shardings and donation) over a mesh of those devices, lowers it with every
argument abstract (state, batch, RNG key and assets as ShapeDtypeStructs
with their shardings) and compiles it. XLA's memory analysis then says what
one chip holds: arguments (parameters, optimiser state, batch, assets),
outputs (the new state; donated, so aliased to the arguments), temporaries
(activations, gradients) and the program itself.

Assets are sized, not built: a pod-scale co-occurrence table or dictionary
need not exist on this machine for the program that reads it to be
compiled. `AssetSizes` gives their sizes; `abstract_assets` the arrays each
asset's value holds (the asset modules' "Value" tables). Every asset is
replicated by its default logical axes, as in training.

Topology names are libtpu's: `v4:2x2x1` (v4-8: 4 chips), `v4:4x4x4`
(v4-128: 64 chips), `v5e:4x4`, `v5p:2x2x2`. v4 and v5p chips are "megacore":
one JAX device per chip, as on a real v4 or v5p slice.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.training.partitioning import Partitioner
from flax_xalign.training.trainer import LoopConfig, Trainer

GIB = 2**30
LIBTPU_PIP = "pip install -e '.[aot]'   (or: pip install 'libtpu==0.0.42.*')"


@dataclasses.dataclass(frozen=True)
class ChipKind:
  """What the compile check needs to know of a TPU generation.

  Attributes:
    hbm_gib: high-bandwidth memory of one chip.
    megacore: two TensorCores act as one device (libtpu's 'megacore' chip config).
    host_bounds: chips per host (x, y, z); a slice is a grid of hosts.
    dims: dimensions of the topology grid (3 for the 3-D tori, 2 for v5e/v6e).
  """

  hbm_gib: float
  megacore: bool
  host_bounds: tuple[int, ...]
  dims: int


CHIPS: dict[str, ChipKind] = {
    "v4": ChipKind(hbm_gib=32, megacore=True, host_bounds=(2, 2, 1), dims=3),
    "v5p": ChipKind(hbm_gib=95, megacore=True, host_bounds=(2, 2, 1), dims=3),
    "v5e": ChipKind(hbm_gib=16, megacore=False, host_bounds=(2, 2), dims=2),
    "v6e": ChipKind(hbm_gib=32, megacore=False, host_bounds=(2, 2), dims=2),
}


@dataclasses.dataclass(frozen=True)
class Topology:
  """A parsed topology name, e.g. `v4:4x4x4` -> generation v4, grid (4, 4, 4)."""

  name: str
  generation: str
  grid: tuple[int, ...]
  num_slices: int = 1

  @property
  def chip(self) -> ChipKind:
    return CHIPS[self.generation]

  @property
  def chips(self) -> int:
    return math.prod(self.grid) * self.num_slices


def parse_topology(name: str, num_slices: int = 1) -> Topology:
  """`v4:2x2x1` -> Topology; UserError naming the known generations and the grid form."""
  known = ", ".join(f"{g}:{'x'.join(['2'] * CHIPS[g].dims)}" for g in CHIPS)
  match = re.fullmatch(r"(v\d+[a-z]?):(\d+(?:x\d+)*)", name.strip())
  if not match or match.group(1) not in CHIPS:
    raise UserError(f"unknown TPU topology {name!r}: give <generation>:<grid>, one of the generations "
                    f"{', '.join(CHIPS)} (e.g. {known}; v4:2x2x1 is a v4-8 with 4 chips, v4:4x4x4 a v4-128).")
  generation, grid = match.group(1), tuple(int(n) for n in match.group(2).split("x"))
  if len(grid) != CHIPS[generation].dims or min(grid) < 1:
    raise UserError(f"topology {name!r}: a {generation} grid has {CHIPS[generation].dims} positive dimensions "
                    f"(e.g. {generation}:{'x'.join(['2'] * CHIPS[generation].dims)}).")
  if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
    raise UserError(f"--num_slices must be an int >= 1, got {num_slices!r}.")
  return Topology(name=name.strip(), generation=generation, grid=grid, num_slices=num_slices)


def check_libtpu() -> None:
  """UserError with the pip line when libtpu (the TPU compiler) is not installed."""
  if importlib.util.find_spec("libtpu") is None:
    raise UserError(f"compiling for a TPU topology needs libtpu, which is not installed; install it with "
                    f"{LIBTPU_PIP}. It runs on Linux x86-64 without a TPU.")


def quiet_libtpu(topology: Topology) -> None:
  """Tells libtpu what it would otherwise look up in a TPU VM's metadata (and complain about).

  Set before libtpu first initialises; a value already in the environment wins.
  TPU_WORKER_HOSTNAMES has no comma, so `training.distributed.maybe_initialize_distributed`
  would not take this process for a multi-host job.
  """
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", f"{topology.generation}-{8 if topology.chip.megacore else 4}")
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  # Compile-only use: several processes (pytest workers, a CLI run) may load libtpu at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def topology_devices(topology: Topology) -> list[jax.Device]:
  """Compile-only devices of `topology` (one per chip), from libtpu."""
  from jax.experimental import topologies

  check_libtpu()
  quiet_libtpu(topology)
  chip = topology.chip
  kwargs: dict[str, Any] = {"num_slices": topology.num_slices}
  if chip.megacore:
    kwargs["chip_config_name"] = "megacore"
  kwargs["chips_per_host_bounds"] = tuple(min(g, h) for g, h in zip(topology.grid, chip.host_bounds))
  try:
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology.name, **kwargs).devices
  except (RuntimeError, ValueError) as e:  # libtpu's errors: JaxRuntimeError with a multi-line C++ trace.
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"libtpu could not describe the topology {topology.name!r} ({first}); check the grid "
                    f"(a {topology.generation} slice such as {topology.generation}:"
                    f"{'x'.join(['2'] * chip.dims)}).") from None
  if len(devices) != topology.chips:
    raise UserError(f"libtpu describes {topology.name!r} x {topology.num_slices} slice(s) with {len(devices)} "
                    f"devices, not one per chip ({topology.chips}); this libtpu splits chips differently.")
  return list(devices)


# ---------------------------------------------------------------- assets


@dataclasses.dataclass(frozen=True)
class AssetSizes:
  """Sizes of the assets a compile check passes abstractly.

  Attributes:
    dictionary_pairs: entries of a bilingual `dictionary` (MUSE's full en-xx
      dictionaries have 10^5 pairs per language pair).
    cooc_nnz: nonzero entries of the `cooc` table (replicated on every chip,
      8 bytes each; tens of millions for a Wikipedia-scale count with window 2).
    lang_vocab_capacity: ids per side of `lang_vocab` / `induced_dictionary`
      (language-specific pieces of a 250k vocabulary: tens of thousands).
    lang_vocab_pairs: their language pairs (1 for two languages; N - 1 for N
      languages with a pivot): 2 x pairs sides.
  """

  dictionary_pairs: int = 100_000
  cooc_nnz: int = 30_000_000
  lang_vocab_capacity: int = 50_000
  lang_vocab_pairs: int = 1

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"asset size {field.name} must be an int >= 1, got {value!r}.")
    if self.cooc_nnz >= 2**31:
      raise UserError(f"cooc_nnz={self.cooc_nnz:,} does not fit the lookup's int32 offsets (< 2**31).")


def asset_shapes(name: str, *, vocab_size: int, sizes: AssetSizes) -> dict[str, tuple[tuple[int, ...], Any]]:
  """{key: (shape, dtype)} of the value of asset `name` (see each asset module's "Value" table)."""
  i32, f32 = np.dtype(np.int32), np.dtype(np.float32)
  c, p, nnz = sizes.lang_vocab_capacity, sizes.dictionary_pairs, sizes.cooc_nnz
  s = 2 * sizes.lang_vocab_pairs
  tables: dict[str, dict[str, tuple[tuple[int, ...], Any]]] = {
      "dictionary": {"pairs": ((p, 2), i32), "mask": ((p,), np.dtype(bool)), "lang_ids": ((2,), i32)},
      "cooc": {"indptr": ((vocab_size + 1,), i32), "indices": ((nnz,), i32), "log_x": ((nnz,), f32)},
      "lang_vocab": {"ids": ((s, c), i32), "mask": ((s, c), np.dtype(bool)), "counts": ((s, c), i32),
                     "lang_ids": ((s,), i32)},
      "induced_dictionary": {"vocab_ids": ((s, c), i32), "vocab_mask": ((s, c), np.dtype(bool)),
                             "translation": ((s, c), i32), "score": ((s, c), f32), "lang_ids": ((s,), i32)},
      "word_starts": {"table": ((vocab_size,), np.dtype(bool))},
  }
  if name not in tables:
    raise UserError(f"the compile check has no abstract shape for the asset {name!r} (known: "
                    f"{', '.join(sorted(tables))}); add its value's arrays to training/aot.py asset_shapes.")
  return tables[name]


def abstract_assets(names: Sequence[str], *, vocab_size: int, sizes: AssetSizes,
                    partitioner: Partitioner) -> dict[str, dict[str, jax.ShapeDtypeStruct]]:
  """The step's assets argument as ShapeDtypeStructs, replicated (every asset's default logical axes)."""
  out = {}
  for name in sorted(names):
    out[name] = {key: jax.ShapeDtypeStruct(shape, dtype,
                                           sharding=partitioner.logical_sharding((None,) * len(shape), shape))
                 for key, (shape, dtype) in asset_shapes(name, vocab_size=vocab_size, sizes=sizes).items()}
  return out


# ---------------------------------------------------------------- compile


class DoesNotFit(UserError):
  """The TPU compiler refused the program: its buffers exceed a chip's HBM (XLA's message says by how much)."""

  def __init__(self, message: str, *, compile_seconds: float):
    super().__init__(message)
    self.compile_seconds = compile_seconds
    found = re.search(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", message)
    self.required_gib, self.available_gib = (float(found.group(1)), float(found.group(2))) if found else (None, None)


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """What one ahead-of-time compile measured (bytes and FLOPs are per chip unless named otherwise)."""

  topology: str
  chips: int
  mesh: dict[str, int]
  hbm_bytes: int
  memory: dict[str, int]
  params: int
  xla_flops_per_chip: float | None
  lower_seconds: float
  compile_seconds: float

  @property
  def total_bytes(self) -> int:
    """Peak footprint: arguments + outputs - aliased (donated) + temporaries + program."""
    m = self.memory
    return m["argument"] + m["output"] - m["alias"] + m["temp"] + m["generated_code"]

  @property
  def fits(self) -> bool:
    return self.total_bytes <= self.hbm_bytes


def memory_of(compiled: Any) -> dict[str, int]:
  """Per-device bytes by category from XLA's memory analysis."""
  stats = compiled.memory_analysis()
  return {"argument": int(stats.argument_size_in_bytes), "output": int(stats.output_size_in_bytes),
          "temp": int(stats.temp_size_in_bytes), "generated_code": int(stats.generated_code_size_in_bytes),
          "alias": int(stats.alias_size_in_bytes)}


def flops_of(compiled: Any) -> float | None:
  """XLA's FLOP count of one device's program (None when the backend gives none)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # Older JAX: one dict per program.
    cost = cost[0] if cost else None
  return float(cost["flops"]) if cost and "flops" in cost else None


def _set_persistent_cache(enabled: bool) -> None:
  """Turns jax's persistent compilation cache on or off for the next compiles.

  jax decides once per process whether the cache is in use; its (private)
  reset makes it decide again. Without it the flag alone changes nothing.
  """
  jax.config.update("jax_enable_compilation_cache", enabled)
  try:
    from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top

    compilation_cache.reset_cache()
  except (ImportError, AttributeError):  # Another jax: the flag is all we have.
    pass


def compile_train_step(trainer: Trainer, *, topology: str, hbm_bytes: int,
                       log: Callable[[str], None] = lambda line: None) -> tuple[CompileReport, Any]:
  """Lowers and compiles `trainer`'s train step with abstract arguments; returns (report, compiled)."""
  from flax_xalign.models import flops as flops_lib

  log("lowering the train step (abstract state, batch, rng, assets)")
  start = time.perf_counter()
  lowered = trainer.lower_train_step()
  lowered_at = time.perf_counter()
  log(f"compiling for {topology} ({trainer.partitioner.mesh.devices.size} devices, mesh "
      f"{dict(trainer.partitioner.mesh.shape)}); lowering took {lowered_at - start:.1f} s")
  # A topology-only client cannot load cached executables (jax warns on every
  # hit): compile without the persistent cache.
  cache_was_on = jax.config.jax_enable_compilation_cache
  _set_persistent_cache(False)
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    raise DoesNotFit(str(e).strip().splitlines()[0], compile_seconds=time.perf_counter() - lowered_at) from None
  finally:
    _set_persistent_cache(cache_was_on)
  done = time.perf_counter()
  report = CompileReport(
      topology=topology, chips=int(trainer.partitioner.mesh.devices.size),
      mesh={k: int(v) for k, v in trainer.partitioner.mesh.shape.items()}, hbm_bytes=int(hbm_bytes),
      memory=memory_of(compiled), params=int(flops_lib.count_params(trainer.abstract_state.params)),
      xla_flops_per_chip=flops_of(compiled), lower_seconds=lowered_at - start, compile_seconds=done - lowered_at)
  return report, compiled


def aot_trainer(*, model: Any, optimizer: Any, partitioner: Partitioner, batch_size: int, length: int,
                train_steps: int, seed: int, asset_names: Sequence[str], vocab_size: int,
                sizes: AssetSizes) -> Trainer:
  """A Trainer over `partitioner`'s (topology) mesh whose assets are abstract: it compiles, never runs."""
  loop = LoopConfig(train_steps=train_steps, batch_size=batch_size, length=length, seed=seed)
  assets = abstract_assets(asset_names, vocab_size=vocab_size, sizes=sizes, partitioner=partitioner)
  return Trainer(model=model, optimizer=optimizer, partitioner=partitioner, loop=loop, abstract_assets=assets)


def report_lines(report: CompileReport, *, flops_ours: float) -> list[str]:
  """The human table: GiB per chip by category, the verdict, FLOPs ours vs XLA."""
  m = report.memory
  lines = [f"per-chip memory on {report.topology} ({report.chips} chips, mesh {report.mesh}):"]
  for key in ("argument", "output", "alias", "temp", "generated_code"):
    sign = "-" if key == "alias" else " "
    lines.append(f"  {key:<15}{sign}{m[key] / GIB:9.3f} GiB")
  verdict = "FITS" if report.fits else "DOES NOT FIT"
  lines.append(f"  {'total':<15} {report.total_bytes / GIB:9.3f} GiB of {report.hbm_bytes / GIB:.0f} GiB HBM "
               f"-> {verdict}")
  if report.xla_flops_per_chip is not None:
    xla_total = report.xla_flops_per_chip * report.chips
    lines.append(f"FLOPs per step: ours {flops_ours:.4g} (matmuls, models/flops.py), XLA {xla_total:.4g} "
                 f"({report.xla_flops_per_chip:.4g} per chip x {report.chips}); ratio XLA/ours "
                 f"{xla_total / flops_ours:.3f}")
  lines.append(f"parameters {report.params / 1e6:.1f}M; lowering {report.lower_seconds:.1f} s, compile "
               f"{report.compile_seconds:.1f} s")
  return lines


def report_json(report: CompileReport, *, flops_ours: float, extra: Mapping[str, Any] | None = None) -> dict:
  """The machine-readable record (the CLI's last line, docs/results/compile_check.json rows)."""
  gib = {k: round(v / GIB, 4) for k, v in report.memory.items()}
  xla_total = report.xla_flops_per_chip * report.chips if report.xla_flops_per_chip is not None else None
  return {
      **dict(extra or {}),
      "topology": report.topology, "chips": report.chips, "mesh": report.mesh, "params": report.params,
      "gib_per_chip": gib, "total_gib_per_chip": round(report.total_bytes / GIB, 4),
      "hbm_gib_per_chip": round(report.hbm_bytes / GIB, 2), "fits": report.fits,
      "flops_per_step_ours": flops_ours, "flops_per_step_xla": xla_total,
      "lower_seconds": round(report.lower_seconds, 2), "compile_seconds": round(report.compile_seconds, 2),
  }


__all__ = ["AssetSizes", "CHIPS", "CompileReport", "DoesNotFit", "Topology", "abstract_assets", "aot_trainer", "asset_shapes",
           "check_libtpu", "compile_train_step", "parse_topology", "report_json", "report_lines",
           "topology_devices"]
