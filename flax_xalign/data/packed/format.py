"""The packed cache on disk: a manifest, ArrayRecord shards and the vocabulary, checked before use.

    CACHE/                       one folder per split (`xalign cache`)
      train/
        manifest.json            what the rows are and how they were made (`Manifest`)
        vocabulary.model         the tokenizer the rows were made with (or vocabulary.txt)
        shard-00000.array_record one record per row, `group_size:1` (random access)
        ...
      validation/ ...

A record is one model row: the converter's features (`tokens, lang_ids,
segment_ids, positions, pair_side`, + `link_groups` in a cache written with
word links: `Manifest.links`), each `[length]`, in `Manifest.features`
order and each in the narrowest unsigned dtype its values fit (tokens of a
32k vocabulary: uint16), concatenated. `record_dtype` turns a list of
records into a structured NumPy array in one `frombuffer`; `decode` widens
it to the int32 arrays the loop takes.

`open_split` refuses anything that does not read back as written, before a
run touches its MODEL_DIR: a missing manifest or shard, a shard whose size,
record count or sha256 differs from the manifest (truncated, partial,
edited), a manifest of another format version, a record whose byte size is
not the manifest's record dtype's or whose values leave their feature's
bounds. How much it reads is the verification mode (`train.cache_verify`):

  full   sha256 of every shard + the record sample  (reads every byte: 1.2-1.6 s per GB here)
  size   sizes + record counts + the record sample  (reads ~`SAMPLE_RECORDS` records per shard)
  auto   full for a split below `FULL_BELOW_BYTES`, size above (the default)

The sample is `SAMPLE_RECORDS` records per shard at indices drawn from a
seed (`SAMPLE_SEED` and the shard's number), so two starts check the same
records. `decode` checks every record's size again on the read path: a
record of another size is refused, never decoded. Nothing here imports
TensorFlow or seqio: a process that trains from a cache needs neither.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from array_record.python import array_record_module

from flax_xalign import storage
from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.data.vocab.spec import VocabularySpec

FORMAT = "flax_xalign.packed"
VERSION = 1
MANIFEST = "manifest.json"
FEATURES = ("tokens", "lang_ids", "segment_ids", "positions", "pair_side")
# The tasks' word links per subword (`flax_xalign.data.feature_converter`), stored when asked. A group number
# counts linked words of the whole pair (not only those a row keeps), so it is bounded by a pair's words, not by
# the row length: uint16, and a pair with more than 65,535 link groups is refused when written.
LINK_FEATURE = "link_groups"
LINK_BOUND = 1 << 16
SCHEME = "cache:"
# Verification modes (`train.cache_verify`); see the module docstring. Below `FULL_BELOW_BYTES` "auto"
# hashes every shard: sha256_of ran at 0.76-1.32 GB/s on a 2-core host (bench/cache_read.py, docs/data.md), so
# 1 GiB costs about a second, a small part of even the cheapest training start (~7 s of CPU for the tiny model
# from a cache); above it the hash grows with the cache (100 GB: 1-3 min at every start and resume), so "auto"
# checks sizes, record counts and a sample instead (under 0.1 s for 1 GB).
VERIFY_MODES = ("auto", "full", "size")
FULL_BELOW_BYTES = 1 << 30
SAMPLE_RECORDS = 32
SAMPLE_SEED = 0x5EED


def shard_name(index: int) -> str:
  return f"shard-{index:05d}.array_record"


def dtype_for(bound: int) -> str:
  """The narrowest unsigned dtype holding 0 .. bound - 1."""
  for name in ("uint8", "uint16", "uint32"):
    if bound <= np.iinfo(name).max + 1:
      return name
  raise ValueError(f"no unsigned dtype holds values below {bound}")


def feature_bounds(*, vocab_size: int, num_languages: int, length: int) -> dict[str, int]:
  """An exclusive upper bound of each feature's values (what picks its dtype).

  Positions and segment ids never exceed the row length; pair_side is 0, 1 or 2;
  link groups stay below `LINK_BOUND`.
  """
  return {"tokens": vocab_size, "lang_ids": num_languages + 1, "segment_ids": length + 1,
          "positions": length + 1, "pair_side": 3, LINK_FEATURE: LINK_BOUND}


def feature_names(links: bool) -> tuple[str, ...]:
  """The features of a row, in record order: the converter's five, then `link_groups` when `links`."""
  return FEATURES + ((LINK_FEATURE,) if links else ())


