"""Writing a packed cache split: rows -> ArrayRecord shards + vocabulary + manifest, all or nothing.

The rows come from the seqio pipeline (`flax_xalign.data.pipeline.converted_examples`,
called by `xalign cache`), so the cache holds exactly what the
trainer would have been fed; seqio stays the one registry. The split is
written into a temporary folder next to its target and renamed into place
once every shard is closed and hashed: an interrupted write leaves no
half-cache that could be trained on.

Writers cannot hurt each other or the user: a split is written under its lock
(`split_lock`, `OUTPUT/.<split>.lock`), so a second writer of the same split
is refused in one line while the first goes on; every folder a writer makes
carries its mark (`fileio.write_mark`: the command, its pid and host, the
files it wrote), so only temporaries whose writer is dead are cleaned up, and
`--overwrite` replaces only a split the mark shows `xalign cache` wrote and
that holds nothing else. A Ctrl-C is held while a finished split is renamed
into place (`errors.interrupts_held`): the split is either the old one or the
new one, never neither. While rows are read, a Ctrl-C is taken between rows
(`errors.interrupts_polled`), never inside the iterator's native code, which
swallowed it or crashed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TextIO

from array_record.python import array_record_module

import flax_xalign
from flax_xalign import errors, fileio
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.errors import UserError
from flax_xalign.errors import no_space_error
from flax_xalign.fileio import check_output_folder, write_atomically

SHARD_BYTES = 256 << 20  # ~256 MiB per shard: few files, and several per process on large caches.
COMMAND = "xalign cache"  # The writer a split's mark names (fileio.write_mark).


def split_info(*, task: str, split: str, length: int, pack: bool, pair_layout: str, both_directions: bool,
               languages: Sequence[str], language_pairs: Sequence[Sequence[str]], vocabulary: Any,
               task_definitions: Sequence[Mapping[str, Any]] | None, seed: int | None,
               order: Mapping[str, Any], links: bool = False) -> format_lib.Manifest:
  """What a split's rows are: its manifest before the rows are written (features, no rows or shards yet).

  `links`: the rows carry the tasks' word links (`link_groups`) as a sixth feature.
  """
  bounds = format_lib.feature_bounds(vocab_size=vocabulary.size, num_languages=len(languages), length=int(length))
  features = tuple((name, format_lib.dtype_for(bounds[name])) for name in format_lib.feature_names(links))
  return format_lib.Manifest(
      task=task, split=split, length=int(length), pack=bool(pack), pair_layout=pair_layout,
      both_directions=bool(both_directions), languages=tuple(languages),
      language_pairs=tuple(tuple(p) for p in language_pairs), vocabulary=vocabulary,
      task_definitions=None if task_definitions is None else tuple(task_definitions), features=features,
      examples=0, shards=(), seed=seed, order=dict(order))


def check_output(root: str, split: str, *, overwrite: bool) -> str:
  """The split's folder; refuses an existing one unless `overwrite` and this command wrote it (nothing written)."""
  target = format_lib.split_dir(root, split)
  if os.path.lexists(target) and not overwrite:
    raise UserError(f"{target} already exists; choose another --output, remove it, or add --overwrite to "
                    "replace it.")
  if os.path.exists(root) and not os.path.isdir(root):
    raise UserError(f"--output={root} is a file, not a folder; name a folder for the cache.")
  check_output_folder(root, owned=_is_cache, what="a packed cache (<split>/manifest.json per entry)")
  if os.path.lexists(target):
    if os.path.islink(target) or not os.path.isdir(target):
      raise UserError(f"{target} is not a folder written by {COMMAND}, so --overwrite will not replace it; "
                      "remove it yourself or choose another --output.")
    fileio.check_own_folder(target, COMMAND)
  return target


def _is_cache(root: str) -> bool:
  """Whether every entry of `root` is a split of a packed cache, or a writer's lock or temporary folder."""
  return all(format_lib.has_split(root, name) or _is_writers(root, name) for name in os.listdir(root))


def _is_writers(root: str, name: str) -> bool:
  """Whether `root/name` is a split writer's lock file, a folder one of them marked, or an empty temporary."""
  path = os.path.join(root, name)
  if name.startswith(".") and name.endswith(".lock"):
    return os.path.isfile(path)
  if name.startswith(".") and (".tmp-" in name or ".old-" in name) and os.path.isdir(path) and not os.listdir(path):
    return True
  return name.startswith(".") and (fileio.read_mark(path) or {}).get("command") == COMMAND


