"""DICT-MLM (`dict_mlm`): MLM whose masked slots are partly shown as their dictionary translation.

Chaudhary et al. 2020, as set up by Tang et al., Appendix G.4: each masked
position is, with probability 1/2 (`swap_rate`), a "translate" slot: if its
original token has a dictionary entry it is shown as its translation
(language id set to the translation's language), otherwise it is left as the
original token (the paper: "otherwise, we leave it as the original token";
the authors' collator does the same, which shows those labels).
`untranslatable="corrupt"` instead keeps the shared 80/10/10 corruption on
such slots. The label stays the original token. The other masked positions
get the usual 80/10/10 corruption, their random replacements drawn from the
regular ids of the example's own language (with the doubled synthetic
vocabulary: its copy of the ids, never the unused copies of the special ids
V..V+4).

Reads the `dictionary` asset, a step argument (never a constant of the
compiled step, so a refreshed or self-induced dictionary of the same capacity
reuses the program): `pairs` int32 [n, 2] (source id, target id), `mask` bool
[n] (padding rows of a capacity-padded table are False) and `lang_ids` int32
[2] (language ids of the source and target column).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from flax_xalign.errors import UserError
from flax_xalign.objectives.base import CorruptionContext, id_table, register
from flax_xalign.objectives.masking import copy_ranges
from flax_xalign.objectives.mlm import MaskedLMObjective

UNTRANSLATABLE = ("unchanged", "corrupt")


@dataclasses.dataclass(frozen=True)
class DictionaryMaskedLM(MaskedLMObjective):
  """MLM on dictionary code-switched masked positions (`dict_mlm`).

  Attributes:
    swap_rate: share of masked positions that are "translate" slots.
    untranslatable: a translate slot whose token has no dictionary entry is
      shown "unchanged" (the paper, default) or keeps its "corrupt"ed
      80/10/10 input.
  """

  requires: tuple[str, ...] = ("dictionary",)
  swap_rate: float = 0.5
  untranslatable: str = "unchanged"

  def corrupt(self, ctx: CorruptionContext) -> CorruptionContext:
    """Replaces some masked slots' inputs by their translations."""
    dictionary = ctx.assets["dictionary"]
    pairs, valid, sides = dictionary["pairs"], dictionary["mask"], dictionary["lang_ids"]
    # Translation of every id in either direction (-1 if none), and the
    # language id a swapped token is shown with (its translation's side).
    translation = id_table(pairs[:, 1], pairs[:, 0], valid,
                           ctx.vocab_size, -1)
    translation = jnp.where(translation >= 0, translation,
                            id_table(pairs[:, 0], pairs[:, 1], valid, ctx.vocab_size, -1))
    lang_of_translation = id_table(pairs[:, 0], jnp.broadcast_to(sides[1], pairs[:, 0].shape), valid,
                                   ctx.vocab_size, 0)
    lang_of_translation = jnp.maximum(
        lang_of_translation,
        id_table(pairs[:, 1], jnp.broadcast_to(sides[0], pairs[:, 1].shape), valid, ctx.vocab_size, 0))
    masked = ctx.masked
    rng_swap, rng_random = jax.random.split(ctx.rng)
    shown = translation[masked.targets]  # [batch, predictions]
    translate = (jax.random.uniform(rng_swap, masked.targets.shape) < self.swap_rate) & (masked.weights > 0)
    swap = translate & (shown >= 0)
    rows = jnp.arange(masked.inputs.shape[0])[:, None]
    current = jnp.take_along_axis(masked.inputs, masked.positions, axis=1)
    slot_lang = jnp.take_along_axis(ctx.lang_ids, masked.positions, axis=1)
    if ctx.vocab_copies > 1:
      current = _redraw_in_own_language(current, masked, slot_lang, dictionary, ctx, rng_random)
    if self.untranslatable == "unchanged":
      current = jnp.where(translate & ~swap, masked.targets, current)
    inputs = masked.inputs.at[rows, masked.positions].set(jnp.where(swap, shown, current))
    lang_ids = ctx.lang_ids.at[rows, masked.positions].set(
        jnp.where(swap, lang_of_translation[masked.targets], slot_lang))
    return ctx.replace(masked=masked._replace(inputs=inputs), lang_ids=lang_ids)


def _redraw_in_own_language(current: jax.Array, masked: Any, slot_lang: jax.Array, dictionary: Any,
                            ctx: CorruptionContext, rng: jax.Array) -> jax.Array:
  """[batch, predictions] inputs with random replacements redrawn from the example's language's copy.

  With a doubled vocabulary the shared masking draws a random replacement from
  the masked token's own copy; a token shared by both languages (partial
  overlap) sits in the natural copy even inside a derived-language example.
  Here the copy follows the slot's language instead: the copy of the
  dictionary column of that language (column ids // V), or the token's own
  copy for a language the dictionary does not name.
  """
  pieces = ctx.vocab_size // ctx.vocab_copies
  column_copy = jnp.max(jnp.where(dictionary["mask"][:, None], dictionary["pairs"] // pieces, 0), axis=0)
  sides = dictionary["lang_ids"]
  copy = jnp.where(slot_lang == sides[1], column_copy[1],
                   jnp.where(slot_lang == sides[0], column_copy[0], masked.targets // pieces))
  low, high = copy_ranges(copy, vocab_size=ctx.vocab_size, copies=ctx.vocab_copies,
                          first_regular=ctx.specials.first_regular, end_regular=ctx.specials.end_regular)
  drawn = jax.random.randint(rng, current.shape, low, high, dtype=current.dtype)
  was_random = (masked.weights > 0) & (current != ctx.specials.mask) & (current != masked.targets)
  return jnp.where(was_random, drawn, current)


@register("dict_mlm")
def dict_mlm(*, swap_rate: float = 0.5, untranslatable: str = "unchanged") -> DictionaryMaskedLM:
  if not 0.0 <= swap_rate <= 1.0:
    raise UserError(f"dict_mlm swap_rate must be in [0, 1], got {swap_rate!r}.")
  if untranslatable not in UNTRANSLATABLE:
    raise UserError(f"dict_mlm untranslatable={untranslatable!r} is not one of "
                    f"{', '.join(map(repr, UNTRANSLATABLE))} ('unchanged': the paper, Appendix G.4).")
  return DictionaryMaskedLM(bitext=False, swap_rate=swap_rate, untranslatable=untranslatable)
