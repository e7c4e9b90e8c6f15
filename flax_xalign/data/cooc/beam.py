r"""The MLM-GC co-occurrence table (`flax_xalign.data.cooc`) counted by an Apache Beam pipeline.

  xalign cooc_beam --task=NAME --output=DIR [--window=2] [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal] [--shards=16] [--buckets=64] \
      [--runner=DirectRunner|DataflowRunner|FlinkRunner|SparkRunner ...other Beam pipeline options]
  xalign cooc_beam --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR ...

The result is the table `xalign cooc` writes for the same input:
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


import dataclasses
import functools
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from flax_xalign.data import cooc
from flax_xalign.data import pipeline
from flax_xalign.errors import UserError

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
  # Modules a worker imports before it looks a task up by name: they register
  # the tasks with seqio (seqio's `--module_import`). The caller names them
  # (the command: flax_xalign.tasks), so this module never imports the tasks.
  task_modules: tuple[str, ...] = ()


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


def _registered(name: str, modules: Sequence[str]) -> Any:
  """The seqio task or mixture `name`, after importing the `modules` that register it."""
  import seqio

  for module in modules:
    importlib.import_module(module)
  return seqio.get_mixture_or_task(name)


def task_shards(task: str, *, split: str, shards: int, task_modules: Sequence[str] = ()) -> list[TaskShard]:
  """The shards of a registered task or mixture: `shards` per member that has `split` (each member read once)."""
  members = [t for t in pipeline.tasks_of(_registered(task, task_modules)) if split in t.splits]
  if not members:
    raise UserError(f"no task of {task!r} has a split {split!r}; count a split it has (--split).")
  return [TaskShard(member=member.name, split=split, index=i, count=shards) for member in members
          for i in range(shards)]


class _ShardOf:
  """A seqio task whose `get_dataset` reads one shard: what `cooc.member_batches` reads from."""

  def __init__(self, task: Any, shard_info: Any):
    self._task, self._shard_info = task, shard_info

  @property
  def name(self) -> str:
    return self._task.name

  def get_dataset(self, *args, **kwargs):
    return self._task.get_dataset(*args, shard_info=self._shard_info, **kwargs)


def task_shard_sequences(shard: TaskShard, settings: Settings, totals: dict[str, int]) -> Iterator[tuple[int, np.ndarray]]:
  """(language index, ids) of every side of the shard's examples; `totals` counts examples and skipped sides.

  The batch handling of `cooc.batches_of_members`, for one shard of one member.
  """
  import seqio

  member = _ShardOf(_registered(shard.member, settings.task_modules),
                    seqio.ShardInfo(index=shard.index, num_shards=shard.count))
  for batch in cooc.member_batches(member, split=shard.split, languages=settings.languages,
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
      for lang, flat, row_lengths in cooc.split_by_language(ids, lengths, langs):
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

