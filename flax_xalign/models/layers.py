"""The building blocks of the encoder: embeddings, attention, MLP, the layer, the MLM head.

Pure Flax linen modules and the initialisers they use; every parameter is
created with logical axis names (`nn.with_logical_partitioning`) and
activations are constrained at block boundaries (`models.axes`). The
`Encoder` (`models/encoder.py`) stacks them; its docstring has the parameter
tree.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from flax_xalign.models import axes
from flax_xalign.models.config import EncoderConfig

Array = jax.Array
# Large but finite, so a query whose keys are all masked (a padding row) gets a
# uniform, finite distribution instead of the NaN that -inf would give.
_MASK_VALUE = -1e9
# The logit of a padded vocabulary id: exp(PADDED_LOGIT - max) is exactly 0 in
# float32, so a softmax over the padded width equals the one over the real ids.
PADDED_LOGIT = -1e9


def _init(init_fn: Any, names: tuple[str, ...]) -> Any:
  return nn.with_logical_partitioning(init_fn, names)


def _kernel_init(config: EncoderConfig, names: tuple[str, ...]) -> Any:
  return _init(nn.initializers.normal(stddev=config.initializer_std), names)


class Projection(nn.Module):
  """A dense map from the trailing `len(in_axes)` input axes to `features`.

  The kernel is created directly in its n-d shape [*in, *features]. (flax's
  DenseGeneral initialises a flat 2-d kernel and reshapes it, and the reshape
  re-applies the n-d logical constraint to the flat array, which fails as soon
  as a mesh is in context.)
  """

  config: EncoderConfig
  features: tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...]

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    contract = len(self.kernel_axes) - len(self.features)
    kernel = self.param("kernel", _kernel_init(cfg, self.kernel_axes),
                        (*x.shape[x.ndim - contract:], *self.features),
                        cfg.params_dtype)
    bias = self.param("bias", _init(nn.initializers.zeros_init(), self.bias_axes),
                      self.features, cfg.params_dtype)
    y = jnp.tensordot(x.astype(cfg.compute_dtype),
                      kernel.astype(cfg.compute_dtype), axes=contract)
    return y + bias.astype(cfg.compute_dtype)


def _dense(config: EncoderConfig, features: int | tuple[int, ...], *,
           axis: int | tuple[int, ...], kernel_axes: tuple[str, ...],
           bias_axes: tuple[str, ...], name: str) -> Projection:
  features = (features,) if isinstance(features, int) else tuple(features)
  contract = 1 if isinstance(axis, int) else len(axis)
  if len(kernel_axes) != contract + len(features):
    raise ValueError(f"kernel_axes {kernel_axes} do not match {contract} input "
                     f"and {len(features)} output axes")
  return Projection(config=config, features=features, kernel_axes=kernel_axes,
                    bias_axes=bias_axes, name=name)


def _layer_norm(config: EncoderConfig, name: str,
                axis_name: str = axes.EMBED) -> nn.LayerNorm:
  # dtype=float32: statistics and output in f32 even under bf16 compute.
  return nn.LayerNorm(
      epsilon=config.layer_norm_epsilon,
      dtype=jnp.float32,
      param_dtype=config.params_dtype,
      scale_init=_init(nn.initializers.ones_init(), (axis_name,)),
      bias_init=_init(nn.initializers.zeros_init(), (axis_name,)),
      name=name)


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


def attention_mask(segment_ids: Array) -> Array:
  """Boolean mask [batch, 1, length, length] from segment ids [batch, length].

  A query may attend to a key iff both carry the same segment id and the key's
  id is nonzero (0 marks padding). Padding queries therefore see no key.
  """
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  real_key = (segment_ids != 0)[:, None, :]
  return (same & real_key)[:, None, :, :]


def sinusoidal_init(std: float) -> Any:
  """Initialiser of a [positions, embed] table with sin/cos columns.

  Column pairs (2i, 2i+1) hold sin/cos(p / 10000^(2i/embed)), as in Vaswani et
  al. 2017, scaled so the entries have standard deviation `std`.
  """

  def init(key: Array, shape: tuple[int, int], dtype: Any = jnp.float32) -> Array:
    del key
    rows, dim = shape
    positions = jnp.arange(rows, dtype=jnp.float32)[:, None]
    freqs = jnp.exp(-jnp.log(10000.0) * jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = positions * freqs[None, :]
    table = jnp.zeros((rows, dim), jnp.float32)
    table = table.at[:, 0::2].set(jnp.sin(angles))
    table = table.at[:, 1::2].set(jnp.cos(angles[:, : dim // 2]))
    return (table * std * jnp.sqrt(2.0)).astype(dtype)

  return init


def zero_padded_init(init_fn: Any, real_rows: int) -> Any:
  """`init_fn` over the first `real_rows` rows of a [rows, ...] table, zeros below.

  The real rows get exactly the values `init_fn` gives an unpadded table of
  `real_rows` rows with the same key, so padding the vocabulary changes no
  real parameter of a fresh model.
  """

  def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    real = init_fn(key, (real_rows, *shape[1:]), dtype)
    return jnp.pad(real, [(0, shape[0] - real_rows)] + [(0, 0)] * (len(shape) - 1))

  return init


class Embedding(nn.Module):
  """A learned table [num_rows, embed] looked up by integer ids.

  With `real_rows` < num_rows the rows from real_rows on are padding (see the
  module docstring): zero at init and out of range for lookups.
  """

  config: EncoderConfig
  num_rows: int
  row_axis: str
  sinusoidal: bool = False
  real_rows: int | None = None

  def setup(self):
    cfg = self.config
    if self.sinusoidal:
      init_fn = sinusoidal_init(cfg.initializer_std)
    else:
      init_fn = nn.initializers.normal(stddev=cfg.initializer_std)
    if self._padded:
      init_fn = zero_padded_init(init_fn, self.real_rows)
    self.embedding = self.param(
        "embedding", _init(init_fn, (self.row_axis, axes.EMBED)), (self.num_rows, cfg.embed_dim),
        cfg.params_dtype)

  @property
  def _padded(self) -> bool:
    return self.real_rows is not None and self.real_rows < self.num_rows

  def __call__(self, ids: Array) -> Array:
    """ids [...] int -> [..., embed] in config.dtype.

    Out-of-range ids (padding rows included) gather NaN (jnp.take's fill
    mode) so they show up in the loss instead of silently reading a clipped
    or padded row.
    """
    if self._padded:
      ids = jnp.where(ids < self.real_rows, ids, self.num_rows)
    return jnp.take(self.embedding, ids, axis=0).astype(self.config.dtype)

  def table(self) -> Array:
    return self.embedding


class SelfAttention(nn.Module):
  """Multi-head self-attention; scores and softmax in float32."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    """x [b, l, e], mask [b, 1, l, l] bool -> [b, l, e]."""
    cfg = self.config
    project = functools.partial(
        _dense, cfg, (cfg.num_heads, cfg.head_dim), axis=-1,
        kernel_axes=(axes.EMBED, axes.HEADS, axes.KV),
        bias_axes=(axes.HEADS, axes.KV))
    head_names = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)
    query = _constrain(project(name="query")(x), head_names)
    key = _constrain(project(name="key")(x), head_names)
    value = _constrain(project(name="value")(x), head_names)
    implementation = cfg.attention_implementation
    if implementation == "cudnn" and jax.default_backend() != "gpu":
      # A run trained with cuDNN attention, read on a CPU/TPU host (eval,
      # align, export): the same function through XLA. Training refuses
      # "cudnn" off a GPU (training/pretrain.resolve_encoder_config).
      implementation = "xla"
    if implementation != "einsum":
      # The fused kernels take the boolean mask as is (cuDNN turns it into a
      # large negative bias, as _MASK_VALUE does below) and never write the
      # [b, h, l, l] probabilities to memory.
      context = jax.nn.dot_product_attention(
          query, key, value, mask=mask, scale=cfg.head_dim**-0.5,
          implementation=implementation)
    else:
      # Scaling the [b, l, h, d] queries is cheaper than scaling [b, h, l, l].
      query = query * jnp.asarray(cfg.head_dim**-0.5, query.dtype)
      # An explicit einsum (rather than jax.nn.dot_product_attention) because we
      # need dropout on the probabilities; XLA fuses it well on CPU/TPU.
      scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                          preferred_element_type=jnp.float32)
      scores = jnp.where(mask, scores, _MASK_VALUE)
      probs = jax.nn.softmax(scores, axis=-1)
      probs = nn.Dropout(rate=cfg.attention_dropout_rate)(
          probs, deterministic=deterministic)
      context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(cfg.dtype), value)
    context = _constrain(context, head_names)
    return _dense(cfg, cfg.embed_dim, axis=(-2, -1),
                  kernel_axes=(axes.HEADS, axes.KV, axes.EMBED),
                  bias_axes=(axes.EMBED,), name="out")(context)


class Mlp(nn.Module):
  """Position-wise feed-forward block with exact (erf) GELU, as in XLM-R."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x [b, l, e] -> [b, l, e]."""
    cfg = self.config
    h = _dense(cfg, cfg.mlp_dim, axis=-1, kernel_axes=(axes.EMBED, axes.MLP),
               bias_axes=(axes.MLP,), name="wi")(x)
    h = nn.gelu(h, approximate=False)
    h = _constrain(h, (axes.BATCH, axes.LENGTH, axes.MLP))
    return _dense(cfg, cfg.embed_dim, axis=-1,
                  kernel_axes=(axes.MLP, axes.EMBED), bias_axes=(axes.EMBED,),
                  name="wo")(h)


