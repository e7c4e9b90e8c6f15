"""Fine-tuning an encoder and a task head on word-level examples, and scoring it.

All parameters are trained: the pretrained encoder (MLM / pointer heads
dropped) and a fresh `models.heads` head, with `training.optimizer`'s clipped
AdamW and decay mask, linear warmup then linear decay.

Speed: all rows of a data set are padded to one length (`Featurizer.featurize`),
so every training batch has one shape [batch_size, length]. The learning rate
is a hyperparameter in the optimiser state (`optax.inject_hyperparams`) that
the step sets from its argument, and the jitted train and predict functions
are cached per (encoder config, head, update rule, padding id): the natural
and derived fine-tunings of a model, and every model of the same size,
whatever their step counts and learning rates, run one compiled program.
`group_by_length=True` trades a few compilations (one per multiple of 32) for
batches of similar-length rows cut to that length: about 2.4x faster training
steps on Greek verses (2,000-piece vocabulary: median row 32 tokens, longest
99). Evaluation always sorts rows by length and cuts batches this way.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer.featurize import (Example, FeatureSet, Featurizer, Transliterate, head_task,
                                              label_index_of, label_set_of, task_of)
from flax_xalign.evaluation.transfer.transfer_data import is_bio
from flax_xalign.evaluation.transfer.transfer_metrics import macro_f1, span_f1, weighted_cross_entropy
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.models.heads import make_head
from flax_xalign.training.optimizer import OptimizerConfig, decay_mask, learning_rate_schedule

BUCKET_MULTIPLE = 32  # With group_by_length, batches are cut to a multiple of this.
GROUP_BATCHES = 50  # With group_by_length, batches are formed by length within 50 at a time.
# Encoder parameters that fine-tuning never reads (MLM / pointer heads).
_UNUSED_ENCODER_PARAMS = ("mlm_head", "pointer_query", "pointer_key")
Log = Callable[[str], None] | None


# ------------------------------------------------------------------ step functions


def finetune_loss(params: Any, batch: Mapping[str, jax.Array], language_id: jax.Array,
                  rng: jax.Array | None, *, encoder: Encoder, head: nn.Module, pad_id: int
                  ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, {"loss", "accuracy"}) of the head's logits on one batch.

  Args:
    params: {"encoder": ..., "head": ...}.
    batch: "tokens" [batch, length] int32 (`pad_id` is padding), optional
      "positions" [batch, length] (default 0, 1, ... along each row);
      "labels" and "weights" [batch, length] (tagging) or [batch]
      (classification).
    language_id: [] int32, the language id of every real token.
    rng: dropout key; None evaluates deterministically.
    encoder, head: the networks.
    pad_id: the padding token id.
  """
  logits = _logits(params, batch["tokens"], batch.get("positions"), language_id, rng,
                   encoder=encoder, head=head, pad_id=pad_id)
  return weighted_cross_entropy(logits, batch["labels"], batch["weights"])


def _logits(params: Any, tokens: jax.Array, positions: jax.Array | None, language_id: jax.Array,
            rng: jax.Array | None, *, encoder: Encoder, head: nn.Module, pad_id: int) -> jax.Array:
  """tokens, positions [batch, length] -> head logits; dropout on iff `rng` is given.

  The whole row is one attention segment, so the two sides of a pair see
  each other.
  """
  real = tokens != pad_id
  if positions is None:
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  positions = jnp.where(real, positions, 0)
  train = rng is not None
  encoder_rngs, head_rngs = ({"dropout": r} for r in jax.random.split(rng)) if train else ({}, {})
  hidden = encoder.apply({"params": params["encoder"]}, tokens,
                         lang_ids=jnp.where(real, language_id, 0), positions=positions,
                         segment_ids=real.astype(jnp.int32), deterministic=not train,
                         rngs=encoder_rngs).hidden
  return head.apply({"params": params["head"]}, hidden, deterministic=not train, rngs=head_rngs)


