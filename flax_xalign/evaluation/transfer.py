"""Zero-shot transfer to a derived language: fine-tune, evaluate, SUP / ZS / Δ.

The ALIGN-MLM protocol (Tang, Deshpande & Narasimhan 2022, §4; Deshpande et
al. 2021): a model pretrained on a natural language L and a derived language
L' (`data.synthetic`) gets a task head and is fine-tuned, all parameters, on
one language and tested on L':

* ZS (zero-shot): fine-tune on natural-language training data, test on L';
* SUP (supervised): fine-tune on the derived training data, test on L';
* Δ = SUP − ZS (lower is better transfer); we also report natural → natural.

Examples are word-tokenised (`transfer_data.TaggedSentence` /
`LabelledSentence`). Each word is tokenised on its own, the row is
`<s> pieces </s>`; a tag sits on the first subword of its word (the other
subwords carry weight 0), a sentence label is predicted from the `<s>` state.
Rows longer than `max_length` keep a prefix of whole words; dropped words are
not scored and `evaluate` counts them.

Speed: all rows of a data set are padded to one length (its longest row
rounded up to a multiple of 16, at most `max_length`), so every training
batch has one shape [batch_size, length]. The jitted train and predict
functions take the parameters, language id and learning rate as arguments and
are cached per (encoder config, head, update rule): the natural and derived
fine-tunings of a model, and every model of the same size, run one compiled
program (derived data keeps the natural row lengths, so the shape is shared
too). `group_by_length=True` trades a few more compilations (one per multiple
of 32) for batches of similar-length rows cut to that length: about 2.4x
faster training steps on Greek verses (2,000-piece vocabulary: median row 32
tokens, longest 99).
Evaluation always sorts rows by length and cuts batches this way.

Paper hyperparameters (Table 11) are lr 2e-5, 10 epochs (POS/NER) or 5
(XNLI), batch 32, length 128 for 500k-step base models; the defaults here
(lr 1e-3, warmup 10 %, linear decay, AdamW) suit the small demo models.

    model, params, meta, _ = mlm_eval.load_model("runs/grc_trans_inv")
    result = zero_shot_transfer((model, params, meta), vocabulary, task_name="pos",
                                train=transfer_data.greek_pos("train"),
                                test=transfer_data.greek_pos("test"), language=language,
                                natural_lang="grc", derived_lang="grc_inv", steps=300)
    result["sup"], result["zs"], result["delta"]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer_data import LabelledSentence, TaggedSentence, derive, is_bio
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.training.optimizer import OptimizerConfig, decay_mask, learning_rate_schedule

PAD_ID, EOS_ID, UNK_ID, BOS_ID = 0, 1, 2, 3  # docs/INTERFACES.md
NUM_SPECIAL_TOKENS = 5
TASKS = ("tagging", "classification")
LENGTH_MULTIPLE = 16  # Rows are padded to a multiple of this (see Featurizer.featurize).
BUCKET_MULTIPLE = 32  # With group_by_length, batches are cut to a multiple of this.
GROUP_BATCHES = 50  # With group_by_length, batches are formed by length within 50 at a time.
# Encoder parameters that fine-tuning never reads (MLM / pointer heads).
_UNUSED_ENCODER_PARAMS = ("mlm_head", "pointer_query", "pointer_key")
Transliterate = Callable[[np.ndarray], np.ndarray]
Log = Callable[[str], None] | None


# ------------------------------------------------------------------ features


class EncodedWords(NamedTuple):
  """One word-tokenised sentence as `<s> pieces </s>`.

  Attributes:
    tokens: [n] int32 ids, n <= max_length.
    word_index: [n] int32: the word's index at its first subword, -1 elsewhere
      (specials and continuation subwords).
    num_words: how many leading words were kept.
  """

  tokens: np.ndarray
  word_index: np.ndarray
  num_words: int


def encode_words(pieces: Sequence[Sequence[int]], *, max_length: int,
                 transliterate: Transliterate | None = None) -> EncodedWords:
  """Lays out per-word subword ids as `<s> pieces </s>`, whole words only.

  Args:
    pieces: subword ids of each word; a word with none becomes `<unk>`.
    max_length: the row budget including `<s>` and `</s>`.
    transliterate: optional map of natural to derived ids, applied to the
      subword ids; special ids (< NUM_SPECIAL_TOKENS) are kept as they are.
  """
  if max_length < 3:
    raise UserError(f"max_length={max_length} leaves no room for a word next to <s> and </s>.")
  pieces = [list(p) or [UNK_ID] for p in pieces]
  budget, kept, used = max_length - 2, 0, 0
  while kept < len(pieces) and used + len(pieces[kept]) <= budget:
    used += len(pieces[kept])
    kept += 1
  body = np.asarray([t for p in pieces[:kept] for t in p], np.int32)
  if transliterate is not None and body.size:
    mapped = np.asarray(transliterate(body))
    if mapped.shape != body.shape:
      raise ValueError(f"transliterate changed the shape {body.shape} to {mapped.shape}.")
    body = np.where(body >= NUM_SPECIAL_TOKENS, mapped, body).astype(np.int32)
  starts = np.full(used, -1, np.int32)
  offsets = np.cumsum([0] + [len(p) for p in pieces[:kept]])[:-1]
  starts[offsets] = np.arange(kept, dtype=np.int32)
  tokens = np.concatenate([[BOS_ID], body, [EOS_ID]]).astype(np.int32)
  word_index = np.concatenate([[-1], starts, [-1]]).astype(np.int32)
  return EncodedWords(tokens, word_index, kept)


class FeatureSet(NamedTuple):
  """Padded model inputs and labels of a list of examples.

  Attributes:
    tokens: [examples, length] int32; 0 is padding.
    labels: [examples, length] (tagging, on first subwords) or [examples]
      (classification) int32 indices into the label set.
    weights: float32, the shape of `labels`; 1 where a label is scored.
    words_dropped: words cut by truncation (tagging: never scored).
  """

  tokens: np.ndarray
  labels: np.ndarray
  weights: np.ndarray
  words_dropped: int


class Featurizer:
  """Featurises word-tokenised examples with a vocabulary; caches each word's pieces.

  Args:
    vocabulary: a seqio / SentencePiece vocabulary (anything with
      `encode(str) -> list[int]`).
    max_length: the longest row, `<s>` and `</s>` included.
  """

  def __init__(self, vocabulary: Any, *, max_length: int = 128):
    if max_length < 3:
      raise UserError(f"max_length={max_length} must be at least 3.")
    self.vocabulary = vocabulary
    self.max_length = int(max_length)
    self._pieces: dict[str, list[int]] = {}

  def word_pieces(self, words: Sequence[str]) -> list[list[int]]:
    """Subword ids of each word, tokenised alone (cached)."""
    missing = [w for w in dict.fromkeys(words) if w not in self._pieces]
    if missing:
      processor = getattr(self.vocabulary, "tokenizer", None)
      encoded = (processor.encode(missing) if processor is not None
                 else [self.vocabulary.encode(w) for w in missing])
      self._pieces.update((w, [int(t) for t in ids]) for w, ids in zip(missing, encoded))
    return [self._pieces[w] for w in words]

  def encode(self, words: Sequence[str], *, transliterate: Transliterate | None = None
             ) -> EncodedWords:
    return encode_words(self.word_pieces(words), max_length=self.max_length,
                        transliterate=transliterate)

  def featurize(self, examples: Sequence[TaggedSentence | LabelledSentence], *,
                label_index: Mapping[str, int], transliterate: Transliterate | None = None
                ) -> FeatureSet:
    """Featurises and pads all examples to one length (see `FeatureSet`).

    The length is the longest row rounded up to a multiple of
    `LENGTH_MULTIPLE`, at most `max_length`: one shape per data set (so one
    compilation), without paying for `max_length` when every row is shorter.
    Derived copies of a data set (reordered words, transliterated ids) have
    the same row lengths, hence the same shape.
    """
    tagging = task_of(examples) == "tagging"
    encoded = [self.encode(e.words, transliterate=transliterate) for e in examples]
    n = len(examples)
    longest = max(e.tokens.size for e in encoded)
    length = min(self.max_length, -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
    tokens = np.zeros((n, length), np.int32)
    labels = np.zeros((n, length) if tagging else (n,), np.int32)
    weights = np.zeros(labels.shape, np.float32)
    dropped = 0
    for i, (example, row) in enumerate(zip(examples, encoded)):
      tokens[i, :row.tokens.size] = row.tokens
      dropped += len(example.words) - row.num_words
      if tagging:
        slots = np.flatnonzero(row.word_index >= 0)
        labels[i, slots] = [_index(label_index, example.tags[w]) for w in row.word_index[slots]]
        weights[i, slots] = 1.0
      else:
        labels[i], weights[i] = _index(label_index, example.label), 1.0
    return FeatureSet(tokens, labels, weights, dropped)


def _index(label_index: Mapping[str, int], label: str) -> int:
  if label not in label_index:
    raise UserError(f"label {label!r} is not in the label set {sorted(label_index)}.")
  return label_index[label]


def task_of(examples: Sequence[TaggedSentence | LabelledSentence]) -> str:
  """"tagging" for TaggedSentences, "classification" for LabelledSentences."""
  if not examples:
    raise UserError("no examples.")
  if all(isinstance(e, TaggedSentence) for e in examples):
    return "tagging"
  if all(isinstance(e, LabelledSentence) for e in examples):
    return "classification"
  raise UserError("examples must be all TaggedSentences or all LabelledSentences.")


def label_set_of(*example_lists: Sequence[TaggedSentence | LabelledSentence]) -> tuple[str, ...]:
  """Sorted labels (tags or sentence labels) occurring in the example lists."""
  labels = set()
  for examples in example_lists:
    for e in examples:
      labels.update(e.tags if isinstance(e, TaggedSentence) else (e.label,))
  return tuple(sorted(labels))


# ------------------------------------------------------------------ network


class TaggingHead(nn.Module):
  """RoBERTa's token-classification head: dropout, then a dense map per token."""

  num_tags: int
  dropout_rate: float = 0.1
  initializer_std: float = 0.02

  @nn.compact
  def __call__(self, hidden: jax.Array, *, deterministic: bool) -> jax.Array:
    """hidden [batch, length, embed] -> logits [batch, length, num_tags] float32."""
    x = nn.Dropout(self.dropout_rate)(hidden.astype(jnp.float32), deterministic=deterministic)
    return nn.Dense(self.num_tags, kernel_init=nn.initializers.normal(self.initializer_std),
                    name="out")(x)


