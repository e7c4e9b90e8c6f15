"""Code-switched MLM on self-induced dictionaries: TCS-MLM (`tcs`) and SCS-MLM (`scs`).

Lu, Lu & Zhang 2023, "Take a Closer Look at Multilinguality! Improve
Multilingual Pre-Training Using Monolingual Corpora Only", §3. Both objectives
read the shared masked batch, code-switch 10-15% of its *context* tokens into
the other language, encode the switched copy in a second pass (same masked
slots, same targets) and score MLM there; `{'mlm': 1.0, 'tcs': 1.0}` is the
paper's L = L_MLM + L_TCS-MLM (Eq. 3), `{'mlm': 1.0, 'scs': 1.0}` its Eq. 8.

Context positions are the regular tokens of monolingual rows (`pair_side ==
0`, not padding) that are not prediction slots, so masked slots, specials and
padding are never switched and the masks and targets stay as they are. Each
row switches a share u ~ U[min_rate, max_rate] of its context tokens: floor(u
n + v) positions (n context tokens, v ~ U[0, 1), the stochastic rounding of
`masking`, so the expected share is u even on short rows), drawn uniformly
among the eligible ones, all of them if fewer are eligible. The number of
switch slots is static, ceil(max_rate * length).

Which language a token switches into follows its language id (the row's
language, "in another language"): the assets hold S = 2 x pairs sides
(`assets.lang_vocab`), side s paired with s ^ 1; a position of language l
reads a side of l, the one side of l for a pair or a non-pivot language, and
for the pivot (English) of a many-language run one of its partners chosen
uniformly per packed sentence (`route_sides`), so English text switches into
every other language. A token is switched only when it belongs to its side's
language-specific vocabulary.

* `tcs` (§3.1) reads the `induced_dictionary` asset: a context token is
  eligible when it has a translation on its side, and is replaced by it.
* `scs` (§3.2) reads `lang_vocab`: a context token is eligible when it is in
  its side's language-specific vocabulary. At its position the first pass's
  MLM distribution gives the top-k tokens (k = 8, footnote 5) and
  x̂ = Σ p_i e_i (Eq. 4), p the probabilities renormalised over the k.
  CSLS on the fly (Eq. 7) ranks the candidates of the partner side, q =
  softmax of the top-k CSLS (Eq. 6) and ŷ = Σ q_j e_j (Eq. 5) replaces the
  position's input embedding in the second pass. e are rows of the input
  token-embedding table.

  CSLS(x̂, y) = 2 cos(x̂, y) − r_K(x̂) − r_K(y): r_K(x̂) over the candidates,
  r_K(y) over the source side's set. `candidates` picks the sets:
  'batch' (default; footnote 6, "we compute CSLS_on-the-fly scores for
  tokens in the same batch"): each side's language-specific tokens present
  in the batch, i.e. the two sets a dictionary induction between the
  batch's two vocabularies would use (not the other x̂ of the step, which
  would make a score depend on how many positions are switched); then ŷ
  depends on the batch size and a token's true translation is a candidate
  only when it occurs in the batch. 'vocabulary' (Eq. 5-7 as written,
  "the top-k tokens in the corresponding language-specific vocabulary V̂"):
  the whole V̂ of each side, at the cost of an [C, C] radius pass per side
  and step.

  By default no gradient flows through x̂ and ŷ (`gradient_through_replacement
  =False`): the replacement is an input, as a TCS token is, and the first
  pass's distribution is not trained to make good replacements. True lets
  gradients reach the first pass's MLM head, the embedding rows averaged into
  x̂ and ŷ and the CSLS weights; the paper does not say which it does.

Language ids of switched positions become the other language's
(`switch_language_ids`); with `EncoderConfig.num_languages = 0` (XLM-R) they
are not read. The second pass starts from the inputs the encoder read after
every `corrupt` hook (`ctx.masked.inputs`), with the batch's language ids.
Everything runs on device inside the jitted step; SCS's CSLS works on the
[switch slots, candidates] scores of one batch, the batch candidates
compacted to min(C, batch * length) per side.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from flax_xalign import ops
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.base import Batch, LossTerm, ObjectiveBase, StepContext, id_table, register
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.objectives.mlm import masked_cross_entropy

# Keys of this module's randomness, folded into ctx.rng (distinct per objective,
# so `tcs` and `scs` trained together switch independently).
_SALT = {"tcs": 0x7C5, "scs": 0x5C5}
CANDIDATES = ("batch", "vocabulary")
_NO_SCORE = -1e30  # Finite "minus infinity": exp underflows to exactly 0, no NaN.


class Selection(NamedTuple):
  """Which context positions a row switches.

  Attributes:
    positions: [batch, slots] int32 positions; only `valid` ones are switched
      (distinct within a row).
    valid: [batch, slots] bool.
    rate: [batch] float32, the row's share u ~ U[min_rate, max_rate].
    jitter: [batch] float32, v ~ U[0, 1) of the stochastic rounding.
    count: [batch] int32 switched positions = min(floor(u n + v), eligible, slots).
    context: [batch] int32 context tokens n.
    eligible: [batch] int32 eligible context tokens.
  """

  positions: jax.Array
  valid: jax.Array
  rate: jax.Array
  jitter: jax.Array
  count: jax.Array
  context: jax.Array
  eligible: jax.Array


def switch_slots(length: int, max_rate: float) -> int:
  """Static number of switch slots that always covers `max_rate` of a row."""
  return max(1, min(length, math.ceil(max_rate * length)))


def prediction_slots(masked: MaskedTokens, length: int) -> jax.Array:
  """[batch, length] bool: positions that are real prediction slots (weight > 0)."""
  rows = jnp.arange(masked.positions.shape[0])[:, None]
  hit = jnp.zeros((masked.positions.shape[0], length), jnp.float32)
  return hit.at[rows, masked.positions].max(masked.weights) > 0


def context_positions(batch: Batch, masked: MaskedTokens, specials: SpecialTokens) -> jax.Array:
  """[batch, length] bool: regular tokens of monolingual rows that are not prediction slots."""
  tokens = batch["tokens"]
  mono = (batch["pair_side"] == 0) & (batch["segment_ids"] > 0)
  return specials.is_regular(tokens) & mono & ~prediction_slots(masked, tokens.shape[1])


def choose_positions(eligible: jax.Array, context: jax.Array, rng: jax.Array, *, min_rate: float,
                     max_rate: float, slots: int) -> Selection:
  """Per row, floor(u n + v) eligible positions chosen uniformly (see the module docstring).

  Args:
    eligible: [batch, length] bool, positions that may be switched (a subset
      of `context`).
    context: [batch, length] bool, the context tokens the share counts.
    rng: a PRNG key.
    min_rate, max_rate: the band of u.
    slots: static number of switch slots (`switch_slots`).

  Returns:
    A `Selection`.
  """
  rng_rate, rng_round, rng_pick = jax.random.split(rng, 3)
  batch, length = eligible.shape
  slots = min(slots, length)
  n_context = jnp.sum(context, axis=1, dtype=jnp.int32)
  n_eligible = jnp.sum(eligible, axis=1, dtype=jnp.int32)
  rate = jax.random.uniform(rng_rate, (batch,), minval=min_rate, maxval=max_rate)
  jitter = jax.random.uniform(rng_round, (batch,))
  wanted = jnp.floor(rate * n_context.astype(jnp.float32) + jitter).astype(jnp.int32)
  count = jnp.minimum(jnp.minimum(wanted, n_eligible), slots)
  # Top-k of uniform scores = a uniform subset without replacement; ineligible
  # positions score -1 and come last, so the first `count` are all eligible.
  scores = jnp.where(eligible, jax.random.uniform(rng_pick, (batch, length)), -1.0)
  _, positions = jax.lax.top_k(scores, slots)
  valid = jnp.arange(slots)[None, :] < count[:, None]
  return Selection(positions=positions.astype(jnp.int32), valid=valid, rate=rate, jitter=jitter, count=count,
                   context=n_context, eligible=n_eligible)


def set_at(values: jax.Array, positions: jax.Array, new: jax.Array, valid: jax.Array) -> jax.Array:
  """`values` [batch, length, ...] with values[b, positions[b, s]] = new[b, s] where valid[b, s]."""
  rows = jnp.arange(values.shape[0])[:, None]
  current = values[rows, positions]
  keep = valid.reshape(valid.shape + (1,) * (new.ndim - valid.ndim))
  return values.at[rows, positions].set(jnp.where(keep, new.astype(values.dtype), current))


# ---------------------------------------------------------------------------- TCS


def side_tables(ids: jax.Array, values: jax.Array, valid: jax.Array, vocab_size: int, fill: int) -> jax.Array:
  """[S, vocab] int32: row s maps ids[s, i] -> values[s, i] where valid, `fill` elsewhere."""
  return jax.vmap(lambda i, v, m: id_table(i, v, m, vocab_size, fill))(ids, values, valid)


def route_sides(lang_ids: jax.Array, segment_ids: jax.Array, side_lang_ids: jax.Array, rng: jax.Array) -> jax.Array:
  """The asset side each position reads: one whose language is the position's (see the module docstring).

  Args:
    lang_ids: [batch, length] int32 language id of each position.
    segment_ids: [batch, length] int32 packed sentence of each position.
    side_lang_ids: [S] int32 language id of each side.
    rng: a PRNG key; where several sides have the position's language (the
      pivot), one of them is chosen uniformly per (row, sentence).

  Returns:
    [batch, length] int32 side, -1 where no side has the position's language.
  """
  batch, length = lang_ids.shape
  match = lang_ids[..., None] == side_lang_ids[None, None, :]  # [batch, length, S]
  count = jnp.sum(match, axis=-1, dtype=jnp.int32)
  draw = jax.random.uniform(rng, (batch, length + 1))
  u = jnp.take_along_axis(draw, jnp.clip(segment_ids, 0, length), axis=1)
  pick = jnp.minimum(jnp.floor(u * count).astype(jnp.int32), jnp.maximum(count - 1, 0))
  rank = jnp.cumsum(match, axis=-1, dtype=jnp.int32) - 1
  chosen = jnp.argmax(match & (rank == pick[..., None]), axis=-1).astype(jnp.int32)
  return jnp.where(count > 0, chosen, -1)


def side_lookup(tables: jax.Array, side: jax.Array, tokens: jax.Array, fill: int) -> jax.Array:
  """tables[side, tokens] per position, `fill` where side is -1."""
  return jnp.where(side >= 0, tables[jnp.maximum(side, 0), tokens], fill)


# ---------------------------------------------------------------------------- SCS


class SemanticSwitch(NamedTuple):
  """SCS intermediates for n switch slots (Eq. 4-7).

  Attributes:
    source_ids: [n, k] the first pass's top-k tokens at each slot.
    p: [n, k] their probabilities renormalised over the k (sum 1).
    x_hat: [n, embed] float32, Σ p_i e_i (Eq. 4).
    target_ids: [n, k'] the top-k' candidates by CSLS (pad id 0 past the valid ones).
    csls: [n, k'] their CSLS (Eq. 7); `_NO_SCORE` past the valid ones.
    q: [n, k'] softmax of `csls` (Eq. 6); 0 past the valid ones.
    y_hat: [n, embed] float32, Σ q_j e_j (Eq. 5).
    target_side: [n] int32, the candidates' side (the source side ^ 1).
  """

  source_ids: jax.Array
  p: jax.Array
  x_hat: jax.Array
  target_ids: jax.Array
  csls: jax.Array
  q: jax.Array
  y_hat: jax.Array
  target_side: jax.Array


def batch_candidates(lang_vocab: Any, tokens: jax.Array, present: jax.Array, *, vocab_size: int,
                     size: int) -> tuple[jax.Array, jax.Array]:
  """Each side's language-specific tokens that occur in the batch, compacted (footnote 6).

  Args:
    lang_vocab: `ids, mask` [S, C].
    tokens: [batch, length] token ids.
    present: [batch, length] bool, the positions that count (not padding).
    vocab_size: the model's embedding rows (size of the batch's bitmap).
    size: static capacity per side (min(C, batch * length) holds them all).

  Returns:
    (ids [S, min(size, C)] int32, in vocabulary order, 0 past the valid ones;
    valid [S, min(size, C)] bool).
  """
  vocab_ids, mask = lang_vocab["ids"], lang_vocab["mask"]
  in_batch = jnp.zeros((vocab_size,), bool).at[jnp.where(present, tokens, vocab_size)].set(True, mode="drop")
  member = mask & in_batch[vocab_ids]
  width = min(size, vocab_ids.shape[1])

  def compact(ids, keep):
    (index,) = jnp.nonzero(keep, size=width, fill_value=0)
    found = jnp.arange(width) < jnp.sum(keep)
    return jnp.where(found, ids[index], 0).astype(jnp.int32), found

  return jax.vmap(compact)(vocab_ids, member)


def _top_k_softmax(scores: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(values, indices, softmax of values) of the top-k of `scores` [n, m]; `_NO_SCORE` entries get 0."""
  values, index = jax.lax.top_k(scores, k)
  real = values > _NO_SCORE / 2
  weights = jax.nn.softmax(jnp.where(real, values, _NO_SCORE), axis=-1)
  return values, index, jnp.where(real, weights, 0.0)


def semantic_switch(table: jax.Array, logits: jax.Array, source_side: jax.Array, candidate_ids: jax.Array,
                    candidate_valid: jax.Array, *, top_k: int = 8, translation_top_k: int = 8, knn: int = 10,
                    regular: jax.Array | None = None) -> SemanticSwitch:
  """SCS's replacement embeddings ŷ for n positions (Eq. 4-7; see the module docstring).

  Args:
    table: [vocab, embed] input token embeddings.
    logits: [n, vocab] the first pass's MLM logits at the positions.
    source_side: [n] int32, the side s of the token at each position; its
      candidates are side s ^ 1's.
    candidate_ids: [S, m] per side, its candidate tokens.
    candidate_valid: [S, m] bool.
    top_k: tokens of the output distribution averaged into x̂ (paper: 8).
    translation_top_k: candidates averaged into ŷ (paper: 8).
    knn: K of r_K in CSLS (MUSE's 10).
    regular: optional [vocab] bool, ids the output distribution may use
      (special ids are left out of x̂).

  Returns:
    A `SemanticSwitch`. Slots whose other side has no valid candidate get
    q = 0 and ŷ = 0; callers do not switch them.
  """
  table = table.astype(jnp.float32)
  logits = logits.astype(jnp.float32)
  if regular is not None:
    logits = jnp.where(regular[None, :], logits, _NO_SCORE)
  top_logits, source_ids = jax.lax.top_k(logits, top_k)
  p = jax.nn.softmax(top_logits, axis=-1)  # = the top-k probabilities renormalised over the k
  x_hat = jnp.einsum("nk,nke->ne", p, table[source_ids])
  x_unit = ops.l2_normalize(x_hat)
  k = min(translation_top_k, candidate_ids.shape[1])
  target_side = jnp.bitwise_xor(source_side, 1).astype(jnp.int32)
  best = []
  for target in range(candidate_ids.shape[0]):
    queries = target_side == target
    targets = table[candidate_ids[target]]
    own = table[candidate_ids[target ^ 1]]
    r_x = ops.neighbourhood_radius(x_hat, targets, knn=knn, target_mask=candidate_valid[target],
                                   query_mask=queries)
    r_y = ops.neighbourhood_radius(targets, own, knn=knn, target_mask=candidate_valid[target ^ 1],
                                   query_mask=candidate_valid[target])
    cos = x_unit @ ops.l2_normalize(targets).T
    scores = 2.0 * cos - r_x[:, None] - r_y[None, :]
    best.append(_top_k_softmax(jnp.where(candidate_valid[target][None, :], scores, _NO_SCORE), k))
  rows = jnp.arange(source_side.shape[0])
  values, index, q = (jnp.stack(parts)[target_side, rows] for parts in zip(*best))
  target_ids = jnp.where(q > 0, candidate_ids[target_side[:, None], index], 0)
  y_hat = jnp.einsum("nk,nke->ne", q, table[target_ids])
  return SemanticSwitch(source_ids=source_ids.astype(jnp.int32), p=p, x_hat=x_hat, target_ids=target_ids,
                        csls=values, q=q, y_hat=y_hat, target_side=target_side)


# ---------------------------------------------------------------------------- objectives


class Switched(NamedTuple):
  """The code-switched copy a second pass reads, and how it was made (for tests and metrics)."""

  inputs: jax.Array  # [batch, length]
  lang_ids: jax.Array  # [batch, length]
  input_embeddings: jax.Array | None  # [batch, length, embed] (SCS)
  selection: Selection
  semantic: SemanticSwitch | None  # SCS, over batch * slots positions
  candidates: jax.Array | None  # SCS: [S] valid candidates per side


@dataclasses.dataclass(frozen=True)
class CodeSwitchObjective(ObjectiveBase):
  """Shared part of `tcs` and `scs`: the second pass and its MLM loss.

  Attributes:
    min_rate, max_rate: per-row share of context tokens switched, u ~ U[min, max].
    switch_language_ids: switched positions get the other language's id.
  """

  min_rate: float = 0.10
  max_rate: float = 0.15
  switch_language_ids: bool = True

  name = "code_switch"

  def switch(self, ctx: StepContext) -> Switched:
    raise NotImplementedError

  def _keys(self, ctx: StepContext) -> tuple[jax.Array, jax.Array]:
    select, dropout = jax.random.split(jax.random.fold_in(ctx.rng, _SALT[self.name]))
    return select, dropout

  def _sides(self, ctx: StepContext, side_lang_ids: jax.Array) -> jax.Array:
    """[batch, length] the asset side each position reads (`route_sides`)."""
    rng = jax.random.fold_in(ctx.rng, _SALT[self.name] + 1)
    return route_sides(ctx.batch["lang_ids"], ctx.batch["segment_ids"], side_lang_ids.astype(jnp.int32), rng)

  def _select(self, ctx: StepContext, eligible: jax.Array, context: jax.Array) -> Selection:
    return choose_positions(eligible & context, context, self._keys(ctx)[0], min_rate=self.min_rate,
                            max_rate=self.max_rate, slots=switch_slots(context.shape[1], self.max_rate))

  def __call__(self, ctx: StepContext) -> LossTerm:
    switched = self.switch(ctx)
    batch = ctx.batch
    out = ctx.apply(ctx.params, switched.inputs, lang_ids=switched.lang_ids, positions=batch["positions"],
                    segment_ids=batch["segment_ids"], deterministic=not ctx.train,
                    input_embeddings=switched.input_embeddings, rngs={"dropout": self._keys(ctx)[1]})
    masked = ctx.masked
    at_masked = jnp.take_along_axis(out.hidden, masked.positions[..., None], axis=1)
    logits = ctx.apply(ctx.params, at_masked, method=Encoder.mlm_logits)
    weights = masked.weights * (ctx.at_predictions("pair_side") == 0).astype(jnp.float32)
    loss_sum, count, correct = masked_cross_entropy(logits, masked.targets, weights)
    denom = jnp.maximum(count, 1.0)
    sel = switched.selection
    n_context = jnp.maximum(jnp.sum(sel.context).astype(jnp.float32), 1.0)
    metrics = {
        "accuracy": correct / denom,
        "predictions": count,
        "switched": jnp.sum(sel.count).astype(jnp.float32) / n_context,
        "eligible": jnp.sum(sel.eligible).astype(jnp.float32) / n_context,
    }
    if switched.semantic is not None:
      valid = sel.valid.reshape(-1).astype(jnp.float32)
      used = jnp.maximum(jnp.sum(valid), 1.0)
      metrics["candidates"] = jnp.sum(switched.candidates).astype(jnp.float32)
      metrics["p_max"] = jnp.sum(switched.semantic.p[:, 0] * valid) / used
      metrics["q_max"] = jnp.sum(switched.semantic.q[:, 0] * valid) / used
    return LossTerm(loss=loss_sum / denom, metrics=metrics, loss_sum=loss_sum, count=count)


@dataclasses.dataclass(frozen=True)
class TokenCodeSwitch(CodeSwitchObjective):
  """TCS-MLM (§3.1): context tokens replaced by their `induced_dictionary` translations."""

  requires: tuple[str, ...] = ("induced_dictionary",)
  name = "tcs"

  def switch(self, ctx: StepContext) -> Switched:
    inputs = ctx.masked.inputs
    dictionary = ctx.assets["induced_dictionary"]
    side_langs = jnp.asarray(dictionary["lang_ids"], jnp.int32)
    tables = side_tables(dictionary["vocab_ids"], dictionary["translation"],
                         dictionary["vocab_mask"] & (dictionary["translation"] >= 0), ctx.logits.shape[-1], -1)
    side = self._sides(ctx, side_langs)
    context = context_positions(ctx.batch, ctx.masked, ctx.specials)
    sel = self._select(ctx, side_lookup(tables, side, ctx.batch["tokens"], -1) >= 0, context)
    current = jnp.take_along_axis(inputs, sel.positions, axis=1)
    at_side = jnp.take_along_axis(side, sel.positions, axis=1)
    translated = side_lookup(tables, at_side, current, -1)
    switched = set_at(inputs, sel.positions, jnp.where(translated >= 0, translated, current), sel.valid)
    lang_ids = ctx.batch["lang_ids"]
    if self.switch_language_ids:
      other = side_langs[jnp.bitwise_xor(jnp.maximum(at_side, 0), 1)]
      lang_ids = set_at(lang_ids, sel.positions, other, sel.valid & (translated >= 0))
    return Switched(inputs=switched, lang_ids=lang_ids, input_embeddings=None, selection=sel, semantic=None,
                    candidates=None)


@dataclasses.dataclass(frozen=True)
class SemanticCodeSwitch(CodeSwitchObjective):
  """SCS-MLM (§3.2): context embeddings replaced by CSLS-weighted averages over the other language.

  Attributes:
    top_k: tokens of the first pass's distribution averaged into x̂ (Eq. 4).
    translation_top_k: candidates averaged into ŷ (Eq. 5).
    csls_knn: K of r_K (Eq. 2, 7).
    gradient_through_replacement: False (default) stops gradients at x̂ and ŷ.
    max_candidates: per-side capacity of the batch's candidates; None =
      min(C, batch * length), which always holds them all.
    candidates: 'batch' (footnote 6) or 'vocabulary' (Eq. 5-7: the whole
      language-specific vocabulary); see the module docstring.
  """

  requires: tuple[str, ...] = ("lang_vocab",)
  top_k: int = 8
  translation_top_k: int = 8
  csls_knn: int = 10
  gradient_through_replacement: bool = False
  max_candidates: int | None = None
  candidates: str = "batch"
  name = "scs"

  def switch(self, ctx: StepContext) -> Switched:
    lang_vocab = ctx.assets["lang_vocab"]
    batch, masked = ctx.batch, ctx.masked
    tokens = batch["tokens"]
    params, hidden = ctx.params, ctx.hidden
    if not self.gradient_through_replacement:
      params, hidden = jax.lax.stop_gradient(params), jax.lax.stop_gradient(hidden)
    table = params["token_embed"]["embedding"]
    vocab = table.shape[0]
    if self.candidates == "vocabulary":
      candidate_ids, candidate_valid = lang_vocab["ids"].astype(jnp.int32), lang_vocab["mask"]
    else:
      size = self.max_candidates or tokens.size
      candidate_ids, candidate_valid = batch_candidates(lang_vocab, tokens, batch["segment_ids"] > 0,
                                                        vocab_size=vocab, size=size)
    has_candidates = jnp.any(candidate_valid, axis=1)  # [S]
    side_langs = jnp.asarray(lang_vocab["lang_ids"], jnp.int32)
    members = side_tables(lang_vocab["ids"], jnp.ones_like(lang_vocab["ids"]), lang_vocab["mask"], vocab, 0)
    side = self._sides(ctx, side_langs)
    own = side_lookup(members, side, tokens, 0) > 0
    other_has = own & has_candidates[jnp.bitwise_xor(jnp.maximum(side, 0), 1)]
    context = context_positions(batch, masked, ctx.specials)
    sel = self._select(ctx, other_has, context)

    at_slots = jnp.take_along_axis(hidden, sel.positions[..., None], axis=1)  # [batch, slots, embed]
    logits = ctx.apply(params, at_slots, method=Encoder.mlm_logits)
    n = sel.positions.size
    ids = jnp.arange(vocab)
    regular = ctx.specials.is_regular(ids)
    if ctx.vocab_size is not None and ctx.vocab_size < vocab:  # A padded vocabulary's rows are no token.
      regular = regular & (ids < ctx.vocab_size)
    source_side = jnp.maximum(jnp.take_along_axis(side, sel.positions, axis=1), 0).reshape(n)
    semantic = semantic_switch(
        table, logits.reshape(n, vocab), source_side, candidate_ids, candidate_valid, top_k=self.top_k,
        translation_top_k=self.translation_top_k, knn=self.csls_knn, regular=regular)
    y_hat = semantic.y_hat
    if not self.gradient_through_replacement:
      y_hat = jax.lax.stop_gradient(y_hat)
    embed_table = ctx.params["token_embed"]["embedding"]  # the regular lookup stays differentiated
    embeddings = jnp.take(embed_table, masked.inputs, axis=0)
    embeddings = set_at(embeddings, sel.positions, y_hat.reshape(sel.positions.shape + (-1,)), sel.valid)
    lang_ids = batch["lang_ids"]
    if self.switch_language_ids:
      other_lang = side_langs[semantic.target_side].reshape(sel.positions.shape)
      lang_ids = set_at(lang_ids, sel.positions, other_lang, sel.valid)
    return Switched(inputs=masked.inputs, lang_ids=lang_ids, input_embeddings=embeddings, selection=sel,
                    semantic=semantic, candidates=jnp.sum(candidate_valid, axis=1))


def _check_rates(name: str, min_rate: float, max_rate: float) -> None:
  if not 0.0 <= min_rate <= max_rate <= 1.0 or max_rate <= 0.0:
    raise UserError(f"{name} needs 0 <= min_rate <= max_rate <= 1 and max_rate > 0, got "
                    f"min_rate={min_rate!r}, max_rate={max_rate!r} (the paper: 0.10 and 0.15); set them in "
                    f"train.objective_options = {{'{name}': {{'min_rate': 0.1, 'max_rate': 0.15}}}}.")


def _check_positive(name: str, **values: Any) -> None:
  for key, value in values.items():
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise UserError(f"{name} option {key} must be an int >= 1, got {value!r} "
                      f"(train.objective_options = {{'{name}': {{'{key}': ...}}}}).")


@register("tcs")
def tcs(*, min_rate: float = 0.10, max_rate: float = 0.15,
        switch_language_ids: bool = True) -> TokenCodeSwitch:
  _check_rates("tcs", min_rate, max_rate)
  return TokenCodeSwitch(min_rate=float(min_rate), max_rate=float(max_rate),
                         switch_language_ids=bool(switch_language_ids))


@register("scs")
def scs(*, min_rate: float = 0.10, max_rate: float = 0.15, switch_language_ids: bool = True, top_k: int = 8,
        translation_top_k: int = 8, csls_knn: int = 10, gradient_through_replacement: bool = False,
        max_candidates: int | None = None, candidates: str = "batch") -> SemanticCodeSwitch:
  _check_rates("scs", min_rate, max_rate)
  _check_positive("scs", top_k=top_k, translation_top_k=translation_top_k, csls_knn=csls_knn)
  if max_candidates is not None:
    _check_positive("scs", max_candidates=max_candidates)
  if candidates not in CANDIDATES:
    raise UserError(f"scs option candidates must be one of {', '.join(map(repr, CANDIDATES))}, got "
                    f"{candidates!r} ('batch': the batch's language-specific tokens, footnote 6; 'vocabulary': "
                    "the whole language-specific vocabulary, Eq. 5-7).")
  return SemanticCodeSwitch(min_rate=float(min_rate), max_rate=float(max_rate),
                            switch_language_ids=bool(switch_language_ids), top_k=top_k,
                            translation_top_k=translation_top_k, csls_knn=csls_knn,
                            gradient_through_replacement=bool(gradient_through_replacement),
                            max_candidates=max_candidates, candidates=candidates)
