"""The claims ledger (docs/results/claims.md) and the README's headline table come from committed raw files.

tools/claims_ledger.py writes the ledger from the raw JSON files it names; these tests regenerate it and
compare, check that every raw file it names is in the checkout (and tracked by git where there is one), and
that every number of the README's headline table is a number of the raw file the table names, and every
decimal of its results table (`| result | number | ...`) one of the raw files its row links (a page's raw
files by RESULT_PAGES_RAW), or a number of the paper the row quotes (PAPER_NUMBERS).
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


def _tool(name: str):
  """tools/NAME.py, a script rather than a package, loaded as the module NAME."""
  spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules.setdefault(name, module)  # (dataclasses look their module up there)
  spec.loader.exec_module(sys.modules[name])
  return sys.modules[name]


def _ledger_module():
  return _tool("claims_ledger")


def _table_rows(text: str, header: str) -> list[list[str]]:
  """The stripped cells of each row of the markdown table whose header line starts with `header`."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(header))
  rows = []
  for line in lines[start + 2:]:
    if not line.startswith("|"):
      break
    rows.append([c.strip() for c in line.strip().strip("|").split("|")])
  return rows


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
  return [float(c) for row in _table_rows(readme, "| model | method | best layer | AER") for c in row[3:]
          if re.fullmatch(r"\d+\.\d", c)]


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


# A results row that links a page (not a raw file) is checked against the page's raw files; a page missing
# here fails the test: a number that has no raw file does not belong in the table.
RESULT_PAGES_RAW = {
    "docs/results/gpu_science_h200.md": ("docs/results/gpu_science_h200/results.json",),
    "docs/results/bli_table1.md": ("docs/results/bli_table1.json",),
    "docs/results/code_switch_debian.md": ("docs/results/code_switch_debian.json",),
}
PAPER_NUMBERS = {50.4}  # The TCS paper's Table 1, XLM-R base (quoted beside ours, not measured here).


def _raw_numbers(path: str) -> set[float]:
  text = (REPO / path).read_text(encoding="utf-8")
  if path.endswith(".json"):
    return _numbers(json.loads(text), set())
  return {float(x) for x in re.findall(r"\d+\.\d+|\d+", text.replace(",", ""))}


def results_rows(readme: str) -> list[tuple[str, list[float], list[str]]]:
  """(the result's name, the decimals of its `number` cell, the docs/results files its row links) per row."""
  return [(cells[0], [float(x) for x in re.findall(r"(?<![\w.])\d+\.\d+", cells[1])],
           re.findall(r"\((docs/results/[^)#]+)", cells[-1])) for cells in _table_rows(readme, "| result | number |")]


def unsourced_results(rows) -> list[str]:
  problems = []
  for name, numbers, links in rows:
    raw = [f for link in links for f in (RESULT_PAGES_RAW.get(link, (link,)) if link.endswith(".md") else (link,))]
    if not raw or any(f.endswith(".md") for f in raw):
      problems.append(f"{name[:60]!r} links no raw file ({links})")
      continue
    have = set().union(*(_raw_numbers(f) for f in raw)) | PAPER_NUMBERS
    missing = [n for n in numbers if n not in have]
    if missing:
      problems.append(f"{name[:60]!r}: {missing} not in {raw}")
  return problems


def test_every_number_of_the_readme_results_table_is_in_its_raw_files():
  rows = results_rows((REPO / "README.md").read_text(encoding="utf-8"))
  assert len(rows) >= 8 and sum(len(numbers) for _, numbers, _ in rows) >= 20
  problems = unsourced_results(rows)
  assert not problems, "README results rows without a committed raw source: " + "; ".join(problems)


def test_the_results_check_catches_a_page_without_raw_files_and_a_number_not_in_them(tmp_path):
  table = ("| result | number | command, machine | details |\n|---|---|---|---|\n"
           "| a | **31.0** AER | x | [p](docs/results/e5_so_eflomal.md) |\n"
           "| b | Trans 37.8, 99.9 | x | [g](docs/results/align_mlm_grid.json) |\n")
  rows = results_rows(table)
  assert rows[1][1] == [37.8, 99.9]
  problems = unsourced_results(rows)
  assert len(problems) == 2 and "links no raw file" in problems[0] and "[99.9]" in problems[1], problems


def test_spearman_and_its_interval_match_scipy():
  from scipy import stats

  ledger = _ledger_module()
  x = [0.1, 0.4, 0.4, 0.2, 0.9, 0.5, 0.3, 0.8]
  y = [3.0, 1.0, 2.0, 2.0, 0.5, 1.5, 2.5, 0.7]
  assert abs(ledger.spearman(x, y) - stats.spearmanr(x, y).statistic) < 1e-12
  assert ledger.spearman([1, 1, 1], [1, 2, 3]) == 0.0
  low, high = ledger.bootstrap_interval(x, y, draws=400)
  assert low <= ledger.spearman(x, y) <= high and ledger.bootstrap_interval(x, y, draws=400) == (low, high)


def test_the_code_switch_seeds_page_table_is_what_its_raw_files_give():
  """docs/results/code_switch_seeds.md carries tools/code_switch_seeds.py's table verbatim (from the raw files)."""
  module = _tool("code_switch_seeds")
  table = module.table(module.load())
  assert table.count("\n") >= 14  # 3 seeds x 5 models, and the two header lines
  page = (REPO / "docs" / "results" / "code_switch_seeds.md").read_text(encoding="utf-8")
  assert table in page, "rerun python tools/code_switch_seeds.py and paste its table into the page"