@contextlib.contextmanager
def split_lock(output: str, split: str) -> Iterator[None]:
  """Holds the lock of `output`'s split `split` (a second writer of it is refused in one line); re-entrant.

  Writers of different splits of one cache may run side by side.
  """
  with fileio.output_lock(output, name=f".{split}.lock"):
    yield


def layout_of(info: format_lib.Manifest) -> tuple[tuple[tuple[str, str], ...], dict[str, int]]:
  """(features with their dtypes, each feature's value bound) of the rows `info` describes."""
  return info.features, info.bounds


def stage(output: str, split: str) -> str:
  """A fresh temporary folder for `split` next to its target, marked as this writer's (hold `split_lock`).

  Clean up after killed writers first (`clean_up_after_dead_writers`).
  """
  os.makedirs(output, exist_ok=True)
  tmp = os.path.join(output, f".{split}.tmp-{os.getpid()}")
  os.makedirs(tmp)
  fileio.write_mark(tmp, COMMAND)
  return tmp


def clean_up_after_dead_writers(output: str, split: str) -> None:
  """Removes what dead writers of `split` left (their mark says so), holding `split_lock`.

  A writer killed while replacing a split (--overwrite) between its two
  renames left the old split at `.<split>.old-<pid>` and none at `<split>`:
  that one is put back. An empty folder of those names (a writer killed
  before its mark, or at the end of a removal) goes too. Folders without this
  command's mark, or of a writer still running, are left alone.
  """
  target = format_lib.split_dir(output, split)
  for name in sorted(os.listdir(output)):
    path = os.path.join(output, name)
    if not name.startswith((f".{split}.tmp-", f".{split}.old-")) or not os.path.isdir(path):
      continue
    if not os.listdir(path):
      with contextlib.suppress(OSError):
        os.rmdir(path)
    elif not _left_by_dead_writer(path):
      continue
    elif name.startswith(f".{split}.old-") and not os.path.lexists(target) and format_lib.has_split(output, name):
      os.rename(path, target)
    else:
      with errors.interrupts_held(deliver=False):
        fileio.remove_marked_folder(path)


def _left_by_dead_writer(path: str) -> bool:
  """Whether `path` (`.<split>.tmp-<pid>` or `.old-<pid>`) holds this command's mark and its writer <pid> is dead."""
  pid = path.rsplit("-", 1)[-1]
  return ((fileio.read_mark(path) or {}).get("command") == COMMAND and pid.isdigit() and int(pid) != os.getpid()
          and not fileio.pid_is_alive(int(pid)))