@dataclasses.dataclass(frozen=True)
class Shard:
  file: str
  examples: int
  bytes: int
  sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
  """What a cached split holds and how it was made.

  Attributes:
    task: the seqio task or mixture the rows came from.
    split: its split.
    length: the row length (TASK_FEATURE_LENGTHS['tokens']).
    pack: several examples per row (segment ids 1..k) or one.
    pair_layout, both_directions: how translation pairs fill a row.
    languages, language_pairs: the task's languages (id = index + 1) and bitext pairs.
    vocabulary: the vocabulary's manifest record (file, sha256, size, specials).
    task_definitions: how to re-register a user-defined task (None: registered by name).
    features: (name, dtype) of each feature, in record order (`link_groups`
      last when the rows carry the tasks' word links).
    examples: rows in all shards.
    shards: each shard's file, rows, size and sha256.
    seed: the seed the rows were drawn with.
    order: how they were drawn ("shuffled" or "in order") and how many
      (`epochs` passes, or the first `examples` rows of the endless stream).
    writer: the flax_xalign version that wrote it.
  """

  task: str
  split: str
  length: int
  pack: bool
  pair_layout: str
  both_directions: bool
  languages: tuple[str, ...]
  language_pairs: tuple[tuple[str, str], ...]
  vocabulary: VocabularySpec
  task_definitions: tuple[dict[str, Any], ...] | None
  features: tuple[tuple[str, str], ...]
  examples: int
  shards: tuple[Shard, ...]
  seed: int | None
  order: Mapping[str, Any]
  writer: str = ""

  @property
  def bounds(self) -> dict[str, int]:
    """Each feature's exclusive value bound for these rows (`feature_bounds` of the vocabulary, languages, length)."""
    return feature_bounds(vocab_size=self.vocabulary.size, num_languages=len(self.languages), length=self.length)

  @property
  def links(self) -> bool:
    """Whether the rows carry the tasks' word links (`link_groups`, `xalign cache --links`)."""
    return any(name == LINK_FEATURE for name, _ in self.features)

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["vocabulary"]["specials"] = self.vocabulary.specials.as_dict()
    return {"format": FORMAT, "version": VERSION, **json.loads(json.dumps(out))}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], *, where: str) -> "Manifest":
    if data.get("format") != FORMAT:
      raise UserError(f"{where} is not a flax_xalign packed-cache manifest (format {data.get('format')!r}); "
                      "build the cache with `xalign cache`.")
    if data.get("version") != VERSION:
      raise UserError(f"{where} is a packed cache of format version {data.get('version')!r}; this flax_xalign "
                      f"reads version {VERSION}: rebuild it with `xalign cache`.")
    try:
      fields = {k: v for k, v in data.items() if k not in ("format", "version")}
      vocabulary = dict(fields.pop("vocabulary"))
      vocabulary["specials"] = SpecialTokens.from_dict(vocabulary["specials"])
      definitions = fields.pop("task_definitions")
      return cls(**{**fields, "languages": tuple(fields["languages"]),
                    "language_pairs": tuple(tuple(p) for p in fields["language_pairs"]),
                    "features": tuple((str(n), str(d)) for n, d in fields["features"]),
                    "shards": tuple(Shard(**s) for s in fields["shards"]),
                    "vocabulary": VocabularySpec(**vocabulary),
                    "task_definitions": None if definitions is None else tuple(definitions)})
    except (KeyError, TypeError, ValueError) as e:
      raise UserError(f"{where} is not a readable packed-cache manifest ({type(e).__name__}: {e}); rebuild the "
                      "cache with `xalign cache`.") from None


def record_dtype(features: Sequence[tuple[str, str]], length: int) -> np.dtype:
  """The structured dtype of one record: each feature a `[length]` field."""
  return np.dtype([(name, np.dtype(dtype).newbyteorder("<"), (length,)) for name, dtype in features])


def encode(row: Mapping[str, np.ndarray], dtype: np.dtype, bounds: Mapping[str, int]) -> bytes:
  """One row's record; ValueError when a value does not fit its feature's bound."""
  record = np.zeros((), dtype)
  for name in dtype.names:
    values = np.asarray(row[name])
    if values.size and (values.min() < 0 or values.max() >= bounds[name]):
      raise ValueError(f"feature {name!r} holds {int(values.min())}..{int(values.max())}, outside "
                       f"[0, {bounds[name]})")
    record[name] = values
  return record.tobytes()


