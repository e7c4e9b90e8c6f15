"""A t5x `BaseModel` for flax_xalign pretraining: our losses under t5x's trainer.

Teams that already run t5x's `train.py` on TPU pods can train a flax_xalign
encoder with it: `XAlignT5xModel` duck-types t5x's `models.BaseModel` (t5x is
not a dependency, so nothing here imports it) around our `PretrainingModel`.
The loss t5x differentiates *is* `PretrainingModel.loss_fn`; t5x owns the
mesh, the optimiser, checkpoints and the loop. `gin_configs/t5x/pretrain.gin`
is a ready run file in t5x's layout.

The contract (t5x `models.BaseModel`, read from t5x's source):

* `FEATURE_CONVERTER_CLS`: t5x builds it as `FEATURE_CONVERTER_CLS(pack=...,
  use_custom_packing_ops=...)`. Our converter also needs the run's languages
  and special ids, so it is a class made by `feature_converter_for(languages,
  specials)`; `XAlignT5xModel(languages=...)` sets it on the instance (as t5x's
  own models do with `feature_converter_cls`).
* `loss_fn(params, batch, dropout_rng) -> (loss, metrics)`; `dropout_rng=None`
  is evaluation (no dropout, masking with the fixed key `EVAL_SEED`).
* `eval_fn(params, batch)`, `predict_batch[_with_aux](params, batch, rng=None)`
  (argmax predictions at the masked slots), `score_batch(params, batch,
  return_intermediates=False)` (per-example sums of the masked tokens'
  log-likelihood, masking with `EVAL_SEED`).
* `get_initial_variables(rng, input_shapes, input_types=None)` ->
  `FrozenDict({"params": ..., "params_axes": ...})`: t5x partitions parameters
  by the logical names in `params_axes` (flax's `AxisMetadata` under
  `<name>_axes` keys), which `params_axes` derives from the names our encoder's
  `nn.with_logical_partitioning` boxes carry. Map them to the mesh with our
  rules table (`PjitPartitioner.logical_axis_rules =
  flax_xalign.training.partitioning.logical_axis_rules()`).
* Every method also takes t5x's `flax_mutables=None` (newer t5x passes it);
  the encoder has no mutable collections, so a non-empty value is refused.

Metrics are `clu.metrics.Average` objects (one per key of our metrics:
`loss`, one per objective, `<objective>_<metric>`, `tokens`), which t5x merges
over microbatches and steps and `.compute()`s to the mean; t5x's own
`AveragePerStep`/`Sum` live in t5x, which we do not import.

Limits, compared with flax_xalign's own trainer (`python -m flax_xalign.train`):

* **Static assets only.** Objectives that read assets (`requires`) get them
  from the `assets` constructor argument, placed on device once and closed
  over by t5x's jitted step (t5x's `loss_fn` has no assets argument), so they
  are constants of the compiled program. An asset that refreshes during
  training (`refresh_every > 0`: self-induced dictionaries and the like) is
  refused: it needs flax_xalign's own trainer, whose step takes assets as
  arguments and whose loop refreshes and checkpoints them.
* No run manifest, asset files or asset fingerprints in t5x checkpoints, and
  objectives' `check(run)` does not run (t5x has no run manifest to check).
* t5x *sums* the gradients of `Trainer.num_microbatches` = k microbatches,
  each of our loss (a mean over that microbatch), and its loop hands every
  microbatch of a step the same `dropout_rng`, so their masking and dropout
  draws repeat. For the mean gradient put `optax.scale(1 / k)` first in the
  optimiser chain (before the clip). Dividing the learning rate by k instead
  is not the same: AdamW's step does not depend on the gradient's scale, so
  that would shrink every step, and the weight decay, k-fold. Use
  microbatches only when a batch does not fit.
* Parameter dimensions must divide the mesh axes they are sharded over (our
  partitioner replicates small ones and refuses big ones; t5x's pjit refuses
  them all): pad the vocabulary to a multiple of the `model` axis
  (`EncoderConfig.vocab_pad_multiple`) or map `vocab` to None.
"""

