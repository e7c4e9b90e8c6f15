"""`python -m flax_xalign.compile_check`: a tiny run compiled for a v4-8; bad input is one `error:` line."""

import json
import os
import subprocess
import sys

import pytest

from tests.testlib import tiny_encoder_gin

pytest.importorskip("libtpu")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gin(tmp_path, **overrides):
  path = tmp_path / "tiny.gin"
  path.write_text("include 'runs/pretrain.gin'\n" + tiny_encoder_gin(**overrides)
                  + "TASK_FEATURE_LENGTHS = {'tokens': 16}\nBATCH_SIZE = 8\n")
  return str(path)


def _run(*args, cwd):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-m", "flax_xalign.compile_check", *args], capture_output=True, text=True, check=False,
                        env=env, cwd=cwd, timeout=600)


def test_tiny_run_compiles_for_v4_8_and_ends_with_json(tmp_path, bible_data_dir):
  model_dir = tmp_path / "never"
  out = _run(f"--gin_file={_gin(tmp_path)}", "--topology=v4:2x2x1", f"--gin.MODEL_DIR='{model_dir}'",
             f"--output={tmp_path / 'record.json'}", cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.strip().splitlines()
  record = json.loads(lines[-1])
  assert record["topology"] == "v4:2x2x1" and record["chips"] == 4 and record["mesh"] == {"data": 4, "model": 1}
  assert record["fits"] and record["objectives"] == ["mlm", "tlm"] and record["batch_size"] == 8
  assert record["total_gib_per_chip"] > 0 and record["flops_per_step_xla"] > 0
  assert json.loads((tmp_path / "record.json").read_text()) == record
  text = out.stdout
  for progress in ("resolving", "describing the devices", "lowering the train step", "compiling for v4:2x2x1"):
    assert progress in text
  assert "-> FITS" in text and "FLOPs per step: ours" in text
  assert not model_dir.exists()  # MODEL_DIR is neither created nor touched.


def test_objectives_flag_overrides_the_gin_objectives(tmp_path, bible_data_dir):
  out = _run(f"--gin_file={_gin(tmp_path)}", "--topology=v4:2x2x1", "--objectives=mlm", cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads(out.stdout.strip().splitlines()[-1])["objectives"] == ["mlm"]


@pytest.mark.parametrize("args, message", [
    (["--topology=v4:9x9"], "a v4 grid has 3 positive dimensions"),
    (["--topology=tpu9"], "unknown TPU topology 'tpu9'"),
    ([], "the following arguments are required: --topology"),
    (["--topology=v4:2x2x1", "--gin.NUM_PARTITIONS=3"], "NUM_PARTITIONS=3 does not divide the 4"),
    (["--topology=v4:2x2x1", "--gin.BATCH_SIZE=6"], "BATCH_SIZE=6 is not divisible by the 4-way 'data'"),
    (["--topology=v4:2x2x1", "--cooc_nnz=0"], "cooc_nnz must be an int >= 1"),
    (["--topology=v4:2x2x1", "--frobnicate"], "unknown flag '--frobnicate'"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, bible_data_dir, args, message):
  out = _run(f"--gin_file={_gin(tmp_path)}", *args, cwd=REPO)
  assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], out.stderr[-2000:]
  assert "Traceback" not in out.stderr
