r"""The MLM-GC co-occurrence table (`flax_xalign.data.cooc`) counted by an Apache Beam pipeline.

  python -m flax_xalign.data.cooc_beam --task=NAME --output=DIR [--window=2] [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal] [--shards=16] [--buckets=64] \
      [--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner ...other Beam pipeline options]
  python -m flax_xalign.data.cooc_beam --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR ...

The result is the table `python -m flax_xalign.cooc` writes for the same input:
the same arrays bit for bit and the same manifest but for its `seconds`.

Shape of the pipeline:

1. Shards. A task or mixture becomes (member task, shard i of --shards)
   elements, each read with seqio's `shard_info` (by source files where a
   member has enough of them, else every k-th example: either way the shards
   are disjoint and cover the split). Text files are a Beam text source, cut
   into batches of --lines_per_shard lines.
2. Per shard, `cooc.count_sequences`: the very function the local counter
   runs, giving exact int64 raw counts C[lang, d, a, b] (`cooc.PairCounts`).
3. Merge, `CombinePerKey`. The key is a bucket of the row token a
   (a mod --buckets); the value the shard's counts of those rows, a
   `PairCounts` with sorted keys. Why so: raw counts add exactly, in any order
   and grouping, so any keying merges to the same canonical counts; a key per
   row would send V tiny elements per shard through the shuffle, while a
   bucket sends a few large NumPy arrays and still spreads the merge (and its
   memory) over up to --buckets workers. a mod B rather than ranges of a,
   because ids of a SentencePiece vocabulary are roughly in frequency order:
   ranges would put all the dense rows in bucket 0. The corpus totals (tokens
   per language, sequences, examples, skipped sides) are a separate global sum.
4. One last step gathers the merged buckets, puts the keys back in order and
   runs `cooc.finalize` + `cooc.save_table`, the same code as the local
   command. finalize needs the whole of C at once (X = C + C^T crosses rows,
   c_lang needs every language's token count): it runs on one worker, whose
   memory bounds the table, as the device lookup that reads it does anyway.

Apache Beam lives in an environment of its own (the `beam` extra pins
protobuf < 7, which the project's main environment is past): docs/BEAM.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from flax_xalign.data import cooc
from flax_xalign.errors import ArgumentParser, UserError, run_command

try:
  import apache_beam as beam
except ImportError:  # The main environment: only the command's UserError needs this module then.
  beam = None

INSTALL_HINT = ("python3.11 -m venv .venv-beam && .venv-beam/bin/pip install -e '.[beam]' "
                "(the `beam` extra; its own environment, since Apache Beam needs protobuf < 7: docs/BEAM.md)")
DEFAULT_SHARDS = 16
DEFAULT_BUCKETS = 64
DEFAULT_LINES_PER_SHARD = 100_000
_MAX_BUCKETS = 1 << 16  # Bucket ids sort as uint16 (a linear-time stable sort).
METRICS_NAMESPACE = "cooc_beam"


def require_beam() -> Any:
  """The apache_beam module, or a UserError naming the extra to install."""
  if beam is None:
    raise UserError(f"the Beam co-occurrence pipeline needs Apache Beam, which is not installed in this "
                    f"environment ({sys.executable}); install it with: {INSTALL_HINT}.")
  return beam


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every shard is counted with."""

  languages: tuple[str, ...]
  vocab_size: int
  window: int
  buckets: int = DEFAULT_BUCKETS


@dataclasses.dataclass(frozen=True)
class Totals:
  """Corpus totals of some shards (summed exactly); tokens: int64 [len(languages)]."""

  tokens: np.ndarray
  sequences: int = 0
  examples: int = 0
  skipped: int = 0

  def __add__(self, other: Totals) -> Totals:
    return Totals(tokens=self.tokens + other.tokens, sequences=self.sequences + other.sequences,
                  examples=self.examples + other.examples, skipped=self.skipped + other.skipped)


def sum_totals(parts: Iterable[Totals], *, languages: int) -> Totals:
  """The sum of `parts` (zeros for none): the global combine of the totals."""
  return functools.reduce(Totals.__add__, parts, Totals(tokens=np.zeros(languages, np.int64)))


