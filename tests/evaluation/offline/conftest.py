"""Fixtures of the offline-suite tests: a suite written from the session's shared tiny run, and its scores.

Session-scoped: the contract file and the subprocess file share one suite and its in-process scores.
"""

import pytest

from tests.evaluation.offline.suite_testlib import MIN_COUNT, SIZES, TASK, GOLD


@pytest.fixture(scope="session")
def sources(shared_run, tmp_path_factory):
  root = tmp_path_factory.mktemp("offline_sources")
  for split, text in GOLD.items():
    (root / f"de-en.{split}.txt").write_text(text, encoding="utf-8")
  files = shared_run["corpus"]["files"]
  en = open(files[("en", "validation")], encoding="utf-8").read().splitlines()
  de = open(files[("de", "validation")], encoding="utf-8").read().splitlines()
  (root / "en-de.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in zip(en, de)), encoding="utf-8")
  return {"gold": str(root / "{lang}-en.{split}.txt"), "retrieval": str(root / "en-{lang}.tsv"), "root": root}


@pytest.fixture(scope="session")
def run(shared_run):
  from flax_xalign.runs import Run

  return Run.open(str(shared_run["dir"]))


@pytest.fixture(scope="session")
def suite(run, sources, tmp_path_factory):
  from flax_xalign.evaluation.offline.suite import SuiteSizes, write_suite

  folder = tmp_path_factory.mktemp("offline") / "suite"
  layout = write_suite(str(folder), run, task=TASK, languages=["de"], gold=sources["gold"],
                       retrieval=sources["retrieval"], min_count=MIN_COUNT, bible_languages=("de", "en"),
                       sizes=SuiteSizes(**SIZES), progress=lambda line: None)
  return {"dir": str(folder), "layout": layout}


@pytest.fixture(scope="session")
def scored(run, suite):
  from flax_xalign.evaluation.offline.scoring import score

  return score(run, suite["dir"], progress=lambda line: None)
