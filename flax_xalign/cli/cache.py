r"""Writes a task's rows once as a packed dataset (ArrayRecord shards + manifest) to train from without TensorFlow.

  xalign cache --task=bible_grc_en_mlm_tlm --split=train --output=cache/bible \
      --length=512 [--examples=N | --epochs=E] [--seed=0] [--pair_layout=restart]
  xalign cache --task=bible_grc_en_mlm_tlm --split=validation --output=cache/bible --length=512
  python -m flax_xalign.train ... --gin.train.data=\"cache:cache/bible\"
  xalign cache --gin_file=my_run.gin --output=cache/mine   # the run's own task and settings
  xalign cache --gin_file=my_run.gin --output=gs://bucket/cache   # written locally, then uploaded

With gin flags (--gin_file, --gin.NAME=VALUE, --gin_search_paths) the run's
settings fill in what is not given as a flag: the task (MIXTURE_OR_TASK_NAME,
with the tasks its `train.user_tasks` define), the row length, languages, pair
layout and seed, so the cache fits that run.

The rows are the seqio pipeline's own (tokenised, feature-converted, packed),
so seqio stays the one task registry; each split goes to OUTPUT/<split>/.
Training reads OUTPUT/train (and OUTPUT/<eval_split> for evaluation during
training, when built). `--examples N` writes the first N rows of the endless
shuffled stream (a mixture keeps its sampling rates); `--epochs E` (default 1)
writes E passes (a mixture is then read task by task, every row once per pass,
rates aside). README "Packed datasets".

A bucket (`--output=gs://BUCKET/FOLDER`): the split is written into a local
temporary folder as above, then uploaded, its manifest last
(`flax_xalign.data.packed.upload`); runs read it as `cache:gs://BUCKET/FOLDER`,
staged on each host's disk (`flax_xalign.data.packed.staging`).

Word links: the rows also carry `link_groups` (the tasks' given word links,
what DWA / SO with label_source 'links', 'intersection' or 'union' read) with
`--links`, and by default when a task behind the name was given links
(`TsvBitextTask(links=...)`, e.g. eflomal's) or the gin run's objectives read
them; `--no-links` leaves them out. docs/data.md "Packed datasets".
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError

PAIR_LAYOUTS = ("restart", "continuous")  # flax_xalign.data.vocab.specials.PAIR_LAYOUTS, without importing it.


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign cache", description=__doc__.splitlines()[0])
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
  args, rest = parser.parse_known_args(argv)
  args.gin = None
  if rest:
    from flax_xalign.cli import gin_cli

    args.gin = gin_cli.parse_args(rest, description=parser.description, prog=parser.prog)  # Unknown flags end here.
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


def _fill_from_gin(args: argparse.Namespace) -> None:
  """Registers the gin run's user tasks and takes its settings for every flag left unset."""
  import copy

  import gin

  from flax_xalign.cli import configurables
  from flax_xalign.cli import compile_check

  configurables.register()
  compile_check.parse_gin_without_training_macros(args.gin)
  bound = gin.get_bindings("flax_xalign.train", resolve_references=False)

  def setting(name, default=None):
    try:
      return copy.deepcopy(bound[name]) if name in bound else default  # Resolves macros and references.
    except (ValueError, KeyError) as e:
      raise UserError(f"gin configuration error: {str(e).strip().splitlines()[0]}") from None

  for spec in setting("user_tasks", ()):
    spec.register()
  args.task = args.task or setting("mixture_or_task_name")
  if not args.task:
    raise UserError("the gin run sets no MIXTURE_OR_TASK_NAME; pass --task=NAME.")
  args.length = args.length or int(dict(setting("task_feature_lengths", {})).get("tokens", 0)) or None
  args.seed = setting("seed", 0) if args.seed is None else args.seed
  args.pair_layout = args.pair_layout or setting("pair_layout")
  if args.both_directions is None:
    args.both_directions = setting("bitext_both_directions")
  languages = setting("languages")
  if args.languages is None and languages:
    args.languages = ",".join(languages)
  if args.links is None and _objectives_read_links(setting("objectives", {}), setting("monitors", ()),
                                                   setting("objective_options", {})):
    args.links = True