# ---------------------------------------------------------------- per shard


@dataclasses.dataclass(frozen=True)
class TaskShard:
  """Shard `index` of `count` of one member task's split."""

  member: str
  split: str
  index: int
  count: int


def task_shards(task: str, *, split: str, shards: int) -> list[TaskShard]:
  """The shards of a task or mixture: `shards` per member that has `split` (each member read once)."""
  return [TaskShard(member=member.name, split=split, index=i, count=shards)
          for member in cooc._members(task, split) for i in range(shards)]  # pylint: disable=protected-access


class _ShardOf:
  """A seqio task whose `get_dataset` reads one shard: what `cooc._member_batches` reads from."""

  def __init__(self, task: Any, shard_info: Any):
    self._task, self._shard_info = task, shard_info

  @property
  def name(self) -> str:
    return self._task.name

  def get_dataset(self, *args, **kwargs):
    return self._task.get_dataset(*args, shard_info=self._shard_info, **kwargs)


def task_shard_sequences(shard: TaskShard, settings: Settings, totals: dict[str, int]) -> Iterator[tuple[int, np.ndarray]]:
  """(language index, ids) of every side of the shard's examples; `totals` counts examples and skipped sides.

  The batch handling of `cooc._task_batches`, for one shard of one member.
  """
  import seqio

  from flax_xalign import tasks

  member = _ShardOf(tasks.get_provider(shard.member), seqio.ShardInfo(index=shard.index, num_shards=shard.count))
  for batch in cooc._member_batches(member, split=shard.split, languages=settings.languages,  # pylint: disable=protected-access
                                    vocab_size=settings.vocab_size):
    totals["examples"] += len(batch["lang"])
    for side in ("", "_b"):
      if f"ids{side}" not in batch:
        continue
      ids, lengths, langs = batch[f"ids{side}"], batch[f"lengths{side}"], batch[f"lang{side}"]
      totals["skipped"] += int(((langs < 0) & (lengths > 0)).sum())
      if ids.size and (ids.min() < 0 or ids.max() >= settings.vocab_size):
        raise UserError(f"task {shard.member!r} ({shard.split}) yields token ids outside [0, {settings.vocab_size}); "
                        "its vocabulary is not the one counted with.")
      for lang, flat, row_lengths in cooc._split_by_language(ids, lengths, langs):  # pylint: disable=protected-access
        yield from ((lang, sequence) for sequence in np.split(flat, np.cumsum(row_lengths)[:-1]))


def _counted(sequences: Iterable[tuple[int, np.ndarray]], settings: Settings,
             extra: dict[str, int]) -> tuple[cooc.PairCounts, Totals]:
  counts = cooc.count_sequences(sequences, languages=settings.languages, vocab_size=settings.vocab_size,
                                window=settings.window)
  if beam is not None:
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, "shards").inc()
  totals = Totals(tokens=counts.tokens.copy(), sequences=counts.sequences, examples=extra.get("examples", 0),
                  skipped=extra.get("skipped", 0))
  return counts, totals


def count_task_shard(shard: TaskShard, settings: Settings) -> tuple[cooc.PairCounts, Totals]:
  """Raw counts and totals of one task shard."""
  extra = {"examples": 0, "skipped": 0}
  return _counted(task_shard_sequences(shard, settings, extra), settings, extra)


@functools.lru_cache(maxsize=4)
def sentencepiece_encoder(path: str) -> tuple[Any, int]:
  """(text -> ids, pieces) of a SentencePiece model at a local or Beam filesystem path (gs://, s3://, ...)."""
  import sentencepiece as spm

  if beam is not None and beam.io.filesystems.FileSystems.get_scheme(path) not in (None, "file"):
    with beam.io.filesystems.FileSystems.open(path) as f:
      processor = spm.SentencePieceProcessor(model_proto=f.read())
    return processor.encode, int(processor.get_piece_size())
  encode, size = cooc.encoder_of(path)
  return encode, size


