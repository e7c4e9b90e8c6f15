"""The tier rules of tests/tiers.py, run on small generated test files (pytester, in-process)."""

import pytest


def _run(pytester, source, *args):
  pytester.makeini("[pytest]\nmarkers =\n    slow: s\n    subprocess: p\n    aot: a\n    t5x: t\n    fast: f\n")
  pytester.makepyfile(test_generated=source)
  return pytester.runpytest_inprocess("-p", "tests.tiers", "-q", *args)


FAST_SOURCE = """
import pytest

@pytest.mark.fast("2-b", lambda p: p["n"] == 1)
@pytest.mark.parametrize("kind", ["a", "b"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_grid(n, kind):
  pass
"""


def test_fast_keeps_its_subset_and_moves_the_rest_of_the_grid_to_slow(pytester):
  # By hand: n=1 keeps a and b (the predicate), "2-b" keeps one more; 3 of the 6 are slow.
  unit = _run(pytester, FAST_SOURCE, "-m", "not slow", "--collect-only")
  got = sorted(line.strip() for line in unit.outlines if "test_grid[" in line)
  assert got == ["test_generated.py::test_grid[1-a]", "test_generated.py::test_grid[1-b]",
                 "test_generated.py::test_grid[2-b]"]
  slow = _run(pytester, FAST_SOURCE, "-m", "slow", "--collect-only")
  got = sorted(line.strip() for line in slow.outlines if "test_grid[" in line)
  assert got == ["test_generated.py::test_grid[2-a]", "test_generated.py::test_grid[3-a]",
                 "test_generated.py::test_grid[3-b]"]


def test_fast_on_a_plain_test_is_a_usage_error(pytester):
  result = _run(pytester, "import pytest\n\n@pytest.mark.fast('x')\ndef test_plain():\n  pass\n")
  assert result.ret != 0
  assert "only applies to parametrized tests" in result.stdout.str() + result.stderr.str()


START_SOURCE = """
import subprocess, sys

def test_starts_python():
  subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_starts_another_program():
  subprocess.run(["true"], check=True)
"""


def test_a_python_start_outside_the_subprocess_tier_fails_naming_the_marker(pytester):
  result = _run(pytester, START_SOURCE)
  result.assert_outcomes(passed=1, failed=1)
  assert "mark it @pytest.mark.subprocess" in result.stdout.str()
  assert "test_starts_python" in "\n".join(line for line in result.outlines if line.startswith("FAILED"))


@pytest.mark.parametrize("args, expected", [
    (["python3", "-c", "1"], True), ([__import__("sys").executable, "x.py"], True), ("python -m x", True),
    (["git", "status"], False), ("true", False), ([], False)])
def test_what_counts_as_starting_python(args, expected):
  from tests import tiers

  assert tiers._starts_python(args) is expected  # pylint: disable=protected-access


def test_every_aot_test_is_in_the_files_make_test_aot_collects():
  """`make test-aot` collects only its AOT_TESTS files (the whole suite would cost each worker ~19 s of CPU):
  an `aot` mark anywhere else would never run."""
  import pathlib
  import re

  repo = pathlib.Path(__file__).resolve().parents[1]
  found = re.search(r"^AOT_TESTS \?= (.+)$", (repo / "Makefile").read_text(), re.M)
  assert found, "the Makefile no longer sets AOT_TESTS"
  collected = set(found.group(1).split())
  marked = {str(p.relative_to(repo)) for p in (repo / "tests").rglob("*.py")
            if p.name != "test_tiers.py" and re.search(r"\bmark\.aot\b", p.read_text(encoding="utf-8"))}
  assert marked and marked <= collected, f"aot tests outside AOT_TESTS ({sorted(collected)}): {sorted(marked - collected)}"


@pytest.mark.parametrize("markexpr, tier", [
    ("contract and not slow and not subprocess and not aot and not t5x", "contract"),
    ("subprocess and not slow and not aot and not t5x", "subprocess"), ("slow and not aot and not t5x", "slow"),
    ("aot", "aot"), ("not slow and not aot and not contract and not subprocess and not t5x", None), ("", None),
    ("slow or subprocess", None), ("fast", None)])
def test_selected_tier(markexpr, tier):
  from tests import tiers

  assert tiers.selected_tier(markexpr) == tier


def test_a_tier_run_never_imports_a_file_that_does_not_name_the_tier(pytester):
  pytester.makepyfile(test_other="raise AssertionError('imported')\n")
  result = _run(pytester, "import pytest\n\n@pytest.mark.slow\ndef test_s():\n  pass\n", "-m", "slow and not aot")
  result.assert_outcomes(passed=1)
  assert "imported" not in result.stdout.str()


def test_a_tier_mark_its_file_never_names_is_refused_where_everything_is_collected(pytester):
  source = "import pytest\n\nhidden = getattr(pytest.mark, 'sl' + 'ow')\n\n@hidden\ndef test_h():\n  pass\n"
  result = _run(pytester, source)
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  assert "in the slow tier, but its file never says 'slow or fast'" in result.stderr.str()