def write_rows(rows: Iterable[Mapping[str, Any]], directory: str, info: format_lib.Manifest, *, prefix: str,
               max_rows: int | None = None, shard_bytes: int = SHARD_BYTES,
               progress: Callable[[int], None] | None = None) -> list[tuple[str, int]]:
  """Writes `rows` as shards `<prefix>-<k>.array_record` in `directory`: [(file name, rows)].

  Stops after `max_rows` rows (None: when `rows` ends); `progress(count)`
  is called after every row (keep it cheap).
  """
  features, bounds = layout_of(info)
  dtype = format_lib.record_dtype(features, info.length)
  per_shard = max(1, shard_bytes // dtype.itemsize)
  parts, writer, in_shard, count = [], None, 0, 0
  # A Ctrl-C is taken between rows, never inside the iterator's native code (errors.interrupts_polled).
  with errors.interrupts_polled():
    try:
      for row in rows:
        errors.check_interrupt()
        if max_rows is not None and count >= max_rows:
          break
        if writer is None:
          name = f"{prefix}-{len(parts):05d}.array_record"
          writer = array_record_module.ArrayRecordWriter(os.path.join(directory, name), "group_size:1")
        try:
          writer.write(format_lib.encode(row, dtype, bounds))
        except ValueError as e:
          raise UserError(f"row {count} of {info.task}/{info.split} does not fit the cache's layout ({e}); the "
                          "task's vocabulary or languages disagree with its rows.") from None
        count, in_shard = count + 1, in_shard + 1
        if in_shard == per_shard:
          writer, open_writer = None, writer
          open_writer.close()
          parts.append((name, in_shard))
          in_shard = 0
        if progress is not None:
          progress(count)
    finally:
      if writer is not None:  # Closed here also when the write stops (a Ctrl-C): no native writer outlives it.
        writer.close()
  if in_shard:
    parts.append((name, in_shard))
  return parts


def commit(tmp: str, info: format_lib.Manifest, parts: Sequence[tuple[str, int]], *, target: str,
           vocabulary_bytes: bytes) -> format_lib.Manifest:
  """Names the parts' shards in order, hashes them, writes vocabulary and manifest, renames `tmp` to `target`."""
  count = sum(rows for _, rows in parts)
  if count == 0:
    raise UserError(f"{info.task} gave no {info.split!r} rows of length {info.length}; check the task's files "
                    "for that split.")
  shards = []
  for index, (name, rows) in enumerate(parts):
    path = os.path.join(tmp, format_lib.shard_name(index))
    os.rename(os.path.join(tmp, name), path)
    shards.append(format_lib.Shard(file=format_lib.shard_name(index), examples=rows, bytes=os.path.getsize(path),
                                   sha256=sha256_of(path)))
  if hashlib.sha256(vocabulary_bytes).hexdigest() != info.vocabulary.sha256:
    raise ValueError("the vocabulary bytes do not match the vocabulary record's sha256")
  write_atomically(os.path.join(tmp, info.vocabulary.file), vocabulary_bytes)
  manifest = dataclasses.replace(info, examples=count, shards=tuple(shards),
                                 writer=flax_xalign.__version__)
  write_atomically(os.path.join(tmp, format_lib.MANIFEST), json.dumps(manifest.to_json(), indent=1) + "\n")
  fileio.write_mark(tmp, COMMAND, [*(s.file for s in shards), info.vocabulary.file, format_lib.MANIFEST])
  with errors.interrupts_held():  # (a Ctrl-C here is delivered once the split is in place)
    _move_into_place(tmp, target)
  return manifest


@contextlib.contextmanager
def staged(output: str, split: str, *, overwrite: bool) -> Iterator[tuple[str, str]]:
  """(temporary folder, target) of a split's write, under the split's lock; the folder is removed when it fails.

  A full disk becomes one UserError.
  """
  with split_lock(output, split):
    clean_up_after_dead_writers(output, split)
    target = check_output(output, split, overwrite=overwrite)  # (again: under the lock, a restored split seen)
    tmp = stage(output, split)
    try:
      yield tmp, target
    except BaseException as e:
      with errors.interrupts_held(deliver=False):
        fileio.remove_marked_folder(tmp)
      error = no_space_error(e, tmp) if isinstance(e, OSError) else None
      if error is None:
        raise
      raise error from e


def report(manifest: format_lib.Manifest, target: str, seconds: float, log: TextIO | None = None) -> None:
  print(f"wrote {manifest.examples:,} rows of {manifest.length} tokens ({len(manifest.shards)} shard(s), "
        f"{sum(s.bytes for s in manifest.shards) / 2**20:.1f} MiB) to {target} in {seconds:.0f} s",
        file=log or sys.stdout, flush=True)


def progress_line(count: int, length: int, seconds: float) -> str:
  return (f"  {count:,} rows ({count * length / 1e6:.1f}M tokens) in {seconds:.0f} s, "
          f"{count / max(seconds, 1e-9):,.0f} rows/s")


def write_split(rows: Iterable[Mapping[str, Any]], info: format_lib.Manifest, *, output: str, vocabulary_bytes: bytes,
                max_rows: int | None = None, shard_bytes: int = SHARD_BYTES, overwrite: bool = False,
                log: TextIO | None = None, report_every_s: float = 10.0) -> format_lib.Manifest:
  """Writes `rows` (dicts of int arrays `[length]`) as the split `info.split` of the cache at `output`.

  `info` says what the rows are and which features they carry (`split_info`);
  its row count and shards are filled in here. Stops after `max_rows` rows (None: when `rows`
  ends). Prints a progress line every `report_every_s` seconds. Returns the
  manifest written.
  """
  log = log or sys.stdout
  start = time.monotonic()
  last = [start]

  def progress(count: int) -> None:
    now = time.monotonic()
    if now - last[0] >= report_every_s:
      last[0] = now
      print(progress_line(count, info.length, now - start), file=log, flush=True)

  with staged(output, info.split, overwrite=overwrite) as (tmp, target):
    parts = write_rows(rows, tmp, info, prefix="part", max_rows=max_rows, shard_bytes=shard_bytes,
                       progress=progress)
    manifest = commit(tmp, info, parts, target=target, vocabulary_bytes=vocabulary_bytes)
  report(manifest, target, time.monotonic() - start, log)
  return manifest


def _move_into_place(tmp: str, target: str) -> None:
  """Renames the finished split into place; an old one (--overwrite) is moved aside first, then removed.

  Call with interrupts held: between the renames the split is only at `.<split>.old-<pid>`
  (`clean_up_after_dead_writers` puts it back after a kill).
  """
  old = None
  if os.path.lexists(target):
    old = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.old-{os.getpid()}")
    os.rename(target, old)
  os.rename(tmp, target)
  if old:
    fileio.remove_marked_folder(old)  # (its mark is check_output's proof that this command wrote it)
