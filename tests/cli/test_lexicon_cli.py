"""`xalign lexicon` in-process (the contract tier): the Greek->English lexicon rebuilt from
the Bible wheel's gold alignments is the shipped file, and bad flags are one `error:` line. The counting
and the reader are tested in tests/data/test_lexicon.py."""

import pytest

from flax_xalign.data.sources import lexicon
from tests.hardening import harness

pytestmark = pytest.mark.contract


def test_writes_the_shipped_lexicon(bible_data_dir, tmp_path, capfd):
  out = tmp_path / "grc-en.txt"
  outcome = harness.run_main(capfd, "lexicon", [f"--output={out}"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert out.read_text(encoding="utf-8") == lexicon.SHIPPED_GREEK_ENGLISH.read_text(encoding="utf-8")


@pytest.mark.parametrize("flags, keywords", [
    (["--min_count=0"], ("min_count=0", "at least 1")),
    (["--split=dev"], ("--split", "dev")),
    (["--min_count=two"], ("--min_count", "two")),
], ids=["min_count_zero", "unknown_split", "min_count_not_a_number"])
def test_refuses_bad_flags(flags, keywords, tmp_path, capfd):
  out = tmp_path / "grc-en.txt"
  outcome = harness.run_main(capfd, "lexicon", [f"--output={out}", *flags])
  harness.assert_user_error(outcome, *keywords)
  assert not out.exists()


def test_needs_an_output(capfd):
  harness.assert_user_error(harness.run_main(capfd, "lexicon", []), "--output")
