"""A command's start prints nothing of libtpu's or TensorFlow's (the dev venv has libtpu).

The quieting is `flax_xalign.cli.setup_process()`, which every command's main
calls first; importing `flax_xalign` alone changes nothing (tests/cli/test_process.py).
"""

import importlib.util
import os
import subprocess
import sys

import pytest

_SET_UP = "from flax_xalign.cli import setup_process; setup_process(); "


@pytest.mark.subprocess
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
@pytest.mark.skipif(bool(os.path.exists("/dev/vfio") or any(n.startswith("accel") for n in os.listdir("/dev"))),
                    reason="this machine has TPU device nodes")
def test_the_process_set_up_keeps_libtpu_quiet_without_a_tpu(tmp_path):
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
  code = _SET_UP + "import jax; print(jax.devices()[0].platform)"
  quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert quiet.returncode == 0 and quiet.stdout.strip() == "cpu", quiet.stderr
  assert "TPU" not in quiet.stderr, quiet.stderr
  # The reference: the same start without the package's settings is noisy, so the test can fail.
  noisy = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                         text=True, timeout=120)
  if "TPU" not in noisy.stderr:  # Some libtpu builds and machines print nothing off a TPU VM.
    pytest.skip("libtpu prints nothing at start here without the set-up, so there is nothing to compare")


def _bare_env(tmp_path):
  """No TF_CPP_MIN_LOG_LEVEL / JAX_PLATFORMS (conftest sets both for the tests themselves)."""
  return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}


_TF_NOISE = ("absl::InitializeLog", "cudart_stub", "cuInit", "oneDNN", "cpu_feature_guard")


@pytest.mark.subprocess
def test_tensorflow_imported_after_the_set_up_is_quiet_and_sees_no_gpu(tmp_path):
  code = _SET_UP + "import tensorflow as tf; print(tf.config.get_visible_devices('GPU'))"
  quiet = subprocess.run([sys.executable, "-c", code], env=_bare_env(tmp_path), capture_output=True, text=True,
                         timeout=300)
  assert quiet.returncode == 0 and quiet.stdout.strip() == "[]", quiet.stderr
  assert not any(noise in quiet.stderr for noise in _TF_NOISE), quiet.stderr
  # The reference: TF imported on its own prints its start lines here (when this TF build prints any).
  noisy = subprocess.run([sys.executable, "-c", "import tensorflow as tf; tf.config.list_physical_devices()"],
                         env=_bare_env(tmp_path), capture_output=True, text=True, timeout=300)
  if not any(noise in noisy.stderr for noise in _TF_NOISE):
    pytest.skip("this TensorFlow build prints nothing at start, so there is nothing to compare")


@pytest.mark.subprocess
def test_train_prints_only_its_own_line_before_failing(tmp_path):
  # A real process, after TF has been imported (resolving the task imports seqio): one line on stderr, ours.
  done = subprocess.run(
      [sys.executable, "-m", "flax_xalign.train", "--gin_file=runs/pretrain.gin", "--gin_file=models/tiny.gin",
       f"--gin.MODEL_DIR='{tmp_path / 'm'}'", "--gin.MIXTURE_OR_TASK_NAME='no_such_task'"],
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env=_bare_env(tmp_path),
      capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and done.stdout == "", done.stdout
  lines = done.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: Unknown task or mixture 'no_such_task'"), done.stderr
  assert not (tmp_path / "m").exists()
