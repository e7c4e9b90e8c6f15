"""The tail every command shares: process set-up, parse the flags, run, one exit status.

    def main(argv=None) -> int:
      return common.main_of(parse_args, run, argv)

Bad input (a UserError from parsing or running) becomes one `error: ...` line
on stderr and exit status 2 (`errors.run_command`); argparse's own errors exit
with 2 from `errors.ArgumentParser`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign import errors
from flax_xalign import storage
from flax_xalign.cli._process import setup_process

# The run directory's flag: one spelling in every argparse command (gin commands bind MODEL_DIR);
# `--checkpoint`, the older spelling of align, bli, retrieval, export_hf and trim, is still accepted.
MODEL_DIR_FLAG, OLD_MODEL_DIR_FLAG = "--model_dir", "--checkpoint"


def argv_of(argv: Sequence[str] | None) -> list[str]:
  """The command line's flags: `argv`, or the process's own when None."""
  return list(sys.argv[1:] if argv is None else argv)


def main_of(parse: Callable[[list[str]], Any], work: Callable[[Any], Any], argv: Sequence[str] | None) -> int:
  """Exit status of a command: set the process up, `args = parse(argv)`, then `work(args)`."""
  setup_process()
  flags = argv_of(argv)
  return errors.run_command(lambda: work(parse(flags)))


def run_driver(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
  """The exit status of a driver (demo, the experiment drivers) that runs `main(argv)` in this process.

  A SIGTERM (a scheduler's, `timeout`'s) stops it as Ctrl-C does: within a training step the trainer saves
  after the step (its own handler), elsewhere it raises there; either way one line and 143 (130 for
  Ctrl-C), and the rows already scored are kept (each driver records a row as soon as it has it).
  """
  status = [0]
  with errors.sigterm_raises():
    code = errors.run_command(lambda: status.__setitem__(0, main(argv)))
  return code or status[0]


def add_model_dir_flag(parser: argparse.ArgumentParser, *, help: str, required: bool = True,  # noqa: A002
                       default: str | None = None) -> None:
  """`--model_dir` (alias `--checkpoint`), read as `args.model_dir`."""
  parser.add_argument(MODEL_DIR_FLAG, OLD_MODEL_DIR_FLAG, dest="model_dir", metavar="MODEL_DIR",
                      required=required, default=default, help=f"{help} (also accepted as {OLD_MODEL_DIR_FLAG})")


def existing_model_dir(path: str) -> str:
  """`path`, or a UserError when it does not exist or is not a directory (before anything reads a run there)."""
  storage.check_run_store(path, setting=MODEL_DIR_FLAG)  # (a URL: its bucket exists and Orbax can reach it)
  if not storage.isdir(path):
    what = "is not a directory" if storage.exists(path) else "does not exist"
    raise errors.UserError(f"{MODEL_DIR_FLAG} {path} {what}; pass a MODEL_DIR written by "
                           "python -m flax_xalign.train or an import.")
  return path


def run_own_entries() -> tuple[str, ...]:
  """The names directly in a MODEL_DIR that belong to the run: what its writers put there.

  Derived from the code that writes them, so a new entry cannot be forgotten:
  every `RunDir` property naming an entry of the folder (checkpoints/,
  config.gin, metrics.jsonl, tensorboard/, eval.json, .lock, origin.json,
  NOTICE, ...), every built-in asset's files (`assets.registry.prepared_files`:
  vocabulary.model or .txt, dictionary.tsv, induced_dictionary.tsv, cooc.npz
  and cooc.json, ...), an import's model.gin and a step's assets/ item name.
  """
  from flax_xalign import run_dir as run_dir_lib
  from flax_xalign.assets import registry as asset_registry
  from flax_xalign.models.config import MODEL_GIN_FILE

  probe = run_dir_lib.RunDir(os.path.join(os.sep, "run"))
  names = set()
  for attribute in vars(run_dir_lib.RunDir).values():
    if isinstance(attribute, property):
      value = attribute.fget(probe)
      if isinstance(value, str) and os.path.dirname(value) == probe.path:
        names.add(os.path.basename(value))
  names.update(asset_registry.prepared_files())
  names.update((MODEL_GIN_FILE, run_dir_lib.STEP_ASSETS))
  return tuple(sorted(names))


def check_outside_run(path: str | os.PathLike | None, run: str | os.PathLike | None, *, setting: str = "--output",
                      run_setting: str = "--model_dir") -> None:
  """Refuses (UserError) an output that is or lies in one of the own files or folders of the run the command reads.

  A run's checkpoints, config.gin, metrics, eval.json, lock, origin, notice
  and asset files (vocabulary.model, dictionary.tsv, ...: `run_own_entries`)
  are the run's: `--output=MODEL_DIR/config.gin` would replace the run's
  settings, `--output=MODEL_DIR/vocabulary.model` its tokenizer,
  `--output=MODEL_DIR/checkpoints/9` would add a step to it. A new file or
  folder beside them (`MODEL_DIR/links.txt`) is fine. Checked whether or not
  the entry exists yet (an eval.json written by another command would be
  taken for the run's).
  """
  from flax_xalign import fileio

  if path is None or run is None or not os.fspath(path).strip():
    return
  if storage.is_url(path) != storage.is_url(run) or not storage.isdir(run):
    return  # (One in a bucket, the other on disk: the output cannot be one of the run's files.)
  folder = storage.absolute(run) if storage.is_url(run) else os.fspath(run)
  for entry in run_own_entries():
    if fileio.lies_in(storage.absolute(path), storage.join(folder, entry)):
      raise errors.UserError(f"{setting} {os.fspath(path)} is {entry} of the run {run_setting} {os.fspath(run)} reads "
                      "(or lies in it); writing there would change that run: name a path outside the run's "
                      f"own files, e.g. {os.path.join(os.fspath(run), 'out', os.path.basename(os.fspath(path)))}.")
