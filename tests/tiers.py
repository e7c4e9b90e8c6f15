"""The test tiers (pytest plugin, loaded by tests/conftest.py).

Tiers are markers (pytest.ini lists them; `--strict-markers` refuses a misspelt one):

* unit (no marker): the default `make test`.
* contract: one file per entry point, in-process smoke runs on one shared trained MODEL_DIR
  (`make test-contract`).
* subprocess: starts a fresh Python (`make test-subprocess`).
* slow: full kernel grids, the full hardening matrix, real-size runs (`make test-slow`).
* aot, t5x: TPU pod compiles, real t5x (each its own make target and CI step); Apache Beam runs
  tests/data/test_cooc_beam.py in .venv-beam (make test-beam).

Two rules are enforced here rather than left to review:

* `@pytest.mark.fast(...)` on a parametrized test keeps a chosen subset of its parametrizations in the
  default tier and moves the rest to `slow` (the full grid), the way ott-jax's test suite splits its
  kernel grids. Arguments are callspec ids (`"3-sinkhorn"`) and/or predicates over the parameters
  (`lambda p: p["n"] == 3`); a parametrization matches if any argument does.
* A test that starts a fresh Python (`sys.executable`) must carry `subprocess` (or a heavier tier):
  otherwise it fails, naming the marker to add, so the default tier never silently pays an interpreter
  start again.
"""

import functools
import os
import pathlib
import re
import subprocess
import sys

import pytest

# Tiers that may start a Python; `contract` is in-process by definition, and so is the default tier.
PYTHON_TIERS = ("subprocess", "slow", "aot", "t5x")

# A tier's own run (`-m "<tier> and not <tier> ..."`, as the Makefile selects them) imports only the test
# files whose text holds one of these words: collecting the whole suite cost each xdist worker ~21 s of CPU.
# `fast` moves parametrizations to `slow`. A run that collects everything (the unit tier's) checks that
# every test of a tier lives in a file its words find (`_check_tier_words`), so no test is left out unseen.
TIER_WORDS = {"contract": ("contract",), "subprocess": ("subprocess",), "slow": ("slow", "fast"), "aot": ("aot",),
              "t5x": ("t5x",)}
_ONE_TIER = re.compile(r"\s*(\w+)(?:\s+and\s+not\s+\w+)*\s*")


def selected_tier(markexpr: str | None) -> str | None:
  """The tier a `-m` expression of the form `<tier> [and not <name>]...` requires; None for any other."""
  match = _ONE_TIER.fullmatch(markexpr or "")
  return match.group(1) if match and match.group(1) in TIER_WORDS else None


@functools.lru_cache(maxsize=None)
def file_names_tier(path: str, tier: str) -> bool:
  text = pathlib.Path(path).read_text(encoding="utf-8", errors="replace")
  return any(word in text for word in TIER_WORDS[tier])


def pytest_ignore_collect(collection_path, config):
  """In a tier's own run, skips the test files that cannot hold a test of that tier (never imported)."""
  tier = selected_tier(config.getoption("markexpr", None))
  if tier is None or not collection_path.is_file() or not collection_path.name.startswith("test_"):
    return None
  if collection_path.suffix == ".py" and not file_names_tier(str(collection_path), tier):
    return True
  return None


def _check_tier_words(config, items) -> None:
  if selected_tier(config.getoption("markexpr", None)) is not None:
    return  # Skipped files are not here to check; the runs that collect everything check.
  for item in items:
    for tier in TIER_WORDS:
      if item.get_closest_marker(tier) is not None and not file_names_tier(str(item.path), tier):
        raise pytest.UsageError(
            f"{item.nodeid} is in the {tier} tier, but its file never says {' or '.join(TIER_WORDS[tier])!r}: "
            f"the {tier} tier's own run would not collect it (tests/tiers.py TIER_WORDS); mark it in its file")


def _fast_matches(marker, item) -> bool:
  callspec = getattr(item, "callspec", None)
  if callspec is None:
    raise pytest.UsageError(
        f"{item.nodeid}: @pytest.mark.fast only applies to parametrized tests; mark the test `slow` instead")
  if not marker.args:
    raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.fast needs callspec ids or predicates")
  for rule in marker.args:
    if callable(rule) and rule(dict(callspec.params)):
      return True
    if isinstance(rule, str) and rule == callspec.id:
      return True
  return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Moves the parametrizations a `fast` marker does not keep into the `slow` tier (before -m runs)."""
  for item in items:
    marker = item.get_closest_marker("fast")
    if marker is not None and not _fast_matches(marker, item):
      item.add_marker(pytest.mark.slow)
  _check_tier_words(config, items)


def _starts_python(args) -> bool:
  if isinstance(args, (str, bytes, os.PathLike)):
    first = os.fsdecode(args).split()[0] if os.fsdecode(args).strip() else ""
  else:
    args = list(args)
    first = os.fsdecode(args[0]) if args else ""
  return first == sys.executable or os.path.basename(first).startswith("python")


@pytest.fixture(autouse=True)
def _python_starts_need_a_tier(request, monkeypatch):
  """Fails a test outside the Python-starting tiers that launches `sys.executable`."""
  if any(request.node.get_closest_marker(m) for m in PYTHON_TIERS):
    yield
    return
  real_init = subprocess.Popen.__init__
  nodeid = request.node.nodeid

  def guarded_init(self, args, *a, **kw):
    if _starts_python(args):
      raise AssertionError(
          f"{nodeid} starts a fresh Python ({args!r:.120}); mark it @pytest.mark.subprocess "
          "(its own tier: make test-subprocess) or test the code in-process")
    real_init(self, args, *a, **kw)

  monkeypatch.setattr(subprocess.Popen, "__init__", guarded_init)
  yield


@pytest.fixture(autouse=True)
def _aot_compiles_optimised(request):
  """The `aot` tier reports memory per chip: its programs get XLA's full optimisation (conftest turns
  most of it off for everything else)."""
  if request.node.get_closest_marker("aot") is None:
    yield
    return
  import jax  # pylint: disable=g-import-not-at-top

  before = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)