class ClassificationHead(nn.Module):
  """RoBERTa's sentence head on the `<s>` state: dropout, dense + tanh, dropout, dense."""

  num_classes: int
  dropout_rate: float = 0.1
  initializer_std: float = 0.02

  @nn.compact
  def __call__(self, hidden: jax.Array, *, deterministic: bool) -> jax.Array:
    """hidden [batch, length, embed] -> logits [batch, num_classes] float32."""
    init = nn.initializers.normal(self.initializer_std)
    dropout = nn.Dropout(self.dropout_rate)
    x = dropout(hidden[:, 0].astype(jnp.float32), deterministic=deterministic)
    x = jnp.tanh(nn.Dense(hidden.shape[-1], kernel_init=init, name="dense")(x))
    x = dropout(x, deterministic=deterministic)
    return nn.Dense(self.num_classes, kernel_init=init, name="out")(x)


def make_head(config: EncoderConfig, task: str, num_labels: int) -> nn.Module:
  """The task head, with the encoder's dropout rate and initialiser scale."""
  if task not in TASKS:
    raise UserError(f"unknown task {task!r}; use one of {', '.join(TASKS)}.")
  head = TaggingHead if task == "tagging" else ClassificationHead
  return head(num_labels, dropout_rate=config.dropout_rate,
              initializer_std=config.initializer_std)


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean cross-entropy over weighted slots.

  Args:
    logits: [..., classes] float32.
    labels: [...] int class indices.
    weights: [...] float; 0 marks slots that are not scored.

  Returns:
    (loss, metrics): loss = sum(weights * nll) / max(sum(weights), 1);
    metrics hold `loss` and `accuracy` with the same normaliser.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  normaliser = jnp.maximum(weights.sum(), 1.0)
  loss = (nll * weights).sum() / normaliser
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": (correct * weights).sum() / normaliser}


