"""Import rules of the package layout, checked on the source (ARCHITECTURE.md, STYLE.md).

* gin lives at the edges: only the gin-edge modules (`gin_cli`,
  `configurables`, and `compile_check`, the entry point that reads a training
  run's `train.*` bindings without calling it) import it;
* `flax_xalign/training/` never imports `flax_xalign.evaluation`;
* the data pipeline never imports the tasks package (callers resolve tasks);
* no objective name is special-cased in `training/`.
"""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "flax_xalign"
GIN_EDGE = {"gin_cli.py", "configurables.py", "compile_check.py"}


def _imports(path: pathlib.Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def _modules(folder: pathlib.Path):
  return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_gin_edge_imports_gin():
  offenders = [str(p.relative_to(PACKAGE)) for p in _modules(PACKAGE)
               if p.name not in GIN_EDGE and any(n == "gin" or n.startswith("gin.") for n in _imports(p))]
  assert not offenders, f"modules below the entry points import gin: {offenders}"


@pytest.mark.parametrize("folder, forbidden", [
    ("training", "flax_xalign.evaluation"),
    ("objectives", "flax_xalign.evaluation"),
    ("objectives", "flax_xalign.training"),
    ("ops", "flax_xalign.training"),
    ("models", "flax_xalign.training"),
])
def test_lower_layers_do_not_import_upper_ones(folder, forbidden):
  offenders = [str(p.relative_to(PACKAGE)) for p in _modules(PACKAGE / folder)
               if any(n == forbidden or n.startswith(forbidden + ".") for n in _imports(p))]
  assert not offenders, f"{offenders} import {forbidden}"


def test_pipeline_does_not_import_tasks():
  imports = _imports(PACKAGE / "data" / "pipeline.py")
  assert not any(n.startswith("flax_xalign.tasks") for n in imports), imports


def test_training_names_no_objective():
  from flax_xalign.objectives import names
  from flax_xalign.objectives import pretraining  # noqa: F401  (registers every built-in objective)

  pattern = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, names())))
  offenders = {str(p.relative_to(PACKAGE)): pattern.findall(p.read_text(encoding="utf-8"))
               for p in _modules(PACKAGE / "training")}
  assert not any(offenders.values()), offenders
