r"""The command of the Beam co-occurrence pipeline (the pipeline itself: `flax_xalign.data.cooc.beam`).

  xalign cooc_beam --task=NAME --output=DIR [--window=2] [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal] [--shards=16] [--buckets=64] \
      [--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner ...other Beam pipeline options]
  xalign cooc_beam --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR ...

(`python -m flax_xalign.cli.cooc_beam` is the same command.) Flags it does not
know are Beam pipeline options, passed through. The pipeline's functions are
used from `flax_xalign.data.cooc.beam`, imported by name, so Beam pickles
them under a module its workers can import; it is imported inside the
functions, after the process set-up, since it brings in TensorFlow.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError


def _text_inputs(specs: Sequence[str]) -> list[tuple[str, str]]:
  """[(path, language code)] of --text FILE:LANG flags; files local or on any Beam filesystem."""
  from flax_xalign.data.cooc import beam as cooc_beam
  inputs = []
  for spec in specs:
    path, sep, lang = spec.rpartition(":")
    if not sep or not path or not lang or lang.startswith("//"):
      raise UserError(f"--text {spec!r}: expected FILE:LANG, e.g. --text=corpus.en.txt:en.")
    if not cooc_beam.beam.io.filesystems.FileSystems.exists(path):
      raise UserError(f"--text {spec!r}: {path} does not exist.")
    inputs.append((path, lang))
  return inputs


def _remote(path: str) -> bool:
  """Whether `path` is on a Beam filesystem other than the local one (gs://, s3://, ...); without Beam
  (checked before it is required), any URL but file://."""
  from flax_xalign.data.cooc import beam as cooc_beam
  beam = cooc_beam.beam
  if beam is None:
    return "://" in path and not path.startswith("file://")
  return beam.io.filesystems.FileSystems.get_scheme(path) not in (None, "file")


def _path(path: str) -> str:
  """An absolute local path (as the local command records it); remote paths unchanged."""
  return path if _remote(path) else os.path.abspath(path)


PIPELINE_MODULE = "flax_xalign.data.cooc.beam"
# Flags whose default is the pipeline module's: None when not given, filled in by `_check` (the module brings
# in TensorFlow, so it is imported once the cheap checks have passed).
_PIPELINE_DEFAULTS = {"shards": "DEFAULT_SHARDS", "lines_per_shard": "DEFAULT_LINES_PER_SHARD",
                      "buckets": "DEFAULT_BUCKETS"}


def _pipeline_summary() -> str:
  """The first line of the pipeline module's docstring, read from its source without importing it."""
  import ast
  import importlib.util

  with open(importlib.util.find_spec(PIPELINE_MODULE).origin, encoding="utf-8") as f:
    return (ast.get_docstring(ast.parse(f.read())) or "").split("\n")[0]


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  """(our flags, the rest: Beam pipeline options such as --runner, passed through).

  --shards, --lines_per_shard and --buckets are None when not given (`_check` fills in the defaults).
  """
  from flax_xalign.data import cooc
  parser = ArgumentParser(prog="xalign cooc_beam", allow_abbrev=False,
                          description=_pipeline_summary())
  parser.add_argument("--task", help="a registered seqio task or mixture to count")
  parser.add_argument("--text", action="append", default=[], metavar="FILE:LANG",
                      help="a text file (one sentence per line) and its language code; repeatable")
  parser.add_argument("--vocabulary", help="SentencePiece model for --text")
  parser.add_argument("--split", default="train")
  parser.add_argument("--languages", help="comma-separated codes to count (default: the task's)")
  parser.add_argument("--window", type=int, default=cooc.DEFAULT_WINDOW,
                      help="n of the ±n window (the paper: 2)")
  parser.add_argument("--reference_language", default=cooc.DEFAULT_REFERENCE_LANGUAGE)
  parser.add_argument("--drop_diagonal", action="store_true", help="leave out X[a, a]")
  parser.add_argument("--output", help="directory for cooc.npz and cooc.json (local or gs://, s3://, ...)")
  parser.add_argument("--shards", type=int, default=None, help="shards per member task")
  parser.add_argument("--lines_per_shard", type=int, default=None, help="text lines per shard")
  parser.add_argument("--buckets", type=int, default=None, help="merge keys: row token a mod buckets")
  return parser.parse_known_args(argv)


def _check(args: argparse.Namespace) -> None:
  """UserError for a bad combination or value of the flags; fills in the pipeline's defaults."""
  if bool(args.task) == bool(args.text):
    raise UserError("count either a task (--task=NAME) or text files (--text=FILE:LANG --vocabulary=MODEL).")
  if not args.output:
    raise UserError("--output=DIR is missing: the directory to write cooc.npz and cooc.json into.")
  if args.window < 1:
    raise UserError(f"--window must be an integer >= 1 (n of the ±n window; the paper: 2), got {args.window}.")
  from flax_xalign.data.cooc import beam as cooc_beam
  for name, default in _PIPELINE_DEFAULTS.items():
    if getattr(args, name) is None:
      setattr(args, name, getattr(cooc_beam, default))
  for flag, value, limit in (("--shards", args.shards, None), ("--lines_per_shard", args.lines_per_shard, None),
                             ("--buckets", args.buckets, cooc_beam._MAX_BUCKETS)):
    if value < 1 or (limit is not None and value > limit):
      raise UserError(f"{flag} must be an integer in [1, {limit or 'inf'}], got {value}.")
  if args.text and not args.vocabulary:
    raise UserError("--text needs --vocabulary=MODEL, the SentencePiece model to tokenise it with.")
  _check_local_paths(args)


def _check_local_paths(args: argparse.Namespace) -> None:
  """The local command's checks for a local --output (new, empty or a cooc table's; none of the inputs) and
  for the local inputs, before the pipeline is built; remote paths are left to the Beam filesystem."""
  if _remote(args.output):
    return
  from flax_xalign.cli import cooc as cooc_cli

  local_texts = [spec for spec in args.text if not _remote(spec.rpartition(":")[0])]
  vocabulary = args.vocabulary if args.vocabulary and not _remote(args.vocabulary) else None
  cooc_cli.check_files(argparse.Namespace(output=args.output, text=local_texts, vocabulary=vocabulary))


def _sha256(path: str) -> str:
  """sha256 of a local or Beam-filesystem file's bytes (the vocabulary a table was counted with)."""
  if not _remote(path):
    from flax_xalign.data.sources import wheels

    return wheels.sha256_of(path)
  from flax_xalign.data.cooc import beam as cooc_beam

  with cooc_beam.beam.io.filesystems.FileSystems.open(path) as f:
    return hashlib.sha256(f.read()).hexdigest()


def run(argv: Sequence[str] | None = None) -> Any:
  """Builds and runs the pipeline of a command line; returns the finished `PipelineResult`."""
  args, beam_args = parse_args(argv)
  _check(args)
  from flax_xalign.data import cooc
  from flax_xalign.data.cooc import beam as cooc_beam

  cooc_beam.require_beam()
  from apache_beam.options.pipeline_options import PipelineOptions

  options = PipelineOptions(beam_args)
  shared = {"output": args.output, "reference_language": args.reference_language,
            "drop_diagonal": args.drop_diagonal}
  if args.task:
    from flax_xalign import tasks

    vocab_size = int(tasks.get_vocabulary(args.task).vocab_size)
    languages = (tuple(sorted({c for c in args.languages.split(",") if c})) if args.languages
                 else tuple(tasks.languages_of(args.task)))
    # Workers import flax_xalign.tasks (it registers the tasks) before they read a shard.
    settings = cooc_beam.Settings(languages=languages, vocab_size=vocab_size, window=args.window,
                                  buckets=args.buckets, task_modules=(tasks.__name__,))
    # A UserError for bad settings, before any pipeline is built.
    cooc.empty_counts(languages=languages, vocab_size=vocab_size, window=args.window)
    shards = cooc_beam.task_shards(args.task, split=args.split, shards=args.shards)
    from flax_xalign.data.vocab.fingerprint import model_sha256

    source = {"task": args.task, "split": args.split,
              cooc.VOCABULARY_KEY: model_sha256(tasks.get_vocabulary(args.task))}
    pipeline = cooc_beam.beam.Pipeline(options=options)
    cooc_beam.build(pipeline, settings=settings, source=source, task_shard_list=shards, **shared)
  else:
    inputs = _text_inputs(args.text)
    languages = tuple(sorted({lang for _, lang in inputs}))
    _, vocab_size = cooc_beam.sentencepiece_encoder(args.vocabulary)  # UserError for a missing or bad model.
    settings = cooc_beam.Settings(languages=languages, vocab_size=vocab_size, window=args.window,
                                  buckets=args.buckets)
    source = {"files": [{"path": _path(p), "language": lang} for p, lang in inputs],
              "vocabulary": _path(args.vocabulary), cooc.VOCABULARY_KEY: _sha256(args.vocabulary)}
    pipeline = cooc_beam.beam.Pipeline(options=options)
    cooc_beam.build(pipeline, settings=settings, source=source,
                    texts=[(p, languages.index(lang)) for p, lang in inputs], vocabulary=args.vocabulary,
                    lines_per_shard=args.lines_per_shard, **shared)
  result = pipeline.run()
  result.wait_until_finish()
  print(f"cooc_beam: wrote {args.output.rstrip('/')}/{cooc.TABLE_FILE} and {cooc.MANIFEST_FILE}")
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(lambda flags: flags, run, argv)


if __name__ == "__main__":
  sys.exit(main())
