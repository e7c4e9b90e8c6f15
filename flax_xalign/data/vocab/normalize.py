"""Text normalisers applied before tokenising: one definition, two runtimes.

A task (`TextTask(normalize=...)`, `TsvBitextTask(normalize=...)`) normalises
its text inside the tf.data pipeline with `normalize_tf`; the word aligner
(`WordAligner(normalize=...)`, `xalign align --normalize=...`)
normalises each word in Python with `normalize_text`. The two agree (tested on
polytonic Greek, accented Latin, already-stripped and empty text), so a model
trained on normalised text is aligned on text normalised the same way.

=================  ==========================================================
name               what it does
=================  ==========================================================
`""`               nothing
`nfd_strip_marks`  Unicode NFD, drop every nonspacing combining mark
                   (category Mn: accents, breathings, iota subscripts), then
                   NFC so that what is left (e.g. Hangul) is composed again
`nfkc`             Unicode NFKC (compatibility forms: ligatures, full-width)
`lower`            Unicode lower case (full mapping, final sigma included)
=================  ==========================================================

Polytonic Greek is the motivating case: stripping its diacritics moves
word-alignment AER by about 6 points for multilingual-e5, whose vocabulary
mostly knows monotonic or unaccented Greek.

Both runtimes use ICU-compatible Unicode data (Python's `unicodedata`,
TensorFlow Text's ICU and RE2's `\\p{Mn}`); characters assigned in a Unicode
version newer than one of them may be treated differently.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from flax_xalign import errors

NONE = ""
NFD_STRIP_MARKS = "nfd_strip_marks"
NFKC = "nfkc"
LOWER = "lower"
NORMALIZERS = (NONE, NFD_STRIP_MARKS, NFKC, LOWER)


def check_normalizer(name: Any, *, where: str = "normalize") -> str:
  """Returns `name` if it is one of `NORMALIZERS`; UserError otherwise.

  Args:
    name: the requested normaliser.
    where: what the message names (a task, a flag).
  """
  if not isinstance(name, str) or name not in NORMALIZERS:
    known = ", ".join(repr(n) for n in NORMALIZERS)
    raise errors.UserError(
        f"{where}={name!r} is not a known text normaliser; use one of {known} "
        "('' normalises nothing).")
  return name


def normalize_text(text: str, name: str) -> str:
  """Normalises a Python string with the normaliser called `name`."""
  check_normalizer(name)
  if name == NFD_STRIP_MARKS:
    decomposed = unicodedata.normalize("NFD", text)
    stripped = "".join(c for c in decomposed if unicodedata.category(c) != "Mn")
    return unicodedata.normalize("NFC", stripped)
  if name == NFKC:
    return unicodedata.normalize("NFKC", text)
  if name == LOWER:
    return text.lower()
  return text


def normalize_tf(text: Any, name: str) -> Any:
  """Normalises a tf.string tensor (any shape, UTF-8) like `normalize_text`.

  Pure TensorFlow / TensorFlow Text ops, so it runs inside tf.data maps and
  the iterator stays checkpointable.
  """
  check_normalizer(name)
  if name == NONE:
    return text
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top

  if name == NFD_STRIP_MARKS:
    decomposed = tf_text.normalize_utf8(text, "NFD")
    stripped = tf.strings.regex_replace(decomposed, r"\p{Mn}", "")
    return tf_text.normalize_utf8(stripped, "NFC")
  if name == NFKC:
    return tf_text.normalize_utf8(text, "NFKC")
  return tf.strings.lower(text, encoding="utf-8")
