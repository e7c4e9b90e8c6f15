"""AER / P / R / F1 against hand-computed examples, gold readers, reports."""

import json

import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import aer
def test_score_with_possible_links_by_hand():
  predicted = [{(0, 0), (1, 1), (2, 2)}, set()]
  sure = [{(0, 0), (1, 2)}, {(0, 1)}]
  possible = [{(1, 1)}, {(0, 1), (1, 1)}]  # The first lacks its sure links: added.
  s = aer.score(predicted, sure, possible)
  # |A| = 3, |S| = 3, |A∩S| = 1 (0-0), |A∩P| = 2 (0-0, 1-1).
  assert s.precision == pytest.approx(2 / 3)
  assert s.recall == pytest.approx(1 / 3)
  assert s.f1 == pytest.approx(2 * (2 / 3) * (1 / 3) / (2 / 3 + 1 / 3))
  assert s.aer == pytest.approx(1 - 3 / 6)
  assert (s.num_predicted, s.num_sure, s.num_possible) == (3, 3, 5)


def test_score_sure_only_and_perfect():
  s = aer.score([{(0, 0), (1, 1)}], [{(0, 0), (1, 1)}])
  assert (s.precision, s.recall, s.f1, s.aer) == (1.0, 1.0, 1.0, 0.0)
  s = aer.score([{(0, 0), (0, 1)}], [{(0, 0)}])
  assert s.precision == 0.5 and s.recall == 1.0 and s.aer == pytest.approx(1 - 2 / 3)


def test_score_empty_predictions_do_not_divide_by_zero():
  s = aer.score([set(), set()], [{(0, 0)}, set()])
  assert (s.precision, s.recall, s.f1, s.aer) == (0.0, 0.0, 0.0, 1.0)
  s = aer.score([], [])
  assert (s.precision, s.recall, s.aer) == (0.0, 0.0, 1.0)
  with pytest.raises(ValueError, match="one entry per sentence pair"):
    aer.score([set()], [set(), set()])


def test_pharaoh_round_trip(tmp_path):
  path = tmp_path / "gold.txt"
  path.write_text("0-0 1?2 3p1\n\n2-0 2-1\n")
  gold = aer.read_pharaoh(str(path))
  assert gold == [aer.GoldLinks(frozenset({(0, 0)}), frozenset({(0, 0), (1, 2), (3, 1)})),
                  aer.GoldLinks(frozenset(), frozenset()),
                  aer.GoldLinks(frozenset({(2, 0), (2, 1)}), frozenset({(2, 0), (2, 1)}))]
  out = tmp_path / "out.txt"
  aer.write_pharaoh(str(out), gold)
  assert out.read_text() == "0-0 1?2 3?1\n\n2-0 2-1\n"
  assert aer.read_pharaoh(str(out)) == gold
  aer.write_pharaoh(str(out), [{(1, 0), (0, 3)}, frozenset()])
  assert out.read_text() == "0-3 1-0\n\n"
  assert [g.sure for g in aer.read_pharaoh(str(out))] == [{(0, 3), (1, 0)}, set()]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["gold.txt", "out.txt"]  # No temporary left.


def test_pharaoh_one_indexed(tmp_path):
  path = tmp_path / "gold.txt"
  path.write_text("1-1 2-3\n")
  assert aer.read_pharaoh(str(path), one_indexed=True)[0].sure == {(0, 0), (1, 2)}
  path.write_text("1-1\n0-2\n")
  with pytest.raises(UserError, match=r"gold.txt:2: .*0-indexed"):
    aer.read_pharaoh(str(path), one_indexed=True)


@pytest.mark.parametrize("line", ["0-0 1-x", "0:1", "1--2", "-1-2", "0-1-2"])
def test_pharaoh_malformed_line_names_file_and_line(tmp_path, line):
  path = tmp_path / "bad.txt"
  path.write_text(f"0-0\n{line}\n")
  with pytest.raises(UserError, match=r"bad.txt:2: bad link .*expected .*'i-j'"):
    aer.read_pharaoh(str(path))


def test_naacl_reader(tmp_path):
  path = tmp_path / "alignv2.txt"
  path.write_text("1 1 1 S\n1 2 3 P\n1 3 2\n\n3 1 2 S\n")
  gold = aer.read_naacl(str(path))
  assert len(gold) == 3
  assert gold[0].sure == {(0, 0), (2, 1)} and gold[0].possible == {(0, 0), (1, 2), (2, 1)}
  assert gold[1] == aer.GoldLinks(frozenset(), frozenset())
  assert gold[2].sure == {(0, 1)}
  assert len(aer.read_naacl(str(path), num_sentences=5)) == 5
  with pytest.raises(UserError, match="only 2 sentence pairs"):
    aer.read_naacl(str(path), num_sentences=2)
  assert aer.read_gold(str(path), "naacl") == gold


