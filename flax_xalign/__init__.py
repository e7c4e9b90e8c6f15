"""flax_xalign: JAX/Flax pretraining of cross-lingual encoders with explicit alignment."""

__version__ = "0.1.0"


def _quiet_libtpu_off_tpu() -> None:
  """Off a TPU VM, tells libtpu what it would otherwise look up in the TPU metadata.

  With libtpu installed (the `aot` and `tpu` extras) every JAX start probes for
  a TPU, and on a machine without one libtpu prints five lines of warnings into
  the output of every command. Where no TPU device node exists, the settings
  it asks for are given (environment values already set win); on a TPU VM
  nothing changes. A single "localhost" worker is not a multi-host job
  (`train.maybe_initialize_distributed`); compiling for any topology still
  works (`training/aot.py`).
  """
  import glob
  import importlib.util
  import os

  if glob.glob("/dev/accel*") or os.path.exists("/dev/vfio") or importlib.util.find_spec("libtpu") is None:
    return
  for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                     ("TPU_ACCELERATOR_TYPE", "v4-8")):
    os.environ.setdefault(key, value)


_quiet_libtpu_off_tpu()
