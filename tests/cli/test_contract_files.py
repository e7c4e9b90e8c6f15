"""Every command has a file of its own in the contract tier (tests/tiers.py, issue 23): a new entry point
without one fails here, naming the table to extend. The table says where each command's contract lives;
the check reads the files (no import, no run): marked `contract`, and naming the command's module."""

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLI = REPO / "flax_xalign" / "cli"

# command module (relative to flax_xalign/cli, without .py) -> the test file holding its contract
CONTRACT_FILES = {
    "align": "tests/test_align_cli.py",
    "assets": "tests/cli/test_assets_cli.py",
    "bli": "tests/test_bli_cli.py",
    "cache": "tests/cli/test_cache_cli.py",
    "cache_beam": "tests/data/test_cache_beam.py",
    "eflomal": "tests/cli/test_eflomal_cli.py",
    "compile_check": "tests/test_compile_check.py",
    "cooc": "tests/test_cooc_cli.py",
    "cooc_beam": "tests/data/test_cooc_beam.py",
    "debian_data": "tests/cli/test_debian_data_cli.py",
    "demo": "tests/cli/test_demo_cli.py",
    "e5_small": "tests/interop/test_e5_small.py",
    "eval": "tests/cli/test_eval_cli.py",
    "gpu_bundle": "tests/cli/test_gpu_bundle_cli.py",
    "gpu_run": "tests/cli/test_gpu_bundle_cli.py",
    "export_hf": "tests/interop/test_hf_cli.py",
    "import_hf": "tests/interop/test_hf_cli.py",
    "lexicon": "tests/cli/test_lexicon_cli.py",
    "retrieval": "tests/cli/test_retrieval_cli.py",
    "train": "tests/test_entry_points.py",
    "trim": "tests/interop/test_trim.py",
    "vocab": "tests/cli/test_vocab_cli.py",
    "xalign": "tests/cli/test_xalign.py",
    "experiments/align_mlm_grid": "tests/cli/test_experiments_cli.py",
    "experiments/bli_table": "tests/cli/test_bli_table_cli.py",
    "experiments/code_switch": "tests/cli/test_experiments_cli.py",
    "experiments/mlm_gc": "tests/cli/test_experiments_cli.py",
}


def commands():
  """The modules under flax_xalign/cli that define a top-level `main`."""
  found = []
  for path in sorted(CLI.rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
      found.append(path.relative_to(CLI).with_suffix("").as_posix())
  return found


def test_every_command_has_a_contract_file():
  missing = sorted(set(commands()) - set(CONTRACT_FILES))
  assert not missing, (f"commands without a contract test file: {missing}; add one under tests/cli/ (a smoke "
                       f"run and one-error-line refusals, marked contract) and list it in {__file__}")
  assert not set(CONTRACT_FILES) - set(commands()), "CONTRACT_FILES names a command that no longer exists"


@pytest.mark.parametrize("command", sorted(CONTRACT_FILES))
def test_the_contract_file_is_marked_and_names_the_command(command):
  text = (REPO / CONTRACT_FILES[command]).read_text(encoding="utf-8")
  assert "pytest.mark.contract" in text, f"{CONTRACT_FILES[command]} has no contract test"
  name = command.rsplit("/", 1)[-1]
  assert any(needle in text for needle in (f"import {name}", f'"{name}"', f"flax_xalign.{name}")), (
      f"{CONTRACT_FILES[command]} never names the {command} command")
