r"""More languages from Debian packages: LibreOffice help, gettext catalogues, dictionaries.

Three kinds of real, offline text arrive with Debian 12 packages (fetch them with
`apt-get download PKG` and unpack with `dpkg-deb -x PKG.deb ROOT`; no root needed):

* **Help paragraphs** (`libreoffice-help-<lang>`, MPL-2.0):
  `usr/share/libreoffice/help/<dir>/text/<topic>/**/*.html`. Every language ships the same
  files and the same `<p id="par_id...">` paragraphs; an untranslated paragraph is the
  English text. A paragraph's key is `(file path under text/, par_id)`; its topic label is
  the first directory under `text/` (`TOPICS`, 9 modules).
* **UI strings** (`libreoffice-l10n-<lang>`): GNU `.mo` catalogues in
  `usr/lib/libreoffice/program/resource/<dir>/LC_MESSAGES/`, msgid English, msgstr the
  translation (`read_mo`, our own reader of the GNU format).
* **Dictionaries**: FreeDict `dict-freedict-eng-<xxx>` (dictd `.index` + `.dict.dz`,
  `read_dictd`) and Ding `trans-de-en` (`read_ding`).

Rendering of help text (`HelpParagraphParser`): markup is dropped and its text kept;
images, `class="bug"` debug spans and the hidden platform variants of a `switchinline`
(MAC, WIN, UNIX, or an application's) are dropped, keeping the `default` variant;
`<br>` is a space; whitespace is collapsed. The product-name variables `$[officename]` and
`%PRODUCTNAME` (and its misspellings in the sources) become "LibreOffice". A paragraph with
no letter left is dropped (only an icon, a number or a variable).

Splits (`split_of`) hash the bare `par_id` (sha256, first 8 bytes, mod 1000: < 900 train,
< 950 validation, else test), so one paragraph is held out in every language at once and
the copies of a paragraph that LibreOffice embeds into several pages share a split. Then,
per output file, each distinct line goes to the first split (train, validation, test) of a
paragraph that holds it, so no held-out line also occurs in training; a held-out pair whose
English or foreign side occurs in a training pair is dropped too.

A foreign paragraph equal to the English one is taken as untranslated (LibreOffice falls
back to English) and left out of that language's files; likewise a catalogue entry with an
empty msgstr or one equal to its msgid. `.mo` files hold no fuzzy entries (msgfmt drops
them unless built with --use-fuzzy), so none can be skipped here.

Output layout (`build`): see `xalign debian_data`. The .mo and dictionary file readers are
`data/debian_formats.py` (re-exported here).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import html.parser
import json
import pathlib
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from flax_xalign import errors
from flax_xalign.data.sources import debian_bli
from flax_xalign.data.sources.debian_formats import (  # noqa: F401  (their old import path is this module)
    MoCatalogue,
    MoEntry,
    PRODUCT_NAME,
    PathLike,
    _BRACKETED,
    _LETTER,
    _MO_MAGIC,
    _PRODUCT_VARIABLES,
    _SENSE_NUMBER,
    _SPACES,
    _WORD_PUNCTUATION,
    _mo_charset,
    _words,
    clean_text,
    dictd_number,
    dictionary_pairs,
    freedict_translations,
    gettext_pairs,
    has_letter,
    is_word,
    mueller_translations,
    read_dictd,
    read_ding,
    read_mo,
    strip_mnemonic,
)
from flax_xalign.fileio import write_atomically

SPLITS = ("train", "validation", "test")
TOPICS = ("sbasic", "scalc", "schart", "sdatabase", "sdraw", "shared", "simpress", "smath", "swriter")
_PARAGRAPH_MARKUP = re.compile(r'<p id="par_id[^"]*"[^>]*>.*?</p>', re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Language:
  """Where one language's data lives in the Debian packages (None: no such package)."""
  code: str
  help_dir: str | None
  l10n_dir: str | None
  freedict: str | None
  to_english: str | None = None  # FreeDict X -> English (`dict-freedict-<xxx>-eng`), for the BLI gold.

  @property
  def help_package(self) -> str | None:
    return None if self.help_dir is None else f"libreoffice-help-{self.help_dir.lower()}"

  @property
  def l10n_package(self) -> str | None:
    return None if self.l10n_dir is None else f"libreoffice-l10n-{self.l10n_dir.lower().replace('_', '-')}"

  @property
  def dict_packages(self) -> tuple[str, ...]:
    found = (f"dict-freedict-eng-{self.freedict}",) if self.freedict else ()
    return found + (("trans-de-en",) if self.code == "de" else ()) + (("mueller7-dict",) if self.code == "ru" else ())

  @property
  def to_english_packages(self) -> tuple[str, ...]:
    return (f"dict-freedict-{self.to_english}-eng",) if self.to_english else ()


