"""The pretraining model: one corruption, one encoder pass, many loss terms.

`PretrainingModel` owns `loss_fn(params, batch, rng, assets, *, train)`; the
trainer owns sharding, the optimiser and the loop. Objectives are named in a
mapping `{name: weight}`; the total loss is the weighted sum of their
unweighted terms, and every term is logged under its own name. Assets
(dictionaries, tables) arrive as the `assets` argument, `{name: {key: array}}`,
and reach objectives as `ctx.assets`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from flax_xalign.data.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import base
from flax_xalign.objectives import dictionary_objectives as _dictionary  # noqa: F401  (align, dict_mlm)
from flax_xalign.objectives import dwa as _dwa  # noqa: F401  (registers dwa)
from flax_xalign.objectives import mlm as _mlm  # noqa: F401  (registers mlm, tlm)
from flax_xalign.objectives.masking import MaskedTokens, mask_tokens, max_predictions_for


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
  """

  encoder: Encoder
  objectives: Mapping[str, float]
  masking: MaskingConfig = MaskingConfig()
  objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  monitor_objectives: tuple[str, ...] = ()
  specials: SpecialTokens = PROJECT

  def __post_init__(self):
    if not self.objectives:
      raise ValueError("PretrainingModel needs at least one objective")
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
    )

  def forward(self, params: Any, batch: base.Batch, rng: jax.Array, assets: base.Assets | None = None, *,
              train: bool) -> base.StepContext:
    """Masks the batch, lets objectives corrupt it, encodes it once, scores the masked slots."""
    assets = dict(assets or {})
    rng_mask, rng_dropout, rng_objectives = jax.random.split(rng, 3)
    corruption = base.CorruptionContext(
        params=params, assets=assets, rng=rng_mask, batch=batch, masked=self.mask(batch, rng_mask),
        lang_ids=batch["lang_ids"], input_embeddings=None, specials=self.specials,
        vocab_size=self.config.vocab_size, train=train)
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
        specials=self.specials)

  def loss_fn(self, params: Any, batch: base.Batch, rng: jax.Array, assets: base.Assets | None = None, *,
              train: bool = True) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted total loss and metrics (`loss`, `<term>`, `<term>_<metric>`)."""
    ctx = self.forward(params, batch, rng, assets, train=train)
    total = jnp.zeros((), jnp.float32)
    metrics: dict[str, jax.Array] = {}
    for name, weight in self.objectives.items():
      term = self._built[name](ctx)
      total = total + weight * term.loss
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