def _logits(params: Any, tokens: jax.Array, language_id: jax.Array, rng: jax.Array | None, *,
            encoder: Encoder, head: nn.Module) -> jax.Array:
  """tokens [batch, length] -> head logits; dropout on iff `rng` is given."""
  real = tokens != PAD_ID
  positions = jnp.where(real, jnp.arange(tokens.shape[1], dtype=jnp.int32)[None], 0)
  train = rng is not None
  encoder_rngs, head_rngs = ({"dropout": r} for r in jax.random.split(rng)) if train else ({}, {})
  hidden = encoder.apply({"params": params["encoder"]}, tokens,
                         lang_ids=jnp.where(real, language_id, 0), positions=positions,
                         segment_ids=real.astype(jnp.int32), deterministic=not train,
                         rngs=encoder_rngs).hidden
  return head.apply({"params": params["head"]}, hidden, deterministic=not train, rngs=head_rngs)


def _train_step(params: Any, opt_state: Any, batch: Mapping[str, jax.Array],
                language_id: jax.Array, learning_rate: jax.Array, rng: jax.Array, step: jax.Array,
                *, encoder: Encoder, head: nn.Module, tx: optax.GradientTransformation
                ) -> tuple[Any, Any, dict[str, jax.Array]]:
  def loss_fn(p):
    logits = _logits(p, batch["tokens"], language_id, jax.random.fold_in(rng, step),
                     encoder=encoder, head=head)
    return weighted_cross_entropy(logits, batch["labels"], batch["weights"])

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  updates, opt_state = tx.update(grads, opt_state, params)
  params = jax.tree.map(lambda p, u: p - learning_rate * u.astype(p.dtype), params, updates)
  return params, opt_state, metrics


