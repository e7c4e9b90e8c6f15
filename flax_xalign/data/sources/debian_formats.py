"""The file formats of the Debian packages that `data/debian.py` reads: GNU .mo catalogues and dictionaries.

* `read_mo`: a GNU gettext `.mo` catalogue (the LibreOffice l10n packages),
  with `gettext_pairs` turning its entries into (English, translation)
  pairs of text (mnemonics stripped).
* `read_dictd` / `freedict_translations`: a dictd `.index` + `.dict(.dz)`
  dictionary (FreeDict); `read_ding`: the Ding German-English list;
  `dictionary_pairs` keeps single-word pairs.

Pure readers of bytes and files; `debian.py` decides what to read and where
the results go.
"""

from __future__ import annotations

import collections
import gzip
import os
import re
import struct
import unicodedata
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from flax_xalign import errors

PathLike = str | os.PathLike
PRODUCT_NAME = "LibreOffice"
# The product-name variables (and their misspellings in LibreOffice 7.4's sources);
# "$[...]" also covers translated copies of the variable (es: "$[nombre de la oficina]").
_PRODUCT_VARIABLES = re.compile(r"\$\[[^\]]*\]|%PRODUCTNAME|%PRDUCTNAME|%PROCUCTNAME|%PRODUCNTAME")
_LETTER = re.compile(r"[^\W\d_]")
_SPACES = re.compile(r"\s+")


def clean_text(text: str) -> str:
  """Product variables -> "LibreOffice", whitespace collapsed, ends stripped."""
  return _SPACES.sub(" ", _PRODUCT_VARIABLES.sub(PRODUCT_NAME, text)).strip()


def has_letter(text: str) -> bool:
  return bool(_LETTER.search(text))


# ------------------------------------------------------------------ GNU .mo


class MoEntry(NamedTuple):
  """One translated message of a `.mo` catalogue.

  Attributes:
    context: msgctxt, or None.
    msgid: the source (English) string.
    msgid_plural: the plural source string, or None.
    msgstr: the translations (one per plural form; one for a plain entry).
  """
  context: str | None
  msgid: str
  msgid_plural: str | None
  msgstr: tuple[str, ...]


class MoCatalogue(NamedTuple):
  header: dict[str, str]
  entries: list[MoEntry]


_MO_MAGIC = 0x950412DE


def _mo_charset(header: bytes) -> str:
  match = re.search(rb"charset=([A-Za-z0-9_.:-]+)", header)
  charset = match.group(1).decode("ascii") if match else "utf-8"
  return "utf-8" if charset.upper() == "CHARSET" else charset


def read_mo(data: bytes, *, where: str = "the .mo file") -> MoCatalogue:
  """Parses a GNU gettext `.mo` catalogue (either byte order, format revision 0 or 1).

  Layout (GNU gettext manual, "The Format of GNU MO Files"): magic 0x950412de as a 4-byte
  word in the file's byte order, revision, N, offset of the original-string table, offset
  of the translation table; each table holds N (length, offset) pairs. An original is
  `[msgctxt "\\x04"] msgid ["\\0" msgid_plural]`; a translation is the plural forms joined
  by "\\0". The header is the entry with an empty msgid and no context.

  Returns:
    The header fields (`Name: value` lines) and the other entries with at least one
    non-empty translation, in file order.

  Raises:
    UserError: not a .mo file, or a table pointing outside the file (naming `where`).
  """
  if len(data) < 20:
    raise errors.UserError(f"{where}: {len(data)} bytes is too short for a .mo catalogue.")
  for order in "<>":
    if struct.unpack(order + "I", data[:4])[0] == _MO_MAGIC:
      break
  else:
    raise errors.UserError(f"{where}: not a GNU .mo catalogue (magic {data[:4].hex()}).")
  revision, count, originals, translations = struct.unpack(order + "4I", data[4:20])
  if revision >> 16 > 1:
    raise errors.UserError(f"{where}: unsupported .mo format revision {revision >> 16}.")

  def strings(table: int) -> list[bytes]:
    end = table + 8 * count
    if end > len(data):
      raise errors.UserError(f"{where}: string table at {table} runs past the end of the file.")
    result = []
    for length, offset in struct.iter_unpack(order + "2I", data[table:end]):
      if offset + length > len(data):
        raise errors.UserError(f"{where}: a string at {offset} runs past the end of the file.")
      result.append(data[offset:offset + length])
    return result

  pairs = list(zip(strings(originals), strings(translations)))
  raw_header = next((value for key, value in pairs if key == b""), b"")
  charset = _mo_charset(raw_header)
  header = {}
  for line in raw_header.decode(charset, errors="replace").splitlines():
    name, colon, value = line.partition(":")
    if colon:
      header[name.strip()] = value.strip()
  entries = []
  for key, value in pairs:
    if key == b"":
      continue
    context, sep, rest = key.partition(b"\x04")
    if not sep:
      context, rest = None, key
    msgid, _, plural = rest.partition(b"\x00")
    forms = tuple(form.decode(charset, errors="replace") for form in value.split(b"\x00"))
    if not any(forms):
      continue
    entries.append(MoEntry(None if context is None else context.decode(charset, errors="replace"),
                           msgid.decode(charset, errors="replace"),
                           plural.decode(charset, errors="replace") if b"\x00" in rest else None,
                           forms))
  return MoCatalogue(header, entries)