def check_record_sizes(records: Sequence[bytes], dtype: np.dtype, *, where: str) -> None:
  """UserError (one line) when a record's byte size is not `dtype`'s: its bytes are never decoded."""
  wrong = next((i for i, record in enumerate(records) if len(record) != dtype.itemsize), None)
  if wrong is not None:
    raise UserError(f"a record of {where} holds {len(records[wrong])} bytes, the manifest's layout "
                    f"({', '.join(dtype.names)} of its row length) takes {dtype.itemsize}: the manifest or the "
                    "shards were edited or mixed; rebuild the cache with `xalign cache`.")


def decode(records: Sequence[bytes], dtype: np.dtype, names: Sequence[str] | None = None, *,
           where: str = "the packed cache") -> dict[str, np.ndarray]:
  """Records -> {feature: int32 [len(records), length]} for the features `names` (default all).

  A record whose size is not `dtype.itemsize` is refused (`check_record_sizes`), never decoded: the
  bytes of several records would otherwise be read as rows of shifted fields.
  """
  check_record_sizes(records, dtype, where=where)
  rows = np.frombuffer(b"".join(records), dtype=dtype)
  return {name: rows[name].astype(np.int32) for name in (dtype.names if names is None else names)}


def parse_source(value: str) -> str | None:
  """The cache folder of `train.data="cache:DIR"`; None for "seqio" (the default)."""
  if value in ("seqio", "", None):
    return None
  if not isinstance(value, str) or not value.startswith(SCHEME) or not value[len(SCHEME):]:
    raise UserError(f"train.data={value!r} is not a data source; use \"seqio\" (the task registry, the default) "
                    f"or \"cache:DIR\" (a folder written by `xalign cache --output=DIR`).")
  return os.path.expanduser(value[len(SCHEME):])


def parse_verify(value: Any) -> str:
  """The verification mode of `train.cache_verify` ("auto", "full" or "size"); UserError for another value."""
  if value not in VERIFY_MODES:
    raise UserError(f"train.cache_verify={value!r} is not a verification mode; use 'auto' (the default: sha256 "
                    f"of every shard below {FULL_BELOW_BYTES >> 30} GiB, sizes and a sample of records above), "
                    "'full' (sha256 of every shard) or 'size' (sizes and a sample of records).")
  return value


def verify_mode(verify: str, total_bytes: int) -> str:
  """"full" or "size": what `verify` means for a split of `total_bytes` bytes of shards."""
  verify = parse_verify(verify)
  if verify == "auto":
    return "full" if total_bytes < FULL_BELOW_BYTES else "size"
  return verify


@dataclasses.dataclass(frozen=True)
class PackedSplit:
  """A verified split of a cache: its folder, manifest and shard paths.

  Attributes:
    directory: the local folder the shards are read from.
    manifest: what the split holds.
    origin: the split as the user named it when that is not `directory`: a bucket's split, read from its
      local staged copy (`data.packed.staging`); "" for a local cache.
  """

  directory: str
  manifest: Manifest
  origin: str = ""

  @property
  def location(self) -> str:
    """The split as the user named it (a bucket's URL, or the local folder): what messages name."""
    return self.origin or self.directory

  @property
  def paths(self) -> list[str]:
    return [os.path.join(self.directory, shard.file) for shard in self.manifest.shards]

  @property
  def vocabulary_path(self) -> str:
    return os.path.join(self.directory, self.manifest.vocabulary.file)

  def check_run(self, *, task: str, length: int, pair_layout: str, both_directions: bool,
                pack: bool = True, languages: Sequence[str] | None = None, links: bool = False) -> None:
    """Refuses, in one line, a cache made for another task, row length, pair layout or language set.

    `links`: the run reads `link_groups`, which the rows must carry.
    """
    m = self.manifest
    self.check_links(links)
    wanted = [("task", m.task, task, "MIXTURE_OR_TASK_NAME"),
              ("row length", m.length, int(length), "TASK_FEATURE_LENGTHS"),
              ("pair layout", m.pair_layout, pair_layout, "train.pair_layout"),
              ("both directions", m.both_directions, bool(both_directions), "train.bitext_both_directions"),
              ("packing", m.pack, bool(pack), "pack")]
    if languages is not None:
      wanted.append(("languages", list(m.languages), sorted(set(languages)), "train.languages"))
    for what, cached, run, setting in wanted:
      if cached != run:
        raise UserError(f"the packed cache {self.location} was built with {what} {cached!r}, this run uses "
                        f"{run!r} ({setting}); rebuild it with `xalign cache` for this run's "
                        "settings, or set them to the cache's.")

  def check_links(self, links: bool) -> None:
    """Refuses, in one line, a split without `link_groups` for a run whose objectives read them."""
    m = self.manifest
    if links and not m.links:
      raise UserError(f"this run's objectives learn from given word links (link_groups), and the packed cache "
                      f"{self.location} was written without them; rebuild it with `xalign cache --links "
                      f"--task={m.task} --split={m.split} ...`, or train from seqio (train.data='seqio').")

  def check_batch(self, batch_size: int) -> None:
    if self.manifest.examples < batch_size:
      raise UserError(f"the packed cache {self.location} holds {self.manifest.examples} rows, fewer than one "
                      f"global batch (BATCH_SIZE={batch_size}); rebuild it with more rows (--examples or "
                      "--epochs) or lower BATCH_SIZE.")