def _predict(params: Any, tokens: jax.Array, language_id: jax.Array, *, encoder: Encoder,
             head: nn.Module) -> jax.Array:
  return jnp.argmax(_logits(params, tokens, language_id, None, encoder=encoder, head=head),
                    axis=-1).astype(jnp.int32)


def adamw_direction(optimizer: OptimizerConfig) -> optax.GradientTransformation:
  """`training.optimizer.make_optimizer`'s AdamW without the learning rate.

  optax.adamw is scale_by_adam + add_decayed_weights + scale_by_learning_rate;
  the train step multiplies by -lr itself, with lr a traced argument, so one
  compiled step serves every step count and learning rate.
  """
  return optax.chain(
      optax.clip_by_global_norm(optimizer.clip_norm),
      optax.scale_by_adam(b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps),
      optax.add_decayed_weights(optimizer.weight_decay, mask=decay_mask))


@functools.lru_cache(maxsize=32)
def _train_functions(config: EncoderConfig, head: nn.Module, optimizer: OptimizerConfig
                     ) -> tuple[Callable, Callable]:
  """Jitted (train step, optimiser init), shared by every run with these settings.

  Only the update rule of `optimizer` (b1, b2, eps, weight decay, clip) is
  part of the key: learning rate and schedule are per-step arguments.
  """
  tx = adamw_direction(optimizer)
  step = jax.jit(functools.partial(_train_step, encoder=Encoder(config), head=head, tx=tx))
  return step, jax.jit(tx.init)