def count_text_shard(lines: Sequence[tuple[int, bytes]], settings: Settings,
                     vocabulary: str) -> tuple[cooc.PairCounts, Totals]:
  """Raw counts of (language index, raw line) pairs: the non-blank lines, stripped, as `cooc.text_sequences`."""
  encode, _ = sentencepiece_encoder(vocabulary)

  def sequences():
    for lang, raw in lines:
      try:
        text = raw.decode("utf-8").strip()
      except UnicodeDecodeError as e:
        raise UserError(f"a line of the text is not valid UTF-8 ({e.reason} at byte {e.start}: "
                        f"{raw[:60]!r}); re-encode the files as UTF-8.") from e
      if text:
        yield lang, np.asarray(encode(text), np.int32)

  return _counted(sequences(), settings, {})


# ---------------------------------------------------------------- merge


def split_rows(counts: cooc.PairCounts, buckets: int) -> Iterator[tuple[int, cooc.PairCounts]]:
  """(bucket, the counts of rows a with a mod buckets == bucket) of every non-empty bucket; keys stay sorted.

  The parts carry no totals (tokens zero, sequences 0): those travel apart.
  """
  size = counts.vocab_size
  rows = (counts.keys // size) % size
  bucket = (rows % buckets).astype(np.uint16)
  order = np.argsort(bucket, kind="stable")  # Stable: each bucket's keys keep their sorted order.
  bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
  zero = np.zeros(len(counts.languages), np.int64)
  for k in np.flatnonzero(np.diff(bounds)):
    take = order[bounds[k]:bounds[k + 1]]
    if beam is not None:
      beam.metrics.Metrics.counter(METRICS_NAMESPACE, "bucket_parts").inc()
    yield int(k), dataclasses.replace(counts, keys=counts.keys[take], counts=counts.counts[take], tokens=zero,
                                      sequences=0)


def merge_counts(parts: Iterable[cooc.PairCounts]) -> cooc.PairCounts:
  """The exact sum of a non-empty collection of counts, merged pairwise as a balanced tree.

  `CombinePerKey`'s function: Beam calls it on partial lists and on its own
  results in any grouping, which is fine because `PairCounts.merge` is exact,
  associative and commutative.
  """
  parts = list(parts)
  if not parts:
    raise ValueError("merge_counts needs at least one part")
  while len(parts) > 1:
    parts = [parts[i].merge(parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
  return parts[0]


def assemble(parts: Iterable[cooc.PairCounts], totals: Totals, settings: Settings) -> cooc.PairCounts:
  """The corpus counts from its merged row buckets (disjoint key sets) and totals: keys back in global order."""
  parts = list(parts)
  keys = np.concatenate([np.zeros(0, np.int64)] + [p.keys for p in parts])
  counts = np.concatenate([np.zeros(0, np.int64)] + [p.counts for p in parts])
  order = np.argsort(keys, kind="stable")
  return cooc.PairCounts(languages=settings.languages, vocab_size=settings.vocab_size, window=settings.window,
                         keys=keys[order], counts=counts[order], tokens=np.asarray(totals.tokens, np.int64),
                         sequences=int(totals.sequences))


def write_table(unused_element: Any, parts: list[cooc.PairCounts], totals: Totals, *, settings: Settings,
                source: dict[str, Any], reference_language: str, drop_diagonal: bool, output: str,
                started: float) -> str:
  """finalize + save_table of the merged counts into `output` (local, or any Beam filesystem); returns a summary."""
  del unused_element
  counts = assemble(parts, totals, settings)
  if "task" in source:
    source = {**source, "examples": int(totals.examples), "skipped_sides": int(totals.skipped)}
  table = cooc.finalize(counts, reference_language=reference_language, drop_diagonal=drop_diagonal, source=source,
                        seconds=time.time() - started, log=print)
  scheme = beam.io.filesystems.FileSystems.get_scheme(output) if beam is not None else None
  if scheme in (None, "file"):
    cooc.save_table(output, table)
  else:  # gs://, s3://, hdfs://: the same bytes, written locally first and copied.
    filesystems = beam.io.filesystems.FileSystems
    with tempfile.TemporaryDirectory() as local:
      cooc.save_table(local, table)
      for name in (cooc.TABLE_FILE, cooc.MANIFEST_FILE):
        with open(os.path.join(local, name), "rb") as src, filesystems.create(filesystems.join(output, name)) as dst:
          dst.write(src.read())
  line = cooc.summary(table)
  print(line)
  return line


# ---------------------------------------------------------------- the pipeline


def build(pipeline: Any, *, settings: Settings, output: str, source: dict[str, Any],
          task_shard_list: Sequence[TaskShard] = (), texts: Sequence[tuple[str, int]] = (), vocabulary: str = "",
          lines_per_shard: int = DEFAULT_LINES_PER_SHARD, reference_language: str = cooc.DEFAULT_REFERENCE_LANGUAGE,
          drop_diagonal: bool = False) -> None:
  """Adds the counting pipeline to `pipeline`: task shards, or text files [(path, language index)]."""
  beam = require_beam()  # pylint: disable=redefined-outer-name
  if task_shard_list:
    shard_counts = (pipeline
                    | "Shards" >> beam.Create(list(task_shard_list))
                    | "Spread" >> beam.Reshuffle()  # Create is one split: let a runner read shards in parallel.
                    | "CountShard" >> beam.Map(count_task_shard, settings))
  else:
    read = [pipeline | f"Read{i}" >> beam.io.ReadFromText(path, delimiter=b"\n", coder=beam.coders.BytesCoder())
            | f"Lang{i}" >> beam.Map(lambda raw, lang=lang: (lang, raw)) for i, (path, lang) in enumerate(texts)]
    shard_counts = (read
                    | "Lines" >> beam.Flatten()
                    | "Batch" >> beam.BatchElements(min_batch_size=lines_per_shard, max_batch_size=lines_per_shard)
                    | "CountShard" >> beam.Map(count_text_shard, settings, vocabulary))
  merged = (shard_counts
            | "Buckets" >> beam.FlatMap(lambda counted: split_rows(counted[0], settings.buckets))
            | "Merge" >> beam.CombinePerKey(merge_counts)
            | "Parts" >> beam.Values())
  totals = (shard_counts
            | "ShardTotals" >> beam.Map(lambda counted: counted[1])
            | "Totals" >> beam.CombineGlobally(functools.partial(sum_totals, languages=len(settings.languages))))
  _ = (pipeline
       | "Once" >> beam.Create([None])
       | "Write" >> beam.Map(write_table, beam.pvalue.AsList(merged), beam.pvalue.AsSingleton(totals),
                             settings=settings, source=source, reference_language=reference_language,
                             drop_diagonal=drop_diagonal, output=output, started=time.time()))


def _text_inputs(specs: Sequence[str]) -> list[tuple[str, str]]:
  """[(path, language code)] of --text FILE:LANG flags; files local or on any Beam filesystem."""
  inputs = []
  for spec in specs:
    path, sep, lang = spec.rpartition(":")
    if not sep or not path or not lang or lang.startswith("//"):
      raise UserError(f"--text {spec!r}: expected FILE:LANG, e.g. --text=corpus.en.txt:en.")
    if not beam.io.filesystems.FileSystems.exists(path):
      raise UserError(f"--text {spec!r}: {path} does not exist.")
    inputs.append((path, lang))
  return inputs


def _path(path: str) -> str:
  """An absolute local path (as the local command records it); remote paths unchanged."""
  if beam is not None and beam.io.filesystems.FileSystems.get_scheme(path) not in (None, "file"):
    return path
  return os.path.abspath(path)


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
  """(our flags, the rest: Beam pipeline options such as --runner, passed through)."""
  parser = ArgumentParser(prog="python -m flax_xalign.data.cooc_beam", allow_abbrev=False,
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--task", help="a registered seqio task or mixture to count")
  parser.add_argument("--text", action="append", default=[], metavar="FILE:LANG",
                      help="a text file (one sentence per line) and its language code; repeatable")
  parser.add_argument("--vocabulary", help="SentencePiece model for --text")
  parser.add_argument("--split", default="train")
  parser.add_argument("--languages", help="comma-separated codes to count (default: the task's)")
  parser.add_argument("--window", type=int, default=cooc.DEFAULT_WINDOW, help="n of the ±n window (the paper: 2)")
  parser.add_argument("--reference_language", default=cooc.DEFAULT_REFERENCE_LANGUAGE)
  parser.add_argument("--drop_diagonal", action="store_true", help="leave out X[a, a]")
  parser.add_argument("--output", help="directory for cooc.npz and cooc.json (local or gs://, s3://, ...)")
  parser.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="shards per member task")
  parser.add_argument("--lines_per_shard", type=int, default=DEFAULT_LINES_PER_SHARD, help="text lines per shard")
  parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS, help="merge keys: row token a mod buckets")
  return parser.parse_known_args(argv)


def _check(args: argparse.Namespace) -> None:
  if bool(args.task) == bool(args.text):
    raise UserError("count either a task (--task=NAME) or text files (--text=FILE:LANG --vocabulary=MODEL).")
  if not args.output:
    raise UserError("--output=DIR is missing: the directory to write cooc.npz and cooc.json into.")
  if args.window < 1:
    raise UserError(f"--window must be an integer >= 1 (n of the ±n window; the paper: 2), got {args.window}.")
  for flag, value, limit in (("--shards", args.shards, None), ("--lines_per_shard", args.lines_per_shard, None),
                             ("--buckets", args.buckets, _MAX_BUCKETS)):
    if value < 1 or (limit is not None and value > limit):
      raise UserError(f"{flag} must be an integer in [1, {limit or 'inf'}], got {value}.")
  if args.text and not args.vocabulary:
    raise UserError("--text needs --vocabulary=MODEL, the SentencePiece model to tokenise it with.")


def run(argv: Sequence[str] | None = None) -> Any:
  """Builds and runs the pipeline of a command line; returns the finished `PipelineResult`."""
  args, beam_args = parse_args(argv)
  _check(args)
  require_beam()
  from apache_beam.options.pipeline_options import PipelineOptions

  options = PipelineOptions(beam_args)
  common = {"output": args.output, "reference_language": args.reference_language,
            "drop_diagonal": args.drop_diagonal}
  if args.task:
    from flax_xalign import tasks

    vocab_size = int(tasks.get_vocabulary(args.task).vocab_size)
    languages = (tuple(sorted({c for c in args.languages.split(",") if c})) if args.languages
                 else tuple(tasks.languages_of(args.task)))
    settings = Settings(languages=languages, vocab_size=vocab_size, window=args.window, buckets=args.buckets)
    cooc.empty_counts(languages=languages, vocab_size=vocab_size, window=args.window)  # UserError for bad settings.
    shards = task_shards(args.task, split=args.split, shards=args.shards)
    source = {"task": args.task, "split": args.split}
    pipeline = beam.Pipeline(options=options)
    build(pipeline, settings=settings, source=source, task_shard_list=shards, **common)
  else:
    inputs = _text_inputs(args.text)
    languages = tuple(sorted({lang for _, lang in inputs}))
    _, vocab_size = sentencepiece_encoder(args.vocabulary)  # UserError for a missing or bad model.
    settings = Settings(languages=languages, vocab_size=vocab_size, window=args.window, buckets=args.buckets)
    source = {"files": [{"path": _path(p), "language": lang} for p, lang in inputs],
              "vocabulary": _path(args.vocabulary)}
    pipeline = beam.Pipeline(options=options)
    build(pipeline, settings=settings, source=source, texts=[(p, languages.index(lang)) for p, lang in inputs],
          vocabulary=args.vocabulary, lines_per_shard=args.lines_per_shard, **common)
  result = pipeline.run()
  result.wait_until_finish()
  print(f"cooc_beam: wrote {args.output.rstrip('/')}/{cooc.TABLE_FILE} and {cooc.MANIFEST_FILE}")
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return run_command(lambda: run(argv))


if __name__ == "__main__":
  # The pipeline's functions must be pickled as `flax_xalign.data.cooc_beam.*`, which workers import, not `__main__.*`.
  import importlib

  sys.exit(importlib.import_module("flax_xalign.data.cooc_beam").main())
