"""Symmetrisation (worked by hand), Pharaoh round trips, eflomal's input files and its absence.

None of these needs eflomal installed; the one test that runs it is skipped without it.
Matrices in the comments: rows = source words i, columns = target words j;
F = forward only, R = reverse only, X = both (the intersection), . = neither;
in the result, # marks a chosen link.
"""

import builtins
import random

import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import statistical as st
def test_intersection_and_union():
  forward, reverse = {(0, 0), (1, 2)}, {(0, 0), (2, 1)}
  assert st.intersection(forward, reverse) == {(0, 0)}
  assert st.union(forward, reverse) == {(0, 0), (1, 2), (2, 1)}
  assert st.symmetrise([forward, set()], [reverse, {(0, 0)}], "intersection") == [{(0, 0)}, set()]
  assert st.symmetrise([forward], [reverse], "union") == [{(0, 0), (1, 2), (2, 1)}]


def test_gdfa_grows_along_the_diagonal():
  #      j0 j1 j2 j3         result
  # i0   X  .  .  .          #  .  .  .
  # i1   .  F  .  .    ->    .  #  .  .
  # i2   .  .  R  .          .  .  #  .
  # i3   .  .  .  F          .  .  .  #
  # (1,1) is a diagonal neighbour of (0,0), row 1 and column 1 unaligned: added;
  # then (2,2) next to (1,1), then (3,3) next to (2,2), all in the union.
  forward = {(0, 0), (1, 1), (3, 3)}
  reverse = {(0, 0), (2, 2)}
  assert st.grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (2, 2), (3, 3)}


def test_gdfa_does_not_grow_into_a_point_whose_row_and_column_are_aligned():
  #      j0 j1 j2         result
  # i0   X  F  .          #  .  .
  # i1   R  X  .    ->    .  #  .
  # i2   .  .  F          .  .  #
  # (0,1) neighbours (0,0) but row 0 and column 1 are both aligned: refused;
  # same for (1,0). (2,2) is a diagonal neighbour of (1,1) with row 2 free: added.
  forward = {(0, 0), (0, 1), (1, 1), (2, 2)}
  reverse = {(0, 0), (1, 0), (1, 1)}
  assert st.grow_diag_final_and(forward, reverse) == {(0, 0), (1, 1), (2, 2)}


def test_gdfa_grows_when_only_one_side_is_unaligned():
  #      j0 j1         result
  # i0   X  F          #  #
  # i1   .  R          .  #
  # (0,1): side neighbour of (0,0); row 0 aligned but column 1 free: added
  # (OR, not AND, in grow-diag). (1,1): row 1 free: added.
  assert st.grow_diag_final_and({(0, 0), (0, 1)}, {(0, 0), (1, 1)}) == {(0, 0), (0, 1), (1, 1)}


def test_gdfa_final_and_needs_both_words_unaligned():
  #      j0 j1 j2 j3 j4         result
  # i0   .  .  .  .  F          .  .  .  .  .
  # i1   F  .  .  .  .          #  .  .  .  .
  # i2   .  .  .  .  .    ->    .  .  .  .  .
  # i3   .  .  .  X  .          .  .  .  #  .
  # i4   .  .  .  .  X          .  .  .  .  #
  # Neither (0,4) nor (1,0) touches the intersection (no growth). final-and:
  # (0,4): row 0 free but column 4 aligned: not added (plain "final" would);
  # (1,0): row 1 and column 0 both free: added.
  forward = {(0, 4), (1, 0), (3, 3), (4, 4)}
  reverse = {(3, 3), (4, 4)}
  assert st.grow_diag_final_and(forward, reverse) == {(1, 0), (3, 3), (4, 4)}


def test_gdfa_final_and_takes_forward_before_reverse():
  #      j0 j1 j2 j3 j4         result
  # i0   .  .  .  .  .          .  .  .  .  .
  # i1   .  .  .  .  .          .  .  .  .  .
  # i2   .  .  .  .  .    ->    .  .  .  .  .
  # i3   .  .  .  .  X          .  .  .  .  #
  # i4   F  R  .  .  .          #  .  .  .  .
  # No neighbours of (3,4) in the union. final-and over forward adds (4,0)
  # (row 4, column 0 free); then reverse's (4,1) finds row 4 taken.
  forward = {(3, 4), (4, 0)}
  reverse = {(3, 4), (4, 1)}
  assert st.grow_diag_final_and(forward, reverse) == {(3, 4), (4, 0)}
  # Swapped, reverse's (4,0) comes second and is refused instead.
  assert st.grow_diag_final_and(reverse, forward) == {(3, 4), (4, 1)}


def test_gdfa_without_intersection_and_empty():
  #      j0 j1 j2        result
  # i0   F  .  .         #  .  .
  # i1   R  .  .   ->    .  .  .     empty intersection: nothing grows; final-and
  # i2   .  .  R         .  .  #     adds (0,0), then (1,0) finds column 0 taken,
  #                                  then (2,2).
  assert st.grow_diag_final_and({(0, 0)}, {(1, 0), (2, 2)}) == {(0, 0), (2, 2)}
  assert st.grow_diag_final_and(set(), set()) == frozenset()
  assert st.grow_diag_final_and({(2, 3)}, set()) == {(2, 3)}


