"""The `dictionary` asset: a bilingual token dictionary of a synthetic language (ALIGN-MLM, DICT-MLM).

For a transliterated synthetic language (`flax_xalign.tasks.synthetic`) the
true translation of natural token i is `id_map[i]` (= i + V). The dictionary
is a seeded random fraction (`rate`, 25% by default, as Tang et al.) of the
pairs (i, id_map[i]), drawn once per run and saved as `dictionary.tsv`
(natural_id, derived_id, piece), which ALIGN-MLM and DICT-MLM train with.
Value: `pairs` int32 [n, 2], `mask` bool [n] (all True: the table is exactly
as large as the draw), `lang_ids` int32 [2] (the run's language ids of the
natural and the derived side). Unavailable for other tasks
(`registry.Unavailable`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.data.transforms import dictionary as dictionary_lib
from flax_xalign.errors import UserError

if TYPE_CHECKING:
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage
  from flax_xalign.run_spec import RunSpec

DEFAULT_RATE = 0.25


def transliterated_language(run: "RunSpec") -> "SyntheticLanguage":
  """The run's transliterated synthetic language; `registry.Unavailable` for any other task."""
  # The task registry (TensorFlow, seqio, every family) is imported when an
  # asset is created, not when the assets package is.
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

  language = transliterated_language(run)
  options = run.options_of("dictionary")
  unknown = sorted(set(options) - {"rate"})
  if unknown:
    raise UserError(f"unknown dictionary option(s) {unknown}; the synthetic dictionary takes 'rate'.")
  lang_ids = (run.language_id(synthetic_tasks.NATURAL),
              run.language_id(synthetic_tasks.derived_language_code(language)))
  return SyntheticDictionary(language, rate=options.get("rate", DEFAULT_RATE), lang_ids=lang_ids,
                             piece=_piece_function(run))
