"""The flags `xalign cache` and `xalign cache_beam` share, and the `CacheJob` they describe (the gin edge).

Both commands take every flag of the packed cache's job; the job itself is `training.cache_job`. A command
hands in its own gin-flag parser (`gin_flags`), so this module imports no gin.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.errors import ArgumentParser

DESCRIPTION = ("Writes a task's rows once as a packed dataset (ArrayRecord shards + manifest) to train from "
               "without TensorFlow.")


def flag_parser(prog: str, description: str) -> ArgumentParser:
  from flax_xalign.training.cache_job import PAIR_LAYOUTS

  parser = ArgumentParser(prog=prog, description=description)
  parser.add_argument("--task", help="registered seqio task or mixture (default: the gin run's MIXTURE_OR_TASK_NAME)")
  parser.add_argument("--split", default="train", help="the task's split to write (default train)")
  parser.add_argument("--output", required=True, help="cache folder or bucket URL (gs://...); the split goes to "
                      "OUTPUT/<split>/")
  parser.add_argument("--length", type=int, help="row length, TASK_FEATURE_LENGTHS['tokens'] (default: the gin "
                      "run's, else 512)")
  amount = parser.add_mutually_exclusive_group()
  amount.add_argument("--examples", type=int, help="rows to write from the endless shuffled stream")
  amount.add_argument("--epochs", type=int, help="passes over the split to write (default 1)")
  parser.add_argument("--seed", type=int, help="seed of the written order (default: the gin run's, else 0)")
  parser.add_argument("--languages", help="comma-separated language list (train.languages), default the task's")
  parser.add_argument("--pair_layout", choices=PAIR_LAYOUTS, help="train.pair_layout (default restart)")
  parser.add_argument("--both_directions", action="store_true", default=None, help="train.bitext_both_directions")
  parser.add_argument("--no_pack", action="store_true", help="one example per row (padding) instead of packing")
  parser.add_argument("--links", action=argparse.BooleanOptionalAction, default=None,
                      help="store the tasks' word links (link_groups) with the rows (default: when a task has "
                      "links or the gin run's objectives read them)")
  parser.add_argument("--shard_mb", type=int, default=256, help="shard size in MiB (default 256)")
  parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT/<split>")
  parser.add_argument("--workers", type=int, default=1, help="processes writing in parallel, one seqio shard "
                      "each (default 1: the one-stream order)")
  return parser


def parse_flags(argv: Sequence[str], *, prog: str, description: str,
                gin_flags: Callable[[list[str]], argparse.Namespace]) -> argparse.Namespace:
  """The flags of `xalign cache`; `args.gin`: the gin flags (`gin_flags` of the rest: the command's gin parser),
  or None. Usage errors exit 2 with one line (errors.ArgumentParser)."""
  parser = flag_parser(prog, description)
  args, rest = parser.parse_known_args(argv)
  args.gin = None
  if rest:
    args.gin = gin_flags(rest)  # Unknown flags end here.
    if not args.gin.gin_file and not args.gin.gin_bindings:
      parser.error(f"unrecognized arguments: {' '.join(rest)}")
  elif args.task is None:
    parser.error("--task is required (or --gin_file of a run that sets MIXTURE_OR_TASK_NAME)")
  for name in ("length", "examples", "epochs", "shard_mb", "workers"):
    value = getattr(args, name)
    if value is not None and value < 1:
      parser.error(f"--{name}={value} must be at least 1")
  if args.seed is not None and args.seed < 0:
    parser.error(f"--seed={args.seed} must be >= 0")
  return args


def job_of(args: argparse.Namespace) -> Any:
  """The `training.cache_job.CacheJob` of `parse_flags`'s flags."""
  from flax_xalign.training.cache_job import CacheJob

  # `--languages=` (empty) is the task's own, given on purpose: () keeps a gin run's list from filling it in.
  languages = tuple(l for l in args.languages.split(",") if l) if args.languages is not None else None
  return CacheJob(task=args.task, split=args.split, output=args.output, length=args.length, examples=args.examples,
                  epochs=args.epochs, seed=args.seed, languages=languages, pair_layout=args.pair_layout,
                  both_directions=args.both_directions, pack=not args.no_pack, links=args.links,
                  shard_mb=args.shard_mb, overwrite=args.overwrite, workers=args.workers)