@pytest.mark.parametrize("line", ["1 1", "1 1 1 X", "a 1 1", "1 1 1 S extra", "0 1 1"])
def test_naacl_malformed_line(tmp_path, line):
  path = tmp_path / "gold.naacl"
  path.write_text(f"1 1 1\n{line}\n")
  with pytest.raises(UserError, match=r"gold.naacl:2: .*sentence_id i j"):
    aer.read_naacl(str(path))


def test_missing_file_and_unknown_format(tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    aer.read_pharaoh(str(tmp_path / "nope.txt"))
  with pytest.raises(UserError, match="unknown gold format"):
    aer.read_gold(str(tmp_path / "nope.txt"), "giza")


def _table():
  s = lambda a: aer.AlignmentScores(precision=0.5, recall=0.5, f1=0.5, aer=a, num_predicted=2, num_sure=2,
                                    num_possible=2)
  return {("argmax", 0): s(0.6), ("argmax", 1): s(0.4), ("argmax", 2): s(0.5),
          ("sinkhorn", 0): s(0.7), ("sinkhorn", 1): s(0.3), ("sinkhorn", 2): s(0.3)}


def test_best_layers_and_markdown_table():
  table = _table()
  best = aer.best_layers(table)
  assert {k: v[0] for k, v in best.items()} == {("", "argmax"): 1, ("", "sinkhorn"): 1}
  text = aer.format_table(table, title="demo")
  lines = text.splitlines()
  assert lines[0] == "**demo**"
  assert lines[2] == "| method | layer | P | R | F1 | AER |"
  assert "| argmax | 1 | 50.0 | 50.0 | 50.0 | **40.0** |" in lines
  assert "| sinkhorn | 2 | 50.0 | 50.0 | 50.0 | 30.0 |" in lines
  assert len(lines) == 4 + 6
  several = {("m1",) + k: v for k, v in table.items()} | {("m2", "argmax", 0): table[("argmax", 0)]}
  assert aer.format_table(several).splitlines()[0].startswith("| model | method |")
  assert aer.format_table({k: v._asdict() for k, v in table.items()}) == aer.format_table(table)


def test_plot_layer_curve(tmp_path):
  path = tmp_path / "curve.png"
  assert aer.plot_layer_curve(_table(), str(path), title="t") == str(path)
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.png"]
  several = {("m1",) + k: v for k, v in _table().items()}
  aer.plot_layer_curve(several, str(path))
  json.dumps(aer.score([{(0, 0)}], [{(0, 0)}]).as_dict())


def test_gold_links_outside_their_pair_are_one_error(tmp_path):
  """A 1-indexed file, or gold of other sentences, would score links past the sentence as misses."""
  from flax_xalign.errors import UserError

  pairs = [("a b c".split(), "x y".split()), ("d e".split(), "z w v".split())]
  good = tmp_path / "good.links"
  good.write_text("0-0 2-1\n1-2 0?0\n", encoding="utf-8")
  aer.check_gold_fits(aer.read_pharaoh(str(good)), pairs, gold_path="good", input_path="in")
  shifted = tmp_path / "one.links"  # the same links counted from 1
  shifted.write_text("1-1 3-2\n2-3 1?1\n", encoding="utf-8")
  with pytest.raises(UserError, match=r"entry 1: link 3-2 lies outside the pair \(3 source and 2 target.*from 1"):
    aer.check_gold_fits(aer.read_pharaoh(str(shifted)), pairs, gold_path="one", input_path="in")
  other = tmp_path / "other.links"  # 0-indexed, but not these sentences
  other.write_text("0-0\n1-1 4-2\n", encoding="utf-8")
  with pytest.raises(UserError, match="entry 2: link 4-2 lies outside.*belongs to this input"):
    aer.check_gold_fits(aer.read_pharaoh(str(other)), pairs, gold_path="other", input_path="in")
  with pytest.raises(UserError, match="has 1 entries but input in has 2 pairs"):
    aer.check_gold_fits(aer.read_pharaoh(str(good))[:1], pairs, gold_path="g", input_path="in")
