"""Longest test files first: the order in which xdist hands files to its workers. Scheduling only: which tests
run, and each file's own order, are unchanged.

`--dist loadfile` gives a worker a whole file at a time, and xdist by default hands the files out by their
number of tests, most first. A file holding one long test came last that way: in the slow tier,
tests/hardening/test_writers.py (one 5-minute Ctrl-C loop) started when the other worker had nearly nothing
left, and ran alone. The slow tier's measured durations, replayed through xdist's scheduling, give 1,019 s
in that order and 935 s longest-file-first (1,869 s of tests on 2 workers).

This plugin sorts the selected tests by their file's expected time, the sum of its selected tests' durations
in tests/durations.json (DEFAULT_S for a test it does not list), longest first; the Makefile turns xdist's
own reordering off (`--no-loadscope-reorder`) so that this order is the one it follows. The durations are a
hint: a stale or missing entry changes only the order.

  pytest ... --store-durations    # merges this run's durations (setup + call + teardown) into the file
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

DURATIONS = pathlib.Path(__file__).with_name("durations.json")
DEFAULT_S = 0.2  # A test durations.json does not list: most tests take well under a second.
KEPT_S = 0.5  # Tests at least this long are written to the file; the rest are DEFAULT_S.


def pytest_addoption(parser):
  parser.addoption("--store-durations", action="store_true", default=False,
                   help=f"merge this run's test durations into {DURATIONS.name} (the order xdist hands out files)")


def load(path: pathlib.Path = DURATIONS) -> dict[str, float]:
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError):
    return {}
  return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def longest_files_first(nodeids: list[str], durations: dict[str, float]) -> list[str]:
  """`nodeids` grouped by file, files by their summed expected time (longest first), each file's order kept."""
  files: dict[str, list[str]] = {}
  for nodeid in nodeids:
    files.setdefault(nodeid.split("::", 1)[0], []).append(nodeid)
  expected = {name: sum(durations.get(n, DEFAULT_S) for n in ids) for name, ids in files.items()}
  order = sorted(files, key=lambda name: -expected[name])  # Stable: ties keep the collection order.
  return [nodeid for name in order for nodeid in files[name]]


@pytest.hookimpl(trylast=True)  # After -m and -k have deselected.
def pytest_collection_modifyitems(config, items):
  del config
  by_id = {item.nodeid: item for item in items}
  items[:] = [by_id[n] for n in longest_files_first([item.nodeid for item in items], load())]


class _Recorder:
  def __init__(self):
    self.durations: dict[str, float] = {}

  def pytest_runtest_logreport(self, report):
    self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration

  def pytest_sessionfinish(self, session):
    if session.testscollected and self.durations:
      merged = load()
      for nodeid, seconds in self.durations.items():
        if seconds >= KEPT_S:
          merged[nodeid] = round(seconds, 1)
        else:
          merged.pop(nodeid, None)
      write(merged)


def write(durations: dict[str, Any], path: pathlib.Path = DURATIONS) -> None:
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(dict(sorted(durations.items())), indent=0) + "\n", encoding="utf-8")
  tmp.replace(path)


def pytest_configure(config):
  # In the controller only (an xdist worker's reports reach the controller's hooks too).
  if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
    config.pluginmanager.register(_Recorder(), "flax_xalign_durations")
