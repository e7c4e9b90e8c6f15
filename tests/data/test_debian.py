"""Tests for the Debian-package readers and builder (flax_xalign.data.sources.debian, debian_data CLI).

The parsers run on small files written here by hand (a .mo laid out with struct from the GNU
format description, a dictd index with base-64 numbers computed by hand, help pages); the real
build runs when the unpacked packages are found ($FLAX_XALIGN_DEBIAN_ROOT, `make debian-data`'s
~/.cache/flax_xalign/debroot, or /).
"""

import gzip
import hashlib
import os
import pathlib
import struct

import pytest

from flax_xalign.cli import debian_data
from flax_xalign.data.sources import debian
from flax_xalign.errors import UserError


def write_mo(entries, *, big_endian=False):
  """A GNU .mo file: 28-byte header, original and translation tables, then the strings."""
  order = ">" if big_endian else "<"
  count = len(entries)
  originals_at, translations_at = 28, 28 + 8 * count
  strings_at = 28 + 16 * count
  blob, originals, translations = b"", [], []
  for table, index in ((originals, 0), (translations, 1)):
    for entry in entries:
      table.append((len(entry[index]), strings_at + len(blob)))
      blob += entry[index] + b"\0"
  header = struct.pack(order + "7I", 0x950412DE, 0, count, originals_at, translations_at, 0, 0)
  tables = b"".join(struct.pack(order + "2I", *pair) for pair in originals + translations)
  return header + tables + blob


MO_ENTRIES = [
    (b"", b"Content-Type: text/plain; charset=UTF-8\nX-Accelerator-Marker: ~\n"),
    (b"~Open", "~Öffnen".encode()),
    (b"STR_SAVE\x04Save", b"Speichern"),
    (b"%1 file\x00%1 files", b"%1 Datei\x00%1 Dateien"),
    (b"Untranslated", b""),
    (b"Ne_w", b"Ne_u"),
    (b"OK", b"OK"),
]


@pytest.mark.parametrize("big_endian", [False, True])
def test_read_mo_both_byte_orders(big_endian):
  catalogue = debian.read_mo(write_mo(MO_ENTRIES, big_endian=big_endian))
  assert catalogue.header == {"Content-Type": "text/plain; charset=UTF-8", "X-Accelerator-Marker": "~"}
  assert catalogue.entries == [
      debian.MoEntry(None, "~Open", None, ("~Öffnen",)),
      debian.MoEntry("STR_SAVE", "Save", None, ("Speichern",)),
      debian.MoEntry(None, "%1 file", "%1 files", ("%1 Datei", "%1 Dateien")),
      debian.MoEntry(None, "Ne_w", None, ("Ne_u",)),
      debian.MoEntry(None, "OK", None, ("OK",)),
  ]
  # Markers and mnemonics dropped; plural -> first form; untranslated "OK" skipped.
  assert list(debian.gettext_pairs(catalogue)) == [
      ("Open", "Öffnen"), ("Save", "Speichern"), ("%1 file", "%1 Datei"), ("New", "Neu")]


def test_read_mo_latin1_charset_and_bad_files():
  entries = [(b"", b"Content-Type: text/plain; charset=ISO-8859-1\n"), (b"Size", "Größe".encode("latin-1"))]
  assert debian.read_mo(write_mo(entries)).entries == [debian.MoEntry(None, "Size", None, ("Größe",))]
  with pytest.raises(UserError, match="not a GNU .mo"):
    debian.read_mo(b"\0" * 40, where="x.mo")
  truncated = write_mo(MO_ENTRIES)[:60]
  with pytest.raises(UserError, match="past the end"):
    debian.read_mo(truncated)


def test_strip_mnemonic():
  assert debian.strip_mnemonic("H_inzufügen") == "Hinzufügen"
  assert debian.strip_mnemonic("Line _1:") == "Line 1:"
  assert debian.strip_mnemonic("FILE_NAME") == "FILE_NAME"
  assert debian.strip_mnemonic("_underline_ and _x") == "_underline_ and _x"


