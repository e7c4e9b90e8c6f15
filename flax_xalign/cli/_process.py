"""The one process set-up of every command: quiet libtpu and TensorFlow, drop known noise.

`setup_process()` is the first thing each command's `main` does. It changes
the whole process, which is why importing `flax_xalign` (or any library
module) does none of it:

* off a TPU VM with libtpu installed, it gives libtpu the settings it would
  otherwise look up in the TPU metadata (environment variables; values
  already set win), so a JAX start prints no libtpu warnings;
* it keeps TensorFlow, which only feeds data here, quiet and off the
  accelerators (an import hook around the first `import tensorflow`);
* it adds log filters for lines that are expected and say nothing to a user
  (gin's search-path misses, seqio's uncached-source warning) and holds back
  seqio's "Failed to load task" line for `gin_cli.run`;
* it installs the Orbax noise hooks (`training/checkpoint_noise.py`), so a
  damaged checkpoint is reported in one line, not hundreds;
* it makes sure no Ctrl-C is lost: one that lands in a callback Python cannot
  raise from (JAX's gc callback) is delivered again, not printed and dropped.

A notebook or script that wants the same behaviour calls it once, before
anything imports TensorFlow or starts JAX:

  from flax_xalign.cli import setup_process
  setup_process()

Calling it again does nothing. `TF_CPP_MIN_LOG_LEVEL=0` leaves TensorFlow
alone, to debug TF itself.
"""

from __future__ import annotations

import _thread
import glob
import importlib.util
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time

from flax_xalign.training import checkpoint_noise

_done = False


def setup_process() -> None:
  """Installs every process-wide setting and hook of a command, once per process."""
  global _done
  if _done:
    return
  _done = True
  _quiet_libtpu_off_tpu()
  _quiet_tensorflow()
  known_noise()
  checkpoint_noise.install()
  _redeliver_swallowed_interrupts()
  _our_warnings_as_one_line()


def _our_warnings_as_one_line() -> None:
  """A `warnings.warn` of ours prints as `warning: <message>`, like every other warning of a command.

  Python's default form is `/path/to/word_align.py:215: UserWarning: ...`: a file path and a class name
  where the user expects our one line. Warnings of other packages keep their form.
  """
  import os
  import warnings

  ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  previous = warnings.formatwarning

  def formatwarning(message, category, filename, lineno, line=None):
    if issubclass(category, UserWarning) and os.path.abspath(filename).startswith(ours + os.sep):
      return f"warning: {message}\n"
    return previous(message, category, filename, lineno, line)

  warnings.formatwarning = formatwarning


def _redeliver_swallowed_interrupts() -> None:
  """Re-raises SIGINT when its KeyboardInterrupt was raised where Python can only print it.

  A Ctrl-C whose handler runs inside a callback of the garbage collector (JAX
  registers one) raises KeyboardInterrupt there; Python reports it through
  `sys.unraisablehook` as "Exception ignored in: <function _xla_gc_callback>"
  with a traceback, and the command carries on as if never interrupted. The
  hook below marks the signal pending again instead, so the handler runs again
  once the callback has returned: the command stops as for any Ctrl-C.
  """
  previous = sys.unraisablehook

  def hook(info) -> None:
    if isinstance(info.exc_value, KeyboardInterrupt):
      # From another thread, a moment later: signalled from here, the handler would run
      # inside this hook and its KeyboardInterrupt would be swallowed again.
      threading.Thread(target=_signal_again, daemon=True).start()
      return
    previous(info)

  sys.unraisablehook = hook


def _signal_again() -> None:
  time.sleep(0.05)
  # Not os.kill: a signal that came while the interpreter shuts down (the command finished meanwhile)
  # would meet the default action and end the process by SIGINT; this is a no-op once Python's handler
  # is gone.
  _thread.interrupt_main(signal.SIGINT)


# --- libtpu -----------------------------------------------------------------------------------------------


def _quiet_libtpu_off_tpu() -> None:
  """Off a TPU VM, tells libtpu what it would otherwise look up in the TPU metadata.

  With libtpu installed (the `aot` and `tpu` extras) every JAX start probes for
  a TPU, and on a machine without one libtpu prints five lines of warnings into
  the output of every command. Where no TPU device node exists, the settings
  it asks for are given (environment values already set win); on a TPU VM
  nothing changes. A single "localhost" worker is not a multi-host job
  (`training.distributed.maybe_initialize_distributed`); compiling for any topology still
  works (`training/aot.py`).
  """
  if glob.glob("/dev/accel*") or os.path.exists("/dev/vfio") or importlib.util.find_spec("libtpu") is None:
    return
  for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                     ("TPU_ACCELERATOR_TYPE", "v4-8")):
    os.environ.setdefault(key, value)


# --- TensorFlow -------------------------------------------------------------------------------------------

# Lines TensorFlow prints while it loads and looks for devices, none of them about this run: absl's
# pre-initialisation banner, INFO/WARNING records (`I0000 00:00:17... port.cc:153] oneDNN ...`,
# `cudart_stub.cc] Could not find cuda drivers`), the CPU-feature note, and on a machine without a GPU
# `E... failed call to cuInit` and the duplicate CUDA-factory registrations.
_TF_START_NOISE = (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called",
    r"[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] ",
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] ",
    r"To enable the following instructions:",
    r"(E\d{4} |\d{4}-\d\d-\d\d .*: E ).*(cuInit|Unable to register cu\w+ factory)",
)


