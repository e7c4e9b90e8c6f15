r"""Builds a GPU bundle: one folder that trains AND scores a grid of experiments on a host without TensorFlow.

  xalign gpu_bundle --grid=science --output=.gpu --debian_data=runs/debian_data
  # then, on the GPU host, from the repository root with .gpu carried:
  bash .gpu/run.sh            # results in $OUT/results.json (+ rsim.png)

Run here, where seqio and TensorFlow are installed; it writes everything the host needs and nothing it can
make itself (grid: `flax_xalign.experiments.gpu.grids`; the build: `flax_xalign.experiments.gpu.builder`):

  start/     the start weights: e5-small trimmed to the grid's text, kept in its source's Q4_0 blocks
             (lossless against what `xalign e5_small` imports), or for --grid=tiny a small MODEL_DIR
  caches/    a packed cache per training setting (`xalign cache`): the Debian help mixture, the Bible
             bitext with eflomal's link groups; each with the validation rows its MLM accuracy reads
  assets/    the assets the host cannot count without seqio (lang_vocab with the pivot, the induced
             dictionaries, the co-occurrence table), built by `xalign assets` for each experiment
  suite/     the evaluation inputs as plain files (`flax_xalign.evaluation.offline.suite`): BLI
             dev/test gold, RSIM/retrieval sentences, MLM rows, the Bible's validation and test gold links
  wheels/    what the host lacks (gin-config, ...), as CPython 3.12 wheels (--wheels=download)
  run.sh, bundle.json (the plan the host runs: every row, the gin files they read, every file with its size)

The bundle must fit what one device call carries: with the checkout, 64 MiB; the bundle's own limit is
--max_mib (default 56). One that would not fit is refused with one line naming its biggest part, and no
bundle.json is written (the host refuses a folder without one). The bundle is assembled in a staging folder
beside --output and replaces it only when whole and within the limit, so a refused, failed or interrupted
build leaves an earlier bundle as it was. Intermediate work (eflomal's links, the tiny start, the assets'
runs) goes to --work (default OUTPUT.work), kept for a rebuild and never carried; the start weights the host
makes go to --host_work (default /tmp/xalign_gpu-KEY, KEY from the output's path: one per bundle). Both are
this command's folders (a mark says so): a folder of someone else's is refused, and work kept there is
reused only when a fingerprint of its inputs says it was made for this build (`experiments.gpu.folders`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flax_xalign.errors import ArgumentParser

DESCRIPTION = __doc__.splitlines()[0]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.experiments.gpu import grids

  parser = ArgumentParser(prog="xalign gpu_bundle", description=DESCRIPTION)
  parser.add_argument("--grid", required=True, choices=sorted(grids.GRIDS), help="the experiment grid")
  parser.add_argument("--output", required=True, help="the bundle folder (e.g. .gpu)")
  parser.add_argument("--debian_data", required=True, help="the `xalign debian_data` output")
  parser.add_argument("--languages", default="", help="Debian languages besides English (default: the grid's "
                      "that the build has)")
  parser.add_argument("--bible_links", default="", help="`xalign eflomal --bible` output (default: made in --work)")
  parser.add_argument("--start_dir", default="", help="--grid=tiny: the MODEL_DIR the grid starts from (default: "
                      "a 4-layer model initialised here, with a vocabulary of the grid's text)")
  parser.add_argument("--work", default="", help="intermediate files (default OUTPUT.work)")
  parser.add_argument("--host_work", default="", help="where run.sh keeps runs on the host (the induced "
                      "dictionaries name their source there; default /tmp/xalign_gpu-KEY, KEY from --output's path)")
  parser.add_argument("--wheels", choices=("download", "none"), default="download",
                      help="download the host's missing wheels (needs the package index) or carry none")
  parser.add_argument("--max_mib", type=_positive_mib, default=56.0, help="the bundle's size limit in MiB (default 56)")
  parser.add_argument("--overwrite", action="store_true", help="replace a bundle this command wrote before")
  return parser.parse_args(argv)


def _positive_mib(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
  if not 0 < value < float("inf"):
    raise argparse.ArgumentTypeError(f"{text!r} is not a size: give a number of MiB above 0")
  return value


def build_options(args: argparse.Namespace):
  """The build the flags ask for (`builder.BuildOptions`)."""
  from flax_xalign.experiments.gpu.builder import BuildOptions

  return BuildOptions(grid=args.grid, output=args.output, debian_data=args.debian_data,
                      languages=tuple(x for x in args.languages.split(",") if x), bible_links=args.bible_links,
                      start_dir=args.start_dir, work=args.work, host_work=args.host_work,
                      wheels=args.wheels == "download", max_mib=args.max_mib, overwrite=args.overwrite)


def register_tasks(gin_file: str) -> None:
  """Registers the tasks `gin_file`'s `train.user_tasks` define (the builder's tasks files)."""
  import copy

  from flax_xalign.cli import gin_cli

  bound = gin_cli.train_bindings(gin_cli.parse_args([f"--gin_file={gin_file}"], description=DESCRIPTION,
                                                    prog="xalign gpu_bundle"))
  for spec in copy.deepcopy(bound.get("user_tasks", ())):  # (the copy resolves gin's references and macros)
    spec.register()


def run(args: argparse.Namespace) -> None:
  from flax_xalign.cli import gin_cli
  from flax_xalign.experiments.gpu import builder

  builder.build(build_options(args), builder.GinEdge(register_tasks=register_tasks, build_assets=gin_cli.build_assets))


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.cli import common
  from flax_xalign.experiments.gpu.builder import INTERRUPTED_EXIT, NestedInterrupt

  try:
    return common.main_of(parse_args, run, argv)
  except NestedInterrupt:  # (the assets build printed the one `interrupted` line; the staging folder is gone)
    return INTERRUPTED_EXIT


if __name__ == "__main__":
  sys.exit(main())