def injected_adamw(optimizer: OptimizerConfig) -> optax.GradientTransformation:
  """`training.optimizer.make_optimizer`'s clip + AdamW with an injected learning rate.

  The learning rate lives in the optimiser state,
  `state.hyperparams["learning_rate"]` (a scalar of the parameters' dtype,
  `optimizer.learning_rate` at init); the train step overwrites it before every update, so one compiled
  step serves every schedule. The updates include the -lr factor: apply them
  with `optax.apply_updates`.
  """

  def clipped_adamw(learning_rate):
    return optax.chain(
        optax.clip_by_global_norm(optimizer.clip_norm),
        optax.adamw(learning_rate, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps,
                    weight_decay=optimizer.weight_decay, mask=decay_mask))

  return optax.inject_hyperparams(clipped_adamw)(learning_rate=optimizer.learning_rate)


def _train_step(params: Any, opt_state: Any, batch: Mapping[str, jax.Array],
                language_id: jax.Array, learning_rate: jax.Array, rng: jax.Array, step: jax.Array,
                *, encoder: Encoder, head: nn.Module, tx: optax.GradientTransformation,
                pad_id: int) -> tuple[Any, Any, dict[str, jax.Array]]:
  loss_fn = functools.partial(finetune_loss, batch=batch, language_id=language_id,
                              rng=jax.random.fold_in(rng, step), encoder=encoder, head=head,
                              pad_id=pad_id)
  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  # This step's scheduled rate, traced: no step count or rate is baked into the program.
  opt_state = opt_state._replace(
      hyperparams={**opt_state.hyperparams, "learning_rate": learning_rate})
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, metrics


def _predict(params: Any, tokens: jax.Array, positions: jax.Array, language_id: jax.Array, *,
             encoder: Encoder, head: nn.Module, pad_id: int) -> jax.Array:
  logits = _logits(params, tokens, positions, language_id, None, encoder=encoder, head=head,
                   pad_id=pad_id)
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


@functools.lru_cache(maxsize=32)
def _train_functions(config: EncoderConfig, head: nn.Module, optimizer: OptimizerConfig,
                     pad_id: int) -> tuple[Callable, Callable]:
  """Jitted (train step, optimiser init), shared by every run with these settings.

  Only the update rule of `optimizer` (b1, b2, eps, weight decay, clip) should
  differ between keys: the learning rate is a per-step argument, so callers
  pass a config with the schedule fields zeroed.
  """
  tx = injected_adamw(optimizer)
  step = jax.jit(functools.partial(_train_step, encoder=Encoder(config), head=head, tx=tx,
                                   pad_id=pad_id))
  return step, jax.jit(tx.init)


@functools.lru_cache(maxsize=32)
def _predict_function(config: EncoderConfig, head: nn.Module, pad_id: int) -> Callable:
  return jax.jit(functools.partial(_predict, encoder=Encoder(config), head=head, pad_id=pad_id))


@functools.lru_cache(maxsize=32)
def _head_init(head: nn.Module, embed_dim: int) -> Callable:
  dummy = jnp.zeros((1, 2, embed_dim), jnp.float32)
  return jax.jit(lambda rng: head.init({"params": rng}, dummy, deterministic=True)["params"])


def encoder_params(params: Any) -> dict[str, Any]:
  """Plain encoder parameters from a checkpoint tree (boxed or not), heads dropped."""
  params = nn.meta.unbox(params)
  if "params" in params and "token_embed" not in params:
    params = params["params"]
  return {k: v for k, v in params.items() if k not in _UNUSED_ENCODER_PARAMS}


def encoder_config_of(model: Any) -> EncoderConfig:
  """The `EncoderConfig` of a `PretrainingModel`, an `Encoder` or a config."""
  if isinstance(model, EncoderConfig):
    return model
  return getattr(model, "encoder", model).config


# ------------------------------------------------------------------ fine-tuning


@dataclasses.dataclass(frozen=True, eq=False)
class FinetunedModel:
  """An encoder + head after fine-tuning.

  Attributes:
    config: the encoder config.
    head: the head module (`TaggingHead` or `ClassificationHead`).
    task: "tagging", "classification" or "pair_classification".
    label_set: label names; index i is logit i.
    params: {"encoder": ..., "head": ...}.
    featurizer: the `Featurizer` used in training (vocabulary, max_length,
      special ids).
    history: per-step "loss" and "accuracy" [steps] (train batches).
    seconds: wall time of the fine-tuning, compilation included.
  """

  config: EncoderConfig
  head: nn.Module
  task: str
  label_set: tuple[str, ...]
  params: Any
  featurizer: Featurizer
  history: dict[str, np.ndarray]
  seconds: float