def test_gdfa_lies_between_intersection_and_union():
  rng = random.Random(0)
  for _ in range(300):
    n, m = rng.randint(1, 8), rng.randint(1, 8)
    forward = {(rng.randrange(n), j) for j in range(m) if rng.random() < 0.8}  # one source per target
    reverse = {(i, rng.randrange(m)) for i in range(n) if rng.random() < 0.8}
    result = st.grow_diag_final_and(forward, reverse)
    assert forward & reverse <= result <= forward | reverse
    assert st.grow_diag_final_and(forward, forward) == forward  # agreement: nothing to add or drop


def test_symmetrise_checks_its_arguments():
  with pytest.raises(UserError, match="unknown symmetrisation 'grow-diag'"):
    st.symmetrise([set()], [set()], "grow-diag")
  with pytest.raises(ValueError, match="1 forward but 2 reverse"):
    st.symmetrise([set()], [set(), set()])


def test_pharaoh_round_trip(tmp_path):
  alignments = [{(0, 0), (10, 2), (1, 1)}, set(), {(3, 12)}]
  path = str(tmp_path / "links.txt")
  st.write_links(path, alignments)
  assert (tmp_path / "links.txt").read_text() == "0-0 1-1 10-2\n\n3-12\n"
  assert st.read_links(path, num_pairs=3) == alignments
  assert st.parse_links("  2-0\t0-1  ") == {(2, 0), (0, 1)}
  assert st.format_links([(1, 0), (0, 3)]) == "0-3 1-0"


def test_pharaoh_reader_errors(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_text("0-0\n1-x\n")
  with pytest.raises(UserError, match=r"bad.txt:2: bad link '1-x'"):
    st.read_links(str(bad))
  with pytest.raises(UserError, match="has 2 lines but there are 3 sentence pairs"):
    st.read_links(str(tmp_path / "bad.txt"), num_pairs=3)
  with pytest.raises(UserError, match="does not exist"):
    st.read_links(str(tmp_path / "missing.txt"))
  with pytest.raises(UserError, match="bad link '0p1'"):
    st.parse_links("0p1")  # possible links belong in gold files (aer.read_pharaoh), not aligner output


def test_eflomal_input_files_are_lowercased_lines(tmp_path):
  path = tmp_path / "src.txt"
  st.write_sentences(str(path), [["Ἐν", "ἀρχῇ", "ἦν"], ["In", "THE", "beginning"]])
  assert path.read_text(encoding="utf-8") == "ἐν ἀρχῇ ἦν\nin the beginning\n"
  st.write_sentences(str(path), [["In", "The"]], lowercase=False)
  assert path.read_text(encoding="utf-8") == "In The\n"
  with pytest.raises(UserError, match="contains whitespace"):
    st.write_sentences(str(path), [["two words"]])
  with pytest.raises(UserError, match="is empty"):
    st.write_sentences(str(path), [["a", ""]])


def test_missing_eflomal_names_the_pip_command(monkeypatch):
  real_import = builtins.__import__

  def no_eflomal(name, *args, **kwargs):
    if name == "eflomal" or name.startswith("eflomal."):
      raise ImportError("No module named 'eflomal'")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_eflomal)
  assert st.eflomal_version() is None
  with pytest.raises(UserError, match=r"pip install eflomal==2\.0\.0"):
    st.run_eflomal([(["a"], ["b"])])


def test_eflomal_refuses_an_empty_side():
  pytest.importorskip("eflomal")
  with pytest.raises(UserError, match="pair 1 has an empty side"):
    st.run_eflomal([(["a"], ["b"]), ([], ["c"])])


def test_eflomal_aligns_a_toy_corpus(tmp_path):
  pytest.importorskip("eflomal")
  # Every German word is its English word reversed, in the same order: any
  # sensible aligner finds the diagonal for most words.
  rng = random.Random(1)
  vocab = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "house"]
  english = [[rng.choice(vocab) for _ in range(rng.randint(3, 8))] for _ in range(300)]
  pairs = [([w[::-1] for w in e], e) for e in english]
  result = st.run_eflomal(pairs, work_dir=str(tmp_path))
  assert len(result.forward) == len(result.reverse) == 300 and result.seconds > 0
  assert (tmp_path / "source.txt").read_text().splitlines()[0] == " ".join(pairs[0][0])
  for links in result.forward:  # forward: each target word has at most one source word
    targets = [j for _, j in links]
    assert len(targets) == len(set(targets))
  for links in result.reverse:  # reverse: each source word has at most one target word
    sources = [i for i, _ in links]
    assert len(sources) == len(set(sources))
  gdfa = st.symmetrise(result.forward, result.reverse)
  diagonal = [{(i, i) for i in range(len(e))} for e in english]
  hits = sum(len(g & d) for g, d in zip(gdfa, diagonal))
  assert hits / sum(len(d) for d in diagonal) > 0.8


def test_best_layer_table_lists_peers_under_the_diagonal():
  from flax_xalign.evaluation.word_alignment import report
  def scores(aer):
    return {"aer": aer, "precision": 0.5, "recall": 0.25}

  ours = {"pairs": 3, "methods": ["argmax"], "diagonal_baseline": scores(0.742), "encoding": "joint",
          "similarity": "dot", "best": {"argmax": {"layer": 2, **scores(0.6)}}}
  table = report.best_layer_table({"ours": ours}, show_aligner=False,
                                  peers={"eflomal 2.0.0": {"grow-diag-final-and": scores(0.348)}})
  rows = table.splitlines()[2:]
  assert rows == ["| (no model) | diagonal | - | 74.2 | 50.0 | 25.0 |",
                  "| eflomal 2.0.0 | grow-diag-final-and | - | 34.8 | 50.0 | 25.0 |",
                  "| ours | argmax | 2 | 60.0 | 50.0 | 25.0 |"]