@functools.lru_cache(maxsize=32)
def _predict_function(config: EncoderConfig, head: nn.Module) -> Callable:
  return jax.jit(functools.partial(_predict, encoder=Encoder(config), head=head))


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


# ------------------------------------------------------------------ fine-tuning


@dataclasses.dataclass(frozen=True, eq=False)
class FinetunedModel:
  """An encoder + head after fine-tuning.

  Attributes:
    config: the encoder config.
    head: the head module (`TaggingHead` or `ClassificationHead`).
    task: "tagging" or "classification".
    label_set: label names; index i is logit i.
    params: {"encoder": ..., "head": ...}.
    featurizer: the `Featurizer` used in training (vocabulary, max_length).
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


def _encoder_config(model: Any) -> EncoderConfig:
  if isinstance(model, EncoderConfig):
    return model
  return getattr(model, "encoder", model).config


def _check_language_id(config: EncoderConfig, language_id: int) -> None:
  if config.num_languages and not 1 <= int(language_id) <= config.num_languages:
    raise UserError(f"language id {language_id} is outside 1..{config.num_languages}, the "
                    "model's language embeddings.")


def finetune(model: Any, params: Any, vocabulary: Any,
             train_examples: Sequence[TaggedSentence | LabelledSentence], *,
             task: str | None = None, label_set: Sequence[str] | None = None,
             language_id: int = 1, transliterate: Transliterate | None = None,
             steps: int | None = None, epochs: float | None = None, batch_size: int = 32,
             learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
             weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
             group_by_length: bool = False, name: str = "", log: Log = print
             ) -> FinetunedModel:
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
    vocabulary: the model's vocabulary, or a `Featurizer` (shares its cache;
      then `max_length` is the featurizer's).
    train_examples: `TaggedSentence`s or `LabelledSentence`s.
    task: "tagging" or "classification"; by default from the example type.
    label_set: label names; by default the sorted labels of the examples.
    language_id: language id of every token (ignored without language
      embeddings).
    transliterate: optional natural -> derived id map (non-special ids).
    steps: optimiser steps; or give `epochs` (steps = ceil(epochs * n / batch)).
    epochs: passes over the data, when `steps` is None.
    batch_size: rows per step.
    learning_rate: peak learning rate.
    warmup_ratio: fraction of the steps spent warming up.
    weight_decay: AdamW decay.
    max_length: the longest row, `<s>` and `</s>` included (<=
      config.max_positions); longer examples keep a prefix of whole words.
    seed: head init, batch order and dropout.
    group_by_length: batch rows of similar length and cut each batch to a
      multiple of 32 (`batch_order`): several times less padding on verse
      data, at the cost of one compilation per bucket (<= max_length / 32).
    name: shown in the progress line.
    log: prints one progress line (None: silent).
  """
  start = time.perf_counter()
  config = _encoder_config(model)
  task = task or task_of(train_examples)
  label_set = tuple(label_set or label_set_of(train_examples))
  featurizer = (vocabulary if isinstance(vocabulary, Featurizer)
                else Featurizer(vocabulary, max_length=max_length))
  if featurizer.max_length > config.max_positions:
    raise UserError(f"max_length={featurizer.max_length} exceeds the model's "
                    f"{config.max_positions} positions.")
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
  features = featurizer.featurize(train_examples, label_index=_label_index(label_set),
                                  transliterate=transliterate)
  head = make_head(config, task, len(label_set))
  optimizer = OptimizerConfig(learning_rate=learning_rate,
                              warmup_steps=int(round(warmup_ratio * steps)),
                              weight_decay=weight_decay, b2=0.999, eps=1e-8, clip_norm=1.0)
  init_rng, dropout_rng = jax.random.split(jax.random.key(seed))
  state = {"encoder": encoder_params(params),
           "head": _head_init(head, config.embed_dim)(init_rng)}
  order = batch_order((features.tokens != PAD_ID).sum(axis=1), batch_size, steps, seed,
                      group_by_length=group_by_length)
  state, history, first_step = _train_loop(
      config, head, optimizer, state, features, order, language_id=language_id,
      rng=dropout_rng, group_by_length=group_by_length)
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
                group_by_length: bool) -> tuple[Any, dict[str, np.ndarray], float]:
  """Runs one compiled step per row of `order` [steps, batch]; (params, history, first-step s).

  Batches are padded to the data set's length, or with `group_by_length` cut
  to `bucket_length` of their longest row (one compilation per bucket).
  """
  steps = len(order)
  train_step, init_optimizer = _train_functions(
      config, head, dataclasses.replace(optimizer, learning_rate=0.0, warmup_steps=0,
                                        end_learning_rate_ratio=0.0))
  learning_rates = np.asarray(
      jax.jit(learning_rate_schedule(optimizer, steps))(np.arange(steps)), np.float32)
  opt_state = init_optimizer(state)
  lang = np.int32(language_id)
  metrics, start, first_step = [], time.perf_counter(), 0.0
  lengths = (features.tokens != PAD_ID).sum(axis=1)
  cap = features.tokens.shape[1]
  for step, rows in enumerate(order):
    length = bucket_length(lengths[rows].max(), cap) if group_by_length else cap
    batch = {"tokens": features.tokens[rows, :length]}
    tagging = features.labels.ndim == 2
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


