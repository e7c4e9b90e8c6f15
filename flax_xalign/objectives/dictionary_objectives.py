"""Objectives that read a bilingual token dictionary: ALIGN-MLM and DICT-MLM.

* `align` (Tang et al., "ALIGN-MLM"): L_ALIGN = -(1/|B|) sum_i cos(E[b_i1], E[b_i2])
  over every dictionary pair on the *input* token-embedding table, every step,
  whatever is in the batch (as the authors' code does). ALIGN-MLM is
  `{'mlm': 1.0, 'align': 10.0}` (α = 10), without language embeddings.
* `dict_mlm` (Chaudhary et al. 2020, as set up by Tang et al.): MLM where each
  masked position whose original token has a dictionary entry is, with
  probability 1/2, shown as its translation (language id flipped to the
  translation's language) instead of being corrupted; the label stays the
  original token. Other masked positions get the usual 80/10/10 corruption.
  (The authors' collator leaves a "to translate" token without an entry
  unchanged, which shows its label; here it is corrupted like any other.)

Dictionaries are [n, 2] int arrays of (natural id, derived id) pairs; see
`flax_xalign.data.dictionary` for how a run draws, saves and reloads one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.objectives.base import Batch, LossTerm, StepContext, register
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.objectives.mlm import MaskedLMObjective

# Objectives whose factory takes `dictionary=` (pretrain() supplies it).
NEEDS_DICTIONARY = ("align", "dict_mlm")


def _check_dictionary(dictionary: Any, name: str) -> np.ndarray:
  if dictionary is None:
    raise UserError(
        f"The {name!r} objective needs a bilingual dictionary; train it on a synthetic-language task "
        "(tasks/synthetic.py) so the dictionary can be drawn, or pass dictionary=[[src, tgt], ...].")
  pairs = np.asarray(dictionary, np.int32)
  if pairs.ndim != 2 or pairs.shape[1] != 2 or not len(pairs):
    raise UserError(f"A dictionary is an [n, 2] array of (source id, target id) pairs, got shape {pairs.shape}.")
  return pairs


def embedding_cosine(table: jax.Array, pairs: jax.Array) -> jax.Array:
  """[n] cosine similarity of rows pairs[:, 0] and pairs[:, 1] of `table` [vocab, embed]."""
  a = table[pairs[:, 0]].astype(jnp.float32)
  b = table[pairs[:, 1]].astype(jnp.float32)
  dot = jnp.sum(a * b, axis=-1)
  norms = jnp.sqrt(jnp.sum(a * a, axis=-1) * jnp.sum(b * b, axis=-1))
  return dot / jnp.maximum(norms, 1e-8)


@dataclasses.dataclass(frozen=True)
class EmbeddingAlignment:
  """The `align` term: minus the mean dictionary cosine on the input embeddings."""

  pairs: np.ndarray
  needs_all_hidden: bool = False

  def __call__(self, ctx: StepContext) -> LossTerm:
    table = ctx.params["token_embed"]["embedding"]
    cos = embedding_cosine(table, jnp.asarray(self.pairs))
    mean = jnp.mean(cos)
    return LossTerm(loss=-mean, metrics={"cosine": mean, "pairs": jnp.asarray(len(self.pairs), jnp.float32)})


@register("align")
def align(dictionary: Any = None) -> EmbeddingAlignment:
  return EmbeddingAlignment(pairs=_check_dictionary(dictionary, "align"))


def translation_table(pairs: np.ndarray, vocab_size: int) -> np.ndarray:
  """[vocab] int32: the translation of each id in either direction, -1 if none."""
  table = np.full((vocab_size,), -1, np.int32)
  if pairs.max() >= vocab_size:
    raise UserError(f"Dictionary ids reach {int(pairs.max())} but the model's vocabulary has {vocab_size} rows.")
  table[pairs[:, 0]] = pairs[:, 1]
  table[pairs[:, 1]] = pairs[:, 0]
  return table


@dataclasses.dataclass(frozen=True)
class DictionaryMaskedLM(MaskedLMObjective):
  """MLM on dictionary code-switched masked positions (`dict_mlm`).

  Attributes:
    table: [vocab] translation of every id (-1 if none).
    first_derived_id: ids >= this belong to the derived language (V).
    natural_lang_id / derived_lang_id: language ids written on swapped tokens.
    swap_rate: share of eligible masked positions shown as translations.
  """

  table: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  first_derived_id: int = 0
  natural_lang_id: int = 0
  derived_lang_id: int = 0
  swap_rate: float = 0.5

  def corrupt(self, batch: Batch, masked: MaskedTokens, lang_ids: jax.Array,
              rng: jax.Array) -> tuple[MaskedTokens, jax.Array]:
    """Replaces some masked slots' inputs by their translations."""
    translation = jnp.asarray(self.table)[masked.targets]  # [batch, predictions]
    swap = ((jax.random.uniform(rng, masked.targets.shape) < self.swap_rate)
            & (translation >= 0) & (masked.weights > 0))
    rows = jnp.arange(masked.inputs.shape[0])[:, None]
    current = jnp.take_along_axis(masked.inputs, masked.positions, axis=1)
    inputs = masked.inputs.at[rows, masked.positions].set(jnp.where(swap, translation, current))
    new_lang = jnp.where(translation >= self.first_derived_id, self.derived_lang_id, self.natural_lang_id)
    current_lang = jnp.take_along_axis(lang_ids, masked.positions, axis=1)
    lang_ids = lang_ids.at[rows, masked.positions].set(jnp.where(swap, new_lang, current_lang))
    return masked._replace(inputs=inputs), lang_ids


@register("dict_mlm")
def dict_mlm(dictionary: Any = None, *, vocab_size: int, first_derived_id: int,
             natural_lang_id: int = 0, derived_lang_id: int = 0, swap_rate: float = 0.5) -> DictionaryMaskedLM:
  pairs = _check_dictionary(dictionary, "dict_mlm")
  return DictionaryMaskedLM(bitext=False, table=translation_table(pairs, vocab_size),
                            first_derived_id=first_derived_id, natural_lang_id=natural_lang_id,
                            derived_lang_id=derived_lang_id, swap_rate=swap_rate)