def split_dir(root: str, split: str) -> str:
  return os.path.join(root, split)


def has_split(root: str, split: str) -> bool:
  if storage.is_url(root):
    return storage.isfile(storage.join(root, split, MANIFEST))
  return os.path.isfile(os.path.join(split_dir(root, split), MANIFEST))


def open_split(root: str, split: str, *, verify: str = "full") -> PackedSplit:
  """The verified split `split` of the cache at `root` (UserError naming what is wrong and the fix).

  Every shard's size and record count are checked against the manifest,
  and a seeded sample of its records for their size and value bounds; with
  `verify` "full" (or "auto" below `FULL_BELOW_BYTES`) every shard's sha256
  too (a progress line on stderr per GiB hashed, for large caches).

  A URL `root` (gs://...) is staged on this host first and its local copy opened (`staging.open_split`).
  """
  verify = parse_verify(verify)
  if storage.is_url(root):  # ArrayRecord reads local files only: the split is staged on this host's disk first.
    from flax_xalign.data.packed import staging

    return staging.open_split(root, split, verify=verify)
  directory = split_dir(root, split)
  path = os.path.join(directory, MANIFEST)
  if not os.path.isfile(path):
    present = sorted(s for s in os.listdir(root) if has_split(root, s)) if os.path.isdir(root) else []
    where = (f"it holds the split(s) {', '.join(present)}" if present else
             "no packed cache is there" if os.path.isdir(root) else "the folder does not exist")
    raise UserError(f"{path} is missing: {where}; build it with `xalign cache "
                    f"--task=NAME --split={split} --output={root}`.")
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read the packed-cache manifest {path} ({e}); rebuild the cache.") from None
  if not isinstance(data, dict):
    raise UserError(f"{path} holds a {type(data).__name__}, not a packed-cache manifest; rebuild the cache.")
  manifest = Manifest.from_json(data, where=path)
  if manifest.split != split:
    raise UserError(f"{path} describes split {manifest.split!r}, not {split!r}; the folder was moved or "
                    "renamed: rebuild the cache.")
  packed = PackedSplit(directory, manifest)
  if not os.path.isfile(packed.vocabulary_path):
    raise UserError(f"the packed cache's vocabulary {packed.vocabulary_path} is missing; rebuild the cache.")
  if sum(s.examples for s in manifest.shards) != manifest.examples:
    raise UserError(f"{path} lists shards of {sum(s.examples for s in manifest.shards)} rows but "
                    f"{manifest.examples} rows in all; the manifest was edited: rebuild the cache.")
  mode = verify_mode(verify, sum(s.bytes for s in manifest.shards))
  _check_shards(packed, hashed=mode == "full")
  _check_records(packed)
  return packed