def _objectives_read_links(objectives, monitors, options) -> bool:
  """Whether an objective (or monitor) of the gin run reads the batch feature `link_groups`."""
  from flax_xalign.objectives import base as objectives_lib

  names = [*(objectives or {}), *(n for n in (monitors or ()) if n not in (objectives or {}))]
  built = objectives_lib.build(names, options or {})
  return any("link_groups" in getattr(objective, "batch_features", ()) for objective in built.values())


def task_has_links(definitions) -> bool:
  """Whether a task behind the definitions was given word links (`TsvBitextTask(links=...)`)."""
  return any(d.get("kind") == "TsvBitextTask" and (d.get("args") or {}).get("links") for d in definitions or ())


def run(args: argparse.Namespace) -> None:
  from flax_xalign import fileio
  from flax_xalign import storage

  if storage.is_url(args.output):
    # A bucket: the split is written into a local folder exactly as below, then uploaded (`data.packed.upload`).
    with fileio.interrupts_held():  # (see _import_libraries)
      from flax_xalign.data.packed import upload

    with upload.written_locally(args.output, args.split, overwrite=args.overwrite) as local:  # Checks first.
      _run_local(argparse.Namespace(**{**vars(args), "output": local, "overwrite": False}))
    return
  _run_local(args)


def _run_local(args: argparse.Namespace) -> None:
  from flax_xalign import fileio

  with fileio.interrupts_held():  # (see _import_libraries)
    from flax_xalign.data.packed import write

  write.check_output(args.output, args.split, overwrite=args.overwrite)  # Before TF and the task load.
  data = None
  if not os.path.isdir(args.output):
    # No writer can hold the split's lock in a folder that is not there yet, so nothing is lost by checking
    # the task (and the gin run) first: a bad --task is then refused before any folder is made.
    with fileio.interrupts_held():
      _import_libraries(gin=args.gin is not None)
    with fileio.interrupts_polled():
      data = resolve(args)
  with write.split_lock(args.output, args.split):  # A second writer of the split is refused now, not at its end.
    with fileio.interrupts_held():
      _import_libraries(gin=args.gin is not None)
    # TensorFlow builds and runs the pipeline from here on: a Ctrl-C is taken between its steps, where
    # `_write` and the row loop check for one, never inside its native code (see fileio.interrupts_polled).
    with fileio.interrupts_polled():
      _write(args, data)


def _import_libraries(*, gin: bool) -> None:
  """Imports the native libraries the write needs (TensorFlow, seqio, JAX; ~8 s), to call with Ctrl-C held.

  A Ctrl-C in the middle of one of these imports left a half-initialised
  extension behind, and the process aborted at exit (SIGABRT, a traceback)
  instead of the one-line interrupt; held, it is taken once they are in.
  """
  import flax_xalign.tasks  # noqa: F401  (seqio, TensorFlow)
  from flax_xalign.assets import vocabulary  # noqa: F401  (JAX)
  from flax_xalign.training import seqio_source  # noqa: F401

  if gin:
    from flax_xalign.cli import compile_check, configurables  # noqa: F401


def resolve(args: argparse.Namespace) -> Any:
  """The task's seqio source, its split checked; fills gin's settings and the defaults into `args`."""
  from flax_xalign.training.seqio_source import SeqioSource

  if args.gin is not None:
    _fill_from_gin(args)
  args.length, args.seed = args.length or 512, args.seed or 0
  args.pair_layout, args.both_directions = args.pair_layout or "restart", bool(args.both_directions)
  data = SeqioSource.resolve(args.task, languages=_languages(args))  # A cache holds the seqio pipeline's rows.
  if not data.has_split(args.split):
    raise UserError(f"task {args.task!r} has no {args.split!r} split (or a task of the mixture lacks it); "
                    "name one it has with --split.")
  return data


def _languages(args: argparse.Namespace) -> list[str] | None:
  return [l for l in args.languages.split(",") if l] if args.languages else None


