"""The compile check of `xalign compile_check`: a configured run's train step compiled for a TPU topology.

The run is resolved as training does (`pretrain.assemble`: MODEL_DIR is
neither needed nor touched) from its `train.*` settings (`train_kwargs`, of
the bindings the command reads from gin); the trainer's jitted step is then
compiled for the devices of the topology with libtpu (`aot`), the assets
abstract at `aot.AssetSizes`. `check` prints the progress and the report and
returns the JSON record (written to `output` too, when given); a step that
does not fit is a record with `fits` false, not an error.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from flax_xalign.errors import UserError

# pretrain() arguments that only a training run reads.
NOT_NEEDED = ("model_dir", "checkpoint", "write_config", "step_callback", "assets_only")
REQUIRED = ("mixture_or_task_name", "task_feature_lengths", "batch_size", "train_steps", "encoder", "objectives")


def train_kwargs(bound: Mapping[str, Any], objectives: str = "") -> dict[str, Any]:
  """The TrainConfig fields as the run's `train.*` bindings (`bound`, unresolved) set them (defaults for the rest).

  `objectives`: a comma list that replaces the run's objectives (weight 1.0 each), or "".
  """
  from flax_xalign.training import config as train_config

  kwargs = train_config.defaults()
  for name, value in bound.items():
    if name in NOT_NEEDED:
      continue  # `%gin.REQUIRED` in runs/pretrain.gin; the check has no MODEL_DIR.
    try:
      kwargs[name] = copy.deepcopy(value)  # Resolves macros and evaluates references, as a call would.
    except (ValueError, KeyError) as e:
      if name == "init_from_checkpoint":
        kwargs[name] = None  # Warm starts change values, not the program.
        continue
      raise UserError(f"gin configuration error: {str(e).strip().splitlines()[0]}") from None
  if objectives:
    names = [n.strip() for n in objectives.split(",") if n.strip()]
    if not names:
      raise UserError(f"--objectives={objectives!r} names no objective; e.g. --objectives=mlm,tlm,dwa")
    kwargs["objectives"] = {n: 1.0 for n in names}
    kwargs["objective_options"] = {k: v for k, v in dict(kwargs.get("objective_options") or {}).items()
                                   if k in names}
  for name in REQUIRED:
    if name not in kwargs:
      raise UserError(f"the gin configuration does not set train.{name}; include gin_configs/runs/pretrain.gin "
                      "and a model size (e.g. gin_configs/models/base.gin).")
  return kwargs


def asset_sizes(**given: int | None) -> Any:
  """The `aot.AssetSizes` of the sizes given (None: the dataclass's default)."""
  from flax_xalign.training import aot

  return aot.AssetSizes(**{name: value for name, value in given.items() if value is not None})


def log(line: str) -> None:
  print(f"[compile_check] {line}", flush=True)


def check(kw: Mapping[str, Any], *, topology: Any, sizes: Any, hbm_gib: float | None = None,
          output: str = "") -> dict[str, Any]:
  """Compiles the run `kw` (`train_kwargs`) for `topology` (`aot.parse_topology`); returns the JSON record.

  `hbm_gib` overrides the chip's HBM; `output`: also write the record there (atomically).
  """
  from flax_xalign.training import aot
  from flax_xalign.training import pretrain as pretrain_lib

  log(f"resolving {kw['mixture_or_task_name']} and objectives {dict(kw['objectives'])}")
  # The check has no MODEL_DIR (assemble never reads it).
  assembly = pretrain_lib.assemble(pretrain_lib.TrainConfig(**{"model_dir": "", **kw}))
  model, run = assembly.model, assembly.run
  log(f"{topology.chips} {topology.generation} chips ({topology.name} x {topology.num_slices} slice(s)): "
      "describing the devices with libtpu")
  devices = aot.topology_devices(topology)
  partitioner = pretrain_lib.make_partitioner(num_partitions=kw["num_partitions"], fsdp=kw["fsdp"],
                                              axis_rules=kw["axis_rules"], devices=devices)
  asset_names = sorted(model.requires())
  shapes = {name: {k: shape for k, (shape, _) in aot.asset_shapes(name, vocab_size=run.vocabulary.size,
                                                                   sizes=sizes).items()}
            for name in asset_names}
  log("building abstract assets: " + (", ".join(f"{name} {value}" for name, value in shapes.items()) or "none"))
  trainer = aot.aot_trainer(model=model, optimizer=kw["optimizer"], partitioner=partitioner,
                            batch_size=kw["batch_size"], length=assembly.length, train_steps=kw["train_steps"],
                            seed=kw["seed"], asset_names=asset_names, vocab_size=run.vocabulary.size, sizes=sizes)
  hbm = int((hbm_gib if hbm_gib else topology.chip.hbm_gib) * aot.GIB)
  flops_ours = pretrain_lib.train_flops(assembly, batch_size=kw["batch_size"])
  settings = _settings(kw, assembly, topology, shapes)
  try:
    report, _ = aot.compile_train_step(trainer, topology=topology.name, hbm_bytes=hbm, log=log)
  except aot.DoesNotFit as e:
    print(f"DOES NOT FIT: the TPU compiler refused the step on {topology.name}: {e}", flush=True)
    record = {**settings, "topology": topology.name, "chips": topology.chips, "fits": False,
              "compiler_error": str(e), "required_temp_gib": e.required_gib, "available_gib": e.available_gib,
              "hbm_gib_per_chip": hbm / aot.GIB, "flops_per_step_ours": flops_ours,
              "compile_seconds": round(e.compile_seconds, 2)}
    write_record(output, record)
    return record
  for line in aot.report_lines(report, flops_ours=flops_ours):
    print(line, flush=True)
  record = aot.report_json(report, flops_ours=flops_ours, extra=settings)
  write_record(output, record)
  return record


def _settings(kw: Mapping[str, Any], assembly: Any, topology: Any, shapes: Mapping[str, Any]) -> dict[str, Any]:
  """The run's settings the record carries besides the compiler's report."""
  encoder = assembly.encoder
  return {
      "num_slices": topology.num_slices, "vocab_size": encoder.vocab_size,
      "padded_vocab_size": getattr(encoder, "padded_vocab_size", encoder.vocab_size),
      "layers": encoder.num_layers, "embed_dim": encoder.embed_dim, "objectives": sorted(kw["objectives"]),
      "batch_size": kw["batch_size"], "length": assembly.length, "num_partitions": kw["num_partitions"],
      "fsdp": bool(kw["fsdp"]), "remat_policy": encoder.remat_policy, "scan_layers": encoder.scan_layers,
      "dtype": encoder.dtype, "assets": {n: {k: list(v) for k, v in value.items()} for n, value in shapes.items()}}


def write_record(output: str, record: Mapping[str, Any]) -> None:
  """Writes the record as JSON to `output` (nothing when it is "")."""
  if output:
    from flax_xalign.fileio import write_atomically

    write_atomically(output, json.dumps(record, indent=1) + "\n")
