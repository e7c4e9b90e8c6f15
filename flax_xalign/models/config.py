"""`EncoderConfig`: the sizes and numerics of the encoder, plus named presets.

The config is a frozen dataclass so it can be hashed into jit caches and bound
from gin by the commands (the gin edge, `cli/configurables.py`, registers it as `EncoderConfig`); this
module itself knows nothing of gin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from flax_xalign.errors import SettingError

_DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots")
POSITION_INITS = ("normal", "sinusoidal")
ATTENTION_IMPLEMENTATIONS = ("einsum", "xla", "cudnn")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EncoderConfig:
  """Hyperparameters of an XLM-R/BERT-style Transformer encoder.

  Attributes:
    vocab_size: rows of the token embedding (tied with the MLM output). Usually
      left None in presets and filled in by the trainer from the vocabulary;
      the encoder refuses to build while it is None.
    vocab_pad_multiple: the token embedding (and the MLM logits and output
      bias) get `padded_vocab_size` = vocab_size rounded up to a multiple of
      this many rows, so the `vocab` axis divides the 'model' mesh axis and is
      sharded instead of replicated (XLM-R's 250,002 ids: 128 gives 250,112).
      The padded rows are inert: zero at init, never looked up by a real id,
      their logits masked out of every softmax and argmax. 1 (no padding)
      keeps every existing checkpoint loadable.
    num_layers: number of Transformer layers.
    embed_dim: width of the residual stream (`embed`).
    num_heads: attention heads (`heads`).
    head_dim: width of one head (`kv`); need not equal embed_dim / num_heads.
    mlp_dim: hidden width of the feed-forward block (`mlp`).
    max_positions: rows of the learned absolute position table. Position p
      reads row p + position_offset, so positions must lie in
      [0, num_positions) with num_positions = max_positions - position_offset.
      514 matches XLM-R's table.
    position_offset: the row that position 0 reads. 0 for our models and
      BERT; 2 for XLM-R/RoBERTa, whose position ids start at padding_idx + 1
      (fairseq's convention, padding_idx = 1), so rows 0 and 1 are never read
      by a real token. Positions beyond the table gather NaN (see
      `Embedding`), never a clipped row.
    num_token_types: rows of BERT's token-type ("segment") embedding table; 0
      (our models) creates none. With a table, row 0 is added to every token:
      our layouts mark the sides of a pair with `pair_side` and language
      embeddings, never with segment-B types, so rows >= 1 are carried (for
      import and export) but never read.
    num_languages: languages with a learned language embedding (XLM-style);
      0 disables them. The table has num_languages + 1 rows because language
      id 0 marks padding.
    dropout_rate: dropout on the embeddings and on each sublayer output.
    attention_dropout_rate: dropout on attention probabilities.
    pre_layer_norm: False for post-LN (BERT/XLM-R: LayerNorm after each
      residual add, and on the embeddings); True for pre-LN (LayerNorm before
      each sublayer and a final LayerNorm, no embedding LayerNorm).
    layer_norm_epsilon: epsilon of every LayerNorm.
    position_init: how the learned position table starts: "normal" (BERT and
      XLM-R) or "sinusoidal" (the Transformer's sin/cos table scaled to
      initializer_std; still trained). Sinusoids make relative offsets a
      linear map from the start, which shortens the early plateau where a
      small model predicts unigram frequencies (see README, demo).
    initializer_std: standard deviation of the normal init of kernels and
      embedding tables.
    dtype: compute dtype of matmuls and the residual stream ("float32", or
      "bfloat16" on accelerators). LayerNorm, softmax and logits stay float32.
    param_dtype: storage dtype of parameters.
    scan_layers: stack the layers under one `layers` module with a leading
      `layers` axis and run them with `nn.scan`, so compile time does not grow
      with depth.
    remat_policy: rematerialisation of each layer in the backward pass:
      "none" (keep all activations), "full" (recompute everything), "dots"
      (keep only weight matmul outputs, recompute attention and elementwise).
    attention_implementation: how scores, softmax and context are computed:
      "einsum" (explicit einsums, the [b, h, l, l] probabilities materialised;
      the only one with attention dropout), "xla" or "cudnn"
      (`jax.nn.dot_product_attention`; "cudnn" is the fused flash-attention
      kernel of NVIDIA GPUs and needs a bfloat16/float16 dtype). The three
      compute the same function; the fused ones need attention_dropout_rate 0.
    pointer_head: add the query/key projections of XLM-Align's denoising
      word alignment pointer network (`Encoder.pointer_projections`); set by
      the trainer when the `dwa` objective is used.
  """

  vocab_size: int | None = None
  vocab_pad_multiple: int = 1
  num_layers: int
  embed_dim: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  max_positions: int = 514
  num_languages: int = 0
  num_token_types: int = 0
  position_offset: int = 0
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  pre_layer_norm: bool = False
  layer_norm_epsilon: float = 1e-5
  initializer_std: float = 0.02
  position_init: str = "normal"
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = True
  remat_policy: str = "none"
  attention_implementation: str = "einsum"
  pointer_head: bool = False

  def __post_init__(self):
    if self.vocab_size is not None:
      _check_positive_int("vocab_size", self.vocab_size)
    for name in ("vocab_pad_multiple", "num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim",
                 "max_positions"):
      _check_positive_int(name, getattr(self, name))
    if not isinstance(self.num_languages, int) or self.num_languages < 0:
      raise SettingError(
          f"EncoderConfig.num_languages must be an int >= 0 (0 disables "
          f"language embeddings), got {self.num_languages!r}.")
    if (isinstance(self.num_token_types, bool)
        or not isinstance(self.num_token_types, int)
        or self.num_token_types < 0):
      raise SettingError(
          f"EncoderConfig.num_token_types must be an int >= 0 (0: no token-type "
          f"table), got {self.num_token_types!r}.")
    if (isinstance(self.position_offset, bool)
        or not isinstance(self.position_offset, int)
        or not 0 <= self.position_offset < self.max_positions):
      raise SettingError(
          f"EncoderConfig.position_offset must be an int in [0, max_positions="
          f"{self.max_positions}), got {self.position_offset!r}.")
    for name in ("dropout_rate", "attention_dropout_rate"):
      rate = getattr(self, name)
      if not 0.0 <= rate < 1.0:
        raise SettingError(
            f"EncoderConfig.{name} must be in [0, 1), got {rate!r}.")
    for name in ("layer_norm_epsilon", "initializer_std"):
      if not getattr(self, name) > 0:
        raise SettingError(
            f"EncoderConfig.{name} must be > 0, got {getattr(self, name)!r}.")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise SettingError(
            f"EncoderConfig.{name} must be one of {_DTYPES}, got "
            f"{getattr(self, name)!r}.")
    if self.position_init not in POSITION_INITS:
      raise SettingError(
          f"EncoderConfig.position_init must be one of {POSITION_INITS}, got "
          f"{self.position_init!r}.")
    if self.remat_policy not in REMAT_POLICIES:
      raise SettingError(
          f"EncoderConfig.remat_policy must be one of {REMAT_POLICIES}, got "
          f"{self.remat_policy!r}.")
    if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
      raise SettingError(
          f"EncoderConfig.attention_implementation must be one of "
          f"{ATTENTION_IMPLEMENTATIONS}, got {self.attention_implementation!r}.")
    if self.attention_implementation != "einsum" and self.attention_dropout_rate:
      raise SettingError(
          f"EncoderConfig.attention_implementation={self.attention_implementation!r} "
          f"has no attention dropout, but attention_dropout_rate is "
          f"{self.attention_dropout_rate}; set EncoderConfig.attention_dropout_rate = 0.0 "
          f"or use attention_implementation='einsum'.")
    if self.attention_implementation == "cudnn" and self.dtype not in ("bfloat16", "float16"):
      raise SettingError(
          f"EncoderConfig.attention_implementation='cudnn' runs in bfloat16 or "
          f"float16, but dtype is {self.dtype!r}; set EncoderConfig.dtype = "
          f"'bfloat16' or use attention_implementation='xla'.")

  def replace(self, **changes: Any) -> EncoderConfig:
    """Returns a copy with `changes` applied (and validated again)."""
    return dataclasses.replace(self, **changes)

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def params_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)

  @property
  def padded_vocab_size(self) -> int | None:
    """Rows of the token embedding and width of the MLM logits: vocab_size
    rounded up to a multiple of vocab_pad_multiple (None while vocab_size is)."""
    if self.vocab_size is None:
      return None
    return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

  @property
  def num_positions(self) -> int:
    """Positions the model can read: [0, max_positions - position_offset)."""
    return self.max_positions - self.position_offset

  @property
  def attention_dim(self) -> int:
    """Total width of the attention projections, heads * head_dim."""
    return self.num_heads * self.head_dim


def _check_positive_int(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise SettingError(
        f"EncoderConfig.{name} must be a positive int, got {value!r}.")


# Size presets. vocab_size stays None: the trainer takes it from the vocabulary.
# `small` mirrors the HF XLMRobertaForMaskedLM config used by the benchmark.
TINY = EncoderConfig(num_layers=4, embed_dim=128, num_heads=4, head_dim=32,
                     mlp_dim=512)
SMALL = EncoderConfig(num_layers=6, embed_dim=512, num_heads=8, head_dim=64,
                      mlp_dim=2048)
BASE = EncoderConfig(num_layers=12, embed_dim=768, num_heads=12, head_dim=64,
                     mlp_dim=3072)
LARGE = EncoderConfig(num_layers=24, embed_dim=1024, num_heads=16, head_dim=64,
                      mlp_dim=4096)

PRESETS: dict[str, EncoderConfig] = {
    "tiny": TINY,
    "small": SMALL,
    "base": BASE,
    "large": LARGE,
}


def tiny(**overrides: Any) -> EncoderConfig:
  """4 layers, embed 128, 4 heads x 32, mlp 512 (the CPU demo)."""
  return TINY.replace(**overrides)


def small(**overrides: Any) -> EncoderConfig:
  """6 layers, embed 512, 8 heads x 64, mlp 2048."""
  return SMALL.replace(**overrides)


def base(**overrides: Any) -> EncoderConfig:
  """XLM-R base: 12 layers, embed 768, 12 heads x 64, mlp 3072."""
  return BASE.replace(**overrides)


def large(**overrides: Any) -> EncoderConfig:
  """XLM-R large: 24 layers, embed 1024, 16 heads x 64, mlp 4096."""
  return LARGE.replace(**overrides)


def preset(name: str, **overrides: Any) -> EncoderConfig:
  """Returns the named preset with `overrides` applied.

  Raises:
    SettingError (a ValueError): if `name` is not one of PRESETS.
  """
  if name not in PRESETS:
    raise SettingError(
        f"Unknown encoder size {name!r}; choose one of {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)


# Fields that define the network a warm start must reproduce (vocab_size comes
# from the vocabulary; dropout, dtypes, scan and remat are free to change).
ARCHITECTURE_FIELDS = ("num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim", "max_positions",
                       "num_languages", "num_token_types", "position_offset", "pre_layer_norm",
                       "layer_norm_epsilon")
MODEL_GIN_FILE = "model.gin"


def architecture_gin(config: EncoderConfig) -> str:
  """`config`'s architecture as gin bindings (an imported MODEL_DIR's model.gin)."""
  lines = ["# The architecture of this model: include it in runs that warm-start from it",
           "# (--gin_file=<this dir>/model.gin --gin.INIT_FROM_CHECKPOINT=\"<this dir>\")."]
  lines += [f"EncoderConfig.{name} = {getattr(config, name)!r}" for name in ARCHITECTURE_FIELDS]
  if config.vocab_pad_multiple != 1:  # Not architecture, but the checkpoint's embedding rows follow it.
    lines.append(f"EncoderConfig.vocab_pad_multiple = {config.vocab_pad_multiple!r}")
  return "\n".join(lines) + "\n"