def strip_mnemonic(text: str) -> str:
  """Drops a GTK mnemonic underscore ("Ne_u", "_Add"): the only "_" in the string, before a
  letter or digit, and not inside an upper-case identifier such as FILE_NAME."""
  at = text.find("_")
  if at < 0 or text.count("_") > 1 or at + 1 == len(text) or not text[at + 1].isalnum():
    return text
  if at > 0 and text[at - 1].isupper() and text[at + 1].isupper():
    return text
  return text[:at] + text[at + 1:]


def gettext_pairs(catalogue: MoCatalogue) -> Iterator[tuple[str, str]]:
  """(English, translation) of a catalogue's entries, cleaned for bitext.

  The singular msgid pairs with the first plural form (languages number their forms
  differently). The accelerator marker the header names (`X-Accelerator-Marker`, "~" in
  LibreOffice) and GTK mnemonic underscores (`strip_mnemonic`, LibreOffice's .ui dialogs)
  are removed, product variables rendered, whitespace collapsed; untranslated
  (equal to the msgid) and letterless entries are skipped.
  """
  marker = catalogue.header.get("X-Accelerator-Marker", "")
  for entry in catalogue.entries:
    source, target = entry.msgid, entry.msgstr[0]
    if marker:
      source, target = source.replace(marker, ""), target.replace(marker, "")
    source, target = clean_text(strip_mnemonic(source)), clean_text(strip_mnemonic(target))
    if source and target and source != target and has_letter(source) and has_letter(target):
      yield source, target


# --------------------------------------------------------------- dictionaries

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}
_BRACKETED = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|\([^()]*\)|<[^<>]*>")
_SENSE_NUMBER = re.compile(r"^\d+\.\s*")
_WORD_PUNCTUATION = frozenset("'’.-")


def dictd_number(text: str) -> int:
  """A dictd index number (base 64, digits A-Z a-z 0-9 + /, most significant first)."""
  value = 0
  for char in text:
    value = value * 64 + _B64_VALUE[char]
  return value


