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
import json
import sys
from typing import Any, Sequence

from flax_xalign.cli import common
from flax_xalign.cli._process import setup_process
from flax_xalign.errors import UserError, path_problem, report


class _Parser(argparse.ArgumentParser):
  def error(self, message: str):  # One `error:` line (exit 2), not argparse's usage block.
    raise UserError(f"{message}; see xalign compile_check --help")


def _parser() -> argparse.ArgumentParser:
  """Our own flags. The asset sizes default to None, read as `aot.AssetSizes()`'s defaults after parsing
  (`aot_check.asset_sizes`), so that a usage error answers before JAX and TensorFlow load."""
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
  from flax_xalign.interop import e5_small
  from flax_xalign.training import aot, aot_check

  topology = aot.parse_topology(own.topology, own.num_slices)
  aot.check_libtpu()
  sizes = aot_check.asset_sizes(dictionary_pairs=own.dictionary_pairs, cooc_nnz=own.cooc_nnz,
                                lang_vocab_capacity=own.lang_vocab_capacity, lang_vocab_pairs=own.lang_vocab_pairs)
  args = gin_cli.parse_args(rest, description=__doc__.splitlines()[0])
  configurables.register()
  with gin.unlock_config():  # An earlier command in this process locked the config; new names need it open.
    try:
      gin.external_configurable(e5_small.xlmr_vocabulary, name="xlmr_vocabulary", module="flax_xalign")
    except ValueError:
      pass  # Registered by an earlier call in this process.
  kw = aot_check.train_kwargs(gin_cli.train_bindings(args), own.objectives)
  return aot_check.check(kw, topology=topology, sizes=sizes, hbm_gib=own.hbm_gib, output=own.output)


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