class EncoderLayer(nn.Module):
  """One Transformer layer; signature shaped for `nn.scan` (carry, ys)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool,
               collect_hidden: bool) -> tuple[Array, Array | None]:
    """x [b, l, e] -> (x' [b, l, e], x' if collect_hidden else None)."""
    cfg = self.config
    dropout = nn.Dropout(rate=cfg.dropout_rate)
    attention = SelfAttention(cfg, name="attention")
    mlp = Mlp(cfg, name="mlp")
    attention_norm = _layer_norm(cfg, "attention_norm")
    mlp_norm = _layer_norm(cfg, "mlp_norm")
    if cfg.pre_layer_norm:
      h = attention(attention_norm(x).astype(cfg.dtype), mask, deterministic)
      x = x + dropout(h, deterministic=deterministic)
      h = mlp(mlp_norm(x).astype(cfg.dtype))
      x = x + dropout(h, deterministic=deterministic)
    else:
      h = attention(x, mask, deterministic)
      x = attention_norm(x + dropout(h, deterministic=deterministic))
      x = x.astype(cfg.dtype)
      h = mlp(x)
      x = mlp_norm(x + dropout(h, deterministic=deterministic))
      x = x.astype(cfg.dtype)
    x = _constrain(x, (axes.BATCH, axes.LENGTH, axes.EMBED))
    return x, (x if collect_hidden else None)


class MlmHead(nn.Module):
  """dense + GELU + LayerNorm, then the tied embedding and an output bias."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, hidden: Array, embedding: Array) -> Array:
    """hidden [b, p, e], embedding [vocab, e] -> logits [b, p, vocab] f32.

    vocab = config.padded_vocab_size; the logits of ids >= config.vocab_size
    are PADDED_LOGIT (a constant: no gradient reaches their rows or bias).
    """
    cfg = self.config
    h = _dense(cfg, cfg.embed_dim, axis=-1,
               kernel_axes=(axes.EMBED, axes.EMBED_OUT),
               bias_axes=(axes.EMBED_OUT,), name="transform")(
                   hidden.astype(cfg.dtype))
    h = nn.gelu(h, approximate=False)
    h = _layer_norm(cfg, "norm", axes.EMBED_OUT)(h)
    # bf16 operands with f32 accumulation: the vocab matmul is the largest one.
    logits = jnp.einsum("bpe,ve->bpv", h.astype(cfg.dtype),
                        embedding.astype(cfg.dtype),
                        preferred_element_type=jnp.float32)
    bias = self.param("output_bias",
                      _init(nn.initializers.zeros_init(), (axes.VOCAB,)),
                      (embedding.shape[0],), cfg.params_dtype)
    logits = logits + bias.astype(jnp.float32)
    if cfg.vocab_size < embedding.shape[0]:
      real = jnp.arange(embedding.shape[0]) < cfg.vocab_size
      logits = jnp.where(real, logits, PADDED_LOGIT)
    return _constrain(logits, (axes.BATCH, axes.LENGTH, axes.VOCAB))


def _layer_class(config: EncoderConfig) -> type[nn.Module]:
  if config.remat_policy == "none":
    return EncoderLayer
  policy = (None if config.remat_policy == "full" else
            jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  # static_argnums count `self` as 0: (deterministic, collect_hidden).
  return nn.remat(EncoderLayer, policy=policy,
                  prevent_cse=not config.scan_layers, static_argnums=(3, 4))
