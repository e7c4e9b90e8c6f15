"""BLI test sets X -> English from Debian dictionaries, built the way MUSE builds its sets.

Lu, Lu & Zhang (2023) score the dictionaries an mPLM's embedding table induces (§2.2, Table 1)
against MUSE's gold lexicons: each source word with all its English translations, the source
words taken from a frequency band of the language. Ours (`build_gold`), per language X:

1. **Lexicon** (`merge_lexicon`): the X -> English dictionaries (`dict-freedict-<xxx>-eng`)
   merged with the English -> X ones inverted (FreeDict `eng-<xxx>`, Ding for German, Mueller
   for Russian). Both sides single words (`is_word`), keys compared lowercased; at most
   `MAX_TRANSLATIONS` English words per source word, X -> English entries first.
2. **Frequencies** (`word_counts`): X's monolingual Debian text (LibreOffice help, training
   split; Arabic has no help, so its text is the msgstr side of the LibreOffice UI
   catalogues), split on whitespace, punctuation and symbols stripped from both ends, words
   only (`is_word`). Case variants count together; a word is written in its most frequent form
   (German nouns keep their capital) and its English side lowercased.
3. **Band** (`band`): the source words of the lexicon with count >= `MIN_COUNT`, ranked by
   count (ties by the word), ranks [0, `BAND_SIZE`).
4. **Split** (`split_of_word`): sha256 of the word (UTF-8), first 8 bytes, mod 100 <
   `DEV_PERCENT` -> dev, else test. Thresholds are chosen on dev only; test is read once.

Written (MUSE format, `source english` per line, one line per translation):
OUT/bli/<x>-en.dev.txt, OUT/bli/<x>-en.test.txt, and OUT/dict/<x>-en.tsv (the whole merged
lexicon, `source<TAB>english`). The band, counts and rule go into the build manifest.
"""

from __future__ import annotations

import collections
import hashlib
import pathlib
import unicodedata
from collections.abc import Iterable, Mapping, Sequence

from flax_xalign.data.sources.debian_formats import is_word
from flax_xalign.fileio import write_atomically

MAX_TRANSLATIONS = 10
MIN_COUNT = 3
BAND_SIZE = 3000
DEV_PERCENT = 30
SPLITS = ("dev", "test")
RULE = (f"source words of the merged X->en lexicon (X->en FreeDict + inverted en->X) with count >= {MIN_COUNT} "
        f"in X's Debian text (help train split; ar: gettext msgstr), ranks [0, {BAND_SIZE}) by count (ties by "
        f"word); dev if sha256(word)[:8] mod 100 < {DEV_PERCENT} else test; at most {MAX_TRANSLATIONS} English "
        "translations per word, lowercased")


def _strip_ends(token: str) -> str:
  start, end = 0, len(token)
  while start < end and unicodedata.category(token[start])[0] in "PS":
    start += 1
  while end > start and unicodedata.category(token[end - 1])[0] in "PS":
    end -= 1
  return token[start:end]


def word_counts(lines: Iterable[str]) -> dict[str, tuple[int, str]]:
  """lowercased word -> (count, most frequent surface form) over whitespace-split `lines`."""
  forms: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for line in lines:
    for token in line.split():
      word = _strip_ends(token)
      if is_word(word):
        forms[word.lower()][word] += 1
  # most_common keeps first-seen order among ties; sort the forms for a deterministic choice.
  return {key: (sum(c.values()), min(c, key=lambda form: (-c[form], form))) for key, c in forms.items()}


def merge_lexicon(to_english: Iterable[tuple[str, str]], from_english: Iterable[tuple[str, str]], *,
                  max_translations: int = MAX_TRANSLATIONS) -> dict[str, list[str]]:
  """lowercased source word -> distinct lowercased English words (X->en pairs first, then inverted en->X).

  `to_english` is (X word, English word) pairs, `from_english` (English word, X word); pairs
  whose sides are not single words are dropped.
  """
  lexicon: dict[str, list[str]] = collections.defaultdict(list)
  pairs = list(to_english) + [(x, en) for en, x in from_english]
  for source, english in pairs:
    source, english = source.lower(), english.lower()
    if is_word(source) and is_word(english):
      translations = lexicon[source]
      if english not in translations and len(translations) < max_translations:
        translations.append(english)
  return dict(lexicon)


def split_of_word(word: str) -> str:
  """'dev' or 'test': sha256 of the word's UTF-8, first 8 bytes big-endian, mod 100 < DEV_PERCENT -> dev."""
  bucket = int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:8], "big") % 100
  return "dev" if bucket < DEV_PERCENT else "test"


def band(counts: Mapping[str, tuple[int, str]], lexicon: Mapping[str, Sequence[str]], *,
         min_count: int = MIN_COUNT, size: int = BAND_SIZE) -> list[tuple[str, int]]:
  """(surface form, count) of the lexicon's source words with count >= min_count, most frequent first
  (ties by the lowercased word), the first `size`."""
  keys = [key for key in lexicon if key in counts and counts[key][0] >= min_count]
  keys.sort(key=lambda key: (-counts[key][0], key))
  return [(counts[key][1], counts[key][0]) for key in keys[:size]]


def gold_sets(counts: Mapping[str, tuple[int, str]], lexicon: Mapping[str, Sequence[str]], *,
              min_count: int = MIN_COUNT, size: int = BAND_SIZE) -> dict[str, list[tuple[str, str]]]:
  """{'dev': [(source, english)], 'test': [...]}: every translation of each band word, in band order."""
  sets: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
  for word, _ in band(counts, lexicon, min_count=min_count, size=size):
    sets[split_of_word(word)].extend((word, english) for english in lexicon[word.lower()])
  return sets


def write_muse(path: pathlib.Path, pairs: Iterable[tuple[str, str]]) -> None:
  write_atomically(path, "".join(f"{source} {english}\n" for source, english in pairs))


def build_gold(out: pathlib.Path, code: str, *, text: Iterable[str], text_source: str,
               to_english: Iterable[tuple[str, str]], from_english: Iterable[tuple[str, str]],
               sources: Sequence[str]) -> dict:
  """Writes OUT/dict/<code>-en.tsv and OUT/bli/<code>-en.{dev,test}.txt; returns their counts."""
  lexicon = merge_lexicon(to_english, from_english)
  write_atomically(out / "dict" / f"{code}-en.tsv",
                   "".join(f"{source}\t{english}\n" for source in sorted(lexicon) for english in lexicon[source]))
  counts = word_counts(text)
  sets = gold_sets(counts, lexicon)
  for split, pairs in sets.items():
    write_muse(out / "bli" / f"{code}-en.{split}.txt", pairs)
  chosen = band(counts, lexicon)
  return {"lexicon_words": len(lexicon), "lexicon_pairs": sum(map(len, lexicon.values())),
          "text": text_source, "text_words": sum(c for c, _ in counts.values()), "text_types": len(counts),
          "band_words": len(chosen), "band_min_count": chosen[-1][1] if chosen else None,
          **{f"{split}_words": len({s for s, _ in pairs}) for split, pairs in sets.items()},
          **{f"{split}_pairs": len(pairs) for split, pairs in sets.items()},
          "dictionaries": list(sources)}
