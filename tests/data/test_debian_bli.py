"""The BLI gold built from Debian dictionaries (flax_xalign.data.sources.debian_bli, the Mueller reader)."""

import gzip
import os

import pytest

from flax_xalign.data.sources import debian, debian_bli
from flax_xalign.data.sources.debian_formats import mueller_translations, read_dictd

MUELLER_TABLE = """table
   [\u2197te\u026abl]
   1. _n.
      1) стол; to be at table быть за столом
      2) таблица; расписание; table of contents оглавление
      продолжение строки; слово
      3) _тех. планшайба
   2. _v. класть на стол
"""
MUELLER_PESSIMIST = "pessimist\n   [\u2197p\u025bs\u026am\u026ast] _n. пессимист\n"


def _write_dictd(folder, name, entries):
  """A dictd database (.index + .dict.dz) of (headword, body) entries; offsets in base 64."""
  b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

  def number(n):
    digits = ""
    while True:
      digits, n = b64[n % 64] + digits, n // 64
      if not n:
        return digits

  body, index = b"", ""
  for headword, text in entries:
    data = text.encode("utf-8")
    index += f"{headword}\t{number(len(body))}\t{number(len(data))}\n"
    body += data
  (folder / f"{name}.index").write_text(index, encoding="utf-8")
  with gzip.open(folder / f"{name}.dict.dz", "wb") as f:
    f.write(body)


def test_mueller_reader_on_a_small_file(tmp_path):
  _write_dictd(tmp_path, "mueller7", [("table", MUELLER_TABLE), ("pessimist", MUELLER_PESSIMIST)])
  entries = dict(read_dictd(tmp_path / "mueller7.index", tmp_path / "mueller7.dict.dz"))
  # Senses up to the first English example; continuation lines and labels (_тех.) skipped.
  assert mueller_translations(entries["table"]) == ["стол", "таблица", "расписание", "планшайба", "класть на стол"]
  assert mueller_translations(entries["pessimist"]) == ["пессимист"]


def test_merge_inverts_english_to_x_and_keeps_x_to_english_first():
  to_english = [("Haus", "House"), ("haus", "home"), ("Haus", "two words")]
  from_english = [("building", "Haus"), ("house", "Haus"), ("cell", "Zelle")]
  lexicon = debian_bli.merge_lexicon(to_english, from_english, max_translations=2)
  assert lexicon == {"haus": ["house", "home"], "zelle": ["cell"]}  # Capped at 2; multiword dropped.


def test_word_counts_merge_case_and_keep_the_frequent_form():
  counts = debian_bli.word_counts(["Die Datei, die Datei.", "(Datei) datei 42 «und»"])
  assert counts["datei"] == (4, "Datei") and counts["die"] == (2, "Die") and counts["und"] == (1, "und")
  assert "42" not in counts


def test_band_and_split_hand_computed():
  # sha256(word)[:8] mod 100 (computed by hand once): Datei 3, und 28, das 24, Haus 79, Tabelle 88, Zelle 33.
  assert [debian_bli.split_of_word(w) for w in ("Datei", "und", "das", "Haus", "Tabelle", "Zelle")] == [
      "dev", "dev", "dev", "test", "test", "test"]
  counts = {"datei": (9, "Datei"), "und": (9, "und"), "das": (20, "das"), "haus": (2, "Haus"),
            "tabelle": (5, "Tabelle"), "zelle": (3, "Zelle"), "ohne": (50, "ohne")}
  lexicon = {"datei": ["file"], "und": ["and"], "das": ["the", "that"], "haus": ["house"],
             "tabelle": ["table", "chart"], "zelle": ["cell"]}  # "ohne" is frequent but has no entry.
  # count >= 3, by count then word: das 20, datei 9, und 9, tabelle 5, zelle 3 (haus 2 is out); size 4 cuts zelle.
  assert debian_bli.band(counts, lexicon, min_count=3, size=4) == [("das", 20), ("Datei", 9), ("und", 9),
                                                                    ("Tabelle", 5)]
  sets = debian_bli.gold_sets(counts, lexicon, min_count=3, size=4)
  assert sets == {"dev": [("das", "the"), ("das", "that"), ("Datei", "file"), ("und", "and")],
                  "test": [("Tabelle", "table"), ("Tabelle", "chart")]}


def test_build_gold_writes_muse_files(tmp_path):
  text = ["das Haus und die Datei", "das Haus", "Datei Datei"]
  result = debian_bli.build_gold(tmp_path, "de", text=text, text_source="help/de.train.txt",
                                 to_english=[("Datei", "file")], from_english=[("house", "Haus")],
                                 sources=("dict-freedict-deu-eng",))
  assert (tmp_path / "dict/de-en.tsv").read_text(encoding="utf-8") == "datei\tfile\nhaus\thouse\n"
  assert (tmp_path / "bli/de-en.dev.txt").read_text(encoding="utf-8") == "Datei file\n"
  assert (tmp_path / "bli/de-en.test.txt").read_text(encoding="utf-8") == ""  # Haus: count 2 < MIN_COUNT.
  assert result["band_words"] == 1 and result["dev_pairs"] == 1 and result["test_words"] == 0


def _real_build():
  for root in (os.environ.get("FLAX_XALIGN_DEBIAN_ROOT"), os.path.expanduser("~/.cache/flax_xalign/debroot")):
    if root and not debian.required_packages(root, ("el", "ru"), ("help", "bli"))[1]:
      return root
  pytest.skip("Debian packages for el and ru BLI not unpacked (`make debian-data`).")


@pytest.mark.slow  # Parses the real Greek and Russian packages (~30 s).
def test_real_gold_files_are_muse_format(tmp_path):
  root = _real_build()
  manifest = debian.build(root, tmp_path, languages=("el", "ru"), sources=("help", "dict", "bli"))
  for code in ("el", "ru"):
    counts = manifest["counts"]["bli"][code]
    assert counts["band_words"] > 500 and counts["dev_words"] + counts["test_words"] == counts["band_words"]
    dev = {line.split(" ")[0] for line in (tmp_path / f"bli/{code}-en.dev.txt").read_text().splitlines()}
    for line in (tmp_path / f"bli/{code}-en.test.txt").read_text(encoding="utf-8").splitlines():
      source, english = line.split(" ")
      assert source not in dev and english == english.lower()