def test_dictd_numbers_and_freedict_entries(tmp_path):
  # Base 64, most significant digit first: A=0, b=27, BA=64, "/"=63.
  assert [debian.dictd_number(s) for s in ("A", "b", "BA", "/", "BAA")] == [0, 27, 64, 63, 4096]
  first = "abet /ɐbˈɛt/ <VT>\n1. उकसाना{बुरे~काम~के~लिये}\n      \"Example.\"\n2. भड़काना, बढ़ावा~देना\n"
  second = "lamp /læmp/\nlampe <fem>; lanterne [old]\n   Synonyms: {light}\n\n see: {lantern}\n"
  body = ("00-database-info\nabout\n" + first + second).encode("utf-8")
  info_len = len(b"00-database-info\nabout\n")
  first_len, second_len = len(first.encode()), len(second.encode())
  b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

  def number(n):
    digits = ""
    while True:
      digits = b64[n % 64] + digits
      n //= 64
      if not n:
        return digits

  index = (f"00databaseinfo\tA\t{number(info_len)}\n"
           f"abet\t{number(info_len)}\t{number(first_len)}\n"
           f"lamp\t{number(info_len + first_len)}\t{number(second_len)}\n")
  (tmp_path / "d.index").write_text(index, encoding="utf-8")
  with gzip.open(tmp_path / "d.dict.dz", "wb") as f:
    f.write(body)
  entries = list(debian.read_dictd(tmp_path / "d.index", tmp_path / "d.dict.dz"))
  assert entries == [("abet", first), ("lamp", second)]
  assert debian.freedict_translations(first) == ["उकसाना", "भड़काना", "बढ़ावा देना"]
  assert debian.freedict_translations(second) == ["lampe", "lanterne"]


def test_ding_and_dictionary_pairs(tmp_path):
  path = tmp_path / "de-en"
  path.write_text("# comment :: ignored\n"
                  "Sonnenbräune {f}; Bräune {f} | eine tiefe Bräune haben :: suntan; tan | to have a deep tan\n"
                  "laufen {vi} [sport] :: to run\n", encoding="utf-8")
  pairs = list(debian.read_ding(path))
  assert pairs == [("suntan", "Sonnenbräune"), ("suntan", "Bräune"), ("tan", "Sonnenbräune"),
                   ("tan", "Bräune"), ("run", "laufen")]
  gold = debian.dictionary_pairs(pairs + [("Run", "rennen"), ("run", "laufen"), ("ice cream", "Eis"),
                                          ("1x", "y"), ("tan", "Farbe")], max_translations=2)
  assert gold == [("run", "laufen"), ("run", "rennen"), ("suntan", "Sonnenbräune"), ("suntan", "Bräune"),
                  ("tan", "Sonnenbräune"), ("tan", "Bräune")]
  assert debian.is_word("घृणा") and debian.is_word("don't") and not debian.is_word("a b")


PAGE = """<html><body><div id="DisplayArea">
<h1 id="hd_id1">Heading</h1>
<p id="par_id1" class="paragraph"><a name="x"></a>Use <span id="swln1" class="switchinline"><span hidden="true"
 id="MACtext1" class="MAC"><span class="keycode">Command</span></span><span hidden="true" id="defaulttext1"><span
 class="keycode">Ctrl</span></span></span><span class="keycode"> + F</span> in $[officename].</p>
<p id="par_id2" class="paragraph">Line one<br>line&nbsp;two <img src="i.png" alt="Icon"> &amp; %PRODUCTNAME</p>
<p id="par_id3" class="paragraph"><img src="a.svg" alt="Icon"> 12</p>
<p id="par_id4">See <span class="bug">[text/x.xhp#y not found].</span>below.</p>
<p dir="auto">Title is: not a paragraph</p>
<p id="par_id1" class="paragraph">A copy keeps the first text.</p>
</div></body></html>"""


def test_parse_help_page():
  assert debian.parse_help_page(PAGE) == [
      ("par_id1", "Use Ctrl + F in LibreOffice."),
      ("par_id2", "Line one line two & LibreOffice"),
      ("par_id4", "See below."),
  ]


def test_split_of_is_the_sha256_bucket():
  for pid in ("par_id1", "par_id3145173", "par_id761615842549780"):
    bucket = int(hashlib.sha256(pid.encode()).hexdigest()[:16], 16) % 1000
    assert debian.split_of(pid) == ("train" if bucket < 900 else "validation" if bucket < 950 else "test")
  counts = {s: 0 for s in debian.SPLITS}
  for i in range(4000):
    counts[debian.split_of(f"par_id{i}")] += 1
  assert 3500 < counts["train"] < 3700 and 140 < counts["validation"] < 260 and 140 < counts["test"] < 260


def test_assign_pairs_keeps_held_out_lines_out_of_training():
  items = [("test", ("a", "A")), ("train", ("a", "A")), ("validation", ("b", "B")),
           ("test", ("c", "C")), ("validation", ("d", "X")), ("train", ("e", "X"))]
  assert debian.assign_pairs(items) == {"train": [("a", "A"), ("e", "X")], "validation": [("b", "B")],
                                        "test": [("c", "C")]}


def _page(lang, paragraphs):
  body = "".join(f'<p id="{pid}" class="paragraph">{text}</p>\n' for pid, text in paragraphs)
  return f'<html lang="{lang}"><body>{body}</body></html>'