def _check_language_id(config: EncoderConfig, language_id: int) -> None:
  if config.num_languages and not 1 <= int(language_id) <= config.num_languages:
    raise UserError(f"language id {language_id} is outside 1..{config.num_languages}, the "
                    "model's language embeddings.")


def finetune(model: Any, params: Any, vocabulary: Any,
             train_examples: Sequence[Example], *,
             task: str | None = None, label_set: Sequence[str] | None = None,
             language_id: int = 1, transliterate: Transliterate | None = None,
             steps: int | None = None, epochs: float | None = None, batch_size: int = 32,
             learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
             weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
             group_by_length: bool = False, pair_layout: str = "restart", name: str = "",
             log: Log = print) -> FinetunedModel:
  """Fine-tunes all encoder parameters and a fresh task head.

  AdamW (b2 0.999, eps 1e-8, clip 1.0, decay on kernels/embeddings), linear
  warmup over `warmup_ratio` of the steps then linear decay to 0; dropout as
  the encoder config says. Batches of `batch_size` rows (see
  `Featurizer.featurize` for their length) are drawn from seeded reshuffles
  of the data (epochs back to back), so two runs with the same seed see
  examples in the same order.

  Args:
    model: a `PretrainingModel`, an `Encoder` or an `EncoderConfig`.
    params: its parameters (boxed or plain; MLM/pointer heads are dropped).
    vocabulary: the model's vocabulary (its special ids are read from its
      SentencePiece model), or a `Featurizer` (shares its cache and special
      ids; then `max_length` and `pair_layout` are the featurizer's).
    train_examples: `TaggedSentence`s, `LabelledSentence`s or `SentencePair`s.
    task: "tagging", "classification" or "pair_classification"; by default
      from the example type.
    label_set: label names; by default the sorted labels of the examples.
    language_id: language id of every token (ignored without language
      embeddings).
    transliterate: optional natural -> derived id map (regular ids only).
    steps: optimiser steps; or give `epochs` (steps = ceil(epochs * n / batch)).
    epochs: passes over the data, when `steps` is None.
    batch_size: rows per step.
    learning_rate: peak learning rate.
    warmup_ratio: fraction of the steps spent warming up.
    weight_decay: AdamW decay.
    max_length: the longest row, `<s>` and `</s>` included (<=
      config.num_positions); longer examples keep a prefix of whole words.
    seed: head init, batch order and dropout.
    group_by_length: batch rows of similar length and cut each batch to a
      multiple of 32 (`batch_order`): several times less padding on verse
      data, at the cost of one compilation per bucket (<= max_length / 32).
    pair_layout: how SentencePairs are laid out ("restart" or "continuous";
      use the model's `RunSpec.pair_layout`).
    name: shown in the progress line.
    log: prints one progress line (None: silent).
  """
  start = time.perf_counter()
  config = encoder_config_of(model)
  task = task or task_of(train_examples)
  label_set = tuple(label_set or label_set_of(train_examples))
  featurizer = (vocabulary if isinstance(vocabulary, Featurizer)
                else Featurizer(vocabulary, max_length=max_length, pair_layout=pair_layout))
  if featurizer.max_length > config.num_positions:
    raise UserError(f"max_length={featurizer.max_length} exceeds the model's "
                    f"{config.num_positions} positions.")
  if task != task_of(train_examples):
    raise UserError(f"task {task!r} does not match the examples ({task_of(train_examples)}).")
  _check_language_id(config, language_id)
  if steps is None:
    if epochs is None:
      raise UserError("give fine-tuning steps or epochs.")
    steps = math.ceil(epochs * len(train_examples) / batch_size)
  steps = int(steps)
  if steps < 1 or batch_size < 1:
    raise UserError(f"steps={steps} and batch_size={batch_size} must be at least 1.")
  features = featurizer.featurize(train_examples, label_index=label_index_of(label_set),
                                  transliterate=transliterate)
  head = make_head(config, head_task(task), len(label_set))
  optimizer = OptimizerConfig(learning_rate=learning_rate,
                              warmup_steps=int(round(warmup_ratio * steps)),
                              weight_decay=weight_decay, b2=0.999, eps=1e-8, clip_norm=1.0)
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  state = {"encoder": encoder_params(params),
           "head": _head_init(head, config.embed_dim)(init_rng)}
  pad_id = featurizer.specials.pad
  order = batch_order((features.tokens != pad_id).sum(axis=1), batch_size, steps, seed,
                      group_by_length=group_by_length)
  state, history, first_step = _train_loop(
      config, head, optimizer, state, features, order, language_id=language_id,
      rng=dropout_rng, group_by_length=group_by_length, pad_id=pad_id)
  seconds = time.perf_counter() - start
  if log is not None:
    tail = max(1, steps // 10)
    shape = "grouped" if group_by_length else str(features.tokens.shape[1])
    log(f"finetune {name or task}: {steps} steps x {batch_size} rows x {shape}, "
        f"loss {history['loss'][:tail].mean():.3f} -> {history['loss'][-tail:].mean():.3f}, "
        f"train acc {history['accuracy'][-tail:].mean():.3f}, {seconds:.1f}s "
        f"(first step {first_step:.1f}s)")
  return FinetunedModel(config=config, head=head, task=task, label_set=label_set, params=state,
                        featurizer=featurizer, history=history, seconds=seconds)


def _train_loop(config: EncoderConfig, head: nn.Module, optimizer: OptimizerConfig, state: Any,
                features: FeatureSet, order: np.ndarray, *, language_id: int, rng: jax.Array,
                group_by_length: bool, pad_id: int
                ) -> tuple[Any, dict[str, np.ndarray], float]:
  """Runs one compiled step per row of `order` [steps, batch]; (params, history, first-step s).

  Batches are padded to the data set's length, or with `group_by_length` cut
  to `bucket_length` of their longest row (one compilation per bucket).
  """
  steps = len(order)
  # The schedule is evaluated here, so the cached step is keyed by the update rule alone.
  train_step, init_optimizer = _train_functions(
      config, head, dataclasses.replace(optimizer, learning_rate=0.0, warmup_steps=0,
                                        end_learning_rate_ratio=0.0), pad_id)
  learning_rates = np.asarray(
      jax.jit(learning_rate_schedule(optimizer, steps))(np.arange(steps)), np.float32)
  opt_state = init_optimizer(state)
  lang = np.int32(language_id)
  metrics, start, first_step = [], time.perf_counter(), 0.0
  lengths = (features.tokens != pad_id).sum(axis=1)
  cap = features.tokens.shape[1]
  positions = _positions(features)
  tagging = features.labels.ndim == 2
  for step, rows in enumerate(order):
    length = bucket_length(lengths[rows].max(), cap) if group_by_length else cap
    batch = {"tokens": features.tokens[rows, :length], "positions": positions[rows, :length]}
    for key in ("labels", "weights"):
      batch[key] = getattr(features, key)[rows, :length] if tagging else getattr(features, key)[rows]
    state, opt_state, m = train_step(state, opt_state, batch, lang, learning_rates[step], rng,
                                     np.int32(step))
    metrics.append(m)
    if step == 0:  # Compilation (or a cache hit) happens here.
      jax.block_until_ready(m)
      first_step = time.perf_counter() - start
  metrics = jax.device_get(metrics)
  return state, {k: np.asarray([m[k] for m in metrics]) for k in metrics[0]}, first_step


def batch_order(lengths: np.ndarray, batch_size: int, steps: int, seed: int, *,
                group_by_length: bool = False) -> np.ndarray:
  """Row indices [steps, batch_size] of every training step.

  Consecutive seeded permutations of the rows (epochs back to back), cut into
  batches. With `group_by_length`, each run of `GROUP_BATCHES` batches is
  sorted by row length before cutting and the resulting batches shuffled (as
  Hugging Face's `group_by_length`), so a batch holds rows of similar length.

  Args:
    lengths: [examples] row lengths (tokens, specials included).
    batch_size: rows per step.
    steps: number of steps.
    seed: seeds the permutations.
    group_by_length: group rows of similar length into a batch.
  """
  rng = np.random.default_rng(seed)
  n, needed = len(lengths), steps * batch_size
  stream = np.concatenate([rng.permutation(n) for _ in range(-(-needed // n))])[:needed]
  order = stream.reshape(steps, batch_size)
  if group_by_length:
    for first in range(0, steps, GROUP_BATCHES):
      part = order[first:first + GROUP_BATCHES].reshape(-1)
      part = part[np.argsort(lengths[part], kind="stable")].reshape(-1, batch_size)
      order[first:first + GROUP_BATCHES] = part[rng.permutation(len(part))]
  return order


def bucket_length(longest: int, cap: int) -> int:
  """The padded length of a batch whose longest row is `longest` (<= cap)."""
  return min(cap, -(-int(longest) // BUCKET_MULTIPLE) * BUCKET_MULTIPLE)


# ------------------------------------------------------------------ evaluation


def evaluate(finetuned: FinetunedModel, examples: Sequence[Example], *,
             language_id: int = 1, transliterate: Transliterate | None = None,
             batch_size: int = 64) -> dict[str, float]:
  """Scores a fine-tuned model on labelled examples.

  Returns:
    Tagging: `accuracy` over scored words (= micro-F1 for POS), `f1` (macro
    over tags occurring in gold or predictions), `count` (scored words),
    `words_dropped` (cut by truncation, not scored); with BIO tags also
    `entity_precision`, `entity_recall`, `entity_f1` (exact spans, micro).
    Classification (single sentences or pairs): `accuracy`, `f1` (macro over
    classes), `count`, `words_dropped`.
  """
  if task_of(examples) != finetuned.task:
    raise UserError(f"the model was fine-tuned for {finetuned.task}, not {task_of(examples)}.")
  _check_language_id(finetuned.config, language_id)
  features = finetuned.featurizer.featurize(
      examples, label_index=label_index_of(finetuned.label_set), transliterate=transliterate)
  predicted = _predict_all(finetuned, features.tokens, _positions(features), language_id, batch_size)
  n = len(examples)
  scored = features.weights > 0
  gold, guess = features.labels[scored], predicted[scored]
  result = {"accuracy": float(np.mean(gold == guess)) if gold.size else 0.0,
            "f1": macro_f1(gold, guess), "count": int(gold.size)}
  result["words_dropped"] = features.words_dropped
  if finetuned.task == "tagging":
    if is_bio(finetuned.label_set):
      names = np.asarray(finetuned.label_set)
      spans = span_f1([names[features.labels[i][scored[i]]] for i in range(n)],
                      [names[predicted[i][scored[i]]] for i in range(n)])
      result.update({f"entity_{k}": v for k, v in spans.items()})
  return result


def _positions(features: FeatureSet) -> np.ndarray:
  """[examples, length] position ids of a FeatureSet (0, 1, ... when it has none)."""
  if features.positions is not None:
    return features.positions
  return np.broadcast_to(np.arange(features.tokens.shape[1], dtype=np.int32), features.tokens.shape)


def _predict_all(finetuned: FinetunedModel, tokens: np.ndarray, positions: np.ndarray,
                 language_id: int, batch_size: int) -> np.ndarray:
  """Predictions for tokens and positions [n, length]: [n, length] tags or [n] classes.

  Rows go through in order of length, each batch cut to `bucket_length` of
  its longest row (padding never changes a row's result), so short rows
  cost little; the last batch is filled with empty rows to keep its shape.
  """
  pad_id = finetuned.featurizer.specials.pad
  predict = _predict_function(finetuned.config, finetuned.head, pad_id)
  n, cap = tokens.shape
  lengths = (tokens != pad_id).sum(axis=1)
  order = np.argsort(lengths, kind="stable")
  lang = np.int32(language_id)
  outputs = []
  for first in range(0, n, batch_size):
    rows = order[first:first + batch_size]
    batch = np.full((batch_size, bucket_length(lengths[rows].max(), cap)), pad_id, np.int32)
    batch[:len(rows)] = tokens[rows, :batch.shape[1]]
    where = np.zeros(batch.shape, np.int32)
    where[:len(rows)] = positions[rows, :batch.shape[1]]
    outputs.append((rows, predict(finetuned.params, batch, where, lang)))
  predicted = np.zeros((n, cap) if finetuned.task == "tagging" else (n,), np.int32)
  for rows, out in jax.device_get(outputs):
    if out.ndim == 2:
      predicted[rows, :out.shape[1]] = out[:len(rows)]
    else:
      predicted[rows] = out[:len(rows)]
  return predicted
