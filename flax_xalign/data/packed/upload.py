"""`xalign cache --output=gs://...`: the split written on this host's disk exactly as for a local output, then uploaded.

    upload.check_output("gs://bucket/cache", "train", overwrite=False)   # before any work
    with upload.written_locally("gs://bucket/cache", "train", overwrite=False) as local:
      write.write_split(rows, info, output=local, ...)                  # as today, into a local folder
    # on leaving the block: OUTPUT/train/ in the bucket, its manifest last

An object store has no rename, so the local writer's all-or-nothing step (a
temporary folder renamed into place) has no equivalent there; the order of the
uploads stands in for it. The writer's mark (`fileio.write_mark`, naming every
file the split holds) goes first, then the shards and the vocabulary, then,
once the store lists every shard at its size, the manifest. A reader opens a
split by its manifest (`format.has_split`, `staging.open_split`), so it never
sees one without its shards; an upload cut short leaves shards without a
manifest, which no run reads and which `--overwrite` replaces (the mark shows
this command wrote them). `--overwrite` deletes the old manifest first, then
the old objects, so no reader sees a mix of the two splits.

Not locked: two writers of the same split of a bucket are not refused. The
local split lock (`write.split_lock`) is taken in each writer's own staging
folder and guards nothing in the bucket; the last upload wins, and a reader
starting while the two race can be refused (a shard's hash no longer that of
the manifest it read). A create-if-absent lock object (`storage.BucketLock`, as
MODEL_DIR in a bucket has) would close that; this command does not take one yet.

The local copy lives in a temporary folder (`tempfile`, so under $TMPDIR) and
needs the split's size on that disk; it is removed once uploaded, or when the
write fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from flax_xalign import fileio
from flax_xalign import storage
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.packed import write
from flax_xalign.errors import UserError


def check_output(url: str, split: str, *, overwrite: bool) -> str:
  """The split's URL; refuses an existing split unless `overwrite` and this command wrote it (nothing written)."""
  root = fileio.check_output_folder(url, owned=_is_cache, what="a packed cache (<split>/manifest.json per entry)")
  target = storage.join(root, split)
  names = storage.listdir(target)
  if not names:
    return target
  if not overwrite:
    if format_lib.MANIFEST not in names:
      raise UserError(f"{target} holds an upload of a split that did not finish (no {format_lib.MANIFEST}, so no "
                      "run reads it); add --overwrite to replace it, or choose another --output.")
    raise UserError(f"{target} already exists; choose another --output, remove it, or add --overwrite to "
                    "replace it.")
  fileio.check_own_folder(target, write.COMMAND)  # Only a split this command wrote, holding only what it wrote.
  return target


def _is_cache(root: str) -> bool:
  """Whether every entry under `root` is a split of a packed cache (a manifest) or one this command marked."""
  return all(format_lib.has_split(root, name)
             or (fileio.read_mark(storage.join(root, name)) or {}).get("command") == write.COMMAND
             for name in storage.listdir(root))


@contextlib.contextmanager
def written_locally(url: str, split: str, *, overwrite: bool) -> Iterator[str]:
  """A fresh local folder to write the cache into; its split `split` is uploaded to `url` when the block ends.

  The folder is removed in any case; nothing is uploaded when the block raises.
  """
  check_output(url, split, overwrite=overwrite)
  local = tempfile.mkdtemp(prefix="xalign-cache-upload-")
  try:
    yield local
    upload_split(os.path.join(local, split), url, split, overwrite=overwrite)
  finally:
    shutil.rmtree(local, ignore_errors=True)


def upload_split(local: str, url: str, split: str, *, overwrite: bool) -> format_lib.Manifest:
  """Uploads the finished local split folder `local` as `url/split`, its manifest last; returns the manifest."""
  packed = format_lib.open_split(os.path.dirname(local), os.path.basename(local), verify="size")
  target = check_output(url, split, overwrite=overwrite)  # Again: the bucket may have changed during the write.
  manifest = packed.manifest
  files = [*(s.file for s in manifest.shards), manifest.vocabulary.file]
  start = time.monotonic()
  fs, inner = storage.filesystem(target)
  try:
    _remove_old(fs, inner)
    fs.put_file(os.path.join(local, fileio.MARK), f"{inner}/{fileio.MARK}")
    fs.put([os.path.join(local, name) for name in files], [f"{inner}/{name}" for name in files])
    listed = {os.path.basename(e["name"]): int(e.get("size") or 0) for e in fs.ls(inner, detail=True, refresh=True)}
    short = [name for name in files if listed.get(name) != os.path.getsize(os.path.join(local, name))]
    if short:
      raise OSError(f"the store lists {short[0]} at {listed.get(short[0])} bytes after its upload")
    fs.put_file(os.path.join(local, format_lib.MANIFEST), f"{inner}/{format_lib.MANIFEST}")
  except (UserError, KeyboardInterrupt):
    raise
  except Exception as e:  # noqa: BLE001  (the store's client: HTTP, credentials, network; many classes)
    detail = str(e).splitlines()[0][:200] if str(e) else "no detail"
    raise UserError(f"could not upload the split to {target} ({type(e).__name__}: {detail}); it has no "
                    f"{format_lib.MANIFEST}, so no run reads it: rerun with --overwrite once the bucket can be "
                    "written.") from None
  total = sum(s.bytes for s in manifest.shards)
  print(f"uploaded {len(manifest.shards)} shard(s) ({total / 2**20:,.1f} MiB) to {target} in "
        f"{time.monotonic() - start:.0f} s", file=sys.stdout, flush=True)
  return manifest


def _remove_old(fs, inner: str) -> None:
  """Deletes the split being replaced, its manifest first (no reader opens it from then on).

  Its mark stays until the new one replaces it: whatever a cut-off replacement leaves is named by a mark.
  """
  try:
    names = [os.path.basename(n.rstrip("/")) for n in fs.ls(inner, detail=False, refresh=True)]
  except FileNotFoundError:
    return
  for name in sorted((n for n in names if n != fileio.MARK), key=lambda n: (n != format_lib.MANIFEST, n)):
    with contextlib.suppress(FileNotFoundError):
      fs.rm_file(f"{inner}/{name}")