def _label_index(label_set: Sequence[str]) -> dict[str, int]:
  return {label: i for i, label in enumerate(label_set)}


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


# ------------------------------------------------------------------ metrics


def macro_f1(gold: np.ndarray, predicted: np.ndarray) -> float:
  """Unweighted mean F1 over the classes that occur in `gold` or `predicted` ([n] ints)."""
  classes = np.union1d(gold, predicted)
  if not classes.size:
    return 0.0
  scores = []
  for c in classes:
    tp = np.sum((gold == c) & (predicted == c))
    denominator = np.sum(gold == c) + np.sum(predicted == c)
    scores.append(2.0 * tp / denominator)
  return float(np.mean(scores))


def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """Entity spans `(type, start, end)` (end exclusive) of a BIO tag sequence.

  conlleval's chunking: an entity starts at `B-X`, or at `I-X` that does not
  continue an `X` entity; it ends before `O`, `B-`, or a tag of another type.
  """
  spans, kind, start = set(), None, 0
  for i, tag in enumerate([*tags, "O"]):
    prefix, _, entity = tag.partition("-") if tag != "O" else ("O", "", "")
    if kind is not None and (prefix != "I" or entity != kind):
      spans.add((kind, start, i))
      kind = None
    if prefix in ("B", "I") and kind is None:
      kind, start = entity, i
  return spans


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
            ) -> dict[str, float]:
  """Micro entity precision, recall and F1 over sentences of BIO tags (exact spans)."""
  tp = num_gold = num_predicted = 0
  for g, p in zip(gold, predicted, strict=True):
    gs, ps = bio_spans(g), bio_spans(p)
    tp += len(gs & ps)
    num_gold += len(gs)
    num_predicted += len(ps)
  precision = tp / num_predicted if num_predicted else 0.0
  recall = tp / num_gold if num_gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}


