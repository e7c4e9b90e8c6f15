"""A packed cache in a bucket, read from a verified copy on this host's disk (ArrayRecord reads local files only).

    packed = format.open_split("gs://bucket/cache", "train")   # stages the split here, then opens the copy
    python -m flax_xalign.train ... --gin.train.data="cache:gs://bucket/cache"

Where: `$FLAX_XALIGN_CACHE_STAGING/<key>/<split>/`, by default
`~/.cache/flax_xalign/staged/<key>/<split>/`, `<key>` the first 16 hex digits of
the sha256 of the cache's URL. A folder under ~/.cache rather than the temp dir:
it outlives a reboot and a cleaned /tmp, so a rerun or a resume finds its copy.
The copy takes the split's size on that disk (checked before anything is fetched).

What: every shard of the split, on every host. A host does not read a subset
of the shards: the global batches are a seeded permutation of all the rows
(`read.PackedBatches`), and each host takes its rows of every batch, which lie
in every shard. Fetching fewer would need another order, and the batches, the
losses and the saved data position would no longer be those of the local cache.

Verified: each shard's size and sha256 against the manifest, hashed as soon as
it is downloaded (from the page cache); one that does not match is refused in
one line naming the shard in the bucket, and its partial copy is deleted. The
manifest is read from the bucket at every start; a shard already staged is
reused without a download or a hash when the staging record (`.staged.json`)
holds that manifest's sha256 for it with the size and mtime the file has now,
and the version (GCS generation) its object in the bucket still has (one
listing of the split per start). Any other copy (the cache rebuilt, a shard
replaced in the bucket, a copy edited or truncated, a download cut off) is
fetched again. After staging the local copy is opened as a local cache is, with
`verify` "full" hashing every shard again and "auto"/"size" checking sizes,
record counts and a sample (the hashes were checked when the shards arrived).

The saved data position (`data_iterator_cache/`) names the rows by their
shards' hashes, not by a folder, so a run resumes alike from the bucket, the
staged copy or a local cache of the same rows.

Processes of one host (a multi-process run) stage one after another under an
`flock` on the split's staging folder (a local folder: flock does not reach a
bucket): the first downloads, the others find its verified copy. A shard is
downloaded to `<file>.part-<pid>-<thread>` and renamed into place once verified, so a
killed process never leaves a shard that looks complete.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator

from flax_xalign import fileio
from flax_xalign import storage
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.errors import NO_SPACE_ERRNOS, UserError, path_error

STAGING_ENV = "FLAX_XALIGN_CACHE_STAGING"
DEFAULT_ROOT = os.path.join("~", ".cache", "flax_xalign", "staged")
RECORD = ".staged.json"  # {file: {sha256, bytes, mtime_ns, object}} of the shards verified in this folder.
LOCK = ".staging.lock"
THREADS = 4  # Shards downloaded at once: one stream seldom fills a host's link to the store.


def staging_root() -> str:
  """The local folder under which caches in buckets are staged: $FLAX_XALIGN_CACHE_STAGING or the default."""
  value = os.environ.get(STAGING_ENV, "").strip()
  if value and storage.is_url(value):
    raise UserError(f"{STAGING_ENV}={value!r} is a URL; it names the local folder a cache in a bucket is copied "
                    f"to (ArrayRecord reads local files): give a local folder, or unset it for {DEFAULT_ROOT}.")
  return storage.absolute(value or DEFAULT_ROOT)


def staging_folder(url: str) -> str:
  """The local folder that holds the staged splits of the cache at `url`."""
  key = hashlib.sha256(storage.absolute(url).encode("utf-8")).hexdigest()[:16]
  return os.path.join(staging_root(), key)


def open_split(url: str, split: str, *, verify: str = "auto") -> format_lib.PackedSplit:
  """The split `split` of the cache at `url`, staged on this host and verified (UserError naming the problem)."""
  verify = format_lib.parse_verify(verify)
  storage.check_store(url, setting="train.data")
  source = storage.join(storage.absolute(url), split)
  manifest_bytes, manifest = _read_manifest(url, split)
  local = os.path.join(staging_folder(url), split)
  fileio.makedirs(local, setting=STAGING_ENV)
  with _held(local), _client_tracebacks_dropped():
    stage_split(source, local, manifest, manifest_bytes)
  packed = format_lib.open_split(os.path.dirname(local), split, verify="full" if verify == "full" else "size")
  return format_lib.PackedSplit(packed.directory, packed.manifest, origin=source)


def _read_manifest(url: str, split: str) -> tuple[bytes, format_lib.Manifest]:
  root = storage.absolute(url)
  path = storage.join(root, split, format_lib.MANIFEST)
  try:
    data = storage.read_bytes(path)
  except FileNotFoundError:
    present = [s for s in storage.listdir(root) if format_lib.has_split(root, s)]
    where = f"it holds the split(s) {', '.join(present)}" if present else "no packed cache is there"
    raise UserError(f"{path} is missing: {where}; build it with `xalign cache --task=NAME --split={split} "
                    f"--output={root}`.") from None
  except Exception as e:  # noqa: BLE001  (the store's client: HTTP, credentials, network; many classes)
    raise _download_error(f"the manifest {path}", e) from None
  try:
    parsed = json.loads(data.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise UserError(f"cannot read the packed-cache manifest {path} ({e}); rebuild the cache.") from None
  if not isinstance(parsed, dict):
    raise UserError(f"{path} holds a {type(parsed).__name__}, not a packed-cache manifest; rebuild the cache.")
  manifest = format_lib.Manifest.from_json(parsed, where=path)
  if manifest.split != split:
    raise UserError(f"{path} describes split {manifest.split!r}, not {split!r}; the objects were moved or "
                    "renamed: rebuild the cache.")
  return data, manifest


@contextlib.contextmanager
def _held(folder: str) -> Iterator[None]:
  """The staging lock of `folder` (one stager per folder on this host); waits for another process's staging."""
  path = os.path.join(folder, LOCK)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise path_error(e, path, setting=STAGING_ENV, doing="write") from None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      print(f"waiting for another process of this host that is staging {folder}", file=sys.stderr, flush=True)
      fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # (releases the flock)