from __future__ import annotations

import functools
import logging
import types
from typing import Any, Mapping, Sequence

import clu.metrics as clu_metrics
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning

from flax_xalign.assets.base import Asset
from flax_xalign.assets.runtime import RunAssets
from flax_xalign.data.feature_converter import XAlignFeatureConverter
from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import base as objectives_lib
from flax_xalign.objectives.model import MaskingConfig, PretrainingModel

# Masking key of evaluation, prediction and scoring when t5x gives no rng, so
# eval losses and scores of different steps see the same masked slots.
EVAL_SEED = 0
DEFAULT_OBJECTIVES: Mapping[str, float] = types.MappingProxyType({"mlm": 1.0, "tlm": 1.0})

_OWN_TRAINER = "python -m flax_xalign.train"


# ---------------------------------------------------------------- feature converter


class T5xFeatureConverter(XAlignFeatureConverter):
  """`XAlignFeatureConverter` with t5x's constructor, `cls(pack=..., use_custom_packing_ops=...)`.

  The languages and special ids are class attributes (`LANGUAGES`,
  `SPECIALS`), set by `feature_converter_for`; this base class has none and
  refuses to be built.
  """

  LANGUAGES: tuple[str, ...] | None = None
  SPECIALS: SpecialTokens = PROJECT

  def __init__(self, pack: bool = True, use_custom_packing_ops: bool = False):
    if self.LANGUAGES is None:
      raise UserError(
          "The t5x feature converter does not know the run's languages; build the model with "
          "XAlignT5xModel(languages=...) (gin: XAlignT5xModel.languages = %LANGUAGES), or use "
          "feature_converter_for(languages, specials).")
    if use_custom_packing_ops:
      # XAlignFeatureConverter has one packing path (seqio's tf.data packer
      # with its own shifted keys); it has no custom-ops variant.
      logging.info("use_custom_packing_ops=True is ignored: flax_xalign packs with seqio's tf.data packer")
    super().__init__(self.LANGUAGES, pack=pack, specials=self.SPECIALS)


@functools.lru_cache(maxsize=None)
def _converter_class(languages: tuple[str, ...], specials: SpecialTokens) -> type[T5xFeatureConverter]:
  return type("XAlignT5xFeatureConverter", (T5xFeatureConverter,), {
      "LANGUAGES": languages, "SPECIALS": specials, "__module__": __name__,
      "__doc__": f"T5xFeatureConverter for languages {list(languages)}.",
  })


def feature_converter_for(languages: Sequence[str],
                          specials: SpecialTokens = PROJECT) -> type[T5xFeatureConverter]:
  """A feature converter class t5x can build with `cls(pack=...)`.

  Args:
    languages: the run's language codes (`flax_xalign.tasks.languages_of(task)`);
      language id = index in the sorted list + 1, as in our own trainer.
    specials: the vocabulary's special ids.

  Returns:
    A subclass of `XAlignFeatureConverter` (the same class for equal
    arguments) whose output features are our batch features (`tokens,
    lang_ids, segment_ids, positions, pair_side`).
  """
  XAlignFeatureConverter(languages, pack=False, specials=specials)  # Validates both now, not in t5x's input pipeline.
  return _converter_class(tuple(sorted(set(languages))), specials)


# ---------------------------------------------------------------- variables and metrics


def params_axes(boxed_params: Any) -> dict[str, Any]:
  """t5x's `params_axes` collection for a tree of logically boxed parameters.

  Args:
    boxed_params: `PretrainingModel.init(...)` (leaves `nn.LogicallyPartitioned`).

  Returns:
    The same nesting with each leaf `name` renamed `name_axes` and holding
    `flax.linen.partitioning.AxisMetadata(names=<the box's logical names>)`,
    which `flax.linen.partitioning.get_axis_names` turns back into the
    PartitionSpec tree of the unboxed parameters. A leaf without a box gets
    all-None names (replicated, as our partitioner treats it).
  """
  flat = traverse_util.flatten_dict(flax.core.unfreeze(boxed_params))
  out = {}
  for path, leaf in flat.items():
    if isinstance(leaf, nn.LogicallyPartitioned):
      names = tuple(leaf.names)
    elif isinstance(leaf, nn.meta.AxisMetadata):
      raise ValueError(f"parameter {'/'.join(path)} is boxed as {type(leaf).__name__}, not with logical "
                       "axis names; t5x's params_axes needs nn.with_logical_partitioning")
    else:
      names = (None,) * np.ndim(leaf)
    out[path[:-1] + (f"{path[-1]}_axes",)] = flax_partitioning.AxisMetadata(names=names)
  return traverse_util.unflatten_dict(out)