def read_dictd(index_path: PathLike, dict_path: PathLike) -> Iterator[tuple[str, str]]:
  """(headword, definition) of a dictd database, in index order.

  `dict_path` is `.dict` or dictzip `.dict.dz` (gzip-compatible, read whole). Database
  entries (headwords starting `00database` / `00-database`) are skipped.
  """
  opener = gzip.open if str(dict_path).endswith(".dz") else open
  with opener(dict_path, "rb") as f:
    body = f.read()
  with open(index_path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      fields = line.rstrip("\n").split("\t")
      if len(fields) != 3:
        raise errors.UserError(f"{index_path}:{number}: expected 3 tab-separated fields "
                               "(headword, offset, length) of a dictd index.")
      headword = fields[0].strip()
      if not headword or headword.startswith(("00database", "00-database")):
        continue
      offset, length = dictd_number(fields[1]), dictd_number(fields[2])
      yield headword, body[offset:offset + length].decode("utf-8", errors="replace")


def _words(text: str) -> list[str]:
  """Comma/semicolon-separated translations of a sense line, notes removed."""
  text = text.replace("~", " ")
  previous = None
  while previous != text:  # Nested brackets: remove innermost first.
    previous, text = text, _BRACKETED.sub(" ", text)
  return [w for w in (clean_text(part) for part in re.split(r"[,;]", text)) if w]


def freedict_translations(definition: str) -> list[str]:
  """The translations of a FreeDict (dictd) entry, in sense order.

  The first line is the headword (with IPA and part of speech); each following line at the
  left margin is a sense (`1. word, word`); indented lines are examples, notes, synonyms
  and cross references, and are skipped.
  """
  result = []
  for line in definition.split("\n")[1:]:
    if not line.strip() or line[0].isspace():
      continue
    for word in _words(_SENSE_NUMBER.sub("", line)):
      if word not in result:
        result.append(word)
  return result


def read_ding(path: PathLike) -> Iterator[tuple[str, str]]:
  """(English, German) pairs of the Ding `trans-de-en` file (`de :: en` lines).

  Each side's first `|` group is the entry proper (later groups are inflections and
  phrases); its `;`-separated synonyms pair with each other. English verbs lose `to `.
  """
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.startswith("#") or " :: " not in line:
        continue
      german, english = line.rstrip("\n").split(" :: ", 1)
      germans = _words(german.split(" | ", 1)[0])
      englishes = [re.sub(r"^to ", "", w) for w in _words(english.split(" | ", 1)[0])]
      for en in englishes:
        for de in germans:
          yield en, de


def is_word(text: str) -> bool:
  """One word: starts with a letter; letters, combining marks (Devanagari vowel signs,
  Arabic harakat), digits and inner ' ’ . - only; no space."""
  if not text or not text[0].isalpha() or text[-1] in _WORD_PUNCTUATION:
    return False
  return all(unicodedata.category(c)[0] in "LMN" or c in _WORD_PUNCTUATION for c in text)


def dictionary_pairs(pairs: Iterable[tuple[str, str]], *, max_translations: int = 5
                     ) -> list[tuple[str, str]]:
  """BLI gold from (English, foreign) candidates: single words, English lowercased,
  first `max_translations` distinct translations per English word, sorted by English word."""
  by_word: dict[str, list[str]] = collections.defaultdict(list)
  for en, other in pairs:
    en = en.lower()
    if is_word(en) and is_word(other) and other not in by_word[en] and len(by_word[en]) < max_translations:
      by_word[en].append(other)
  return [(en, other) for en in sorted(by_word) for other in by_word[en]]


_MUELLER_SENSE_START = re.compile(r"^(?:_[IVX]+\s*)?(?:\[[^\]]*\]\s*)?(?:\d+[.)]\s*)?(?:(?:_[^\s.]+\.)\s*)*")
_LATIN = re.compile(r"[A-Za-z]")


def mueller_translations(definition: str) -> list[str]:
  """The Russian translations of a Mueller English-Russian entry (`mueller7-dict`, a dictd body).

  The body is the headword line, then indented lines: homonym marks (`_I`), the transcription
  (`[...]`), part-of-speech senses (`1. _n.`) and numbered senses (`1) word, word; example`)
  that wrap onto continuation lines. A line is a sense when it starts with a homonym mark, a
  transcription, a sense number or a `_label.` (continuation lines start with a word and are
  skipped). After its labels, a sense is `;`-separated items: translations come first and the
  English examples after, so the items are read up to the first one with a Latin letter;
  each item's `,`-separated words go through `_words` (brackets dropped).
  """
  result = []
  for line in definition.split("\n")[1:]:
    text = line.strip()
    if not text or not (text[0] in "_[" or text[0].isdigit()):
      continue
    text = re.sub(r"(?:^|\s)_[^\s.]+\.", " ", _MUELLER_SENSE_START.sub("", text, count=1))
    for item in text.split(";"):
      if _LATIN.search(item):
        break
      for word in _words(item):
        if word not in result:
          result.append(word)
  return result