def plan(args: argparse.Namespace, data: Any, *, workers: int, how: str = "",
         parts: str | None = None) -> tuple[Any, dict[str, Any]]:
  """(the split's manifest before its rows, the spec `cache_workers` writes shard i of) of `resolve`d `args`.

  `workers` seqio shards (1: the one-process stream); `how` and `parts` go into the progress line.
  """
  from flax_xalign.cli import cache_workers
  from flax_xalign.data.packed import write

  train = args.split == "train"
  epochs = None if args.examples else (args.epochs or 1)
  if data.is_mixture and epochs is not None and train:
    print(f"note: --epochs reads each task of mixture {args.task} once per pass (its sampling rates apply only to "
          "the endless stream); --examples=N writes N rows sampled at the mixture's rates", flush=True)
  order = ({"shuffled": train, "examples": args.examples} if args.examples else
           {"shuffled": train, "epochs": epochs})
  if workers > 1:
    order["workers"] = workers  # `xalign cache --workers=N` and `cache_beam --num_shards=N` write the same rows.
  links = task_has_links(data.definitions) if args.links is None else args.links
  info = write.split_info(
      task=args.task, split=args.split, length=args.length, pack=not args.no_pack, pair_layout=args.pair_layout,
      both_directions=args.both_directions, languages=data.languages, language_pairs=data.language_pairs,
      vocabulary=data.vocabulary_spec, task_definitions=data.definitions, seed=args.seed, order=order, links=links)
  print(f"caching {args.task}/{args.split}{how}: rows of {args.length} tokens, languages {list(data.languages)}, "
        + (f"{args.examples:,} rows" if args.examples else f"{epochs} epoch(s)")
        + (", with word links (link_groups)" if links else "")
        + (f", {parts}" if parts else ""), flush=True)
  spec = dict(task=args.task, definitions=data.definitions, languages=_languages(args), split=args.split,
              length=args.length, seed=args.seed, shuffle=train, pack=not args.no_pack, epochs=epochs,
              pair_layout=args.pair_layout, both_directions=args.both_directions, links=links, workers=workers,
              max_rows=cache_workers.split_rows(args.examples, workers), shard_bytes=args.shard_mb << 20,
              info=info)
  return info, spec


def _write(args: argparse.Namespace, data: Any = None) -> None:
  """Writes the split of `args` (`data`: its `resolve`d source, None: resolved here, holding the lock)."""
  from flax_xalign import fileio
  from flax_xalign.assets import vocabulary as vocabulary_asset
  from flax_xalign.cli import cache_workers
  from flax_xalign.data.packed import write

  data = resolve(args) if data is None else data
  fileio.check_interrupt()
  info, spec = plan(args, data, workers=args.workers,
                    parts=f"{args.workers} workers" if args.workers > 1 else None)
  vocabulary_bytes = vocabulary_asset.model_bytes(data.vocabulary)
  if args.workers == 1:
    rows = cache_workers.shard_rows(data, spec, 0)
    fileio.check_interrupt()
    write.write_split(rows, info, output=args.output,
                      vocabulary_bytes=vocabulary_bytes, max_rows=args.examples, shard_bytes=spec["shard_bytes"],
                      overwrite=args.overwrite)
    return
  start = time.monotonic()
  with write.staged(args.output, args.split, overwrite=args.overwrite) as (tmp, target):
    parts = cache_workers.write_parallel({**spec, "tmp": tmp})
    manifest = write.commit(tmp, info, parts, target=target, vocabulary_bytes=vocabulary_bytes)
  write.report(manifest, target, time.monotonic() - start)


def _ignore_ctrl_c() -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: Sequence[str] | None = None) -> int:
  code = common.main_of(parse_args, run, argv)
  # The work is over (the split is in place, or refused, or interrupted). The interpreter's teardown takes
  # seconds (TensorFlow's and JAX's objects) after it has given SIGINT its default action back: a Ctrl-C then
  # killed the process silently (status -2) after a complete write. Ignored from the exit handlers on (the
  # last registered runs first; a caller in-process keeps its own handler), the exit status stays the truth.
  atexit.unregister(_ignore_ctrl_c)
  atexit.register(_ignore_ctrl_c)
  return code


if __name__ == "__main__":
  sys.exit(main())