def as_clu_metrics(metrics: Mapping[str, jax.Array]) -> dict[str, clu_metrics.Average]:
  """Our scalar metrics as `clu.metrics.Average` (t5x merges them over steps)."""
  return {key: clu_metrics.Average.from_model_output(jnp.asarray(value, jnp.float32))
          for key, value in metrics.items()}


def _as_jax(batch: Mapping[str, Any]) -> dict[str, jax.Array]:
  """The batch as jax arrays (t5x hands jitted methods jax arrays; direct callers may pass numpy)."""
  return {key: jnp.asarray(value) for key, value in batch.items()}


def _no_mutables(flax_mutables: Any) -> None:
  if flax_mutables:
    raise ValueError("XAlignT5xModel has no mutable variable collections; got flax_mutables with "
                     f"{sorted(flax_mutables)}")


# ---------------------------------------------------------------- assets


def _split_assets(assets: Any) -> tuple[dict[str, Asset], dict[str, Mapping[str, Any]]]:
  """(asset objects where known, host values) of the `assets` argument."""
  if assets is None:
    return {}, {}
  if isinstance(assets, RunAssets):
    return dict(assets.assets), assets.host_values()
  if not isinstance(assets, Mapping):
    raise UserError(f"assets must be a mapping {{name: value}} or a RunAssets, got {type(assets).__name__}")
  objects, values = {}, {}
  for name, entry in assets.items():
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], Asset):
      objects[name], values[name] = entry
    elif isinstance(entry, Asset):
      raise UserError(f"assets[{name!r}] is an Asset without its value; pass (asset, value), with the value "
                      "from asset.load(directory) or asset.build(run)")
    elif isinstance(entry, Mapping):
      values[name] = entry
    else:
      raise UserError(f"assets[{name!r}] must be a value {{key: numpy array}} or (Asset, value), "
                      f"got {type(entry).__name__}")
  return objects, values


def static_assets(required: Mapping[str, Sequence[str]], assets: Any) -> dict[str, dict[str, jax.Array]]:
  """Device values of the assets the objectives require, refusing refreshed ones.

  Args:
    required: asset name -> objectives that need it (`PretrainingModel.requires()`).
    assets: None; a mapping name -> host value `{key: numpy array}` (taken as
      static) or -> `(Asset, value)`; or a `RunAssets`. Where the Asset object
      is given, its `refresh_every` is checked.

  Returns:
    {name: {key: jax.Array}} for the required on-device assets (placed once,
    uncommitted, so jit may copy them to any mesh).

  Raises:
    UserError: a required asset is missing, or refreshes during training.
  """
  objects, values = _split_assets(assets)
  placed = {}
  for name, users in sorted(required.items()):
    asset = objects.get(name)
    if asset is not None and asset.refresh_every > 0:
      raise UserError(
          f"Objectives {sorted(users)} need the asset {name!r}, which refreshes every {asset.refresh_every} "
          "steps; the t5x adapter supports static assets only (t5x's loss_fn has no assets argument and "
          f"its loop no refresh hook). Train this run with flax_xalign's own trainer ({_OWN_TRAINER}).")
    if name not in values:
      raise UserError(
          f"Objectives {sorted(users)} need the asset {name!r}; pass its value as "
          f"XAlignT5xModel(assets={{{name!r}: {{key: array}}}}), e.g. from the asset's load(MODEL_DIR) "
          "after `xalign assets <train flags>` built it.")
    if asset is not None and not asset.on_device:
      continue
    placed[name] = {key: jax.device_put(np.asarray(value)) for key, value in values[name].items()}
  unused = sorted(set(values) - set(required))
  if unused:
    logging.info("assets %s are not read by the trained objectives; ignored", unused)
  return placed


