"""MLM-GC's global co-occurrence regression (`gc`), Ai & Fang 2023, §3.2-3.3 and App. D.

For every masked slot t (original token w_t) and every neighbour k in
[t - n, t) ∪ (t, t + n] of the same sequence (token w_k):

    L_GC = mean_t (1/(2n)) Σ_k f(X[w_t, w_k]) (s(t, k) - log X[w_t, w_k])²
    f(x) = min(1, (x / x_max)^α)              (x_max 100, α 0.75: GloVe)
    Eq. 3 (`representation='hidden'`):  s = H_t · H_k / √d
    Eq. 6 (`representation='output'`):  s = H_t^T O_{w_k} / √d

H are the final hidden states of the masked input (`ctx.hidden`), d the model
width, X the `cooc` asset (a CSR table of pre-logged counts, looked up on
device by `ops.cooc_lookup`). `{'mlm': 1.0, 'gc': 1.0}` is the paper's Eq. 4
with λ = 1. The mean runs over the masked slots (`count`); a pair the table
lacks has X = 0, f(0) = 0 and contributes nothing, as in GloVe.

Eq. 6 here. The paper's O is the pre-softmax map with Q ∝ exp(H^T O_w). Our
MLM head computes logit_w = g(H_t) · E_w + b_w, g = dense + GELU + LayerNorm
and E the tied token embedding, so its "H^T O_w" is g(H_t) · E_w: the MLM
logit without its output bias. `ctx.logits` already holds every logit at the
masked slots, so s is a gather from it minus b_w, and the term costs no
extra matmul; its gradient reaches the head and the (tied) embedding rows of
the neighbours, which is what App. D says distinguishes Eq. 6. The bias is
left out because the paper's formula has none and because with it GC would
pull b_w (which MLM uses for the unigram prior) towards log X, GloVe's b_j.

Which pairs count (everything else is 0 weight, never a wrong pair):
* t: a prediction slot of `ctx.masked` with weight > 0 (those are regular
  tokens), in any row: the table counts every side of a translation pair as
  its own sequence, so pairs within one side are as valid as in monolingual
  text;
* k: same `segment_ids` (> 0, so never padding) and same `pair_side` as t
  (the two sides of a pair share a segment: TLM attends across them, but
  the table never pairs them), inside the row, not t itself, and not a
  layout special (`<pad>`, `<s>`, `</s>`, `<mask>`: the converter adds them
  and the table never counts them; `<unk>` is text and may be counted);
* `masked_neighbours='exclude'` also drops k whose *input* is `<mask>` (the
  authors' code: its context is every token that is not MASK, EOS or PAD, so
  random and kept prediction slots still count); 'include' (default, Eq. 3
  as written, XLM-style) keeps them;
* `neighbour_ids='original'` (default, the paper's X_{w_t w_k}) looks up the
  uncorrupted w_k; 'input' the id the encoder read at k (the authors'
  `X[label_i, input_j]`; a neighbour showing `<mask>` then drops out, as the
  authors' X has no `<mask>` entries).
Distance in the row equals distance in the sequence for such pairs, since a
side's text tokens are contiguous between its `<s>` and `</s>`.

The paper finds training collapses to L_GC without LR warmup, √d or 1/(2n)
(§3.3): `check(run)` refuses such runs unless `accept_collapse_risk=True`.

Metrics (`gc_...`): `error`, the f-weighted mean squared error per found pair
Σ f (s - log X)² / Σ f; `found`, the share of candidate pairs the table has;
`abs_score`, the mean |s| over found pairs; `pairs`, candidate pairs per
masked slot.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.objectives.base import Batch, LossTerm, ObjectiveBase, StepContext, register
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.ops import cooc_lookup

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

REPRESENTATIONS = ("hidden", "output")
MASKED_NEIGHBOURS = ("include", "exclude")
NEIGHBOUR_IDS = ("original", "input")
# The `cooc` asset's window when its options do not name one (`data.cooc.DEFAULT_WINDOW`).
TABLE_DEFAULT_WINDOW = 2


class NeighbourPairs(NamedTuple):
  """The (masked slot, neighbour) pairs of a batch, [batch, predictions, 2n] each.

  Attributes:
    rows: int32 w_t, the original token at the slot (the table's row).
    cols: int32 w_k as `neighbour_ids` says (the table's column).
    positions: int32 k, clipped into the row (read only where `valid`).
    valid: bool, the pair counts (see the module docstring).
  """

  rows: jax.Array
  cols: jax.Array
  positions: jax.Array
  valid: jax.Array


def window_offsets(window: int) -> np.ndarray:
  """[2n] int32 offsets -n..-1, 1..n (position t itself is not its own neighbour)."""
  return np.concatenate([np.arange(-window, 0), np.arange(1, window + 1)]).astype(np.int32)


def neighbour_pairs(batch: Batch, masked: MaskedTokens, specials: SpecialTokens, *, window: int,
                    masked_neighbours: str = "include", neighbour_ids: str = "original") -> NeighbourPairs:
  """Every masked slot's neighbours within ±window that may pair with it.

  Args:
    batch: `tokens, segment_ids, pair_side` [batch, length] (uncorrupted).
    masked: the step's masking; `positions, targets, weights` [batch, predictions],
      `inputs` [batch, length].
    specials: the vocabulary's special ids.
    window: n >= 1.
    masked_neighbours: "include" or "exclude" (neighbours whose input is `<mask>`).
    neighbour_ids: "original" or "input".

  Returns:
    NeighbourPairs of [batch, predictions, 2n].
  """
  tokens, length = batch["tokens"], batch["tokens"].shape[1]
  offsets = jnp.asarray(window_offsets(window))
  slot = masked.positions[..., None]  # [b, p, 1]
  k = slot + offsets  # [b, p, 2n]
  inside = (k >= 0) & (k < length)
  k = jnp.clip(k, 0, length - 1).astype(jnp.int32)

  def at(values: jax.Array, where: jax.Array) -> jax.Array:
    return jnp.take_along_axis(values, where.reshape(where.shape[0], -1), axis=1).reshape(where.shape)

  segment, side = batch["segment_ids"], batch["pair_side"]
  same_sequence = ((at(segment, k) == at(segment, slot)) & (at(side, k) == at(side, slot))
                   & (at(segment, slot) > 0))
  original, inputs = at(tokens, k), at(masked.inputs, k)
  cols = original if neighbour_ids == "original" else inputs
  layout = jnp.asarray((specials.pad, specials.bos, specials.eos, specials.mask), original.dtype)
  # Both the position (a text token) and the looked-up id (with 'input', a <mask>) must be text.
  text = ~jnp.isin(original, layout) & ~jnp.isin(cols, layout)
  valid = inside & same_sequence & text & (masked.weights[..., None] > 0)
  if masked_neighbours == "exclude":
    valid = valid & (inputs != specials.mask)
  rows = jnp.broadcast_to(masked.targets[..., None], k.shape)
  return NeighbourPairs(rows=rows.astype(jnp.int32), cols=cols.astype(jnp.int32), positions=k, valid=valid)


def hidden_scores(hidden: jax.Array, slots: jax.Array, neighbours: jax.Array, *, scale: float) -> jax.Array:
  """Eq. 3's H_t · H_k * scale.

  Args:
    hidden: [batch, length, embed] final hidden states.
    slots: [batch, predictions] positions t.
    neighbours: [batch, predictions, 2n] positions k.
    scale: 1/√d, or 1.

  Returns:
    [batch, predictions, 2n] float32.
  """
  hidden = hidden.astype(jnp.float32)
  h_t = jnp.take_along_axis(hidden, slots[..., None], axis=1)  # [b, p, e]
  flat = neighbours.reshape(neighbours.shape[0], -1)
  h_k = jnp.take_along_axis(hidden, flat[..., None], axis=1).reshape(neighbours.shape + hidden.shape[-1:])
  return jnp.einsum("bpe,bpne->bpn", h_t, h_k) * scale


def output_scores(logits: jax.Array, output_bias: jax.Array, cols: jax.Array, *, scale: float) -> jax.Array:
  """Eq. 6's H_t^T O_{w_k} * scale, read off the MLM logits (see the module docstring).

  Args:
    logits: [batch, predictions, vocab] MLM logits at the masked slots.
    output_bias: [vocab] the MLM head's output bias (subtracted).
    cols: [batch, predictions, 2n] ids w_k.
    scale: 1/√d, or 1.

  Returns:
    [batch, predictions, 2n] float32.
  """
  gathered = jnp.take_along_axis(logits.astype(jnp.float32), cols, axis=2)
  return (gathered - jnp.take(output_bias.astype(jnp.float32), cols, axis=0)) * scale


class GloveTerms(NamedTuple):
  """Summed parts of the regression over a batch (scalars).

  Attributes:
    loss_sum: Σ_t weight_t · norm · Σ_k f (s - log X)², norm = 1/(2n) or 1.
    count: Σ_t weight_t, the masked slots.
    error_sum: Σ f (s - log X)² over found pairs.
    f_sum: Σ f over found pairs.
    abs_score_sum: Σ |s| over found pairs.
    found: found pairs.
    pairs: candidate pairs.
  """

  loss_sum: jax.Array
  count: jax.Array
  error_sum: jax.Array
  f_sum: jax.Array
  abs_score_sum: jax.Array
  found: jax.Array
  pairs: jax.Array


def glove_regression(scores: jax.Array, log_x: jax.Array, found: jax.Array, valid: jax.Array,
                     slot_weights: jax.Array, *, x_max: float, alpha: float, norm: float) -> GloveTerms:
  """GloVe's weighted least squares on the pairs of a batch.

  Args:
    scores: [batch, predictions, 2n] s(t, k).
    log_x: [batch, predictions, 2n] log X (anything where not found).
    found: [batch, predictions, 2n] bool, X > 0.
    valid: [batch, predictions, 2n] bool, the pair counts.
    slot_weights: [batch, predictions] the masked slots' weights.
    x_max, alpha: f(x) = min(1, (x / x_max)^alpha).
    norm: the per-slot factor on Σ_k (1/(2n), or 1).

  Returns:
    GloveTerms.
  """
  hit = found & valid
  log_x = jnp.where(hit, log_x, 0.0)
  # (x / x_max)^α in log space: exact, and no overflow for huge counts.
  f = jnp.where(hit, jnp.minimum(1.0, jnp.exp(alpha * (log_x - math.log(x_max)))), 0.0)
  error = f * jnp.square(scores - log_x)
  per_slot = norm * jnp.sum(error, axis=-1)
  return GloveTerms(
      loss_sum=jnp.sum(slot_weights * per_slot), count=jnp.sum(slot_weights),
      error_sum=jnp.sum(error), f_sum=jnp.sum(f), abs_score_sum=jnp.sum(jnp.where(hit, jnp.abs(scores), 0.0)),
      found=jnp.sum(hit.astype(jnp.float32)), pairs=jnp.sum(valid.astype(jnp.float32)))


@dataclasses.dataclass(frozen=True)
class GlobalCooccurrence(ObjectiveBase):
  """The `gc` term; options as `gc(...)` documents them."""

  window: int = 2
  x_max: float = 100.0
  alpha: float = 0.75
  representation: str = "hidden"
  masked_neighbours: str = "include"
  neighbour_ids: str = "original"
  scale_sqrt_d: bool = True
  per_window_norm: bool = True
  accept_collapse_risk: bool = False
  requires: ClassVar[tuple[str, ...]] = ("cooc",)
  needs_all_hidden: ClassVar[bool] = False

  def check(self, run: RunSpec) -> None:
    table_window = int(run.options_of("cooc").get("window", TABLE_DEFAULT_WINDOW))
    if self.window > table_window:
      raise UserError(
          f"gc window={self.window} is wider than the co-occurrence table's window {table_window}: pairs "
          f"beyond distance {table_window} were never counted. Count the table with the same window "
          f"(train.asset_options = {{'cooc': {{'window': {self.window}}}}}) or narrow the objective's "
          f"(train.objective_options = {{'gc': {{'window': {table_window}}}}}).")
    risks = collapse_risks(self, run)
    if not risks:
      return
    if not self.accept_collapse_risk:
      raise UserError(
          "this MLM-GC run risks collapsing to L_GC (Ai & Fang 2023, §3.3: without LR warmup, √d or "
          "1/(2n) the GC term converges too fast and the model stops learning MLM): " + "; ".join(risks)
          + ". Fix the settings, or set train.objective_options = {'gc': {'accept_collapse_risk': True}} "
          "to train anyway.")
    print("WARNING: gc accept_collapse_risk=True: training despite " + "; ".join(risks)
          + " (Ai & Fang 2023 §3.3 report collapse to L_GC).", flush=True)

  def __call__(self, ctx: StepContext) -> LossTerm:
    pairs = neighbour_pairs(ctx.batch, ctx.masked, ctx.specials, window=self.window,
                            masked_neighbours=self.masked_neighbours, neighbour_ids=self.neighbour_ids)
    width = ctx.hidden.shape[-1]
    scale = 1.0 / math.sqrt(width) if self.scale_sqrt_d else 1.0
    if self.representation == "hidden":
      scores = hidden_scores(ctx.hidden, ctx.masked.positions, pairs.positions, scale=scale)
    else:
      bias = ctx.params["mlm_head"]["output_bias"]
      scores = output_scores(ctx.logits, bias, pairs.cols, scale=scale)
    table = cooc_lookup.lookup_table(ctx.assets["cooc"], pairs.rows, pairs.cols)
    norm = 1.0 / (2 * self.window) if self.per_window_norm else 1.0
    terms = glove_regression(scores, table.log_x, table.found, pairs.valid, ctx.masked.weights,
                             x_max=self.x_max, alpha=self.alpha, norm=norm)
    denom = jnp.maximum(terms.count, 1.0)
    found = jnp.maximum(terms.found, 1.0)
    return LossTerm(
        loss=terms.loss_sum / denom,
        metrics={"error": terms.error_sum / jnp.maximum(terms.f_sum, 1e-12),
                 "found": terms.found / jnp.maximum(terms.pairs, 1.0),
                 "abs_score": terms.abs_score_sum / found,
                 "pairs": terms.pairs / denom},
        loss_sum=terms.loss_sum,
        count=terms.count,
    )


def collapse_risks(objective: GlobalCooccurrence, run: RunSpec) -> list[str]:
  """The settings §3.3 says make MLM-GC collapse, as phrases (empty: none)."""
  risks = []
  warmup = run.optimizer.get("warmup_steps") if run.optimizer else None
  if warmup is not None and int(warmup) <= 0:
    risks.append(f"no learning-rate warmup (OptimizerConfig.warmup_steps={warmup}; the paper: 10000)")
  if not objective.scale_sqrt_d:
    risks.append("scale_sqrt_d=False (no 1/√d on the scores)")
  if not objective.per_window_norm:
    risks.append("per_window_norm=False (no 1/(2n) on each slot's sum)")
  if not any(name in run.objectives for name in ("mlm", "tlm")):
    risks.append(f"no MLM or TLM term beside gc (objectives {sorted(run.objectives)}; the paper: "
                 "{'mlm': 1.0, 'gc': 1.0})")
  return risks


def _options_problems(window: Any, x_max: Any, alpha: Any, representation: Any, masked_neighbours: Any,
                      neighbour_ids: Any, flags: dict[str, Any]) -> list[str]:
  problems = []
  if isinstance(window, bool) or not isinstance(window, int) or window < 1:
    problems.append(f"window must be an int >= 1 (the paper: 2), got {window!r}")
  for key, value in (("x_max", x_max), ("alpha", alpha)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
      problems.append(f"{key} must be a number > 0 (GloVe: x_max 100, alpha 0.75), got {value!r}")
  for key, value, allowed in (("representation", representation, REPRESENTATIONS),
                              ("masked_neighbours", masked_neighbours, MASKED_NEIGHBOURS),
                              ("neighbour_ids", neighbour_ids, NEIGHBOUR_IDS)):
    if value not in allowed:
      problems.append(f"{key} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
  for key, value in flags.items():
    if not isinstance(value, bool):
      problems.append(f"{key} must be True or False, got {value!r}")
  return problems


@register("gc")
def gc(*, window: int = 2, x_max: float = 100.0, alpha: float = 0.75, representation: str = "hidden",
       masked_neighbours: str = "include", neighbour_ids: str = "original", scale_sqrt_d: bool = True,
       per_window_norm: bool = True, accept_collapse_risk: bool = False) -> GlobalCooccurrence:
  """MLM-GC's co-occurrence regression.

  Args:
    window: n, neighbours within ±n (<= the `cooc` table's window).
    x_max, alpha: GloVe's weighting f(x) = min(1, (x / x_max)^alpha).
    representation: "hidden" (Eq. 3, H_t · H_k) or "output" (Eq. 6, App. D,
      H_t^T O_{w_k}).
    masked_neighbours: "include" (Eq. 3) or "exclude" (neighbours showing
      `<mask>` drop out: the authors' code).
    neighbour_ids: "original" (X[w_t, w_k]) or "input" (X[w_t, input_k]: the
      authors' code).
    scale_sqrt_d: divide the scores by √d (§3.2; False needs
      accept_collapse_risk).
    per_window_norm: the 1/(2n) on each slot's sum (False needs
      accept_collapse_risk).
    accept_collapse_risk: train even with what §3.3 says collapses (no LR
      warmup, no √d, no 1/(2n), no MLM term); a warning is printed.
  """
  flags = {"scale_sqrt_d": scale_sqrt_d, "per_window_norm": per_window_norm,
           "accept_collapse_risk": accept_collapse_risk}
  problems = _options_problems(window, x_max, alpha, representation, masked_neighbours, neighbour_ids, flags)
  if problems:
    raise UserError("bad gc options: " + "; ".join(problems) + ". Set them in train.objective_options = "
                    "{'gc': {'window': 2, 'representation': 'hidden', ...}}.")
  return GlobalCooccurrence(window=window, x_max=float(x_max), alpha=float(alpha), representation=representation,
                            masked_neighbours=masked_neighbours, neighbour_ids=neighbour_ids,
                            scale_sqrt_d=scale_sqrt_d, per_window_norm=per_window_norm,
                            accept_collapse_risk=accept_collapse_risk)