ENGLISH = Language("en", "en-US", None, None)
LANGUAGES = {lang.code: lang for lang in (
    Language("de", "de", "de", "deu", "deu"), Language("fr", "fr", "fr", "fra", "fra"),
    Language("es", "es", "es", None), Language("ru", "ru", "ru", "rus"),
    Language("zh", "zh-CN", "zh_CN", None), Language("ja", "ja", "ja", None),
    Language("hi", "hi", "hi", "hin"), Language("ar", None, "ar", "ara", "ara"),
    Language("el", "el", "el", "ell", "ell"))}
DEFAULT_LANGUAGES = tuple(LANGUAGES)
SOURCES = ("help", "gettext", "dict", "bli")
HELP_ROOT = "usr/share/libreoffice/help"
L10N_ROOT = "usr/lib/libreoffice/program/resource"
DICTD_ROOT = "usr/share/dictd"
DING_FILE = "usr/share/trans/de-en"


def split_of(paragraph_id: str) -> str:
  """The split of a paragraph id: sha256 bucket, 90 / 5 / 5 % (same in every language)."""
  bucket = int.from_bytes(hashlib.sha256(paragraph_id.encode("utf-8")).digest()[:8], "big") % 1000
  return "train" if bucket < 900 else "validation" if bucket < 950 else "test"


# ------------------------------------------------------------------- help pages


class HelpParagraphParser(html.parser.HTMLParser):
  """Collects `(par_id, text)` of the `<p id="par_id...">` paragraphs of one help page."""

  _VOID = frozenset({"img", "br", "input", "meta", "link", "hr", "wbr", "source"})

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.paragraphs: list[tuple[str, str]] = []
    self._id: str | None = None
    self._parts: list[str] = []
    self._open: list[bool] = []  # Per open element inside the paragraph: does it hide its text?
    self._hidden = 0

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    if tag == "p":
      self._finish()
      if (attrs.get("id") or "").startswith("par_id"):
        self._id, self._parts, self._open, self._hidden = attrs["id"], [], [], 0
      return
    if self._id is None:
      return
    if tag == "br":
      self._parts.append(" ")
    if tag in self._VOID:
      return
    # A switchinline's variants are hidden spans; keep only the default one (id "default...").
    hides = (tag == "span" and (attrs.get("class") == "bug" or (
        "hidden" in attrs and not (attrs.get("id") or "").startswith("default"))))
    self._open.append(hides)
    self._hidden += hides

  def handle_startendtag(self, tag, attrs):
    if tag == "br" and self._id is not None:
      self._parts.append(" ")
    elif tag == "p":
      self._finish()

  def handle_endtag(self, tag):
    if self._id is None:
      return
    if tag == "p":
      self._finish()
    elif tag not in self._VOID and self._open:
      self._hidden -= self._open.pop()

  def handle_data(self, data):
    if self._id is not None and not self._hidden:
      self._parts.append(data)

  def _finish(self):
    if self._id is not None:
      self.paragraphs.append((self._id, "".join(self._parts)))
    self._id = None

  def close(self):
    super().close()
    self._finish()


