"""`xalign compile_check`: a tiny run compiled for a v4-8; bad input is one `error:` line.

The contract tier runs `main(argv)` in-process (a fresh interpreter per case cost ~20 s of imports and
libtpu start each); one test starts the real command line (subprocess tier).
"""

import json
import os
import subprocess
import sys

import pytest

from flax_xalign.cli import compile_check
from tests.testlib import tiny_encoder_gin

pytest.importorskip("libtpu")

pytestmark = pytest.mark.contract

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gin(tmp_path, **overrides):
  path = tmp_path / "tiny.gin"
  path.write_text("include 'runs/pretrain.gin'\n" + tiny_encoder_gin(**overrides)
                  + "TASK_FEATURE_LENGTHS = {'tokens': 16}\nBATCH_SIZE = 8\n")
  return str(path)


def _main(capsys, *args):
  """(exit status, stdout, stderr) of compile_check's main in this process."""
  capsys.readouterr()
  code = compile_check.main(list(args))
  out, err = capsys.readouterr()
  return code, out, err


def test_tiny_run_compiles_for_v4_8_and_ends_with_json(tmp_path, bible_data_dir, capsys):
  model_dir = tmp_path / "never"
  code, out, err = _main(capsys, f"--gin_file={_gin(tmp_path)}", "--topology=v4:2x2x1",
                         f"--gin.MODEL_DIR='{model_dir}'", f"--output={tmp_path / 'record.json'}")
  assert code == 0, err[-3000:]
  record = json.loads(out.strip().splitlines()[-1])
  assert record["topology"] == "v4:2x2x1" and record["chips"] == 4 and record["mesh"] == {"data": 4, "model": 1}
  assert record["fits"] and record["objectives"] == ["mlm", "tlm"] and record["batch_size"] == 8
  assert record["total_gib_per_chip"] > 0 and record["flops_per_step_xla"] > 0
  assert json.loads((tmp_path / "record.json").read_text()) == record
  for progress in ("resolving", "describing the devices", "lowering the train step", "compiling for v4:2x2x1"):
    assert progress in out
  assert "-> FITS" in out and "FLOPs per step: ours" in out
  assert not model_dir.exists()  # MODEL_DIR is neither created nor touched.


@pytest.mark.slow  # A second compile for the v4-8 (~12 s of CPU); an empty --objectives is a refusal below.
def test_objectives_flag_overrides_the_gin_objectives(tmp_path, bible_data_dir, capsys):
  code, out, err = _main(capsys, f"--gin_file={_gin(tmp_path)}", "--topology=v4:2x2x1", "--objectives=mlm")
  assert code == 0, err[-3000:]
  assert json.loads(out.strip().splitlines()[-1])["objectives"] == ["mlm"]


@pytest.mark.parametrize("args, message", [
    (["--topology=v4:9x9"], "a v4 grid has 3 positive dimensions"),
    (["--topology=tpu9"], "unknown TPU topology 'tpu9'"),
    ([], "the following arguments are required: --topology"),
    (["--topology=v4:2x2x1", "--gin.NUM_PARTITIONS=3"], "NUM_PARTITIONS=3 does not divide the 4"),
    (["--topology=v4:2x2x1", "--gin.BATCH_SIZE=6"], "BATCH_SIZE=6 is not divisible by the 4-way 'data'"),
    (["--topology=v4:2x2x1", "--cooc_nnz=0"], "cooc_nnz must be an int >= 1"),
    (["--topology=v4:2x2x1", "--frobnicate"], "unknown flag '--frobnicate'"),
    (["--topology=v4:2x2x1", "--objectives=,"], "names no objective"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, bible_data_dir, capsys, args, message):
  code, out, err = _main(capsys, f"--gin_file={_gin(tmp_path)}", *args)
  assert code == 2, (out[-2000:], err[-2000:])
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], err[-2000:]
  assert "Traceback" not in err


@pytest.mark.subprocess
def test_the_command_line_refuses_bad_input_with_one_error_line(tmp_path):
  """The real `xalign compile_check`: the alias module, the exit status and stderr."""
  done = subprocess.run([sys.executable, "-m", "flax_xalign.cli.compile_check", f"--gin_file={_gin(tmp_path)}",
                         "--topology=tpu9"], capture_output=True, text=True, check=False, cwd=REPO, timeout=600,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
  assert done.stderr.splitlines() == [line for line in done.stderr.splitlines() if line.startswith("error:")]
  assert len(done.stderr.splitlines()) == 1 and "unknown TPU topology 'tpu9'" in done.stderr, done.stderr[-2000:]