# ---------------------------------------------------------------- the model


class XAlignT5xModel:
  """flax_xalign pretraining as a t5x `BaseModel` (duck-typed; see the module docstring).

  Args:
    encoder_config: the encoder's sizes, `vocab_size` set (the vocabulary's
      size); objectives' `adapt_encoder` hooks are applied to it.
    objectives: objective name -> weight, as `train.objectives`.
    objective_options: per-objective options, as `train.objective_options`.
    masking: the shared masking.
    specials: the vocabulary's special ids.
    assets: static values of the assets the objectives require; see
      `static_assets`. Refreshed assets are refused: they need
      flax_xalign's own trainer (`python -m flax_xalign.train`).
    optimizer_def: t5x's optimizer (kept as `self.optimizer_def`, which
      t5x's train state reads).
    languages: the run's languages; sets `FEATURE_CONVERTER_CLS` to
      `feature_converter_for(languages, specials)`. Without it the class
      attribute refuses to be built.

  Attributes:
    model: the wrapped `PretrainingModel`.
    assets: the device values closed over by every method.
  """

  FEATURE_CONVERTER_CLS: type[T5xFeatureConverter] = T5xFeatureConverter

  def __init__(self, encoder_config: EncoderConfig, objectives: Mapping[str, float] = DEFAULT_OBJECTIVES,
               objective_options: Mapping[str, Any] | None = None, masking: MaskingConfig = MaskingConfig(),
               specials: SpecialTokens = PROJECT, assets: Any = None, optimizer_def: Any = None, *,
               languages: Sequence[str] | None = None):
    if encoder_config.vocab_size is None:
      raise UserError("XAlignT5xModel needs EncoderConfig.vocab_size (the vocabulary's size, e.g. "
                      "flax_xalign.tasks.get_vocabulary(MIXTURE_OR_TASK_NAME).vocab_size).")
    built = objectives_lib.build(list(objectives), objective_options)
    config = objectives_lib.adapt_encoder(encoder_config, built.values())
    if languages is not None:
      self.FEATURE_CONVERTER_CLS = feature_converter_for(languages, specials)  # pylint: disable=invalid-name
      count = len(self.FEATURE_CONVERTER_CLS.LANGUAGES)
      # The same rule as flax_xalign's trainer, so checkpoints move between the two.
      if config.num_languages and config.num_languages < count + 1:
        raise UserError(f"EncoderConfig.num_languages={config.num_languages} is too small for {count} languages "
                        "(+1 for padding); raise it or set 0 to drop language embeddings.")
    self.model = PretrainingModel(encoder=Encoder(config), objectives=dict(objectives), masking=masking,
                                  objective_options=dict(objective_options or {}), specials=specials)
    self.assets = static_assets(self.model.requires(), assets)
    self.optimizer_def = optimizer_def

  @property
  def config(self) -> EncoderConfig:
    return self.model.config

  @staticmethod
  def eval_rng() -> jax.Array:
    """The masking key when t5x gives none (evaluation, scoring)."""
    return jax.random.PRNGKey(EVAL_SEED)

  # ------------------------------------------------------------- training

  def loss_fn(self, params: Any, batch: Mapping[str, jax.Array], dropout_rng: jax.Array | None,
              flax_mutables: Any = None) -> tuple[jax.Array, dict[str, clu_metrics.Average]]:
    """`PretrainingModel.loss_fn(params, batch, dropout_rng, assets, train=True)`, metrics as clu.

    `dropout_rng=None` evaluates: `train=False` and masking with `EVAL_SEED`.
    """
    _no_mutables(flax_mutables)
    train = dropout_rng is not None
    rng = dropout_rng if train else self.eval_rng()
    loss, metrics = self.model.loss_fn(params, _as_jax(batch), rng, self.assets, train=train)
    return loss, as_clu_metrics(metrics)

  def eval_fn(self, params: Any, batch: Mapping[str, jax.Array],
              flax_mutables: Any = None) -> tuple[jax.Array, dict[str, clu_metrics.Average]]:
    return self.loss_fn(params, batch, None, flax_mutables)

  # ------------------------------------------------------------- inference

  def predict_batch(self, params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                    flax_mutables: Any = None) -> jax.Array:
    """[batch, predictions] argmax token ids at the masked slots."""
    return self.predict_batch_with_aux(params, batch, rng=rng, flax_mutables=flax_mutables)[0]

  def predict_batch_with_aux(self, params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None = None,
                             flax_mutables: Any = None) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Argmax predictions at the masked slots (masking with `rng`, default `EVAL_SEED`).

    Returns:
      (predicted [batch, p] int32, aux) with aux [batch, p] arrays `targets`,
      `weights` (1 for real slots), `positions` (index in the row),
      `log_probs` (of the prediction), `lang_ids`, `pair_side`.
    """
    _no_mutables(flax_mutables)
    rng = self.eval_rng() if rng is None else rng
    ctx = self.model.forward(params, _as_jax(batch), rng, self.assets, train=False)
    log_probs = jax.nn.log_softmax(ctx.logits.astype(jnp.float32), axis=-1)
    predicted = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    return predicted, {
        "targets": ctx.masked.targets,
        "weights": ctx.masked.weights,
        "positions": ctx.masked.positions,
        "log_probs": jnp.take_along_axis(log_probs, predicted[..., None], axis=-1)[..., 0],
        "lang_ids": ctx.at_predictions("lang_ids"),
        "pair_side": ctx.at_predictions("pair_side"),
    }

  def score_batch(self, params: Any, batch: Mapping[str, jax.Array], return_intermediates: bool = False,
                  flax_mutables: Any = None) -> jax.Array | tuple[jax.Array, dict[str, jax.Array]]:
    """[batch] sums over the masked slots of log p(original token) (masking with `EVAL_SEED`).

    The slots are those the objectives train on (their `corrupt` hooks
    included), so scores of one batch are comparable across checkpoints.
    With `return_intermediates`, also `token_scores, targets, weights,
    positions` ([batch, p]).
    """
    _no_mutables(flax_mutables)
    ctx = self.model.forward(params, _as_jax(batch), self.eval_rng(), self.assets, train=False)
    log_probs = jax.nn.log_softmax(ctx.logits.astype(jnp.float32), axis=-1)
    weights = ctx.masked.weights.astype(jnp.float32)
    token_scores = jnp.take_along_axis(log_probs, ctx.masked.targets[..., None], axis=-1)[..., 0] * weights
    scores = jnp.sum(token_scores, axis=-1)
    if not return_intermediates:
      return scores
    return scores, {"token_scores": token_scores, "targets": ctx.masked.targets,
                    "weights": ctx.masked.weights, "positions": ctx.masked.positions}

  # ------------------------------------------------------------- variables

  def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Sequence[int]],
                            input_types: Mapping[str, Any] | None = None) -> flax.core.FrozenDict:
    """`{"params": unboxed parameters, "params_axes": their logical names}` (t5x's layout).

    `input_shapes["tokens"]` is `(batch, length)`; the other features have the
    same shape and every feature is int32, so `input_types` is not needed.
    """
    del input_types
    if "tokens" not in input_shapes:
      raise UserError(f"input_shapes has no 'tokens' (has {sorted(input_shapes)}); the batches must come from "
                      "XAlignT5xModel.FEATURE_CONVERTER_CLS")
    batch, length = tuple(input_shapes["tokens"])
    # One compiled program (op-by-op initialisation is slow); a no-op inside t5x's jit.
    boxed = jax.jit(functools.partial(self.model.init, batch=batch, length=length))(rng)
    return flax.core.freeze({"params": nn.meta.unbox(boxed), "params_axes": params_axes(boxed)})