def parse_help_page(markup: str) -> list[tuple[str, str]]:
  """`(par_id, text)` of a help page's paragraphs, in page order, text cleaned (`clean_text`).

  Paragraphs without a letter are dropped; a repeated par_id keeps its first text.
  """
  parser = HelpParagraphParser()
  # Parsing only the paragraphs' own markup halves the time (a page is mostly other markup).
  parser.feed("\n".join(_PARAGRAPH_MARKUP.findall(markup)))
  parser.close()
  seen, result = set(), []
  for par_id, raw in parser.paragraphs:
    text = clean_text(raw)
    if par_id not in seen and has_letter(text):
      seen.add(par_id)
      result.append((par_id, text))
  return result


class Paragraph(NamedTuple):
  """A help paragraph: `key` = "<path under text/>#<par_id>", `topic` its module."""
  key: str
  par_id: str
  topic: str
  text: str


def read_help(root: PathLike, help_dir: str) -> dict[str, Paragraph]:
  """Paragraphs of one language's help pages (`ROOT/usr/share/libreoffice/help/<dir>/text`)."""
  base = pathlib.Path(root) / HELP_ROOT / help_dir / "text"
  result = {}
  for path in sorted(base.rglob("*.html")):
    rel = path.relative_to(base).as_posix()
    topic = rel.split("/", 1)[0]
    if topic not in TOPICS:
      continue
    for par_id, text in parse_help_page(path.read_text(encoding="utf-8", errors="replace")):
      key = f"{rel}#{par_id}"
      result[key] = Paragraph(key, par_id, topic, text)
  return result


# ------------------------------------------------------------ splitting help


