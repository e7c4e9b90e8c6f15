"""Transfer task data: book groups, gold Greek labels, derived copies of examples."""

import pytest

from flax_xalign.evaluation.transfer import transfer_data
from flax_xalign.evaluation.transfer.transfer_data import LabelledSentence, TaggedSentence
from tests.evaluation.transfer_testlib import FakeLanguage


def test_book_groups():
  assert [transfer_data.book_group(v) for v in
          ("40001001", "43021025", "44001001", "45001001", "57001025", "58001001",
           "65001025", "66022021")] == [
              "gospels", "gospels", "acts", "pauline", "pauline", "general", "general",
              "revelation"]
  covered = sorted(b for books in transfer_data.BOOK_GROUPS.values() for b in books)
  assert covered == list(range(40, 67))
  with pytest.raises(ValueError):
    transfer_data.book_group("01001001")


def test_greek_tasks_read_gold_labels(bible_data_dir):
  del bible_data_dir  # Sets $FLAX_XALIGN_DATA_DIR.
  pos = transfer_data.greek_pos("test")
  assert pos[0] == TaggedSentence(("Ἀρχὴ", "τοῦ", "εὐαγγελίου", "Ἰησοῦ", "χριστοῦ"),
                                  ("noun", "det", "noun", "noun", "noun"))
  assert sum(len(s.words) for s in pos) == 14651
  assert all(len(s.words) == len(s.tags) for s in pos)
  assert {t for s in pos for t in s.tags} <= set(transfer_data.GREEK_POS_TAGS)
  verses = transfer_data.greek_verse_classification("test")
  counts = {g: sum(v.label == g for v in verses) for g in transfer_data.BOOK_GROUPS}
  # Whole-book splits: Acts and Revelation never reach the test split.
  assert counts == {"gospels": 673, "acts": 0, "pauline": 104, "general": 108, "revelation": 0}
  assert verses[0].words == pos[0].words


def test_derive_moves_tags_with_words_and_seeds_by_index():
  language = FakeLanguage(vocab_size=10, invert=True)
  examples = [TaggedSentence(("a", "b", "c"), ("x", "y", "z")), TaggedSentence(("d",), ("w",))]
  assert transfer_data.derive(examples, language) == [
      TaggedSentence(("c", "b", "a"), ("z", "y", "x")), TaggedSentence(("d",), ("w",))]
  assert language.seeds == [0, 1]
  assert transfer_data.derive([LabelledSentence(("a", "b"), "k")], language,
                              sentence_seeds=[7]) == [LabelledSentence(("b", "a"), "k")]
  assert language.seeds == [0, 1, 7]


def test_derive_with_a_synthetic_language_repairs_bio():
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage

  language = SyntheticLanguage(("trans", "inv"), 50)
  ner = [TaggedSentence(("a", "b", "c"), ("B-PER", "I-PER", "O"))]
  assert transfer_data.derive(ner, language) == [
      TaggedSentence(("c", "b", "a"), ("O", "B-PER", "I-PER"))]
  pos = [TaggedSentence(("a", "b"), ("noun", "verb"))]
  assert transfer_data.derive(pos, language) == [TaggedSentence(("b", "a"), ("verb", "noun"))]
