"""XLM-Align's denoising word alignment (DWA) with self-labelled alignments.

Chi et al. 2021, "Improving Pretrained Cross-Lingual Language Models via
Self-Labeled Word Alignment", Sec. 3. Each step, for the translation pairs in
the batch (`pair_side` 1 and 2):

1. *Self-labelling* (no gradient, dropout off): encode the uncorrupted pair
   (jointly, as the paper, or each side alone: `self_label_encoding`), run
   the layers up to `self_label_layer` and no further, score every source
   subword against every target subword (dot product, or cosine), solve the
   paper's optimal-transport problem (kernel max(eps, S)^(1/mu), Eq. 1-6)
   with a few Sinkhorn iterations and keep the Itermax-filtered links
   (forward ∩ backward argmax, α-discounted extra rounds; see
   `ops.AlignmentSolver.self_labels`). Special tokens (`<s>`, `</s>`) never align; pairs packed into one
   row stay independent (every op is block-diagonal over `segment_ids`).
2. *Denoising*: on the masked pair the shared forward pass already computed,
   a pointer network (query/key projections, scaled dot product restricted to
   the other side's real tokens) predicts, for every masked token that has a
   label, its aligned positions — source→target and target→source.

The loss is the cross-entropy summed over the labelled (query, target) links
and divided by their number (the paper's Eq. 15 sums; the authors' code divides
the sum of all terms by the number of targets, so a mean per link keeps the
weight against MLM/TLM comparable across batch sizes). The term also returns
its summed loss and link count, so `loss_normalization="pooled"` reproduces
the code's one mean over masked tokens and links together.

Logged per step: `dwa_labels` (links per batch), `dwa_queries` (masked
labelled queries), `dwa_entropy` (mean entropy in nats of a source token's
normalised transport row), `dwa_accuracy` (pointer argmax hits a label).

Where the labels come from is `label_source` (not in the paper, whose labels
are always its own): "self" (the paper), "links" (word links that come with
the bitext, e.g. a statistical aligner's Pharaoh output, through
`TsvBitextTask(links=...)`: distils that aligner into the encoder, and the
self-labelling pass is skipped), "intersection" (self-labels the given links
confirm) or "union" (either). With given links the term also logs
`dwa_given` (given links per batch) and `dwa_agreement` (the share of them
the self-labels also find).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from flax_xalign import ops
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.base import Batch, LossTerm, ObjectiveBase, StepContext, register, require_bitext

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

_MASKED_SCORE = -1e9


@dataclasses.dataclass(frozen=True)
class DwaConfig:
  """Hyperparameters of self-labelling and the pointer network.

  Attributes:
    self_label_layer: hidden layer used for self-labelling (0 = embeddings,
      num_layers = last). None: the paper's layer 10 of 12 scaled to the
      model's depth, round(10 / 12 * num_layers).
    solver: similarity, Sinkhorn and Itermax settings (`ops.AlignmentSolver`,
      shared with the word aligner; the paper's values by default).
    pointer_layer: layer whose states feed the pointer network; None is the
      last layer (the states TLM reads, so no extra work).
    pointer_projections: False uses the states themselves as queries and keys
      (the code's `--no_linear_proj`).
    self_label_encoding: "joint" (the paper: the pair encoded as one sequence,
      each side attending to the other) or "separate" (each side encoded
      alone, as SimAlign and awesome-align align; an encoder that never saw
      TLM, e.g. an imported sentence encoder, labels better this way at first).
      Separate encoding costs nothing extra: the clean pass gives each side its
      own segment, so attention stays within the side.
  """

  self_label_layer: int | None = None
  solver: ops.AlignmentSolver = ops.AlignmentSolver()
  pointer_layer: int | None = None
  pointer_projections: bool = True
  self_label_encoding: str = "joint"
  label_source: str = "self"

  def __post_init__(self):
    if self.self_label_encoding not in SELF_LABEL_ENCODINGS:
      raise UserError(f"DwaConfig.self_label_encoding={self.self_label_encoding!r} is unknown; use one of "
                      f"{', '.join(SELF_LABEL_ENCODINGS)}.")
    if self.label_source not in LABEL_SOURCES:
      raise UserError(f"DwaConfig.label_source={self.label_source!r} is unknown; use one of "
                      f"{', '.join(LABEL_SOURCES)} (all but 'self' read word links given with the bitext: "
                      "TsvBitextTask(links={'train': 'FILE.pharaoh'})).")


def separate_sides(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """Segment ids and positions that encode each side of a pair alone.

  Args:
    batch: `segment_ids, positions, pair_side` ([batch, length]).

  Returns:
    (segment_ids, positions) [batch, length]: side b of every pair gets a
    segment of its own (2s + 1 where side a and monolingual text get 2s,
    padding stays 0), and positions restart at 0 on each side (they already
    do in the "restart" layout; the "continuous" one runs on across the pair).
  """
  seg = batch["segment_ids"]
  side_b = (batch["pair_side"] == 2).astype(seg.dtype)
  segments = jnp.where(seg > 0, 2 * seg + side_b, 0)
  same = segments[:, :, None] == segments[:, None, :]
  first = jnp.min(jnp.where(same, batch["positions"][:, None, :], jnp.iinfo(jnp.int32).max), axis=-1)
  return segments, batch["positions"] - first.astype(batch["positions"].dtype)


SELF_LABEL_ENCODINGS = ("joint", "separate")
# Where DWA's alignment labels come from (DwaConfig.label_source).
LABEL_SOURCES = ("self", "links", "intersection", "union")


def default_self_label_layer(num_layers: int) -> int:
  """The paper's layer 10 of XLM-R base's 12, scaled to `num_layers`."""
  return max(1, min(num_layers, round(10 * num_layers / 12)))


def _layer(index: int | None, num_layers: int, default: int, what: str) -> int:
  layer = default if index is None else index
  if not 0 <= layer <= num_layers:
    raise ValueError(f"DwaConfig.{what}={index} is outside 0..{num_layers} for this encoder.")
  return layer


def pair_masks(batch: Batch, specials: SpecialTokens) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Where alignment links may lie (never on special tokens).

  Returns:
    (link_mask [batch, length, length] bool: source i and target j of the same
    packed pair, both real subwords; source [batch, length]; target [batch,
    length]).
  """
  real = specials.is_regular(batch["tokens"])
  source = real & (batch["pair_side"] == 1)
  target = real & (batch["pair_side"] == 2)
  seg = batch["segment_ids"]
  same = seg[:, :, None] == seg[:, None, :]
  return source[:, :, None] & target[:, None, :] & same, source, target


def self_label(hidden: jax.Array, batch: Batch, config: DwaConfig,
               specials: SpecialTokens) -> tuple[jax.Array, ops.SinkhornResult]:
  """Sinkhorn + Itermax alignment labels from one layer's states.

  Args:
    hidden: [batch, length, embed] states of the uncorrupted batch.
    batch: `tokens, pair_side, segment_ids` ([batch, length]).
    config: the DWA hyperparameters.
    specials: the vocabulary's special ids (never aligned).

  Returns:
    (links [batch, length, length] bool from source position i to target
    position j, the Sinkhorn result).
  """
  link_mask, _, _ = pair_masks(batch, specials)
  seg = batch["segment_ids"]
  solver = config.solver
  return solver.self_labels(solver.scores(hidden, hidden), link_mask, row_segments=seg, col_segments=seg)


def given_links(batch: Batch, link_mask: jax.Array) -> jax.Array:
  """bool [batch, length, length]: source i and target j share a non-zero link group in the same pair.

  Args:
    batch: `link_groups` [batch, length] (`tasks.links`: each subword's word-link group, 0 = none).
    link_mask: where links may lie (`pair_masks`).
  """
  groups = batch["link_groups"]
  return link_mask & (groups[:, :, None] == groups[:, None, :]) & (groups[:, :, None] > 0)


def combine_labels(own: jax.Array | None, batch: Batch, link_mask: jax.Array,
                   source: str) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(the links to train on, metrics) for a `label_source` (LABEL_SOURCES).

  Args:
    own: the model's own links [batch, length, length] (None with "links", which does not use them).
    batch: with `link_groups` unless `source` is "self".
    link_mask: where links may lie (`pair_masks`).
    source: "self", "links", "intersection" or "union".

  Returns:
    The links, and with given links {"given": their count, "agreement": the share of them `own` also
    has (only when `own` is given)}.
  """
  if source == "self":
    return own, {}
  given = given_links(batch, link_mask)
  count = jnp.sum(given).astype(jnp.float32)
  if source == "links":
    return given, {"given": count}
  metrics = {"given": count, "agreement": jnp.sum(given & own) / jnp.maximum(count, 1.0)}
  return (own & given if source == "intersection" else own | given), metrics


def row_entropy(log_plan: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Summed entropy (nats) of the row-normalised plan over rows with links, and the row count."""
  masked = jnp.where(mask, log_plan, -jnp.inf)
  log_row = masked - jax.nn.logsumexp(masked, axis=-1, keepdims=True)
  p = jnp.where(mask, jnp.exp(log_row), 0.0)
  entropy = -jnp.sum(jnp.where(mask, p * log_row, 0.0), axis=-1)
  rows = jnp.any(mask, axis=-1)
  return jnp.sum(jnp.where(rows, entropy, 0.0)), jnp.sum(rows).astype(jnp.float32)


def pointer_loss(queries: jax.Array, keys: jax.Array, links: jax.Array, key_mask: jax.Array,
                 query_weights: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Cross-entropy of the pointer network against alignment labels.

  Args:
    queries: [batch, length, d] float32.
    keys: [batch, length, d] float32.
    links: [batch, length, length] bool, targets of each query position
      (several targets give several cross-entropy terms).
    key_mask: [batch, length, length] bool, keys each query may point at.
    query_weights: [batch, length] float32, 1 for positions used as queries.

  Returns:
    (loss_sum over links, number of links, correct queries, queries): a query
    is correct when its argmax key is one of its targets.
  """
  scores = jnp.einsum("bid,bjd->bij", queries, keys) / math.sqrt(queries.shape[-1])
  scores = jnp.where(key_mask, scores, _MASKED_SCORE)
  log_probs = jax.nn.log_softmax(scores, axis=-1)
  targets = (links & key_mask).astype(jnp.float32) * query_weights[:, :, None]
  loss_sum = -jnp.sum(targets * log_probs)
  has_target = (jnp.sum(targets, axis=-1) > 0).astype(jnp.float32)
  best = jnp.argmax(scores, axis=-1)
  hit = jnp.take_along_axis(targets, best[..., None], axis=-1)[..., 0] > 0
  return loss_sum, jnp.sum(targets), jnp.sum(hit * has_target), jnp.sum(has_target)


@dataclasses.dataclass(frozen=True)
class DenoisingWordAlignment(ObjectiveBase):
  """The `dwa` objective; see the module docstring."""

  config: DwaConfig = DwaConfig()

  def check(self, run: "RunSpec") -> None:
    require_bitext("dwa", run, what="aligns the words of translation pairs")

  def adapt_encoder(self, config: EncoderConfig) -> EncoderConfig:
    """The pointer network's query/key projections live on the encoder."""
    return config if config.pointer_head else config.replace(pointer_head=True)

  @property
  def needs_all_hidden(self) -> bool:
    return self.config.pointer_layer is not None

  @property
  def batch_features(self) -> tuple[str, ...]:
    return () if self.config.label_source == "self" else ("link_groups",)

  @staticmethod
  def _clean_pass(ctx: StepContext, up_to_layer: int | None, encoding: str = "joint"):
    """The uncorrupted batch through the first `up_to_layer` layers, no gradient, no dropout."""
    batch = ctx.batch
    segments, positions = batch["segment_ids"], batch["positions"]
    if encoding == "separate":
      segments, positions = separate_sides(batch)
    return ctx.apply(
        jax.lax.stop_gradient(ctx.params), batch["tokens"], lang_ids=batch["lang_ids"],
        positions=positions, segment_ids=segments,
        deterministic=True, return_all_hidden=up_to_layer is None, up_to_layer=up_to_layer)

  def __call__(self, ctx: StepContext) -> LossTerm:
    cfg = self.config
    batch = ctx.batch
    # Self-labelling reads the current parameters without differentiating
    # through them, with dropout off (as the authors' code does).
    # The pass stops at the self-label layer: the layers above it would be
    # computed only to be thrown away.
    full = None
    num_layers = ctx.num_layers
    link_mask, _, _ = pair_masks(batch, ctx.specials)
    own = None
    if cfg.label_source == "links":  # Nothing of the model's own: no self-labelling pass.
      if num_layers is None and cfg.pointer_layer is not None:  # Only the pointer layer needs the depth.
        num_layers = len(ctx.all_hidden) - 1
      entropy_sum = entropy_rows = jnp.zeros((), jnp.float32)
    else:
      if num_layers is None:  # A context that does not know the depth: a full pass tells it.
        full = self._clean_pass(ctx, None, cfg.self_label_encoding).all_hidden
        num_layers = len(full) - 1
      label_layer = _layer(cfg.self_label_layer, num_layers, default_self_label_layer(num_layers),
                           "self_label_layer")
      if full is None:
        clean = self._clean_pass(ctx, label_layer, cfg.self_label_encoding).hidden
      else:
        clean = full[label_layer]
      own, plan = self_label(jax.lax.stop_gradient(clean), batch, cfg, ctx.specials)
      entropy_sum, entropy_rows = row_entropy(plan.log_plan, link_mask)
    links, extra = combine_labels(own, batch, link_mask, cfg.label_source)

    if cfg.pointer_layer is None:
      states = ctx.hidden
    else:
      states = ctx.all_hidden[_layer(cfg.pointer_layer, num_layers, num_layers, "pointer_layer")]
    if cfg.pointer_projections:
      queries, keys = ctx.apply(ctx.params, states, method=Encoder.pointer_projections)
    else:
      queries = keys = states.astype(jnp.float32)

    # Both directions at once: source queries point at target keys of their
    # own pair and vice versa.
    both = links | jnp.swapaxes(links, 1, 2)
    key_mask = link_mask | jnp.swapaxes(link_mask, 1, 2)
    is_masked = jnp.zeros(batch["tokens"].shape, jnp.float32)
    is_masked = is_masked.at[jnp.arange(is_masked.shape[0])[:, None], ctx.masked.positions].max(ctx.masked.weights)
    loss_sum, count, correct, queries_used = pointer_loss(queries, keys, both, key_mask, is_masked)
    return LossTerm(
        loss=loss_sum / jnp.maximum(count, 1.0),
        loss_sum=loss_sum,
        count=count,
        metrics={
            "accuracy": correct / jnp.maximum(queries_used, 1.0),
            "labels": jnp.sum(links).astype(jnp.float32),
            "queries": queries_used,
            "entropy": entropy_sum / jnp.maximum(entropy_rows, 1.0),
            **extra,
        },
    )


@register("dwa")
def dwa(config: DwaConfig = DwaConfig()) -> DenoisingWordAlignment:
  return DenoisingWordAlignment(config=config)