def assign_lines(items: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
  """Distinct lines by split: each line goes to the first split (train, validation, test)
  of the (split, line) items holding it; order of first occurrence kept."""
  first: dict[str, str] = {}
  for split, line in items:
    if line not in first or SPLITS.index(split) < SPLITS.index(first[line]):
      first[line] = split
  result = {split: [] for split in SPLITS}
  for line, split in first.items():
    result[split].append(line)
  return result


def assign_pairs(items: Iterable[tuple[str, tuple[str, str]]]) -> dict[str, list[tuple[str, str]]]:
  """`assign_lines` for pairs, then held-out pairs sharing a side with a training pair dropped."""
  by_split = assign_lines(items)
  train_a = {a for a, _ in by_split["train"]}
  train_b = {b for _, b in by_split["train"]}
  for split in SPLITS[1:]:
    by_split[split] = [(a, b) for a, b in by_split[split] if a not in train_a and b not in train_b]
  return by_split


def help_files(english: Mapping[str, Paragraph], other: Mapping[str, Paragraph] | None
               ) -> tuple[dict[str, list[str]], dict[str, list[tuple[str, str]]],
                          dict[str, list[tuple[str, str]]]]:
  """(text, bitext, labels) by split for one language (`other=None`: English itself).

  text: translated paragraphs; bitext: (English, translation) by key; labels: (topic, text),
  texts found under two topics dropped (no single gold label).
  """
  paragraphs = []
  for key, en in english.items():
    if other is None:
      paragraphs.append((en, en.text))
    elif key in other and other[key].text != en.text:
      paragraphs.append((other[key], en.text))
  texts = assign_lines((split_of(p.par_id), p.text) for p, _ in paragraphs)
  bitext = assign_pairs((split_of(p.par_id), (en_text, p.text)) for p, en_text in paragraphs
                        ) if other is not None else {s: [] for s in SPLITS}
  topics = collections.defaultdict(set)
  for p, _ in paragraphs:
    topics[p.text].add(p.topic)
  labels = {split: [(next(iter(topics[t])), t) for t in lines if len(topics[t]) == 1]
            for split, lines in texts.items()}
  return texts, bitext, labels


# ------------------------------------------------------------------ packages


def _has_files(path: pathlib.Path, pattern: str) -> bool:
  return path.is_dir() and next(path.rglob(pattern), None) is not None


def _help_present(root: pathlib.Path, lang: Language) -> bool:
  return _has_files(root / HELP_ROOT / lang.help_dir / "text", "*.html")


def _l10n_present(root: pathlib.Path, lang: Language) -> bool:
  return _has_files(root / L10N_ROOT / lang.l10n_dir / "LC_MESSAGES", "*.mo")


def _dictd_name(package: str) -> str:
  return "mueller7" if package == "mueller7-dict" else package[len("dict-"):]


def _dict_present(root: pathlib.Path, package: str) -> bool:
  if package == "trans-de-en":
    return (root / DING_FILE).is_file()
  name = _dictd_name(package)
  return (root / DICTD_ROOT / f"{name}.index").is_file() and (
      (root / DICTD_ROOT / f"{name}.dict.dz").is_file() or (root / DICTD_ROOT / f"{name}.dict").is_file())


def required_packages(root: PathLike, languages: Sequence[str], sources: Sequence[str]
                      ) -> tuple[list[str], list[str]]:
  """(present, missing) Debian packages that `build` reads for these languages and sources.

  A language without a package for a source (e.g. no FreeDict for Spanish, no help for
  Arabic) simply has no data of that kind; only packages that exist are listed.
  """
  root = pathlib.Path(root)
  wanted: dict[str, bool] = {}
  if "help" in sources and any(LANGUAGES[c].help_dir for c in languages):
    wanted[ENGLISH.help_package] = _help_present(root, ENGLISH)
  for code in languages:
    lang = LANGUAGES[code]
    if "help" in sources and lang.help_dir:
      wanted[lang.help_package] = _help_present(root, lang)
    if "gettext" in sources and lang.l10n_dir:
      wanted[lang.l10n_package] = _l10n_present(root, lang)
    if "dict" in sources or "bli" in sources:
      for package in lang.dict_packages + (lang.to_english_packages if "bli" in sources else ()):
        wanted[package] = _dict_present(root, package)
  return ([p for p, ok in wanted.items() if ok], [p for p, ok in wanted.items() if not ok])


def package_version(root: PathLike, package: str) -> str | None:
  """The installed version: dpkg's status file under ROOT, else the first line of the
  package's Debian changelog (the source version, which `apt-get download` fetched)."""
  root = pathlib.Path(root)
  status = root / "var/lib/dpkg/status"
  if status.is_file():
    stanza = None
    for line in status.read_text(encoding="utf-8", errors="replace").splitlines():
      if line.startswith("Package: "):
        stanza = line[len("Package: "):].strip()
      elif stanza == package and line.startswith("Version: "):
        return line[len("Version: "):].strip()
  changelog = root / "usr/share/doc" / package / "changelog.Debian.gz"
  if changelog.is_file():
    with gzip.open(changelog, "rt", encoding="utf-8", errors="replace") as f:
      match = re.match(r"\S+ \(([^)]+)\)", f.readline())
    if match:
      return match.group(1)
  return None


def install_hint(missing: Sequence[str]) -> str:
  """How to get `missing` packages: apt-get as root, or download + unpack without root."""
  names = " ".join(missing)
  return (f"Install them as root:  apt-get install {names}\n"
          f"or, without root, unpack them into a folder and pass --root=ROOT:\n"
          f"  mkdir -p DEBS ROOT && (cd DEBS && apt-get download {names}) && "
          f"for f in DEBS/*.deb; do dpkg-deb -x \"$f\" ROOT; done\n"
          "(run `apt-get update` first on a fresh system so apt knows the packages).")


# ------------------------------------------------------------------- builder


def _write_lines(path: pathlib.Path, lines: Iterable[str]) -> None:
  write_atomically(path, "".join(line + "\n" for line in lines))


def _write_pairs(path: pathlib.Path, pairs: Iterable[tuple[str, str]]) -> None:
  _write_lines(path, (f"{a}\t{b}" for a, b in pairs))


def _build_help(root: pathlib.Path, out: pathlib.Path, languages: Sequence[str],
                progress: Callable[[str], None]) -> dict:
  start = time.time()
  english = read_help(root, ENGLISH.help_dir)
  progress(f"help en: {len(english)} paragraphs read ({time.time() - start:.1f}s)")
  counts = {}
  for code in ["en"] + [c for c in languages if LANGUAGES[c].help_dir]:
    other = None if code == "en" else read_help(root, LANGUAGES[code].help_dir)
    texts, bitext, labels = help_files(english, other)
    for split in SPLITS:
      _write_lines(out / "help" / f"{code}.{split}.txt", texts[split])
      _write_pairs(out / "help_labels" / f"{code}.{split}.tsv", labels[split])
      if other is not None:
        _write_pairs(out / "help_bitext" / f"en-{code}.{split}.tsv", bitext[split])
    counts[code] = {"paragraphs": {s: len(texts[s]) for s in SPLITS},
                    "labels": {s: len(labels[s]) for s in SPLITS}}
    if other is not None:
      counts[code]["pairs"] = {s: len(bitext[s]) for s in SPLITS}
    progress(f"help {code}: {sum(counts[code]['paragraphs'].values())} paragraphs, "
             f"{sum(counts[code].get('pairs', {}).values())} pairs with en "
             f"({time.time() - start:.1f}s)")
  return counts


def _build_gettext(root: pathlib.Path, out: pathlib.Path, languages: Sequence[str],
                   progress: Callable[[str], None]) -> dict:
  counts = {}
  for code in languages:
    lang = LANGUAGES[code]
    if not lang.l10n_dir:
      continue
    folder = root / L10N_ROOT / lang.l10n_dir / "LC_MESSAGES"
    pairs: dict[tuple[str, str], None] = {}
    files = sorted(folder.glob("*.mo"))
    for path in files:
      pairs.update(dict.fromkeys(gettext_pairs(read_mo(path.read_bytes(), where=str(path)))))
    _write_pairs(out / "gettext" / f"en-{code}.tsv", pairs)
    _write_lines(out / "gettext" / f"{code}.txt", dict.fromkeys(target for _, target in pairs))  # Monolingual.
    counts[code] = {"pairs": len(pairs), "catalogues": len(files)}
    progress(f"gettext {code}: {len(pairs)} pairs from {len(files)} catalogues")
  return counts


def _dictionary_candidates(root: pathlib.Path, package: str) -> Iterator[tuple[str, str]]:
  if package == "trans-de-en":
    yield from read_ding(root / DING_FILE)
    return
  name = _dictd_name(package)
  index = root / DICTD_ROOT / f"{name}.index"
  body = root / DICTD_ROOT / f"{name}.dict.dz"
  body = body if body.is_file() else body.with_suffix("")
  translations = mueller_translations if package == "mueller7-dict" else freedict_translations
  for headword, definition in read_dictd(index, body):
    for word in translations(definition):
      yield headword, word


def _build_dict(root: pathlib.Path, out: pathlib.Path, languages: Sequence[str],
                progress: Callable[[str], None], max_translations: int) -> dict:
  counts = {}
  for code in languages:
    packages = LANGUAGES[code].dict_packages
    if not packages:
      continue
    candidates = [pair for package in packages for pair in _dictionary_candidates(root, package)]
    pairs = dictionary_pairs(candidates, max_translations=max_translations)
    _write_pairs(out / "dict" / f"en-{code}.tsv", pairs)
    counts[code] = {"pairs": len(pairs), "english_words": len({en for en, _ in pairs}),
                    "sources": list(packages)}
    progress(f"dict {code}: {len(pairs)} pairs, {counts[code]['english_words']} English words "
             f"({', '.join(packages)})")
  return counts


def _bli_text(out: pathlib.Path, code: str) -> tuple[list[str], str]:
  """(lines, what they are) of `code`'s monolingual text for the gold's frequency band."""
  help_file, gettext_file = out / "help" / f"{code}.train.txt", out / "gettext" / f"{code}.txt"
  path = help_file if LANGUAGES[code].help_dir else gettext_file
  if not path.is_file():
    source = "help" if LANGUAGES[code].help_dir else "gettext"
    raise errors.UserError(f"the BLI gold of {code!r} counts words in {path}, which is missing; build it in the "
                           f"same run (--sources={source},bli).")
  return path.read_text(encoding="utf-8").splitlines(), f"{path.parent.name}/{path.name}"


def _build_bli(root: pathlib.Path, out: pathlib.Path, languages: Sequence[str],
               progress: Callable[[str], None]) -> dict:
  counts = {}
  for code in languages:
    lang = LANGUAGES[code]
    if not lang.to_english_packages and not lang.dict_packages:
      continue
    start = time.time()
    text, what = _bli_text(out, code)
    to_english = [pair for package in lang.to_english_packages for pair in _dictionary_candidates(root, package)]
    from_english = [pair for package in lang.dict_packages for pair in _dictionary_candidates(root, package)]
    counts[code] = debian_bli.build_gold(out, code, text=text, text_source=what, to_english=to_english,
                                         from_english=from_english,
                                         sources=lang.to_english_packages + lang.dict_packages)
    c = counts[code]
    progress(f"bli {code}-en: lexicon {c['lexicon_words']} words; band {c['band_words']} words (count >= "
             f"{c['band_min_count']} in {what}); dev {c['dev_words']} / test {c['test_words']} words "
             f"({time.time() - start:.1f}s)")
  return counts


def build(root: PathLike, output: PathLike, *, languages: Sequence[str] = DEFAULT_LANGUAGES,
          sources: Sequence[str] = SOURCES, max_translations: int = 5,
          progress: Callable[[str], None] = lambda line: None) -> dict:
  """Builds the text / TSV files from unpacked (or installed) Debian packages under `root`.

  Returns:
    The manifest (also written to OUTPUT/manifest.json): packages with versions and licence
    files, counts per source and language, and the rules used.

  Raises:
    UserError: an unknown language or source, or packages missing under `root` (the message
      gives the apt-get line).
  """
  unknown = [c for c in languages if c not in LANGUAGES]
  if unknown or not languages:
    raise errors.UserError(f"Unknown or no languages {unknown or list(languages)}; choose from "
                           f"{', '.join(LANGUAGES)} (English is always the pivot).")
  bad = [s for s in sources if s not in SOURCES]
  if bad or not sources:
    raise errors.UserError(f"Unknown or no sources {bad or list(sources)}; choose from {', '.join(SOURCES)}.")
  root, out = pathlib.Path(root), pathlib.Path(output)
  present, missing = required_packages(root, languages, sources)
  if missing:
    raise errors.UserError(f"Debian packages missing under {root}: {', '.join(missing)}.\n"
                           + install_hint(missing))
  start = time.time()
  packages = {}
  for package in present:
    copyright_file = root / "usr/share/doc" / package / "copyright"
    licence = None
    if copyright_file.is_file():
      licence = f"LICENSES/{package}.txt"
      (out / "LICENSES").mkdir(parents=True, exist_ok=True)
      shutil.copyfile(copyright_file, out / licence)
    else:
      progress(f"warning: {copyright_file} not found; keep {package}'s licence with the data yourself")
    packages[package] = {"version": package_version(root, package), "license_file": licence}
  counts = {}
  if "help" in sources:
    counts["help"] = _build_help(root, out, languages, progress)
  if "gettext" in sources:
    counts["gettext"] = _build_gettext(root, out, languages, progress)
  if "dict" in sources:
    counts["dict"] = _build_dict(root, out, languages, progress, max_translations)
  if "bli" in sources:
    counts["bli"] = _build_bli(root, out, languages, progress)
  manifest = {
      "languages": list(languages), "sources": list(sources), "packages": packages, "counts": counts,
      "rules": {
          "split": "sha256(par_id)[:8] mod 1000: <900 train, <950 validation, else test; each line in "
                   "its first split; held-out pairs sharing a side with a training pair dropped",
          "untranslated": "foreign text equal to the English is dropped",
          "placeholders": f"$[officename] and %PRODUCTNAME -> {PRODUCT_NAME}; letterless paragraphs dropped",
          "labels": f"first directory under text/ ({', '.join(TOPICS)}); texts under two topics dropped",
          "dictionary": f"single words, English lowercased, at most {max_translations} translations per word",
          "bli": debian_bli.RULE,
      },
      "seconds": round(time.time() - start, 1),
  }
  write_atomically(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
  return manifest