def evaluate(finetuned: FinetunedModel, examples: Sequence[TaggedSentence | LabelledSentence], *,
             language_id: int = 1, transliterate: Transliterate | None = None,
             batch_size: int = 64) -> dict[str, float]:
  """Scores a fine-tuned model on labelled examples.

  Returns:
    Tagging: `accuracy` over scored words (= micro-F1 for POS), `f1` (macro
    over tags occurring in gold or predictions), `count` (scored words),
    `words_dropped` (cut by truncation, not scored); with BIO tags also
    `entity_precision`, `entity_recall`, `entity_f1` (exact spans, micro).
    Classification: `accuracy`, `f1` (macro over classes), `count`.
  """
  if task_of(examples) != finetuned.task:
    raise UserError(f"the model was fine-tuned for {finetuned.task}, not {task_of(examples)}.")
  _check_language_id(finetuned.config, language_id)
  features = finetuned.featurizer.featurize(
      examples, label_index=_label_index(finetuned.label_set), transliterate=transliterate)
  predicted = _predict_all(finetuned, features.tokens, language_id, batch_size)
  n = len(examples)
  scored = features.weights > 0
  gold, guess = features.labels[scored], predicted[scored]
  result = {"accuracy": float(np.mean(gold == guess)) if gold.size else 0.0,
            "f1": macro_f1(gold, guess), "count": int(gold.size)}
  if finetuned.task == "tagging":
    result["words_dropped"] = features.words_dropped
    if is_bio(finetuned.label_set):
      names = np.asarray(finetuned.label_set)
      spans = span_f1([names[features.labels[i][scored[i]]] for i in range(n)],
                      [names[predicted[i][scored[i]]] for i in range(n)])
      result.update({f"entity_{k}": v for k, v in spans.items()})
  return result


def _predict_all(finetuned: FinetunedModel, tokens: np.ndarray, language_id: int,
                 batch_size: int) -> np.ndarray:
  """Predictions for tokens [n, length]: [n, length] tags or [n] classes.

  Rows go through in order of length, each batch cut to `bucket_length` of
  its longest row (padding never changes a row's result), so short rows
  cost little; the last batch is filled with empty rows to keep its shape.
  """
  predict = _predict_function(finetuned.config, finetuned.head)
  n, cap = tokens.shape
  lengths = (tokens != PAD_ID).sum(axis=1)
  order = np.argsort(lengths, kind="stable")
  lang = np.int32(language_id)
  outputs = []
  for first in range(0, n, batch_size):
    rows = order[first:first + batch_size]
    batch = np.zeros((batch_size, bucket_length(lengths[rows].max(), cap)), np.int32)
    batch[:len(rows)] = tokens[rows, :batch.shape[1]]
    outputs.append((rows, predict(finetuned.params, batch, lang)))
  predicted = np.zeros((n, cap) if finetuned.task == "tagging" else (n,), np.int32)
  for rows, out in jax.device_get(outputs):
    if out.ndim == 2:
      predicted[rows, :out.shape[1]] = out[:len(rows)]
    else:
      predicted[rows] = out[:len(rows)]
  return predicted


def default_metric(task: str, label_set: Sequence[str]) -> str:
  """The paper's headline metric: entity F1 for NER, accuracy for POS and sentences."""
  return "entity_f1" if task == "tagging" and is_bio(label_set) else "accuracy"


# ------------------------------------------------------------------ SUP / ZS / Δ


def _language_id(config: EncoderConfig, languages: Sequence[str] | None,
                 lang: str | int | None, role: str) -> int:
  if not config.num_languages:
    return 1  # No language embeddings: the encoder ignores lang_ids.
  if isinstance(lang, int):
    return lang
  if lang is None or languages is None or lang not in languages:
    raise UserError(f"the model has language embeddings: give {role} as one of its languages "
                    f"{list(languages or [])} (or as an id).")
  return list(languages).index(lang) + 1


