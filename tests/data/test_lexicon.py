"""The MUSE lexicon reader and the shipped Greek->English lexicon (rebuilt from the real wheel)."""

import pytest

from flax_xalign import errors
from flax_xalign.data.sources import bible
from flax_xalign.data.sources import lexicon
def _verse(greek, english, sure):
  return bible.GoldAlignment(verse_id="40001001", greek=tuple(greek), english=tuple(english), sure=tuple(sure))


def test_count_links_counts_every_link_of_a_group_lowercased_without_punctuation():
  verses = [
      # Λόγος is linked to "The" and "Word" (one group of 1 x 2), θεοῦ to "God's"; "—" is no word.
      _verse(["Λόγος", "θεοῦ"], ["The", "Word", "God’s", "—"], [(0, 0), (0, 1), (1, 2), (1, 3)]),
      _verse(["λόγος"], ["word"], [(0, 0)]),
  ]
  counts = lexicon.count_links(verses)
  assert counts == {"λόγος": {"the": 1, "word": 2}, "θεοῦ": {"god’s": 1}}


def test_most_frequent_translation_tie_break_and_min_count():
  counts = {
      "ἄνθρωπος": {"man": 3, "a": 3},      # Tie: "man" has fewer links overall than "a".
      "τις": {"a": 2, "one": 1},
      "ἀμήν": {"truly": 1, "amen": 1},     # Best count 1 < min_count 2: dropped.
      "ναί": {"yes": 2, "indeed": 2},      # Tie, equal totals (2 each): code-point order.
  }
  rows = lexicon.most_frequent_translations(counts, min_count=2)
  # "a" totals 5, "man" 3; sorted by count descending, then Greek word.
  assert rows == [("ἄνθρωπος", "man", 3), ("ναί", "indeed", 2), ("τις", "a", 2)]
  assert {r[0] for r in lexicon.most_frequent_translations(counts, min_count=1)} == set(counts)
  with pytest.raises(errors.UserError, match="min_count"):
    lexicon.most_frequent_translations(counts, min_count=0)


def test_read_lexicon_groups_translations_and_names_bad_lines(tmp_path):
  path = tmp_path / "lex.txt"
  path.write_text("λόγος word\nλόγος message\n\nθεός\tgod\nλόγος word\n", encoding="utf-8")
  assert lexicon.read_lexicon(path) == {"λόγος": ["word", "message"], "θεός": ["god"]}
  path.write_text("λόγος word\nθεός god deity\n", encoding="utf-8")
  with pytest.raises(errors.UserError, match=r"lex.txt:2: malformed line"):
    lexicon.read_lexicon(path)
  path.write_text("\n\n", encoding="utf-8")
  with pytest.raises(errors.UserError, match="no entries"):
    lexicon.read_lexicon(path)
  path.write_bytes(b"\xff\xfe word\n")
  with pytest.raises(errors.UserError, match="not UTF-8"):
    lexicon.read_lexicon(path)
  with pytest.raises(errors.UserError, match="does not exist"):
    lexicon.read_lexicon(tmp_path / "missing.txt")


@pytest.fixture(scope="module")
def rebuilt(bible_data_dir):
  del bible_data_dir  # Sets $FLAX_XALIGN_DATA_DIR.
  return lexicon.greek_english_lexicon("train")


def test_shipped_lexicon_is_the_rebuilt_one(rebuilt):
  shipped = lexicon.SHIPPED_GREEK_ENGLISH.read_text(encoding="utf-8")
  assert lexicon.format_lexicon(rebuilt) == shipped
  read = lexicon.read_lexicon(lexicon.SHIPPED_GREEK_ENGLISH)
  assert len(read) == len(rebuilt) == len(shipped.splitlines()) and all(len(t) == 1 for t in read.values())


def test_shipped_lexicon_hand_checked_entries(rebuilt):
  # Checked by hand against the link counts of the train books, e.g. θεοῦ: god 455, of 318, god's 76;
  # ἀλλήλους: one 43, another 43 (a tie: "another" has fewer links over the split than "one").
  entries = {greek: english for greek, english, _ in rebuilt}
  assert entries["θεοῦ"] == "god"
  assert entries["καὶ"] == "and"
  assert entries["λόγος"] == "word"
  assert entries["ἀγάπη"] == "love"
  assert entries["βασιλεία"] == "kingdom"
  assert entries["ἀλλήλους"] == "another"
  assert rebuilt[0] == ("καὶ", "and", 4211)
  # Train books only: a word that occurs only in Mark (test) is absent.
  test_only = {w.lower() for v in bible.gold_alignments("test") for w in v.greek} - {
      w.lower() for v in bible.gold_alignments("train") for w in v.greek}
  assert test_only and not test_only & set(entries)
  assert all(lexicon.is_word(e) and e == e.lower() and g == g.lower() for g, e in entries.items())
