"""awesome-align's self-training objective (SO): pull aligned words together at the alignment layer.

Dou & Neubig 2021, "Word Alignment by Fine-tuning Embeddings on Parallel
Corpora", §2.2. Each side of a translation pair is encoded alone (no masking,
as awesome-align fine-tunes), up to the alignment layer ℓ; S = h_a · h_bᵀ.
With P_ab the softmax of S over the pair's target subwords (each row) and
P_ba the softmax over its source subwords (each column), and A the labels,

    L_so = - mean over labelled pairs [ Σ_ij A_ij P_ab[i, j] / n_a + Σ_ij A_ij P_ba[i, j] / n_b ],

n_a, n_b the pair's source and target subwords. The labels (`label_source`,
as DWA's):

* "self": awesome-align's self-training: from the same similarity without
  gradient, the subword links (P_ab > t) ∧ (P_ba > t) (t =
  `softmax_threshold`, 1e-3, the aligner's `softmax` method). With
  `label_level='word'` (the default, awesome-align's `get_aligned_word`) a
  subword link aligns its two words and every subword pair of two aligned
  words is a label; `label_level='subword'` keeps the subword links as they
  are (sparser: a word's other pieces get no label);
* "links": word links given with the bitext (`TsvBitextTask(links=...)`,
  e.g. eflomal's), every subword pair of two linked words (awesome-align's
  supervised setting, which expands word links to subwords the same way);
* "intersection" / "union" of the two (the self-labels at `label_level`).

Words are found on device from the `word_starts` asset (which ids begin a
word: SentencePiece's `▁`, the pieces `tasks/links.py` counts for given links;
a side's first subword always begins one), so the word level needs no batch
feature. A pair without any label adds nothing to the loss and is left out of
its denominator (awesome-align's `torch.mean` over the batch counts such
sentences; a pair whose given links did not fit its words has none, and
counting it would only shrink the loss by the share of such pairs in the
batch). SO needs each side framed as a sentence of its own (`<s> a </s> <s>
b </s>`), so it refuses `pair_layout='continuous'`, as the aligner refuses
separate encoding there.

Differences from awesome-align's code, on purpose: pairs packed into one row
stay independent; the pass runs without dropout (the recipes use 0 anyway).
It is a term of its own, so it composes with MLM/TLM/DWA under the trainer's
weights.

Logged: `so_labels` (label links per batch), `so_pairs` (pairs in the
batch), `so_labelled_pairs` (the denominator), and with given links
`so_given` and `so_agreement` (the share of given links the self-labels also
find).
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

LABEL_LEVELS = ("word", "subword")
WORD_STARTS = "word_starts"  # The asset (flax_xalign/assets/word_starts.py).


@dataclasses.dataclass(frozen=True)
class SoConfig:
  """Settings of the self-training objective.

  Attributes:
    layer: the alignment layer (0 = embeddings). None: awesome-align's layer
      8 of 12 scaled to the model's depth, round(8 / 12 * num_layers).
    softmax_threshold: t of the self-labels (awesome-align's 1e-3).
    label_source: "self", "links", "intersection" or "union" (module docstring).
    label_level: where self-labels are taken: "word" (awesome-align's: a
      subword link aligns its words, and all their subword pairs are labels)
      or "subword" (the subword links alone). Given links are always word
      links expanded to subwords.
  """

  layer: int | None = None
  softmax_threshold: float = 1e-3
  label_source: str = "self"
  label_level: str = "word"

  def __post_init__(self):
    if self.label_level not in LABEL_LEVELS:
      raise UserError(f"SoConfig.label_level={self.label_level!r} is unknown; use 'word' (awesome-align: every "
                      "subword pair of two aligned words) or 'subword' (the subword links alone).")
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
  """(summed loss over pairs, number of pairs with at least one label) of L_so.

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
  # A pair is counted once, at its first source subword, and only when it has a label: an unlabelled pair
  # adds 0 to the sum and stays out of the mean.
  labelled = jnp.any(same & jnp.any(labels, axis=-1)[:, None, :], axis=-1)
  pairs = jnp.sum(pair_starts(source) & labelled).astype(jnp.float32)
  return -(jnp.sum(jnp.where(source, per_source, 0.0)) + jnp.sum(jnp.where(target, per_target, 0.0))), pairs


def pair_starts(source: jax.Array) -> jax.Array:
  """bool [batch, length]: the first source subword of each pair (a side's subwords are contiguous, framed by
  specials)."""
  return source & ~jnp.concatenate([jnp.zeros_like(source[:, :1]), source[:, :-1]], axis=-1)


def word_ids(tokens: jax.Array, regular: jax.Array, word_starts: jax.Array) -> jax.Array:
  """int32 [batch, length]: one number per word of the row (1, 2, ...), 0 outside `regular`.

  Args:
    tokens: [batch, length] ids.
    regular: [batch, length] bool, the subwords to group (the pairs' sides, specials excluded).
    word_starts: bool [vocab], the id begins a word (the `word_starts` asset).

  A word is a subword that begins one and the non-beginning subwords after it;
  the first subword after a special (a side's first) always begins a word, so
  words never cross sides or pairs.
  """
  begins = jnp.take(word_starts, tokens, mode="clip") & regular
  after_special = regular & ~jnp.concatenate([jnp.zeros_like(regular[:, :1]), regular[:, :-1]], axis=-1)
  ids = jnp.cumsum((begins | after_special).astype(jnp.int32), axis=-1)
  return jnp.where(regular, ids, 0)


def word_level_labels(links: jax.Array, words: jax.Array, link_mask: jax.Array) -> jax.Array:
  """bool [batch, length, length]: every subword pair of two words that some subword link joins.

  awesome-align's `get_aligned_word`: subword links -> word links -> all
  subword pairs of the linked words.

  Args:
    links: [batch, length, length] bool subword links (source rows, target columns).
    words: [batch, length] word numbers (`word_ids`, 0 = none).
    link_mask: where links may lie (`dwa.pair_masks`).
  """
  same_word = ((words[:, :, None] == words[:, None, :]) & (words[:, :, None] > 0)).astype(jnp.float32)
  # same_word @ links @ same_word: entry (i, j) counts the links from i's word to j's word (0/1 products are exact
  # at any matmul precision, and only > 0 is read).
  joined = jnp.einsum("bik,bkl,bjl->bij", same_word, links.astype(jnp.float32), same_word)
  return (joined > 0) & link_mask


@dataclasses.dataclass(frozen=True)
class SelfTraining(ObjectiveBase):
  """The `so` objective; see the module docstring."""

  config: SoConfig = SoConfig()

  def check(self, run: "RunSpec") -> None:
    if run.pair_layout == "continuous":
      raise UserError("the 'so' objective encodes each side of a pair alone (awesome-align), which needs the "
                      "'restart' pair layout (side b with its own <s> and positions from 0), not "
                      "train.pair_layout='continuous'; set train.pair_layout='restart' or drop 'so'.")
    require_bitext("so", run, what="aligns the words of translation pairs")

  @property
  def _word_level_self_labels(self) -> bool:
    return self.config.label_level == "word" and self.config.label_source != "links"

  @property
  def requires(self) -> tuple[str, ...]:  # type: ignore[override]
    return (WORD_STARTS,) if self._word_level_self_labels else ()

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
    own = None
    if cfg.label_source != "links":
      own = self_labels(jax.lax.stop_gradient(scores), link_mask, cfg.softmax_threshold)
      if self._word_level_self_labels:
        if WORD_STARTS not in ctx.assets:
          raise ValueError(f"SoConfig.label_level='word' reads the {WORD_STARTS!r} asset, which this step was "
                           "not given (the trainer provides it through `requires`).")
        words = word_ids(batch["tokens"], source | target, ctx.assets[WORD_STARTS]["table"])
        own = word_level_labels(own, words, link_mask)
    labels, extra = dwa.combine_labels(own, batch, link_mask, cfg.label_source)
    loss_sum, labelled = so_loss(scores, labels, link_mask, source, target, batch["segment_ids"])
    return LossTerm(loss=loss_sum / jnp.maximum(labelled, 1.0), loss_sum=loss_sum, count=labelled,
                    metrics={"labels": jnp.sum(labels).astype(jnp.float32),
                             "pairs": jnp.sum(pair_starts(source)).astype(jnp.float32),
                             "labelled_pairs": labelled, **extra})


def self_labels(scores: jax.Array, link_mask: jax.Array, threshold: float) -> jax.Array:
  """awesome-align's extraction: both the row and the column softmax of the pair above `threshold`
  (the word aligner's "softmax" method, `ops.AlignmentSolver.links`)."""
  return ops.AlignmentSolver(softmax_threshold=threshold).links(scores, link_mask, "softmax")


@register("so")
def so(config: SoConfig = SoConfig()) -> SelfTraining:
  return SelfTraining(config=config)