class _DropTracebacks(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return not record.exc_info


@contextlib.contextmanager
def _client_tracebacks_dropped() -> Iterator[None]:
  """gcsfs logs a traceback for a request it gives up on (403, 416, ...); staging reports that error in one line."""
  logger, quiet = logging.getLogger("gcsfs"), _DropTracebacks()
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


def stage_split(source: str, local: str, manifest: format_lib.Manifest, manifest_bytes: bytes) -> dict[str, int]:
  """Makes `local` a verified copy of the split at `source` (URL); hold `_held(local)`.

  Returns {"fetched": shards downloaded, "reused": shards already staged, "bytes": bytes downloaded}.
  """
  objects = _list_objects(source)
  wanted = {s.file for s in manifest.shards}
  record = {name: entry for name, entry in _read_record(local).items() if name in wanted}
  todo = [s for s in manifest.shards if not _is_staged(local, s, record, objects)]
  vocabulary = os.path.join(local, manifest.vocabulary.file)
  manifest_path = os.path.join(local, format_lib.MANIFEST)
  stats = {"fetched": len(todo), "reused": len(manifest.shards) - len(todo), "bytes": sum(s.bytes for s in todo)}
  if not todo and _has_bytes(manifest_path, manifest_bytes) and _hash_is(vocabulary, manifest.vocabulary.sha256):
    print(f"{source}: the staged copy in {local} is reused ({len(manifest.shards)} shard(s), verified when "
          "staged)", file=sys.stderr, flush=True)
    return stats
  with contextlib.suppress(FileNotFoundError):  # Until every shard is in, the folder is no split to read.
    os.unlink(manifest_path)
  _remove_leftovers(local, manifest)
  _check_objects(source, manifest, todo, objects)
  _check_room(local, stats["bytes"])
  start = time.monotonic()
  print(f"staging {source} into {local}: {len(todo)} shard(s), {stats['bytes'] / 2**20:,.1f} MiB to fetch, "
        f"{stats['reused']} already staged", file=sys.stderr, flush=True)
  _fetch_shards(source, local, todo, record, objects)
  if not _hash_is(vocabulary, manifest.vocabulary.sha256):
    vocabulary_url = storage.join(source, manifest.vocabulary.file)
    _fetch(vocabulary_url, vocabulary, size=objects[manifest.vocabulary.file][0],
           sha256=manifest.vocabulary.sha256, what=f"the vocabulary {vocabulary_url}")
  fileio.write_atomically(manifest_path, manifest_bytes)  # Last: a folder with a manifest is a complete copy.
  seconds = time.monotonic() - start
  print(f"staged {source}: {stats['bytes'] / 2**20:,.1f} MiB in {seconds:.1f} s "
        f"({stats['bytes'] / max(seconds, 1e-9) / 1e6:,.0f} MB/s)", file=sys.stderr, flush=True)
  return stats


def _read_record(local: str) -> dict:
  try:
    with open(os.path.join(local, RECORD), encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  return record.get("shards", {}) if isinstance(record, dict) and isinstance(record.get("shards"), dict) else {}


def _write_record(local: str, source: str, record: dict) -> None:
  fileio.write_atomically(os.path.join(local, RECORD),
                          json.dumps({"source": source, "shards": record}, indent=1, sort_keys=True) + "\n")


def _list_objects(source: str) -> dict[str, tuple[int, str]]:
  """{name: (size, version)} of the objects of the split at `source`, in one listing.

  The version is the object's generation (GCS; its etag elsewhere): a shard replaced in the bucket, even by
  bytes of the same size, has another one, so its staged copy is not taken for it.
  """
  fs, inner = storage.filesystem(source)
  try:
    entries = fs.ls(inner, detail=True, refresh=True)
  except FileNotFoundError:
    return {}
  except Exception as e:  # noqa: BLE001  (the store's client: HTTP, credentials, network; many classes)
    raise _download_error(f"the list of objects of {source}", e) from None
  return {os.path.basename(e["name"].rstrip("/")): (int(e.get("size") or 0),
                                                    str(e.get("generation") or e.get("etag") or ""))
          for e in entries}


def _is_staged(local: str, shard: format_lib.Shard, record: dict, objects: dict[str, tuple[int, str]]) -> bool:
  """Whether `local` holds `shard` as verified: its record names the manifest's hash, the file's size and mtime,
  and the version the object in the bucket still has."""
  try:
    stat = os.stat(os.path.join(local, shard.file))
  except OSError:
    return False
  entry = record.get(shard.file) or {}
  return (entry.get("sha256") == shard.sha256 and entry.get("bytes") == shard.bytes == stat.st_size
          and entry.get("mtime_ns") == stat.st_mtime_ns and shard.file in objects
          and entry.get("object") == objects[shard.file][1])


def _has_bytes(path: str, data: bytes) -> bool:
  try:
    with open(path, "rb") as f:
      return f.read() == data
  except OSError:
    return False


def _hash_is(path: str, sha256: str) -> bool:
  try:
    return sha256_of(path) == sha256
  except OSError:
    return False


def _remove_leftovers(local: str, manifest: format_lib.Manifest) -> None:
  """Deletes partial downloads (their process is gone: we hold the lock) and shards of an older cache."""
  wanted = {s.file for s in manifest.shards}
  for name in os.listdir(local):
    old_shard = name.startswith("shard-") and name.endswith(".array_record") and name not in wanted
    if ".part-" in name or old_shard:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(local, name))


def _check_objects(source: str, manifest: format_lib.Manifest, todo: list[format_lib.Shard],
                   objects: dict[str, tuple[int, str]]) -> None:
  """Refuses, before any download, a shard or vocabulary missing from the bucket or of another size."""
  sizes = {name: size for name, (size, _) in objects.items()}
  if manifest.vocabulary.file not in sizes:
    raise UserError(f"the packed cache's vocabulary {storage.join(source, manifest.vocabulary.file)} is missing; "
                    "rebuild the cache with `xalign cache --overwrite`.")
  for shard in todo:
    url = storage.join(source, shard.file)
    if shard.file not in sizes:
      raise UserError(f"shard {url} of the packed cache is missing; rebuild the cache with `xalign cache "
                      "--overwrite` (or restore the object).")
    if sizes[shard.file] != shard.bytes:
      raise UserError(f"shard {url} has {sizes[shard.file]} bytes, the manifest says {shard.bytes} (a partial or "
                      "damaged upload); rebuild the cache with `xalign cache --overwrite` (or restore the object).")


def _check_room(local: str, needed: int) -> None:
  free = shutil.disk_usage(local).free
  if needed > free:
    raise UserError(f"staging the packed cache needs {needed / 2**30:.2f} GiB in {local}, which has "
                    f"{free / 2**30:.2f} GiB free; free space there, or set {STAGING_ENV} to a folder with room.")


def _fetch_shards(source: str, local: str, todo: list[format_lib.Shard], record: dict,
                  objects: dict[str, tuple[int, str]]) -> None:
  """Downloads `todo` a few at a time, each verified and renamed into place, the record updated as each lands."""
  if not todo:
    _write_record(local, source, record)
    return
  stop = threading.Event()  # Set when one fails or a Ctrl-C comes: the shards not yet begun are skipped.

  def one(shard: format_lib.Shard) -> format_lib.Shard:
    _fetch(storage.join(source, shard.file), os.path.join(local, shard.file), size=shard.bytes,
           sha256=shard.sha256, what=f"shard {storage.join(source, shard.file)}", stop=stop)
    return shard

  pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(THREADS, len(todo)),
                                               thread_name_prefix="cache-staging")
  try:
    futures = [pool.submit(one, shard) for shard in todo]
    for future in concurrent.futures.as_completed(futures):
      shard = future.result()
      stat = os.stat(os.path.join(local, shard.file))
      record[shard.file] = {"sha256": shard.sha256, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                            "object": objects[shard.file][1]}
      _write_record(local, source, record)  # After each shard: a cut-off staging keeps what it verified.
  except BaseException:
    stop.set()
    raise
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


