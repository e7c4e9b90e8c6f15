"""A Python that imports `xalign cache`'s libraries once, then forks one child per write (tests/hardening/test_writers.py).

    python -m tests.hardening.forked_writer      # then one JSON request a line on stdin

The Ctrl-C loop interrupts two thirds of its writes while they write, after a fresh interpreter's ~8 s of
TensorFlow, seqio and JAX imports (the other third interrupts those imports, in fresh interpreters). A child
forked from this process starts its write at once: the same `cache.main`, in a process of its own, with
Python's own SIGINT handler, its output in its own files, and the interpreter's whole teardown (atexit
handlers, TensorFlow's and JAX's objects) when it exits. Nothing here initialises a JAX backend or runs a
TensorFlow op before the fork, so the children build those as a fresh process does.

Protocol: a request is {"argv": [...], "stdout": PATH, "stderr": PATH}; the answer is the line
`forked-writer: pid N` when the child runs, then `forked-writer: exit CODE` when it ends (CODE as Popen's
returncode: 130 for exit(130), -2 for death by SIGINT). `forked-writer: ready` says the imports are done.
"""

from __future__ import annotations

import json
import os
import signal
import sys

PREFIX = "forked-writer:"


def _serve() -> dict | None:
  """Forks a child per request; returns the request in a child, None in this process at the end of its input."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # A Ctrl-C is for the children.
  print(f"{PREFIX} ready", flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      return request
    print(f"{PREFIX} pid {pid}", flush=True)
    _, status = os.waitpid(pid, 0)
    print(f"{PREFIX} exit {os.waitstatus_to_exitcode(status)}", flush=True)
  return None


def _become_the_command(request: dict) -> int:
  """In the child: the process state a shell gives `xalign cache`, then its main."""
  signal.signal(signal.SIGINT, signal.default_int_handler)  # What Python installs at start (SIGINT not ignored).
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.close(null)
  for fd, key in ((1, "stdout"), (2, "stderr")):
    out = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, fd)
    os.close(out)
  from flax_xalign.cli import cache

  return cache.main(request["argv"])


if __name__ == "__main__":
  from flax_xalign.cli import cache as _cache
  from flax_xalign.cli import setup_process

  setup_process()  # As `cache.main` does first in a fresh process: before TensorFlow is imported.

  _cache._import_libraries(gin=True)  # pylint: disable=protected-access
  from jax._src import xla_bridge

  assert not xla_bridge.backends_are_initialized(), "a JAX backend before the fork"
  child_request = _serve()
  if child_request is not None:
    sys.exit(_become_the_command(child_request))
