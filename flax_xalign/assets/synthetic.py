"""Assets of the synthetic-language setting (ALIGN-MLM): dictionary and token map.

For a transliterated synthetic language (`flax_xalign.tasks.synthetic`) the
true translation of natural token i is `id_map[i]` (= i + V):

* `dictionary` — a seeded random fraction (`rate`, 25% by default, as Tang et
  al.) of the pairs (i, id_map[i]), drawn once per run and saved as
  `dictionary.tsv` (natural_id, derived_id, piece), which ALIGN-MLM and
  DICT-MLM train with. Value: `pairs` int32 [n, 2], `mask` bool [n] (all
  True: the table is exactly as large as the draw), `lang_ids` int32 [2]
  (the run's language ids of the natural and the derived side).
* `token_map` — the gold one-to-one map the alignment score is measured
  against: `queries` (natural ids with a distinct counterpart), `targets`
  (their counterparts) and `candidates` (the derived vocabulary), saved as
  `token_map.npz`.

Both are unavailable for other tasks (`registry.Unavailable`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.data import dictionary as dictionary_lib
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.data.synthetic import SyntheticLanguage
  from flax_xalign.run_spec import RunSpec

DEFAULT_RATE = 0.25
TOKEN_MAP_FILE = "token_map.npz"


def _language(run: "RunSpec") -> "SyntheticLanguage":
  from flax_xalign.tasks import synthetic as synthetic_tasks

  language = synthetic_tasks.language_of(run.task)
  if language is None or not language.transliterates:
    raise registry.Unavailable(
        f"a bilingual token dictionary is drawn for transliterated synthetic languages only, and {run.task!r} "
        "is not one. Use a synthetic_<transforms>_mlm mixture (flax_xalign.tasks.synthetic) with 'trans' "
        "among the transforms")
  return language


class SyntheticDictionary(Asset):
  """`dictionary` of a synthetic language (see the module docstring)."""

  name = "dictionary"
  files = (dictionary_lib.FILENAME,)

  def __init__(self, language: "SyntheticLanguage", *, rate: float, lang_ids: tuple[int, int],
               piece: Any = None):
    self.language = language
    self.rate = float(rate)
    self.lang_ids = np.asarray(lang_ids, np.int32)
    self._piece = piece

  def _value(self, pairs: np.ndarray) -> Value:
    pairs = np.asarray(pairs, np.int32).reshape(-1, 2)
    return {"pairs": pairs, "mask": np.ones(len(pairs), bool), "lang_ids": self.lang_ids.copy()}

  def build(self, run: "RunSpec") -> Value:
    return self._value(dictionary_lib.draw(self.language.id_map(), rate=self.rate, seed=run.seed))

  def save(self, directory: str, value: Value) -> None:
    pairs = np.asarray(value["pairs"])[np.asarray(value["mask"], bool)]
    pieces = [self._piece(int(i)) for i in pairs[:, 0]] if self._piece is not None else None
    dictionary_lib.save(os.path.join(directory, dictionary_lib.FILENAME), pairs, pieces)

  def load(self, directory: str) -> Value:
    return self._value(dictionary_lib.load(os.path.join(directory, dictionary_lib.FILENAME)))

  def check(self, value: Value, run: "RunSpec") -> None:
    id_map = self.language.id_map()
    pairs = np.asarray(value["pairs"])
    if pairs[:, 0].max() >= len(id_map) or not np.array_equal(id_map[pairs[:, 0]], pairs[:, 1]):
      raise UserError(f"{dictionary_lib.FILENAME} does not match this run's synthetic language/vocabulary; use "
                      "a new MODEL_DIR (the dictionary of a run is never regenerated).")

  def describe(self, value: Value) -> str:
    return f"dictionary: {int(np.sum(value['mask'])):,} translation pairs (rate {self.rate:g})"


def token_map_of(id_map: np.ndarray, first_regular: int) -> Value:
  """The `token_map` value of a natural -> derived id map (ids below `first_regular` are special)."""
  id_map = np.asarray(id_map)
  ids = np.arange(len(id_map))
  regular = ids >= first_regular
  queries = ids[regular & (id_map != ids)]
  return {"queries": queries.astype(np.int32), "targets": id_map[queries].astype(np.int32),
          "candidates": np.unique(id_map[regular]).astype(np.int32)}


class TokenMap(Asset):
  """`token_map`: the gold natural -> derived token map of a synthetic language."""

  name = "token_map"
  files = (TOKEN_MAP_FILE,)

  def __init__(self, language: "SyntheticLanguage", first_regular: int):
    self.language = language
    self.first_regular = int(first_regular)

  def build(self, run: "RunSpec") -> Value:
    return token_map_of(self.language.id_map(), self.first_regular)

  def save(self, directory: str, value: Value) -> None:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in value.items()})
    write_atomically(os.path.join(directory, TOKEN_MAP_FILE), buffer.getvalue())

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, TOKEN_MAP_FILE)
    try:
      with np.load(path) as data:
        value = {k: np.asarray(data[k], np.int32) for k in ("queries", "targets", "candidates")}
    except (OSError, KeyError, ValueError) as e:
      raise UserError(f"{path} is not a token map written by flax_xalign ({e}).") from e
    return value

  def check(self, value: Value, run: "RunSpec") -> None:
    expected = self.build(run)
    if any(not np.array_equal(value[k], expected[k]) for k in expected):
      raise UserError(f"{TOKEN_MAP_FILE} does not match this run's synthetic language; use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    return (f"token_map: {len(value['queries']):,} natural tokens with a derived counterpart, "
            f"{len(value['candidates']):,} derived candidates")


def _piece_function(run: "RunSpec") -> Any:
  """natural id -> SentencePiece string, for the dictionary's readable column."""
  from flax_xalign import tasks

  try:
    vocabulary = tasks.get_vocabulary(run.task)
  except UserError:
    return None
  model = getattr(getattr(vocabulary, "base", vocabulary), "tokenizer", None)
  return None if model is None else model.id_to_piece


@registry.register("dictionary")
def _dictionary(run: "RunSpec") -> Asset:
  from flax_xalign.tasks import synthetic as synthetic_tasks

  language = _language(run)
  options = run.options_of("dictionary")
  unknown = sorted(set(options) - {"rate"})
  if unknown:
    raise UserError(f"unknown dictionary option(s) {unknown}; the synthetic dictionary takes 'rate'.")
  lang_ids = (run.language_id(synthetic_tasks.NATURAL),
              run.language_id(synthetic_tasks.derived_language_code(language)))
  return SyntheticDictionary(language, rate=options.get("rate", DEFAULT_RATE), lang_ids=lang_ids,
                             piece=_piece_function(run))


@registry.register("token_map")
def _token_map(run: "RunSpec") -> Asset:
  return TokenMap(_language(run), run.vocabulary.specials.first_regular)
