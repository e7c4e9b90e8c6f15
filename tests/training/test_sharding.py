"""The loss on 8 fake CPU devices (data=4, model=2) equals the 1-device loss."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.training import partitioning
from tests import testlib


@pytest.mark.subprocess  # 8 fake devices need a fresh JAX.
def test_sharded_train_steps_match_single_device():
  env = dict(os.environ, XLA_FLAGS=testlib.xla_flags_with_devices(8), JAX_PLATFORMS="cpu",
             TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-m", "tests.training.sharded_loss_script"], env=env,
                        capture_output=True, text=True, timeout=600,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  single, sharded = out["single"], out["sharded"]
  assert sharded["mesh"] == {"data": 4, "model": 2}
  assert sharded["sharded_leaves"] > 0, "no parameter was actually sharded"
  for a, b in zip(single["losses"], sharded["losses"]):
    for key in a:
      np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
  np.testing.assert_allclose(sharded["checksum"], single["checksum"], rtol=1e-5)


def test_mesh_rejects_non_divisor_partitions():
  with pytest.raises(UserError, match="NUM_PARTITIONS=3"):
    partitioning.make_mesh(3, devices=[object()] * 8)


def test_rules_table_and_fsdp_switch():
  rules = dict(partitioning.logical_axis_rules())
  assert rules["batch"] == "data" and rules["vocab"] == "model" and rules["embed"] is None
  assert dict(partitioning.logical_axis_rules(fsdp=True))["embed"] == "data"