def zero_shot_transfer(model: str | tuple, vocabulary: Any, *, task_name: str,
                       train: Sequence[TaggedSentence | LabelledSentence],
                       test: Sequence[TaggedSentence | LabelledSentence], language: Any,
                       natural_lang: str | int | None = None,
                       derived_lang: str | int | None = None, steps: int | None = None,
                       epochs: float | None = None, batch_size: int = 32,
                       learning_rate: float = 1e-3, warmup_ratio: float = 0.1,
                       weight_decay: float = 0.01, max_length: int = 128, seed: int = 0,
                       group_by_length: bool = False,
                       label_set: Sequence[str] | None = None, metric: str | None = None,
                       eval_batch_size: int = 64, log: Log = print) -> dict[str, Any]:
  """SUP, ZS and Δ = SUP − ZS of one pretrained model on one task.

  Two fine-tunings with the same seed (same head init and batch order):
  natural train -> scored on the natural test ("natural") and on the derived
  test ("zs"); derived train -> scored on the derived test ("sup"). Derived
  data is `transfer_data.derive(...)` plus `language.transliterate_ids` on
  the subword ids when the language transliterates.

  Args:
    model: a MODEL_DIR, or `(model, params, meta)` / `load_model`'s 4-tuple;
      `meta` may be None for a model without language embeddings.
    vocabulary: the natural-language vocabulary of the model.
    task_name: a name for the report.
    train, test: natural-language examples (tagging or classification).
    language: the derived language (`data.synthetic.SyntheticLanguage`).
    natural_lang, derived_lang: codes in meta["languages"] (or ids); needed
      only when the model has language embeddings.
    steps, epochs, batch_size, learning_rate, warmup_ratio, weight_decay,
      max_length, seed, group_by_length: as in `finetune`.
    label_set: by default the sorted labels of train and test (natural and
      derived).
    metric: key of `evaluate`'s result to report; see `default_metric`.
    eval_batch_size: rows per prediction batch.
    log: progress lines (None: silent).

  Returns:
    {"task", "language", "metric", "sup", "zs", "delta", "natural",
     "scores": {"sup"|"zs"|"natural": evaluate's dict}, "steps", "seconds"}.
  """
  start = time.perf_counter()
  if isinstance(model, str):
    from flax_xalign.evaluation.mlm_eval import load_model  # Orbax only when needed.
    model = load_model(model)
  network, params, meta = model[:3]
  config = _encoder_config(network)
  languages = (meta or {}).get("languages")
  natural_id = _language_id(config, languages, natural_lang, "natural_lang")
  derived_id = _language_id(config, languages, derived_lang, "derived_lang")
  transliterate = language.transliterate_ids if language.transliterates else None
  if transliterate is not None and language.derived_vocab_size > (config.vocab_size or 0):
    raise UserError(f"{language.name} needs {language.derived_vocab_size} token ids but the model "
                    f"has {config.vocab_size}; use a model pretrained on this language pair.")
  task = task_of(train)
  derived_train, derived_test = derive(train, language), derive(test, language)
  # Derived BIO tags are repaired after reordering, so take labels from both.
  label_set = tuple(label_set or label_set_of(train, test, derived_train, derived_test))
  metric = metric or default_metric(task, label_set)
  featurizer = Featurizer(vocabulary, max_length=max_length)
  common = dict(task=task, label_set=label_set, steps=steps, epochs=epochs,
                batch_size=batch_size, learning_rate=learning_rate, warmup_ratio=warmup_ratio,
                weight_decay=weight_decay, seed=seed, group_by_length=group_by_length, log=log)

  natural = finetune(network, params, featurizer, train, language_id=natural_id,
                     name=f"{task_name} natural", **common)
  scores = {
      "natural": evaluate(natural, test, language_id=natural_id, batch_size=eval_batch_size),
      "zs": evaluate(natural, derived_test, language_id=derived_id, transliterate=transliterate,
                     batch_size=eval_batch_size)}
  del natural
  derived = finetune(network, params, featurizer, derived_train, language_id=derived_id,
                     transliterate=transliterate, name=f"{task_name} {language.name}", **common)
  scores["sup"] = evaluate(derived, derived_test, language_id=derived_id,
                           transliterate=transliterate, batch_size=eval_batch_size)
  sup, zs = scores["sup"][metric], scores["zs"][metric]
  return {"task": task_name, "language": language.name, "metric": metric, "sup": sup, "zs": zs,
          "delta": sup - zs, "natural": scores["natural"][metric], "scores": scores,
          "steps": len(derived.history["loss"]), "seconds": time.perf_counter() - start}