def fake_root(root: pathlib.Path) -> pathlib.Path:
  """A root holding libreoffice-help-{en-us,hi}, libreoffice-l10n-hi and dict-freedict-eng-hin."""
  english = {"scalc/01/a.html": [(f"par_id{i}", f"Calc sentence {i}.") for i in range(40)],
             "swriter/guide/b.html": [(f"par_id{i}", f"Writer sentence {i}.") for i in range(40, 60)]
             + [("par_id99", "Shared words.")]}
  english["scalc/01/a.html"].append(("par_id97", "Shared words."))
  for folder, pages in (("en-US", english), ("hi", english)):
    for rel, paragraphs in pages.items():
      if folder == "hi":  # Every other paragraph translated; the rest fall back to English.
        paragraphs = [(pid, f"वाक्य {pid[6:]}।" if int(pid[6:]) % 2 == 0 else text) for pid, text in paragraphs]
      path = root / debian.HELP_ROOT / folder / "text" / rel
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(_page(folder, paragraphs), encoding="utf-8")
  mo = root / debian.L10N_ROOT / "hi" / "LC_MESSAGES" / "sw.mo"
  mo.parent.mkdir(parents=True)
  mo.write_bytes(write_mo([(b"", b"Content-Type: text/plain; charset=UTF-8\n"), (b"Save", "सहेजें".encode())]))
  dictd = root / debian.DICTD_ROOT
  dictd.mkdir(parents=True)
  entry = "able /ˈeɪbəl/\n1. समर्थ\n".encode()
  (dictd / "freedict-eng-hin.index").write_text(f"able\tA\t{'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'[len(entry)]}\n")
  with gzip.open(dictd / "freedict-eng-hin.dict.dz", "wb") as f:
    f.write(entry)
  for package in ("libreoffice-help-en-us", "libreoffice-help-hi", "libreoffice-l10n-hi", "dict-freedict-eng-hin"):
    doc = root / "usr/share/doc" / package
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(f"licence of {package}\n")
    with gzip.open(doc / "changelog.Debian.gz", "wt") as f:
      f.write("libreoffice (4:7.4.7-1+deb12u14) bookworm; urgency=medium\n")
  return root


def test_unknown_languages_are_refused(tmp_path):
  with pytest.raises(UserError, match="Unknown or no languages"):
    debian.build(tmp_path, tmp_path / "o", languages=["xx"])


def _real_root():
  wanted = ("libreoffice-help-en-us", "libreoffice-help-de", "libreoffice-help-hi", "libreoffice-l10n-ar",
            "dict-freedict-eng-deu", "trans-de-en", "dict-freedict-eng-ara")
  unpacked = os.path.expanduser("~/.cache/flax_xalign/debroot")  # where `make debian-data` puts them
  for root in (os.environ.get(debian_data.ROOT_ENV), unpacked, "/"):
    if root and not debian.required_packages(root, ("de", "hi", "ar"), debian.SOURCES)[1]:
      return root
  pytest.skip(f"Debian packages not found under ${debian_data.ROOT_ENV}, {unpacked} or /: need {' '.join(wanted)}"
              " (`make debian-data` unpacks them without root).")


@pytest.mark.slow  # Parses the real Debian packages (~1 min); the tests above build from small fake packages.
def test_real_build_counts(tmp_path):
  root = _real_root()
  manifest = debian.build(root, tmp_path, languages=("de", "hi", "ar"))
  counts = manifest["counts"]
  de, hi = counts["help"]["de"], counts["help"]["hi"]
  assert 20000 < de["pairs"]["train"] < 40000 and 1000 < de["pairs"]["test"] < 2000
  assert 2000 < sum(hi["pairs"].values()) < 5000 and "ar" not in counts["help"]
  labels = {line.split("\t")[0] for line in (tmp_path / "help_labels/de.train.tsv").read_text().splitlines()}
  assert labels == set(debian.TOPICS)
  for split in debian.SPLITS:  # No held-out German paragraph occurs in training.
    if split != "train":
      held = set((tmp_path / f"help/de.{split}.txt").read_text().splitlines())
      assert not held & set((tmp_path / "help/de.train.txt").read_text().splitlines())
  assert counts["gettext"]["ar"]["pairs"] > 10000 and counts["gettext"]["de"]["catalogues"] > 20
  assert counts["dict"]["de"]["pairs"] > 100000 and counts["dict"]["ar"]["english_words"] > 30000
  assert manifest["packages"]["libreoffice-help-de"]["version"].startswith("4:7.")
  assert (tmp_path / "LICENSES/trans-de-en.txt").stat().st_size > 100
