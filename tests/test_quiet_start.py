"""A JAX start on a machine without a TPU prints nothing of libtpu's (the dev venv has libtpu)."""

import importlib.util
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
@pytest.mark.skipif(bool(os.path.exists("/dev/vfio") or any(n.startswith("accel") for n in os.listdir("/dev"))),
                    reason="this machine has TPU device nodes")
def test_importing_the_package_keeps_libtpu_quiet_without_a_tpu(tmp_path):
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
  code = "import flax_xalign, jax; print(jax.devices()[0].platform)"
  quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert quiet.returncode == 0 and quiet.stdout.strip() == "cpu", quiet.stderr
  assert "TPU" not in quiet.stderr, quiet.stderr
  # The reference: the same start without the package's settings is noisy, so the test can fail.
  noisy = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                         text=True, timeout=120)
  assert "TPU" in noisy.stderr
