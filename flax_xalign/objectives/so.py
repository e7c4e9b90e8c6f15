"""awesome-align's self-training objective (SO): pull aligned subwords together at the alignment layer.

Dou & Neubig 2021, "Word Alignment by Fine-tuning Embeddings on Parallel
Corpora", §2.2. Each side of a translation pair is encoded alone (no masking,
as awesome-align fine-tunes), up to the alignment layer ℓ; S = h_a · h_bᵀ.
With P_ab the softmax of S over the pair's target subwords (each row) and
P_ba the softmax over its source subwords (each column), and A the labels,

    L_so = - mean over pairs [ Σ_ij A_ij P_ab[i, j] / n_a + Σ_ij A_ij P_ba[i, j] / n_b ],

n_a, n_b the pair's source and target subwords. The labels (`label_source`,
as DWA's):

* "self": awesome-align's self-training, A = (P_ab > t) ∧ (P_ba > t) from the
  same similarity without gradient (t = `softmax_threshold`, 1e-3, the
  aligner's `softmax` method);
* "links": word links given with the bitext (`TsvBitextTask(links=...)`,
  e.g. eflomal's), every subword pair of two linked words (awesome-align's
  supervised setting, which expands word links to subwords the same way);
* "intersection" / "union" of the two.

Differences from awesome-align's code, on purpose: self-labels are taken
between subwords, not between words expanded back to their subwords (the
batch carries no word boundaries); pairs packed into one row stay
independent; the pass runs without dropout. It is a term of its own, so it
composes with MLM/TLM/DWA under the trainer's weights.

Logged: `so_labels` (label links per batch), `so_pairs`, and with given
links `so_given` and `so_agreement` (the share of given links the
self-labels also find).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from flax_xalign import ops
from flax_xalign.errors import UserError
from flax_xalign.objectives import dwa
from flax_xalign.objectives.base import LossTerm, ObjectiveBase, StepContext, register, require_bitext

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec


@dataclasses.dataclass(frozen=True)
class SoConfig:
  """Settings of the self-training objective.

  Attributes:
    layer: the alignment layer (0 = embeddings). None: awesome-align's layer
      8 of 12 scaled to the model's depth, round(8 / 12 * num_layers).
    softmax_threshold: t of the self-labels (awesome-align's 1e-3).
    label_source: "self", "links", "intersection" or "union" (module docstring).
  """

  layer: int | None = None
  softmax_threshold: float = 1e-3
  label_source: str = "self"

  def __post_init__(self):
    if self.label_source not in dwa.LABEL_SOURCES:
      raise UserError(f"SoConfig.label_source={self.label_source!r} is unknown; use one of "
                      f"{', '.join(dwa.LABEL_SOURCES)}.")
    if not 0.0 < self.softmax_threshold < 1.0:
      raise UserError(f"SoConfig.softmax_threshold={self.softmax_threshold} must lie in (0, 1).")


def default_layer(num_layers: int) -> int:
  """awesome-align's layer 8 of mBERT's 12, scaled to `num_layers`."""
  return max(1, min(num_layers, round(8 * num_layers / 12)))


def so_loss(scores: jax.Array, labels: jax.Array, link_mask: jax.Array, source: jax.Array, target: jax.Array,
            segments: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(summed loss over pairs, number of pairs) of L_so.

  Args:
    scores: [batch, length, length] float32 similarity, source rows, target columns.
    labels: [batch, length, length] bool links A.
    link_mask: [batch, length, length] bool, source i and target j of one pair.
    source, target: [batch, length] bool, the pairs' regular subwords of each side.
    segments: [batch, length] segment ids (one pair per segment).
  """
  masked = jnp.where(link_mask, scores, -jnp.inf)
  rows = jnp.any(link_mask, axis=-1, keepdims=True)
  cols = jnp.any(link_mask, axis=-2, keepdims=True)
  p_ab = jnp.where(link_mask, jax.nn.softmax(jnp.where(rows, masked, 0.0), axis=-1), 0.0)
  p_ba = jnp.where(link_mask, jax.nn.softmax(jnp.where(cols, masked, 0.0), axis=-2), 0.0)
  same = segments[:, :, None] == segments[:, None, :]
  n_a = jnp.sum(same & source[:, None, :], axis=-1).astype(jnp.float32)  # [batch, length]: source count of i's pair.
  n_b = jnp.sum(same & target[:, None, :], axis=-1).astype(jnp.float32)
  a = labels.astype(jnp.float32)
  per_source = jnp.sum(a * p_ab, axis=-1) / jnp.maximum(n_a, 1.0)
  per_target = jnp.sum(a * p_ba, axis=-2) / jnp.maximum(n_b, 1.0)
  # A pair is counted once, at its first source subword (a side's subwords are contiguous, framed by specials).
  starts = source & ~jnp.concatenate([jnp.zeros_like(source[:, :1]), source[:, :-1]], axis=-1)
  pairs = jnp.sum(starts).astype(jnp.float32)
  return -(jnp.sum(jnp.where(source, per_source, 0.0)) + jnp.sum(jnp.where(target, per_target, 0.0))), pairs


@dataclasses.dataclass(frozen=True)
class SelfTraining(ObjectiveBase):
  """The `so` objective; see the module docstring."""

  config: SoConfig = SoConfig()

  def check(self, run: "RunSpec") -> None:
    require_bitext("so", run, what="aligns the words of translation pairs")

  @property
  def batch_features(self) -> tuple[str, ...]:
    return () if self.config.label_source == "self" else ("link_groups",)

  def __call__(self, ctx: StepContext) -> LossTerm:
    cfg, batch = self.config, ctx.batch
    num_layers = ctx.num_layers if ctx.num_layers is not None else len(ctx.all_hidden) - 1
    layer = cfg.layer if cfg.layer is not None else default_layer(num_layers)
    if not 0 <= layer <= num_layers:
      raise ValueError(f"SoConfig.layer={cfg.layer} is outside 0..{num_layers} for this encoder.")
    segments, positions = dwa.separate_sides(batch)
    hidden = ctx.apply(ctx.params, batch["tokens"], lang_ids=batch["lang_ids"], positions=positions,
                       segment_ids=segments, deterministic=True, return_all_hidden=False, up_to_layer=layer).hidden
    hidden = hidden.astype(jnp.float32)
    scores = jnp.einsum("bid,bjd->bij", hidden, hidden)
    link_mask, source, target = dwa.pair_masks(batch, ctx.specials)
    own = None if cfg.label_source == "links" else self_labels(jax.lax.stop_gradient(scores), link_mask,
                                                                cfg.softmax_threshold)
    labels, extra = dwa.combine_labels(own, batch, link_mask, cfg.label_source)
    loss_sum, pairs = so_loss(scores, labels, link_mask, source, target, batch["segment_ids"])
    return LossTerm(loss=loss_sum / jnp.maximum(pairs, 1.0), loss_sum=loss_sum, count=pairs,
                    metrics={"labels": jnp.sum(labels).astype(jnp.float32), "pairs": pairs, **extra})


def self_labels(scores: jax.Array, link_mask: jax.Array, threshold: float) -> jax.Array:
  """awesome-align's extraction: both the row and the column softmax of the pair above `threshold`
  (the word aligner's "softmax" method, `ops.AlignmentSolver.links`)."""
  return ops.AlignmentSolver(softmax_threshold=threshold).links(scores, link_mask, "softmax")


@register("so")
def so(config: SoConfig = SoConfig()) -> SelfTraining:
  return SelfTraining(config=config)
