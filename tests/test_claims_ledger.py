"""The claims ledger (docs/results/claims.md) and the README's headline table come from committed raw files.

tools/claims_ledger.py writes the ledger from the raw JSON files it names; these tests regenerate it and
compare, check that every raw file it names is in the checkout (and tracked by git where there is one), and
that every number of the README's headline table is a number of the raw file the table names.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# The README's headline table is the demo's output (`make demo`); its raw file, committed from that run.
HEADLINE_RAW = "docs/results/demo_e5_aer.json"


def _ledger_module():
  spec = importlib.util.spec_from_file_location("claims_ledger", REPO / "tools" / "claims_ledger.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules.setdefault("claims_ledger", module)  # (dataclasses look their module up there)
  spec.loader.exec_module(sys.modules["claims_ledger"])
  return sys.modules["claims_ledger"]


def test_the_ledger_is_what_the_raw_files_give():
  ledger = _ledger_module()
  committed = (REPO / ledger.LEDGER).read_text(encoding="utf-8")
  assert committed == ledger.render(ledger.measure_all()), (
      "docs/results/claims.md differs from what its raw files give: run python tools/claims_ledger.py "
      "(never edit the page by hand)")


def _tracked(path: str) -> bool:
  if not (REPO / ".git").exists():
    return True  # (an export without git: being in the tree is all there is to check)
  done = subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=REPO, capture_output=True, check=False)
  return done.returncode == 0


def test_every_raw_file_the_ledger_names_is_committed():
  ledger = _ledger_module()
  named = sorted({path for claim in ledger.CLAIMS for path in claim.raw} | {HEADLINE_RAW})
  missing = [p for p in named if not (REPO / p).is_file() or not _tracked(p)]
  assert not missing, f"raw files the ledger or the README names that are not committed: {missing}"
  assert all(claim.measure is not None and claim.rule for claim in ledger.CLAIMS)


def test_a_missing_raw_file_is_one_error_naming_it(monkeypatch):
  ledger = _ledger_module()
  with pytest.raises(SystemExit, match="docs/results/no_such.json"):
    ledger._load("docs/results/no_such.json")  # pylint: disable=protected-access


def _numbers(value, out: set[float]) -> set[float]:
  """Every number in a JSON value, as the percentage it prints as (x100, one decimal) and as itself."""
  if isinstance(value, bool):
    return out
  if isinstance(value, (int, float)):
    out.update({round(100 * value, 1), round(value, 1)})
  elif isinstance(value, dict):
    for item in value.values():
      _numbers(item, out)
  elif isinstance(value, list):
    for item in value:
      _numbers(item, out)
  return out


def headline_numbers(readme: str) -> list[float]:
  """The AER / precision / recall cells of the README's headline table (`| model | method | best layer | ...`)."""
  lines = readme.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith("| model | method | best layer | AER"))
  cells = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    cells += [float(c) for c in (c.strip() for c in line.strip("|").split("|")[3:]) if re.fullmatch(r"\d+\.\d", c)]
  return cells


def unsourced(cells: list[float], raw) -> list[float]:
  have = _numbers(raw, set())
  return [c for c in cells if c not in have]


def test_the_readme_headline_numbers_are_in_its_raw_file():
  raw = json.loads((REPO / HEADLINE_RAW).read_text(encoding="utf-8"))
  cells = headline_numbers((REPO / "README.md").read_text(encoding="utf-8"))
  assert len(cells) >= 30  # The table has 13 rows of AER, precision and recall.
  missing = unsourced(cells, raw)
  assert not missing, f"README headline numbers not in {HEADLINE_RAW}: {missing} (rerun make demo and commit its aer.json)"


def test_the_headline_check_catches_a_number_no_raw_file_has():
  table = ("| model | method | best layer | AER | precision | recall |\n|---|---|---:|---:|---:|---:|\n"
           "| eflomal | gdfa | - | 34.6 | 79.7 | 55.5 |\n")
  assert headline_numbers(table) == [34.6, 79.7, 55.5]
  assert unsourced([34.6, 79.7, 55.5], {"aer": 0.3461, "precision": 0.797, "recall": 0.5549}) == []
  assert unsourced([34.75], {"aer": 0.3461}) == [34.75]


def test_spearman_and_its_interval_match_scipy():
  from scipy import stats

  ledger = _ledger_module()
  x = [0.1, 0.4, 0.4, 0.2, 0.9, 0.5, 0.3, 0.8]
  y = [3.0, 1.0, 2.0, 2.0, 0.5, 1.5, 2.5, 0.7]
  assert abs(ledger.spearman(x, y) - stats.spearmanr(x, y).statistic) < 1e-12
  assert ledger.spearman([1, 1, 1], [1, 2, 3]) == 0.0
  low, high = ledger.bootstrap_interval(x, y, draws=400)
  assert low <= ledger.spearman(x, y) <= high and ledger.bootstrap_interval(x, y, draws=400) == (low, high)
