"""`xalign eflomal` in-process (the contract tier): Pharaoh links for a TSV bitext, the Bible's
split files a TsvBitextTask(links=...) reads, and one `error:` line for bad input."""

import random

import pytest

from flax_xalign.evaluation.word_alignment import statistical
from tests import testlib
from tests.hardening import harness

pytestmark = [pytest.mark.contract,
              pytest.mark.skipif(statistical.eflomal_version() is None, reason=statistical.INSTALL_HINT)]


def _bitext(path, n=60):
  pairs = testlib.sentences(random.Random(4), n)
  path.write_text("".join(f"{de}\t{en}\n" for en, de in pairs), encoding="utf-8")
  return [(de.split(), en.split()) for en, de in pairs]


def test_links_for_a_tsv_bitext(tmp_path, capfd):
  pairs = _bitext(tmp_path / "p.tsv")
  outcome = harness.run_main(capfd, "eflomal", [f"--input={tmp_path / 'p.tsv'}", f"--output={tmp_path / 'p.links'}"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert "grow-diag-final-and, 60 lines" in outcome.out
  links = statistical.read_links(str(tmp_path / "p.links"))
  assert len(links) == len(pairs)
  assert all(i < len(a) and j < len(b) for (a, b), pair_links in zip(pairs, links) for i, j in pair_links)
  # The toy bitext translates word i by word i: an aligner that works finds mostly the diagonal.
  diagonal = sum((i, i) in pair_links for pair_links in links for i in range(12))
  assert diagonal > 0.5 * sum(len(pair_links) for pair_links in links)


@pytest.mark.parametrize("flags, keywords", [
    ([], ("--input", "--bible")),
    (["--input=IN"], ("--input needs --output",)),
    (["--bible"], ("--output_dir",)),
    (["--input=IN", "--output=IN"], ("--output", "is the --input file")),
    (["--input=IN", "--output=OUT", "--symmetrize=max"], ("--symmetrize", "max")),
], ids=["nothing", "no_output", "bible_without_dir", "output_is_input", "unknown_symmetrisation"])
def test_bad_flags_are_one_error(tmp_path, capfd, flags, keywords):
  _bitext(tmp_path / "in.tsv", n=3)
  flags = [f.replace("IN", str(tmp_path / "in.tsv")).replace("OUT", str(tmp_path / "out.links")) for f in flags]
  harness.assert_user_error(harness.run_main(capfd, "eflomal", flags), *keywords)
  assert (tmp_path / "in.tsv").read_text(encoding="utf-8").count("\n") == 3  # The input is never overwritten.


@pytest.mark.slow  # eflomal over all 7,919 New Testament verse pairs (~40 s).
def test_bible_split_files_match_the_gold_word_lists(tmp_path, bible_data_dir, capfd):
  from flax_xalign.evaluation.word_alignment import word_align

  outcome = harness.run_main(capfd, "eflomal", ["--bible", f"--output_dir={tmp_path}"])
  assert outcome.code == 0, outcome.err[-2000:]
  pairs, sure = word_align.bible_gold("test")
  lines = (tmp_path / "test.tsv").read_text(encoding="utf-8").splitlines()
  assert [tuple(line.split("\t")) for line in lines] == [(" ".join(a), " ".join(b)) for a, b in pairs]
  links = statistical.read_links(str(tmp_path / "test.links"), num_pairs=len(pairs))
  from flax_xalign.evaluation.word_alignment import aer

  assert aer.score(links, sure).aer < 0.40  # eflomal's grow-diag-final-and: ~0.34 on these books.
  assert (tmp_path / "NOTICE").exists() and len((tmp_path / "train.tsv").read_text().splitlines()) == 6330
