"""The process set-up lives in `flax_xalign.cli`: importing the package (or a library module) changes nothing.

Each check runs in a fresh interpreter, since the test process itself has been
set up by conftest. The libraries `training/checkpoints.py` builds on (jax,
Orbax, absl) set variables and import finders of their own when imported, so
they are imported before the first snapshot. The script then calls
`setup_process()`, the reference that shows the comparison can fail: the
set-up does change exactly the things an import must not.
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = r"""
import json, logging, os, sys

def state():
  return {"environ": dict(os.environ), "meta_path": [repr(f) for f in sys.meta_path],
          "excepthook": repr(sys.excepthook), "unraisablehook": repr(sys.unraisablehook),
          "filters": {n: [type(f).__name__ for f in logging.getLogger(n).filters] for n in ("", "absl", "asyncio")}}

import jax, orbax.checkpoint  # noqa: third-party imports set variables and finders of their own
before = state()
import flax_xalign, flax_xalign.cli, flax_xalign.cli.common, flax_xalign.cli.gin_cli, flax_xalign.train  # noqa
import flax_xalign.training.checkpoints  # noqa: used to install Orbax hooks of its own
imported = state()
if SET_UP:
  from flax_xalign.cli import setup_process
  setup_process()
  setup_process()  # Idempotent: the second call adds nothing.
print(json.dumps({"before": before, "imported": imported, "after": state()}))
"""


def _states(tmp_path, set_up: bool) -> dict:
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": REPO}
  done = subprocess.run([sys.executable, "-c", _SCRIPT.replace("SET_UP", str(set_up))], env=env, cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _changes(a: dict, b: dict) -> list[str]:
  changed = [k for k in ("meta_path", "excepthook", "unraisablehook", "filters") if a[k] != b[k]]
  env = sorted(k for k in set(a["environ"]) | set(b["environ"]) if a["environ"].get(k) != b["environ"].get(k))
  return changed + [f"environ[{k}]" for k in env]


@pytest.mark.subprocess
def test_importing_the_package_changes_nothing_and_setup_process_does(tmp_path):
  states = _states(tmp_path, set_up=True)
  assert _changes(states["before"], states["imported"]) == []
  # The reference: the set-up changes each of these, once.
  after = states["after"]
  changed = _changes(states["imported"], after)
  assert {"meta_path", "excepthook", "unraisablehook", "filters"} <= set(changed)
  assert sum("QuietTensorFlowFinder" in f for f in after["meta_path"]) == 1
  assert after["filters"][""].count("KnownNoise") == 1 and after["filters"]["absl"].count("KnownNoise") == 1
  assert after["filters"]["absl"].count("DiskFullLogFilter") == 1
  assert after["filters"]["asyncio"] == ["AbandonedReadNoise"]


def test_setup_process_is_idempotent_in_this_process():
  import logging

  from flax_xalign.cli import _process, setup_process

  hooks = (list(sys.meta_path), sys.excepthook, sys.unraisablehook)
  filters = {n: list(logging.getLogger(n).filters) for n in ("", "absl", "asyncio")}
  setup_process()  # conftest has called it already.
  assert (list(sys.meta_path), sys.excepthook, sys.unraisablehook) == hooks
  assert {n: list(logging.getLogger(n).filters) for n in ("", "absl", "asyncio")} == filters
  assert _process.known_noise() is _process.known_noise()


def test_seqio_pad_id_warning_of_an_xlmr_layout_vocabulary_is_dropped():
  import inspect
  import logging

  import seqio

  from flax_xalign.cli import _process

  # seqio's own wording (a rewording would let the line through again: this fails then).
  source = inspect.getsource(seqio.vocabularies)
  assert '"T5 library uses PAD_ID=%s, which is different from the "' in source
  record = logging.LogRecord("absl", logging.WARNING, __file__, 1, "T5 library uses PAD_ID=%s, which is different "
                             "from the sentencepiece vocabulary, which defines pad_id=%s", (0, 1), None)
  assert not _process.KnownNoise().filter(record)
  other = logging.LogRecord("absl", logging.WARNING, __file__, 1, "PAD_ID is fine", (), None)
  assert _process.KnownNoise().filter(other)


def test_the_t5x_spellings_are_the_cli_commands():
  from flax_xalign import eval as eval_module, train
  from flax_xalign.cli import eval as cli_eval, train as cli_train

  assert train.main is cli_train.main
  assert eval_module.main is cli_eval.main


@pytest.mark.subprocess
@pytest.mark.parametrize("argv, needle", [
    (["-m", "flax_xalign.cli", "vocab", "--help"], "xalign vocab"),
    (["-m", "flax_xalign.cli", "cooc_beam", "--help"], "xalign cooc_beam"),
    (["-m", "flax_xalign.cli.lexicon", "--help"], "xalign lexicon"),
    (["-m", "flax_xalign.cli.e5_small", "--help"], "xalign e5_small"),
    (["-m", "flax_xalign.cli", "assets", "--help"], "--gin_file"),
])
def test_a_command_runs_as_xalign_and_as_its_module(argv, needle, tmp_path):
  done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env={**os.environ, "HOME": str(tmp_path)})
  assert done.returncode == 0 and done.stdout.startswith("usage:") and needle in done.stdout, done.stderr[-2000:]
  assert done.stderr == "", done.stderr[-2000:]


def test_ctrl_c_in_a_gin_command_is_one_line_and_exit_130(monkeypatch, capsys):
  import gin

  from flax_xalign.cli import gin_cli

  def interrupted(**_):
    raise KeyboardInterrupt

  real = gin.get_configurable
  monkeypatch.setattr(gin, "get_configurable", lambda name: interrupted if name == "flax_xalign.eval_job" else
                      real(name))
  try:
    code, result = gin_cli.run(["--gin_file=runs/eval.gin", "--gin.MODEL_DIR='nowhere'"], description="eval",
                               configurable="eval_job")
  finally:
    gin.clear_config()
  assert (code, result) == (130, None)
  err = capsys.readouterr().err
  assert err.strip().splitlines() == ["interrupted (Ctrl-C); nothing was left half-written"], err


def test_a_ctrl_c_swallowed_by_a_gc_callback_is_delivered_again(monkeypatch, capsys):
  # Python reports a KeyboardInterrupt raised in a callback it cannot raise from (JAX's gc callback; here a
  # __del__) through sys.unraisablehook and carries on: eval exited 0 after such a Ctrl-C. The set-up's hook
  # signals SIGINT again, so the default handler raises it in the main thread.
  import signal
  import time

  from flax_xalign.cli import _process

  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  # Python's own handler (a shell starts background jobs, CI's included, with SIGINT ignored).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    _process._redeliver_swallowed_interrupts()

    class Interrupted:
      def __del__(self):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
      Interrupted()  # Dropped at once: __del__ raises, Python calls the unraisable hook.
      deadline = time.monotonic() + 10
      while time.monotonic() < deadline:
        time.sleep(0.01)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert "Exception ignored" not in capsys.readouterr().err