class _Stopped(Exception):
  pass


def _fetch(url: str, path: str, *, size: int, sha256: str, what: str, stop: threading.Event | None = None) -> None:
  """Downloads `url` to `path` through `<path>.part-...` and hashes the copy; UserError when it is not the
  manifest's `size` bytes of `sha256`.

  The copy is hashed right after its download, from the page cache: gcsfs's whole-object download
  (`get_file`) and the hash took 1.15 s for 500 MB here, reading it in chunks and hashing each as it came
  1.5-2.6 s (more requests, each a round trip).
  """
  if stop is not None and stop.is_set():
    raise _Stopped()
  part = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
  fs, inner = storage.filesystem(url)
  try:
    try:
      fs.get_file(inner, part)
    except OSError as e:
      if e.filename == part or e.errno in NO_SPACE_ERRNOS:  # This host's disk, not the store.
        raise path_error(e, part, setting=STAGING_ENV, doing="write") from None
      raise _download_error(what, e) from None
    except Exception as e:  # noqa: BLE001  (the store's client: HTTP, credentials, network; many classes)
      raise _download_error(what, e) from None
    got = os.path.getsize(part)
    if got != size or sha256_of(part) != sha256:
      raise UserError(f"{what} does not match its {'size and ' if got != size else ''}sha256 in the manifest "
                      "(damaged or edited in the bucket); rebuild the cache with `xalign cache --overwrite` (or "
                      "restore the object).")
    os.replace(part, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(part)


def _download_error(what: str, e: BaseException) -> UserError:
  detail = str(e).splitlines()[0][:200] if str(e) else "no detail"
  return UserError(f"could not download {what} ({type(e).__name__}: {detail}); check the bucket, the credentials "
                   "and the network, then rerun (the shards already staged are kept).")
