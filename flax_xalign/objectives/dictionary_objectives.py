"""Objectives that read a bilingual token dictionary: ALIGN-MLM and DICT-MLM.

* `align` (Tang et al., "ALIGN-MLM"): L_ALIGN = -(1/|B|) sum_i cos(E[b_i1], E[b_i2])
  over every dictionary pair on the *input* token-embedding table, every step,
  whatever is in the batch (as the authors' code does). ALIGN-MLM is
  `{'mlm': 1.0, 'align': 10.0}` (α = 10), without language embeddings. Its
  monitor is the alignment score (`alignment_all`, `alignment_heldout`).
* `dict_mlm` (Chaudhary et al. 2020, as set up by Tang et al., Appendix G.4):
  each masked position is, with probability 1/2 (`swap_rate`), a "translate"
  slot: if its original token has a dictionary entry it is shown as its
  translation (language id set to the translation's language), otherwise it
  is left as the original token (the paper: "otherwise, we leave it as the
  original token"; the authors' collator does the same, which shows those
  labels). `untranslatable="corrupt"` instead keeps the shared 80/10/10
  corruption on such slots. The label stays the original token. The other
  masked positions get the usual 80/10/10 corruption, their random
  replacements drawn from the regular ids of the example's own language
  (with the doubled synthetic vocabulary: its copy of the ids, never the
  unused copies of the special ids V..V+4).

Both read the `dictionary` asset, a step argument (never a constant of the
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

from flax_xalign import ops
from flax_xalign.errors import UserError
from flax_xalign.objectives.masking import copy_ranges
from flax_xalign.objectives.base import Assets, CorruptionContext, LossTerm, ObjectiveBase, StepContext, register
from flax_xalign.objectives.mlm import MaskedLMObjective


def embedding_cosine(table: jax.Array, pairs: jax.Array) -> jax.Array:
  """[n] cosine similarity of rows pairs[:, 0] and pairs[:, 1] of `table` [vocab, embed]."""
  a = table[pairs[:, 0]].astype(jnp.float32)
  b = table[pairs[:, 1]].astype(jnp.float32)
  dot = jnp.sum(a * b, axis=-1)
  norms = jnp.sqrt(jnp.sum(a * a, axis=-1) * jnp.sum(b * b, axis=-1))
  return dot / jnp.maximum(norms, 1e-8)


def id_table(ids: jax.Array, values: jax.Array, valid: jax.Array, size: int, fill: int) -> jax.Array:
  """[size] int32 with table[ids[i]] = values[i] where valid[i], `fill` elsewhere."""
  index = jnp.where(valid, ids, size)  # Out of range: dropped.
  return jnp.full((size,), fill, jnp.int32).at[index].set(values.astype(jnp.int32), mode="drop")


def alignment_score(table: jax.Array, token_map: Any, dictionary: Any | None = None, *,
                    block: int = 1024) -> dict[str, jax.Array]:
  """The ALIGN-MLM alignment score of an embedding table (jit-friendly).

  Args:
    table: [vocab, embed] input token embeddings.
    token_map: the `token_map` asset (`queries`, `targets`, `candidates`).
    dictionary: the `dictionary` asset; its source ids are left out of
      `heldout` (the leak-free score), or None.
    block: query rows per similarity block.

  Returns:
    {"all": share of queries whose cosine nearest candidate is their target,
     "heldout": the same over queries outside the dictionary}.
  """
  nearest = ops.nearest_neighbours(table, token_map["queries"], token_map["candidates"], block=block)
  hit = (nearest == token_map["targets"]).astype(jnp.float32)
  held = jnp.ones_like(hit)
  if dictionary is not None:
    pairs = dictionary["pairs"]
    in_dictionary = id_table(pairs[:, 0], jnp.ones_like(pairs[:, 0]), dictionary["mask"], table.shape[0], 0)
    held = 1.0 - in_dictionary[token_map["queries"]].astype(jnp.float32)
  return {"all": jnp.mean(hit), "heldout": jnp.sum(hit * held) / jnp.maximum(jnp.sum(held), 1.0)}


@dataclasses.dataclass(frozen=True)
class EmbeddingAlignment(ObjectiveBase):
  """The `align` term: minus the mean dictionary cosine on the input embeddings."""

  requires: tuple[str, ...] = ("dictionary",)
  monitor_requires: tuple[str, ...] = ("dictionary", "token_map")

  def __call__(self, ctx: StepContext) -> LossTerm:
    dictionary = ctx.assets["dictionary"]
    table = ctx.params["token_embed"]["embedding"]
    cos = embedding_cosine(table, dictionary["pairs"])
    weights = dictionary["mask"].astype(jnp.float32)
    count = jnp.sum(weights)
    # mean over the table rows, rescaled to the valid ones: for a full table
    # (no padding) this is exactly jnp.mean(cos), bit for bit.
    mean = jnp.mean(cos * weights) * (cos.shape[0] / jnp.maximum(count, 1.0))
    return LossTerm(loss=-mean, metrics={"cosine": mean, "pairs": count})

  def monitor(self, params: Any, assets: Assets) -> dict[str, jax.Array]:
    score = alignment_score(params["token_embed"]["embedding"], assets["token_map"], assets["dictionary"])
    return {f"alignment_{k}": v for k, v in score.items()}


@register("align")
def align() -> EmbeddingAlignment:
  return EmbeddingAlignment()


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
