"""The pretraining model: one corruption, one encoder pass, many loss terms.

`PretrainingModel` owns `loss_fn(params, batch, rng, train=...)`; the trainer
owns sharding, the optimiser and the loop. Objectives are named in a mapping
`{name: weight}`; the total loss is the weighted sum of their unweighted terms,
and every term is logged under its own name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import base
from flax_xalign.objectives import dictionary_objectives as _dictionary  # noqa: F401  (align, dict_mlm)
from flax_xalign.objectives import dwa as _dwa  # noqa: F401  (registers dwa)
from flax_xalign.objectives import mlm as _mlm  # noqa: F401  (registers mlm, tlm)
from flax_xalign.objectives.masking import MaskedTokens, mask_tokens, max_predictions_for

# Fixed special ids of our SentencePiece vocabularies (docs/INTERFACES.md).
MASK_ID = 4
NUM_SPECIAL_TOKENS = 5


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """BERT masking hyperparameters (15%, 80/10/10)."""

  mask_rate: float = 0.15
  replace_with_mask_rate: float = 0.8
  replace_with_random_rate: float = 0.1
  mask_id: int = MASK_ID
  num_special_tokens: int = NUM_SPECIAL_TOKENS


@dataclasses.dataclass(frozen=True)
class PretrainingModel:
  """An encoder plus weighted objectives.

  Attributes:
    encoder: the Flax encoder module (pure network).
    objectives: objective name -> weight in the total loss.
    masking: how the shared masked copy of each batch is made.
    monitors: name -> `fn(params) -> {metric: scalar}` computed in evaluation
      only (e.g. the embedding alignment score), logged as `<name>_<metric>`.
    objective_options: optional per-objective constructor arguments: a
      mapping of keyword arguments, or a config dataclass passed as `config=`
      (e.g. {'dwa': DwaConfig(self_label_layer=3)}).
  """

  encoder: Encoder
  objectives: Mapping[str, float]
  masking: MaskingConfig = MaskingConfig()
  objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  monitors: Mapping[str, Callable[[Any], Mapping[str, jax.Array]]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not self.objectives:
      raise ValueError("PretrainingModel needs at least one objective")
    unknown = sorted(set(self.objective_options) - set(self.objectives))
    if unknown:
      raise UserError(
          f"objective_options name objectives that are not trained: {unknown}; "
          f"the objectives are {sorted(self.objectives)}.")
    built = {}
    for name in self.objectives:
      options = self.objective_options.get(name, {})
      kwargs = dict(options) if isinstance(options, Mapping) else {"config": options}
      built[name] = base.get(name, **kwargs)
    object.__setattr__(self, "_built", built)

  @property
  def config(self):
    return self.encoder.config

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
    return mask_tokens(
        tokens,
        rng,
        eligible=tokens >= m.num_special_tokens,
        vocab_size=self.config.vocab_size,
        mask_id=m.mask_id,
        first_random_id=m.num_special_tokens,
        mask_rate=m.mask_rate,
        replace_with_mask_rate=m.replace_with_mask_rate,
        replace_with_random_rate=m.replace_with_random_rate,
        max_predictions=max_predictions_for(tokens.shape[1], m.mask_rate),
    )

  def forward(self, params: Any, batch: base.Batch, rng: jax.Array, *, train: bool) -> base.StepContext:
    """Masks the batch, encodes it and computes logits at the masked slots."""
    rng_mask, rng_dropout, rng_objectives = jax.random.split(rng, 3)
    masked = self.mask(batch, rng_mask)
    lang_ids = batch["lang_ids"]
    # Objectives that change the corruption (DICT-MLM's dictionary swaps)
    # do so here, before the one shared forward pass.
    for index, obj in enumerate(self._built.values()):
      corrupt = getattr(obj, "corrupt", None)
      if corrupt is not None:
        masked, lang_ids = corrupt(batch, masked, lang_ids, jax.random.fold_in(rng_mask, index + 1))
    needs_all = any(obj.needs_all_hidden for obj in self._built.values())
    out = self.apply(
        params,
        masked.inputs,
        lang_ids=lang_ids,
        positions=batch["positions"],
        segment_ids=batch["segment_ids"],
        deterministic=not train,
        return_all_hidden=needs_all,
        rngs={"dropout": rng_dropout},
    )
    at_masked = jnp.take_along_axis(out.hidden, masked.positions[..., None], axis=1)
    logits = self.apply(params, at_masked, method=Encoder.mlm_logits)
    return base.StepContext(
        params=params,
        apply=self.apply,
        batch=batch,
        masked=masked,
        hidden=out.hidden,
        all_hidden=out.all_hidden,
        logits=logits,
        rng=rng_objectives,
        train=train,
    )

  def loss_fn(
      self, params: Any, batch: base.Batch, rng: jax.Array, *, train: bool = True
  ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Weighted total loss and metrics (`loss`, `<term>`, `<term>_<metric>`)."""
    ctx = self.forward(params, batch, rng, train=train)
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

  def monitor(self, params: Any) -> dict[str, jax.Array]:
    """Evaluation-only metrics of the parameters themselves (see `monitors`)."""
    out: dict[str, jax.Array] = {}
    for name, fn in self.monitors.items():
      for key, value in fn(params).items():
        out[f"{name}_{key}"] = value
    return out

  def masked_predictions(self, params: Any, batch: base.Batch, rng: jax.Array) -> dict[str, jax.Array]:
    """For evaluation: argmax predictions at masked slots with their context.

    Returns [batch, predictions] arrays `predicted, targets, weights, lang_ids,
    pair_side`.
    """
    ctx = self.forward(params, batch, rng, train=False)
    return {
        "predicted": jnp.argmax(ctx.logits, axis=-1).astype(jnp.int32),
        "targets": ctx.masked.targets,
        "weights": ctx.masked.weights,
        "lang_ids": ctx.at_predictions("lang_ids"),
        "pair_side": ctx.at_predictions("pair_side"),
    }