def _quiet_tensorflow() -> None:
  """Keeps TensorFlow quiet and off the accelerators.

  On a CPU machine a `train` run used to print seven TF/CUDA lines before its
  first own line, one of them `E... failed call to cuInit: INTERNAL: CUDA
  error`. TF 2.21 prints its start lines before its log level is read, so the
  level (`TF_CPP_MIN_LOG_LEVEL`, default here 2: errors only) is not enough:
  the first `import tensorflow`, whoever does it (seqio, clu, tensorflow_text),
  runs with stderr going to a temporary file, and only lines that are not
  start noise are passed on. Right after the import, before TF creates a
  device, its GPUs are hidden from it (`tf.config.set_visible_devices([],
  "GPU")`), so it never allocates accelerator memory; JAX is not affected
  (CUDA_VISIBLE_DEVICES would hide them from JAX too).
  """
  if os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2") == "0":
    return
  if "tensorflow" in sys.modules:
    _hide_accelerators_from_tf(sys.modules["tensorflow"])
    return
  sys.meta_path.insert(0, _QuietTensorFlowFinder())


class _QuietTensorFlowFinder:
  """An import hook: wraps the real loader's `exec_module` for the first `import tensorflow`.

  It stays in `sys.meta_path` until TF is executed (a bare `find_spec` that
  never imports must not use it up), then removes itself.
  """

  _finding = False

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname != "tensorflow" or self._finding:
      return None
    self._finding = True
    try:
      spec = importlib.util.find_spec(fullname)
    finally:
      self._finding = False
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    loader = spec.loader
    exec_module = loader.exec_module

    def quiet_exec_module(module):
      if self in sys.meta_path:
        sys.meta_path.remove(self)
      with _TfStartNoiseDropped():
        try:
          exec_module(module)
        finally:
          loader.__dict__.pop("exec_module", None)
        _hide_accelerators_from_tf(module)

    loader.exec_module = quiet_exec_module
    return spec


def _hide_accelerators_from_tf(tf) -> None:
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError, AttributeError):  # TF already made its devices: too late.
    pass


class _TfStartNoiseDropped:
  """Sends fd 2 to a temporary file for the block, then writes on what is not TF start noise."""

  def __enter__(self):
    sys.stderr.flush()
    self._file = tempfile.TemporaryFile()
    self._saved = os.dup(2)
    os.dup2(self._file.fileno(), 2)
    return self

  def __exit__(self, *exc):
    try:
      sys.stderr.flush()
    finally:
      os.dup2(self._saved, 2)
      os.close(self._saved)
    self._file.seek(0)
    text = self._file.read().decode("utf-8", errors="replace")
    self._file.close()
    noise = re.compile("|".join(f"(?:{p})" for p in _TF_START_NOISE))
    kept = "".join(line for line in text.splitlines(keepends=True) if not noise.match(line))
    if kept:
      sys.stderr.write(kept)
      sys.stderr.flush()
    return False


# --- log lines that say nothing to a user -----------------------------------------------------------------


class KnownNoise(logging.Filter):
  """Drops log lines that are expected and say nothing to a user.

  gin logs an ERROR for every search-path miss before it finds an included
  file, and seqio warns on every uncached in-memory source (ours are shuffled
  over the whole split in-graph, so its concern does not apply). seqio also
  logs `ERROR:absl:Failed to load task ... as part of mixture ...` before
  re-raising any failure of a mixture's task: for a UserError (which names the
  file and line) that is a second error line, so it is held back (`held`) and
  printed only when the failure turns out to be a crash (`gin_cli.run`).
  seqio warns "T5 library uses PAD_ID=0" on every load of a SentencePiece
  model whose pad id is another (XLM-R's layout: <pad> = 1); our special ids
  are read from the model itself (`data.vocab.specials`), never seqio's
  constant, so the line says nothing.
  """

  PREFIXES = ("Path not found:", "Using an uncached FunctionDataset", "T5 library uses PAD_ID")
  HOLD = ("Failed to load task",)

  def __init__(self):
    super().__init__()
    self.held: list[str] = []

  def filter(self, record) -> bool:
    message = str(record.msg)
    if message.startswith(self.HOLD):
      self.held.append(f"{record.levelname}:{record.name}:{record.getMessage()}")
      return False
    return not message.startswith(self.PREFIXES)


_LOGGERS = ("", "absl")  # gin logs through the root logger, seqio through absl's.


def known_noise() -> KnownNoise:
  """The KnownNoise filter on the root and absl loggers, added on the first call."""
  current = [f for f in logging.getLogger(_LOGGERS[0]).filters if isinstance(f, KnownNoise)]
  if current and all(current[0] in logging.getLogger(name).filters for name in _LOGGERS):
    return current[0]
  noise = KnownNoise()
  for name in _LOGGERS:
    logger = logging.getLogger(name)
    for old in [f for f in logger.filters if isinstance(f, KnownNoise)]:
      logger.removeFilter(old)
    logger.addFilter(noise)
  return noise
