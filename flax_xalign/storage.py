"""Paths that may be a local folder or an object store (gs://, s3://): the one path layer of the project.

Every place a user names (MODEL_DIR, --model_dir, --output, a vocabulary, a
TSV, a cache) may be a URL. Local paths keep their POSIX behaviour exactly
(`os.path`, atomic renames, `flock`); a URL goes through fsspec (gcsfs for
`gs://`, s3fs for `s3://` where installed), the same backend that
`etils.epath`, and so Orbax, uses once `EPATH_USE_TF=false` (set here as a
default: TensorFlow's gfile ignores a GCS emulator and a process without
TensorFlow must behave the same).

An object store is not a file system, and nothing here pretends it is:

* there are no folders: `makedirs` on a URL creates nothing, `isdir` means
  "some object has this prefix";
* an object is written whole or not at all (`write_object`): that is the
  store's own atomic write, so no temporary name and no rename are used;
* a growing file (`metrics.jsonl`) is appended with GCS's server-side
  *compose* (`append_object`): each flush uploads only its new bytes;
* locks are not `flock` but create-if-absent objects (`training/model_dir.py`).

`check_store` asks the store once, before any work, whether the bucket exists
and can be reached, so a typo in a bucket or a missing credential is one
line at the start instead of a traceback at the first checkpoint.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

from flax_xalign.errors import UserError

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_url(path: object) -> bool:
  """Whether `path` names an object in a store (`gs://b/x`, `s3://b/x`), not a local file."""
  return isinstance(path, (str, os.PathLike)) and bool(_URL.match(os.fspath(path)))


def scheme(path: str) -> str:
  """'gs', 's3', ... of a URL; '' of a local path."""
  match = _URL.match(os.fspath(path))
  return match.group(1).lower() if match else ""


def absolute(path: str | os.PathLike) -> str:
  """A URL with its trailing slashes dropped, or the absolute, `~`-expanded local path."""
  text = os.fspath(path)
  if is_url(text):
    head = _URL.match(text).group(0)
    rest = re.sub(r"/+", "/", text[len(head):]).rstrip("/")
    return head + rest
  return os.path.abspath(os.path.expanduser(text))


def join(base: str | os.PathLike, *names: str) -> str:
  """`base/name/...`: posix joins for a URL, `os.path.join` for a local path.

  A name that is a URL replaces everything before it, as an absolute name does in `os.path.join` (an
  output setting that names gs://... is written there, not in a local folder called `gs:`).
  """
  base = os.fspath(base)
  for i in range(len(names) - 1, -1, -1):
    if is_url(names[i]):
      return join(names[i], *names[i + 1:])
  if is_url(base):
    return posixpath.join(base.rstrip("/"), *names)
  return os.path.join(base, *names)


def dirname(path: str) -> str:
  if is_url(path):
    parent = posixpath.dirname(absolute(path))
    return parent if _URL.sub("", parent) else absolute(path)  # gs://bucket is its own parent.
  return os.path.dirname(path)


def basename(path: str) -> str:
  return posixpath.basename(absolute(path)) if is_url(path) else os.path.basename(path)


def bucket_of(path: str) -> str:
  """The bucket of a URL ('b' of gs://b/x)."""
  return _URL.sub("", absolute(path)).split("/", 1)[0]


def key_of(path: str) -> str:
  """The object name inside the bucket ('x/y' of gs://b/x/y)."""
  parts = _URL.sub("", absolute(path)).split("/", 1)
  return parts[1] if len(parts) > 1 else ""


def configure() -> None:
  """The process-wide defaults the layer relies on (values the user set win); called before any URL is used."""
  os.environ.setdefault("EPATH_USE_TF", "false")
  if os.environ.get("STORAGE_EMULATOR_HOST"):
    # gcsfs's zonal-bucket probe speaks gRPC to the real control plane, which an emulator does not serve:
    # every first touch of a bucket would print a warning after a failed call.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", os.environ["STORAGE_EMULATOR_HOST"])
    os.environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")  # (TensorStore's: an emulator takes any)


def filesystem(path: str) -> tuple[Any, str]:
  """(the fsspec file system, the path as it knows it) of a URL; UserError when no backend is installed."""
  configure()
  import fsspec

  try:
    fs, inner = fsspec.core.url_to_fs(absolute(path))
  except (ImportError, ValueError) as e:
    package = {"gs": "gcsfs", "s3": "s3fs"}.get(scheme(path), f"an fsspec backend for {scheme(path)}://")
    raise UserError(f"{path}: {scheme(path)}:// paths need {package}, which is not installed ({e}); "
                    f"pip install {package}.") from None
  return fs, inner


def epath_of(path: str | os.PathLike):
  """`etils.epath.Path` of `path` (what Orbax takes): absolute, URL or local."""
  configure()
  from etils import epath

  return epath.Path(absolute(path))


# --- the operations every caller needs, for both kinds of path ---------------------------------------------------

def exists(path: str) -> bool:
  if not is_url(path):
    return os.path.exists(path)
  fs, inner = filesystem(path)
  return bool(fs.exists(inner))


def isdir(path: str) -> bool:
  if not is_url(path):
    return os.path.isdir(path)
  fs, inner = filesystem(path)
  return bool(fs.isdir(inner))


def isfile(path: str) -> bool:
  if not is_url(path):
    return os.path.isfile(path)
  fs, inner = filesystem(path)
  return bool(fs.isfile(inner))


def listdir(path: str) -> list[str]:
  """The names directly under `path` (a URL: the objects and prefixes one level down); [] when there are none."""
  if not is_url(path):
    return os.listdir(path)
  fs, inner = filesystem(path)
  try:
    entries = fs.ls(inner, detail=False)
  except FileNotFoundError:
    return []
  return sorted({posixpath.basename(e.rstrip("/")) for e in entries} - {""})


def glob(pattern: str) -> list[str]:
  """The paths matching `pattern`, sorted: `glob.glob` for a local pattern, the store's own match for a URL
  (each match a full URL)."""
  if not is_url(pattern):
    import glob as glob_lib

    return sorted(glob_lib.glob(pattern))
  fs, inner = filesystem(pattern)
  head = _URL.match(absolute(pattern)).group(0)
  return sorted(head + match for match in fs.glob(inner))


def makedirs(path: str) -> None:
  """os.makedirs(exist_ok=True) for a local path; nothing for a URL (an object store has no folders)."""
  if not is_url(path):
    os.makedirs(path, exist_ok=True)


def read_bytes(path: str) -> bytes:
  if not is_url(path):
    with open(path, "rb") as f:
      return f.read()
  fs, inner = filesystem(path)
  return fs.cat_file(inner)


def read_text(path: str) -> str:
  return read_bytes(path).decode("utf-8")


def open_file(path: str, mode: str = "r", **kwargs):
  """`open(path, mode, ...)` for a local path; for a URL, the object as a stream (fsspec's file)."""
  if not is_url(path):
    return open(path, mode, **kwargs)
  fs, inner = filesystem(path)
  return fs.open(inner, mode, **kwargs)


_FENCED: dict[str, str] = {}  # URL prefix -> why this process may no longer write under it (`BucketLock`).


def check_fence(path: str | os.PathLike) -> None:
  """UserError where `path` lies under a run whose bucket lock another writer took over from this process."""
  if not _FENCED or not is_url(path):
    return
  url = absolute(path)
  for folder, why in _FENCED.items():
    if url == folder or url.startswith(folder + "/"):
      raise UserError(why)


def write_object(path: str, data: bytes) -> None:
  """Writes one whole object (the store's atomic write: readers see the old object or the new one)."""
  check_fence(path)
  fs, inner = filesystem(path)
  fs.pipe_file(inner, data)


def append_object(path: str, data: bytes) -> None:
  """Appends `data` to an object, uploading only `data` (GCS compose); a new object when there is none.

  Stores without compose (S3) rewrite the object: O(size) per append, which
  is why growing files are flushed in batches (at checkpoints), not per line.
  """
  check_fence(path)
  fs, inner = filesystem(path)
  if not data:
    return
  if not fs.exists(inner):
    fs.pipe_file(inner, data)
    return
  if scheme(path) == "gs":
    part = f"{inner}.part-{os.getpid()}-{os.urandom(4).hex()}"
    fs.pipe_file(part, data)
    try:
      fs.merge(inner, [inner, part])
    finally:
      fs.rm_file(part)
  else:
    fs.pipe_file(inner, fs.cat_file(inner) + data)


def remove(path: str) -> None:
  """Deletes a file or object; a missing one is no error."""
  if not is_url(path):
    try:
      os.unlink(path)
    except FileNotFoundError:
      pass
    return
  check_fence(path)
  fs, inner = filesystem(path)
  try:
    fs.rm_file(inner)
  except FileNotFoundError:
    pass


def rmtree(path: str) -> None:
  """Deletes a folder or every object under a prefix."""
  if not is_url(path):
    import shutil

    shutil.rmtree(path)
    return
  check_fence(path)
  fs, inner = filesystem(path)
  fs.rm(inner, recursive=True)


def move(source: str, target: str) -> None:
  """os.replace for local paths; for a URL, a copy then a delete of every object (a store has no rename)."""
  if not is_url(source):
    os.replace(source, target)
    return
  check_fence(source)
  check_fence(target)
  fs, inner = filesystem(source)
  fs.mv(inner, filesystem(target)[1], recursive=True)


_LOCAL_COPIES: dict[str, str] = {}  # URL -> its copy in this process's scratch folder (`local_copy`).


def local_copy(path: str) -> str:
  """`path` itself when local; for a URL, a copy of the object in a scratch folder this process removes at exit.

  For libraries that open a file by name through their own I/O (seqio's SentencePiece model through
  TensorFlow's gfile, which ignores a GCS emulator and does not exist without TensorFlow). One download
  per URL and process: what is copied is a run's own file (a vocabulary, its sha256 in the manifest), which
  no reader rewrites. The copy keeps the object's name, so messages that show it still say what it is.
  """
  if not is_url(path):
    return os.fspath(path)
  url = absolute(path)
  if url not in _LOCAL_COPIES:
    import atexit
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix="flax_xalign_copy_")
    atexit.register(shutil.rmtree, scratch, True)
    target = os.path.join(scratch, basename(url))
    with open(target, "wb") as f:
      f.write(read_bytes(url))
    _LOCAL_COPIES[url] = target
  return _LOCAL_COPIES[url]


def check_store(path: str, *, setting: str) -> None:
  """For a URL: the bucket exists and this process can reach it, or one UserError; nothing for a local path.

  Asked once before any work, so a misspelt bucket or missing credentials stop
  a run before it trains instead of at its first checkpoint.
  """
  if not is_url(path):
    return
  bucket = bucket_of(path)
  if not bucket:
    raise UserError(f"{setting}={path!r} names no bucket; give {scheme(path)}://BUCKET/FOLDER.")
  fs, _ = filesystem(path)
  try:
    found = fs.exists(bucket)
  except Exception as e:  # noqa: BLE001  (credentials, network: the client's own errors, many classes)
    raise UserError(f"{setting}={path}: the bucket {scheme(path)}://{bucket} cannot be reached "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no detail'}); check the "
                    "credentials (gcloud auth application-default login) and the network.") from None
  if not found:
    raise UserError(f"{setting}={path}: the bucket {scheme(path)}://{bucket} does not exist (or these credentials "
                    "may not see it); create it or fix the name.")


def check_local(path: str | os.PathLike | None, *, setting: str, reason: str) -> None:
  """UserError where `path` is a URL given to a flag that only a local path can serve (`reason`: why)."""
  if path is not None and is_url(path):
    raise UserError(f"{setting}={os.fspath(path)}: {reason}, so it takes a local path only; copy the data to this "
                    f"host first (e.g. gcloud storage cp -r {os.fspath(path)} .).")


def check_run_store(path: str, *, setting: str) -> None:
  """`check_store`, and a run (checkpoints) only where Orbax can write it: a local folder or gs://.

  Orbax's TensorStore layer (orbax-checkpoint 0.12) drives only local files and
  GCS: it turns `s3://b/run` into the local path `s3:/b/run`. An S3 bucket
  holds a run only mounted as a local folder (mountpoint-s3, s3fs-fuse).
  """
  check_store(path, setting=setting)
  if is_url(path) and scheme(path) != "gs":
    raise UserError(f"{setting}={path}: a run's checkpoints are written and read by Orbax, which reaches only "
                    f"local folders and gs:// (not {scheme(path)}://); keep the run in gs:// or a local folder "
                    "(an S3 bucket mounted as a folder, e.g. with mountpoint-s3, is one). Outputs, task files, "
                    f"vocabularies and packed caches may live on {scheme(path)}://.")


# --- one writer of a folder in a bucket: a create-if-absent object with a lease ---------------------------------

LEASE_S_DEFAULT = 120.0  # A holder renews every third of it; a record older than it belongs to a dead writer.


def lease_seconds() -> float:
  try:
    return max(1.0, float(os.environ.get("FLAX_XALIGN_LOCK_LEASE_S", LEASE_S_DEFAULT)))
  except ValueError:
    raise UserError(f"FLAX_XALIGN_LOCK_LEASE_S={os.environ['FLAX_XALIGN_LOCK_LEASE_S']!r} is not a number of "
                    "seconds; unset it or give e.g. 120.") from None


class LockHeld(Exception):
  """Another live writer holds the lock object; `owner` is its record."""

  def __init__(self, owner: dict):
    super().__init__(owner)
    self.owner = owner


class BucketLock:
  """The lock object at `url`: taken by a write that succeeds only where no object exists (GCS's
  ifGenerationMatch=0), or, where a record is released or its lease has run out, only where the object is
  still the generation that was read (so two writers racing for a stale lock cannot both win).

  The holder renews the lease every third of it (a daemon thread, a conditional write each time) and
  writes a released record when it ends; a writer killed without a word leaves a record that any newcomer
  may take over once the lease has run out (at once on the same host, where its pid is seen to be dead).
  The object stays after the run, like a local .lock file. Where a renewal finds that another writer took
  the lock over (this process stalled, or could not reach the store, for longer than the lease), the run's
  folder (`fence`) is fenced: every later write of this process under it is refused (`check_fence`), so
  the two runs never mix their files. A run lives only on GCS or a local disk (`check_run_store`): the
  record-only branch for other stores serves no run today.
  """

  def __init__(self, url: str, owner: dict, *, fence: str | None = None):
    self.url, self.owner = absolute(url), dict(owner)
    self.fence = absolute(fence) if fence is not None else dirname(self.url)
    self.lease_s = lease_seconds()
    self._generation: int | None = None
    self._stop = None
    self._thread = None
    self.lost: str = ""

  # The two primitives, per store: read (record, generation) and write-if-generation.
  def _blob(self):
    configure()
    from google.cloud import storage as gcs  # (google-cloud-storage: gcsfs's own dependency)

    if not hasattr(BucketLock, "_client"):
      BucketLock._client = (gcs.Client.create_anonymous_client() if os.environ.get("STORAGE_EMULATOR_HOST")
                            else gcs.Client())
    return BucketLock._client.bucket(bucket_of(self.url)).blob(key_of(self.url))

  def _read(self) -> tuple[dict, int | None]:
    import json

    if scheme(self.url) != "gs":
      if not exists(self.url):
        return {}, None
      data, generation = read_bytes(self.url), 1
    else:
      from google.api_core import exceptions as gexc

      blob = self._blob()
      try:
        data = blob.download_as_bytes()
      except gexc.NotFound:
        return {}, None
      generation = blob.generation
    try:
      record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
      record = {}
    return (record if isinstance(record, dict) else {}), generation

  def _write(self, record: dict, *, if_generation: int, quick: bool = False) -> bool:
    """Writes `record` only where the object is still `if_generation` (0: absent); False where it is not.

    `quick`: one attempt of at most 10 s (the release: a store that went away must not hold up the exit
    of a run that is already failing; the lease then runs out by itself)."""
    import json

    data = (json.dumps(record) + "\n").encode("utf-8")
    if scheme(self.url) != "gs":
      write_object(self.url, data)
      self._generation = 1
      return True
    from google.api_core import exceptions as gexc

    blob = self._blob()
    try:
      options = {"retry": None, "timeout": 10} if quick else {}
      blob.upload_from_string(data, content_type="application/json", if_generation_match=if_generation, **options)
    except gexc.PreconditionFailed:
      return False
    self._generation = blob.generation
    return True

  def _record(self, *, released: bool = False) -> dict:
    import time

    return {**self.owner, "lease_until": 0.0 if released else time.time() + self.lease_s,
            "lease_s": self.lease_s, "released": released}

  def _free(self, record: dict) -> bool:
    import socket
    import time

    if not record or record.get("released"):
      return True
    if time.time() > float(record.get("lease_until", 0) or 0):
      return True
    pid = record.get("pid")
    if record.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
      try:
        os.kill(pid, 0)
      except ProcessLookupError:
        return True  # Its writer died on this host: no need to wait out the lease.
      except PermissionError:
        pass
    return False

  def acquire(self) -> dict:
    """Takes the lock; returns the record it replaced ({} where none). Raises LockHeld with the holder's record."""
    for _ in range(5):
      record, generation = self._read()
      if generation is not None and not self._free(record):
        raise LockHeld(record)
      if self._write(self._record(), if_generation=generation or 0):
        self._start_renewing()
        return record
    raise LockHeld(self._read()[0])  # Lost every race: someone else is taking it right now.

  def _start_renewing(self) -> None:
    import threading

    self._stop = threading.Event()

    def renew():
      while not self._stop.wait(self.lease_s / 3):
        try:
          if not self._write(self._record(), if_generation=self._generation):
            self._taken_over()
            return
        except Exception as e:  # noqa: BLE001  (a store briefly unreachable: the next renewal retries)
          self.lost = f"renewing {self.url} failed ({type(e).__name__})"

    self._thread = threading.Thread(target=renew, name="bucket-lock-lease", daemon=True)
    self._thread.start()

  def _taken_over(self) -> None:
    import sys

    try:
      holder = self._read()[0]
    except Exception:  # noqa: BLE001  (who holds it is a detail of the message)
      holder = {}
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}" if holder else "another writer"
    self.lost = (f"{self.fence} was taken over by {who} while this run held it (its lease of {self.lease_s:g} s "
                 "ran out unrenewed: this process stalled or could not reach the store for that long)")
    _FENCED[self.fence] = (f"{self.lost}; this run stopped writing there so the two runs do not mix. Its "
                           "checkpoints up to the last one are intact; let the other run go on, or stop it and "
                           "rerun this command to resume.")
    self._generation = None  # (nothing to release: the lock is no longer ours)
    print(f"warning: {self.lost}; this run stops at its next write there.", file=sys.stderr, flush=True)

  def release(self) -> None:
    if self._stop is not None:
      self._stop.set()
      self._thread.join(timeout=10)
    if self._generation is not None:
      try:
        self._write(self._record(released=True), if_generation=self._generation, quick=True)
      except Exception:  # noqa: BLE001  (the store went away: the lease runs out by itself)
        pass