def _check_shards(packed: PackedSplit, *, hashed: bool) -> None:
  start, done, reported = time.monotonic(), 0, 0
  total = sum(s.bytes for s in packed.manifest.shards)
  for shard, path in zip(packed.manifest.shards, packed.paths):
    if not os.path.isfile(path):
      raise UserError(f"shard {path} of the packed cache is missing; rebuild the cache (or restore the file).")
    size = os.path.getsize(path)
    if size != shard.bytes:
      raise UserError(f"shard {path} has {size} bytes, the manifest says {shard.bytes} (a partial or damaged "
                      "copy); rebuild the cache (or restore the file).")
    if not hashed:
      continue
    if sha256_of(path) != shard.sha256:
      raise UserError(f"shard {path} does not match its sha256 in the manifest (damaged or edited); rebuild "
                      "the cache (or restore the file).")
    done += size
    if done - reported >= 1 << 30:
      reported = done
      print(f"verifying {packed.directory}: {done / 2**30:.1f}/{total / 2**30:.1f} GiB "
            f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)


def sample_indices(examples: int, shard_index: int, count: int = SAMPLE_RECORDS) -> list[int]:
  """The sorted record indices of shard `shard_index` (of `examples` records) that opening a split checks."""
  rng = np.random.default_rng([SAMPLE_SEED, shard_index])
  if examples <= count:
    return list(range(examples))
  return sorted(int(i) for i in rng.choice(examples, size=count, replace=False))


def _check_records(packed: PackedSplit) -> None:
  """Each shard's record count, and a seeded sample of its records: byte size and each feature's bounds."""
  m = packed.manifest
  dtype = record_dtype(m.features, m.length)
  bounds = m.bounds
  for index, (shard, path) in enumerate(zip(m.shards, packed.paths)):
    try:
      reader = array_record_module.ArrayRecordReader(path, "readahead_buffer_size:0")
      try:
        count = reader.num_records()
        records = reader.read(sample_indices(count, index)) if count == shard.examples else []
      finally:
        reader.close()
    except (RuntimeError, ValueError, OSError) as e:
      raise UserError(f"shard {path} of the packed cache does not read as an ArrayRecord file ("
                      f"{str(e).splitlines()[0][:160]}); rebuild the cache (or restore the file).") from None
    if count != shard.examples:
      raise UserError(f"shard {path} holds {count} records, the manifest says {shard.examples}; rebuild the "
                      "cache (or restore the file).")
    check_record_sizes(records, dtype, where=f"shard {path}")
    rows = np.frombuffer(b"".join(records), dtype=dtype)
    for name in dtype.names:
      values = rows[name]
      if values.size and values.max() >= bounds[name]:
        raise UserError(f"shard {path} holds {name} value {int(values.max())}, outside [0, {bounds[name]}) for "
                        f"the manifest's vocabulary, languages and row length: the manifest and the shards "
                        "disagree; rebuild the cache with `xalign cache`.")


class FileVocabulary:
  """The cached vocabulary file, shaped as the vocabulary asset reads a seqio vocabulary.

  A run from a cache writes this file into MODEL_DIR as its vocabulary, so
  evaluation and export read the exact tokenizer the rows were made with,
  without importing seqio.
  """

  def __init__(self, spec: VocabularySpec, data: bytes):
    self.kind, self.lower_case = spec.kind, spec.lower_case
    self.sp_model = self.model_bytes = data
    self.vocab_size = spec.size

  def __repr__(self) -> str:
    return f"FileVocabulary({self.kind}, {self.vocab_size} ids)"

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids` (SentencePiece: its decoder; WordPiece: pieces joined, `##` glued)."""
    if self.kind == "wordpiece":
      pieces = self.model_bytes.decode("utf-8").splitlines()
      text = " ".join(pieces[i] for i in ids if 0 <= i < len(pieces))
      return text.replace(" ##", "")
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=self.sp_model)
    pieces = processor.get_piece_size()
    return processor.decode([int(i) % pieces for i in ids])  # Doubled vocabularies: ids V.. are copies.


def file_vocabulary(packed: PackedSplit) -> FileVocabulary:
  with open(packed.vocabulary_path, "rb") as f:
    data = f.read()
  if hashlib.sha256(data).hexdigest() != packed.manifest.vocabulary.sha256:
    raise UserError(f"{packed.vocabulary_path} does not match the vocabulary sha256 in the cache's manifest; "
                    "rebuild the cache.")
  return FileVocabulary(packed.manifest.vocabulary, data)
