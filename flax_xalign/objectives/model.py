"""The pretraining model: one corruption, one encoder pass, many loss terms.

`PretrainingModel` owns `loss_fn(params, batch, rng, assets, *, train)`; the
trainer owns sharding, the optimiser and the loop. Objectives are named in a
mapping `{name: weight}`; the total loss combines their terms as
`loss_normalization` says (below), and every term is logged under its own
name, as its own mean. Assets
(dictionaries, tables) arrive as the `assets` argument, `{name: {key: array}}`,
and reach objectives as `ctx.assets`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
# The package's __init__ registers every built-in objective before this
# module body runs, so `base.build` can name any of them.
from flax_xalign.objectives import base
from flax_xalign.objectives.masking import MaskedTokens, copy_ranges, mask_tokens, max_predictions_for

LOSS_NORMALIZATIONS = ("per_term", "pooled")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """BERT masking hyperparameters (15%, 80/10/10); the ids come from the vocabulary."""

  mask_rate: float = 0.15
  replace_with_mask_rate: float = 0.8
  replace_with_random_rate: float = 0.1


@dataclasses.dataclass(frozen=True)
class PretrainingModel:
  """An encoder plus weighted objectives.

  Attributes:
    encoder: the Flax encoder module (pure network).
    objectives: objective name -> weight in the total loss.
    masking: how the shared masked copy of each batch is made.
    objective_options: optional per-objective constructor arguments: a
      mapping of keyword arguments, or a config dataclass passed as `config=`
      (e.g. {'dwa': DwaConfig(self_label_layer=3)}).
    monitor_objectives: objectives that are not trained but whose `monitor`
      runs in evaluation (e.g. ALIGN-MLM's alignment score on an MLM run).
    specials: the vocabulary's special ids (masking never touches specials).
    vocab_copies: 1, or 2 for the synthetic languages' doubled vocabulary
      (`VocabularySpec.factor`): random replacements stay inside the masked
      token's own copy (`masking.copy_ranges`).
    loss_normalization: how the terms make the total loss.
      "per_term" (default): each term is its own mean (MLM and TLM over their
      masked tokens, DWA over its links) and the total is the weighted sum
      `sum_t w_t * S_t / N_t` (S_t the term's summed token loss, N_t its
      count). A term's weight then does not depend on how much of the batch
      its data fills, which is what the papers' per-objective weights mean.
      "pooled": one mean over every predicted token, `sum_t w_t * S_t /
      sum_t N_t`, as the released XLM-Align code (losses summed, divided by
      the sample size: masked tokens + DWA targets) and the ALIGN-MLM paper's
      XLM baseline (TLM rows mixed into the MLM batch, one token mean) do.
      Terms without token counts (ALIGN's mean cosine) are added as
      `w_t * loss_t` in both modes. The two differ whenever the streams are
      unbalanced: with {'mlm': 1, 'tlm': 1} and TLM on ~25% of the masked
      tokens, per_term gives each TLM token the weight 1/N_tlm ~ 4/N, four
      times its pooled weight 1/N, and each MLM token 1/N_mlm ~ 4/(3N).
  """

  encoder: Encoder
  objectives: Mapping[str, float]
  masking: MaskingConfig = MaskingConfig()
  objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  monitor_objectives: tuple[str, ...] = ()
  specials: SpecialTokens = PROJECT
  vocab_copies: int = 1
  loss_normalization: str = "per_term"

  def __post_init__(self):
    if not self.objectives:
      raise ValueError("PretrainingModel needs at least one objective")
    if self.loss_normalization not in LOSS_NORMALIZATIONS:
      raise UserError(f"loss_normalization={self.loss_normalization!r} is not one of "
                      f"{', '.join(map(repr, LOSS_NORMALIZATIONS))} (train.loss_normalization).")
    names = list(self.objectives) + [n for n in self.monitor_objectives if n not in self.objectives]
    unknown = sorted(set(self.objective_options) - set(names))
    if unknown:
      raise UserError(
          f"objective_options name objectives that are not trained: {unknown}; "
          f"the objectives are {sorted(self.objectives)}.")
    object.__setattr__(self, "_built", base.build(names, self.objective_options))

  @property
  def config(self):
    return self.encoder.config

  @property
  def built(self) -> Mapping[str, base.Objective]:
    """Every objective object: the trained ones, then monitor-only ones."""
    return self._built

  def requires(self) -> dict[str, list[str]]:
    """Asset name -> trained objectives whose loss needs it."""
    out: dict[str, list[str]] = {}
    for name in self.objectives:
      for asset in base.requires_of(self._built[name]):
        out.setdefault(asset, []).append(name)
    return out

  def monitor_requires(self) -> dict[str, list[str]]:
    """Asset name -> objectives whose monitor reads it."""
    out: dict[str, list[str]] = {}
    for name, obj in self._built.items():
      for asset in base.monitor_requires_of(obj):
        out.setdefault(asset, []).append(name)
    return out

  def init(self, rng: jax.Array, *, batch: int, length: int) -> Any:
    """Initial (logically boxed) variables for inputs of shape [batch, length]."""
    ones = jnp.ones((batch, length), jnp.int32)
    variables = self.encoder.init(
        {"params": rng, "dropout": rng},
        ones,
        lang_ids=ones,
        positions=jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length)),
        segment_ids=ones,
        deterministic=True,
    )
    return variables["params"]

  def apply(self, params: Any, *args: Any, method: Any = None, **kwargs: Any) -> Any:
    return self.encoder.apply({"params": params}, *args, method=method, **kwargs)

  def mask(self, batch: base.Batch, rng: jax.Array) -> MaskedTokens:
    tokens = batch["tokens"]
    m = self.masking
    first, end = self.specials.regular_range(self.config.vocab_size)
    low = high = None
    if self.vocab_copies > 1:  # Each token's own copy of a doubled vocabulary.
      low, high = copy_ranges(tokens // (self.config.vocab_size // self.vocab_copies),
                              vocab_size=self.config.vocab_size, copies=self.vocab_copies,
                              first_regular=self.specials.first_regular, end_regular=self.specials.end_regular)
    return mask_tokens(
        tokens,
        rng,
        eligible=self.specials.is_regular(tokens),
        vocab_size=end,
        mask_id=self.specials.mask,
        first_random_id=first,
        mask_rate=m.mask_rate,
        replace_with_mask_rate=m.replace_with_mask_rate,
        replace_with_random_rate=m.replace_with_random_rate,
        max_predictions=max_predictions_for(tokens.shape[1], m.mask_rate),
        random_low=low,
        random_high=high,
    )

  def forward(self, params: Any, batch: base.Batch, rng: jax.Array, assets: base.Assets | None = None, *,
              train: bool) -> base.StepContext:
    """Masks the batch, lets objectives corrupt it, encodes it once, scores the masked slots."""
    assets = dict(assets or {})
    rng_mask, rng_dropout, rng_objectives = jax.random.split(rng, 3)
    corruption = base.CorruptionContext(
        params=params, assets=assets, rng=rng_mask, batch=batch, masked=self.mask(batch, rng_mask),
        lang_ids=batch["lang_ids"], input_embeddings=None, specials=self.specials,
        vocab_size=self.config.vocab_size, train=train, vocab_copies=self.vocab_copies)
    # Objectives that change the corruption (DICT-MLM's dictionary swaps) do
    # so here, before the one shared forward pass; each gets its own key.
    for index, name in enumerate(self.objectives):
      corrupt = getattr(self._built[name], "corrupt", None)
      if corrupt is not None:
        corruption = corrupt(corruption.replace(rng=jax.random.fold_in(rng_mask, index + 1)))
    masked = corruption.masked
    needs_all = any(getattr(self._built[n], "needs_all_hidden", False) for n in self.objectives)
    out = self.apply(
        params,
        masked.inputs,
        lang_ids=corruption.lang_ids,
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        deterministic=not train,
        return_all_hidden=needs_all,
        input_embeddings=corruption.input_embeddings,
        rngs={"dropout": rng_dropout},
    )
    at_masked = jnp.take_along_axis(out.hidden, masked.positions[..., None], axis=1)
    logits = self.apply(params, at_masked, method=Encoder.mlm_logits)
    return base.StepContext(
        params=params, apply=self.apply, batch=batch, masked=masked, hidden=out.hidden,
        all_hidden=out.all_hidden, logits=logits, rng=rng_objectives, train=train, assets=assets,
        specials=self.specials, num_layers=self.config.num_layers, vocab_size=self.config.vocab_size)

  def loss_fn(self, params: Any, batch: base.Batch, rng: jax.Array, assets: base.Assets | None = None, *,
              train: bool = True) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss and metrics (`loss`, `<term>`, `<term>_<metric>`); see `loss_normalization`."""
    ctx = self.forward(params, batch, rng, assets, train=train)
    terms = {name: self._built[name](ctx) for name in self.objectives}
    total = combine_terms(terms, self.objectives, self.loss_normalization)
    metrics: dict[str, jax.Array] = {}
    for name, term in terms.items():
      metrics[name] = term.loss
      for key, value in term.metrics.items():
        metrics[f"{name}_{key}"] = value
    metrics["loss"] = total
    metrics["tokens"] = jnp.sum(batch["segment_ids"] > 0).astype(jnp.float32)
    return total, metrics

  def has_monitors(self, assets: base.Assets | None) -> bool:
    return bool(self._monitors(assets))

  def _monitors(self, assets: base.Assets | None) -> list[Any]:
    available = set(assets or {})
    return [obj for obj in self._built.values()
            if hasattr(obj, "monitor") and set(base.monitor_requires_of(obj)) <= available]

  def monitor(self, params: Any, assets: base.Assets | None = None) -> dict[str, jax.Array]:
    """Evaluation-only metrics of the parameters (objectives' `monitor` hooks)."""
    out: dict[str, jax.Array] = {}
    for obj in self._monitors(assets):
      out.update(obj.monitor(params, dict(assets or {})))
    return out

  def masked_predictions(self, params: Any, batch: base.Batch, rng: jax.Array,
                         assets: base.Assets | None = None) -> dict[str, jax.Array]:
    """For evaluation: argmax predictions at masked slots with their context.

    Returns [batch, predictions] arrays `predicted, targets, weights, lang_ids,
    pair_side`.
    """
    ctx = self.forward(params, batch, rng, assets, train=False)
    return {
        "predicted": jnp.argmax(ctx.logits, axis=-1).astype(jnp.int32),
        "targets": ctx.masked.targets,
        "weights": ctx.masked.weights,
        "lang_ids": ctx.at_predictions("lang_ids"),
        "pair_side": ctx.at_predictions("pair_side"),
    }


def combine_terms(terms: Mapping[str, base.LossTerm], weights: Mapping[str, float],
                  normalization: str) -> jax.Array:
  """The total loss of weighted terms, "per_term" or "pooled" (see `PretrainingModel`).

  Args:
    terms: name -> LossTerm; pooled terms need `loss_sum` and `count`.
    weights: name -> weight.
    normalization: "per_term" or "pooled".

  Returns:
    A float32 scalar.
  """
  total = jnp.zeros((), jnp.float32)
  pooled_sum = jnp.zeros((), jnp.float32)
  pooled_count = jnp.zeros((), jnp.float32)
  for name, term in terms.items():
    weight = weights[name]
    if normalization == "pooled" and term.loss_sum is not None:
      pooled_sum = pooled_sum + weight * term.loss_sum
      pooled_count = pooled_count + term.count
    else:
      total = total + weight * term.loss
  return total + pooled_sum / jnp.maximum(pooled_count, 1.0)
