"""Usage errors and `--help` answer before the heavy libraries load (issue 23).

TensorFlow (brought in by seqio through the task registries) costs seconds at
start-up, JAX a few more. A command that is only asked for its help, or given
a flag it does not know, must answer without them: these tests run each
command as `python -m` would, in a fresh interpreter (`runpy`, so the module
runs as `__main__`), and read `sys.modules` afterwards. They assert which
modules were imported, never how long it took.

The reference that the probe sees imports at all: gin commands import gin
(their flags are gin's), so `gin` must show up for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_PROBE = r"""
import json, runpy, sys
module, flags = sys.argv[1], sys.argv[2:]
sys.argv = [module, *flags]
code = 0
try:
  runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as e:
  code = e.code
sys.stdout.flush()
print("\nPROBE " + json.dumps({"code": code, "loaded": sorted(m for m in ("gin", "jax", "seqio", "tensorflow")
                                                          if m in sys.modules)}))
"""

NO_TF = ("tensorflow", "seqio")
NO_TF_NO_JAX = ("tensorflow", "seqio", "jax")

# (module as run with -m, modules it must not import for --help or a bad flag)
COMMANDS = [
    ("flax_xalign.train", NO_TF_NO_JAX),
    ("flax_xalign.cli.train", NO_TF_NO_JAX),
    ("flax_xalign.eval", NO_TF_NO_JAX),
    ("flax_xalign.cli.assets", NO_TF_NO_JAX),
    ("flax_xalign.cli.compile_check", NO_TF_NO_JAX),
    ("flax_xalign.cli.vocab", NO_TF_NO_JAX),
    ("flax_xalign.cli.cooc_beam", NO_TF_NO_JAX),
    ("flax_xalign.cli.cache_beam", NO_TF_NO_JAX),
    ("flax_xalign.cli.cooc", NO_TF_NO_JAX),
    ("flax_xalign.cli.lexicon", NO_TF_NO_JAX),
    ("flax_xalign.cli.import_hf", NO_TF_NO_JAX),
    ("flax_xalign.cli.demo", NO_TF_NO_JAX),
    ("flax_xalign.cli.experiments.mlm_gc", NO_TF_NO_JAX),
    # Their flags' choices and defaults are constants of JAX modules (word_align.METHODS, ...): JAX loads.
    ("flax_xalign.cli.align", NO_TF),
    ("flax_xalign.cli.bli", NO_TF),
    ("flax_xalign.cli.retrieval", NO_TF),
]
GIN_COMMANDS = ("flax_xalign.train", "flax_xalign.cli.train", "flax_xalign.eval", "flax_xalign.cli.assets")


def _probe(tmp_path, module: str, *flags: str) -> tuple[dict, str, str]:
  """(what the probe reports, the command's stdout, its stderr) of `python -m module flags...`."""
  env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": REPO,
         "JAX_PLATFORMS": "cpu"}
  done = subprocess.run([sys.executable, "-c", _PROBE, module, *flags], cwd=str(tmp_path), env=env,
                        capture_output=True, text=True, timeout=300)
  out, sep, report = done.stdout.rpartition("\nPROBE ")
  assert sep and done.returncode == 0, f"the probe itself failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
  return json.loads(report), out, done.stderr


@pytest.mark.subprocess
@pytest.mark.parametrize("module, unwanted", COMMANDS, ids=[m for m, _ in COMMANDS])
def test_help_loads_no_heavy_library(module, unwanted, tmp_path):
  report, out, err = _probe(tmp_path, module, "--help")
  assert report["code"] in (0, None), (report, err[-2000:])
  assert out.strip(), "no help printed"
  assert err == "", err[-2000:]
  assert not set(unwanted) & set(report["loaded"]), f"--help imported {report['loaded']}"
  if module in GIN_COMMANDS:
    assert "gin" in report["loaded"]  # The probe sees what the command imported.


@pytest.mark.subprocess
@pytest.mark.parametrize("module, unwanted", COMMANDS, ids=[m for m, _ in COMMANDS])
def test_unknown_flag_is_one_error_line_before_heavy_libraries(module, unwanted, tmp_path):
  report, out, err = _probe(tmp_path, module, "--frobnicate")
  lines = [line for line in err.splitlines() if line.strip()]
  assert report["code"] == 2, (report, err[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
  assert out.strip() == ""
  assert not set(unwanted) & set(report["loaded"]), f"a bad flag imported {report['loaded']}"
  if module in GIN_COMMANDS:
    assert "--frobnicate" in lines[0] and "gin" in report["loaded"]


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["flax_xalign.train", "flax_xalign.eval", "flax_xalign.cli.assets"])
def test_missing_gin_file_is_reported_before_the_configurables_load(module, tmp_path):
  report, _, err = _probe(tmp_path, module, "--gin_file=no_such_file.gin")
  lines = [line for line in err.splitlines() if line.strip()]
  assert report["code"] == 2, (report, err[-2000:])
  assert len(lines) == 1 and lines[0].startswith("error: gin file 'no_such_file.gin' not found"), err[-2000:]
  assert not set(NO_TF_NO_JAX) & set(report["loaded"]), f"imported {report['loaded']}"
