"""XLM-R/BERT-style Transformer encoder in Flax linen.

Token embeddings (tied with the MLM output), optional BERT token-type
embeddings (row 0 added to every token), learned absolute positions (position
p reads row p + config.position_offset: 2 for XLM-R, 0 otherwise), optional
XLM language embeddings, then `num_layers` post-LN (default) or pre-LN
layers. Attention stays inside a packed segment: a query attends only to keys
with its own nonzero `segment_ids`.

Every parameter is created with logical axis names
(`nn.with_logical_partitioning`), so `nn.get_partition_spec` works on the
initialised variables, and activations carry `nn.with_logical_constraint` at
block boundaries. Parameters are stored in
`config.param_dtype`; matmuls run in `config.dtype`; LayerNorm, softmax and the
MLM logits are float32.

Parameter tree (`variables["params"]`):

  token_embed/embedding       [vocab, embed]       vocab = config.padded_vocab_size rows
  type_embed/embedding        [types, embed]       only if num_token_types > 0
  position_embed/embedding    [positions, embed]
  language_embed/embedding    [languages, embed]   only if num_languages > 0
  embed_norm/{scale,bias}     [embed]              post-LN only
  layers/...                  leading [layers] axis if scan_layers, else
  layers_0/... layers_{n-1}/  one subtree per layer; each layer holds
      attention/{query,key,value}/{kernel [embed,heads,kv], bias [heads,kv]}
      attention/out/{kernel [heads,kv,embed], bias [embed]}
      attention_norm/{scale,bias}, mlp/wi/{kernel [embed,mlp], bias [mlp]},
      mlp/wo/{kernel [mlp,embed], bias [embed]}, mlp_norm/{scale,bias}
  final_norm/{scale,bias}     [embed]              pre-LN only
  mlm_head/transform/{kernel [embed,embed_out], bias [embed_out]}
  mlm_head/norm/{scale,bias}  [embed_out]
  mlm_head/output_bias        [vocab]              padded like the token embedding
  pointer_query/{kernel [embed,embed_out], bias [embed_out]}  pointer_head only
  pointer_key/{kernel [embed,embed_out], bias [embed_out]}    pointer_head only

Padded vocabulary (`config.vocab_pad_multiple` > 1): the token table has
`padded_vocab_size` rows so the `vocab` axis divides the 'model' mesh axis.
Rows past `vocab_size` start at zero, ids there gather NaN like any other
out-of-range id, and their MLM logits are masked to `PADDED_LOGIT`, so they
never win an argmax, carry no softmax mass and get no gradient. Code that
reads the table directly takes `token_embedding_table(params, config)`, the
real rows only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.models import axes
from flax_xalign.models.config import EncoderConfig

Array = jax.Array
# Large but finite, so a query whose keys are all masked (a padding row) gets a
# uniform, finite distribution instead of the NaN that -inf would give.
_MASK_VALUE = -1e9
# The logit of a padded vocabulary id: exp(PADDED_LOGIT - max) is exactly 0 in
# float32, so a softmax over the padded width equals the one over the real ids.
PADDED_LOGIT = -1e9


class EncoderOutput(NamedTuple):
  """What `Encoder.__call__` returns.

  Attributes:
    hidden: [batch, length, embed] final hidden states, in config.dtype.
    all_hidden: with return_all_hidden, a tuple of num_layers + 1 arrays
      [batch, length, embed]: the embedding output, then each layer's output;
      the last entry is always `hidden` (after the final LayerNorm for pre-LN).
      None otherwise.
  """

  hidden: Array
  all_hidden: tuple[Array, ...] | None


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
    # Scaling the [b, l, h, d] queries is cheaper than scaling [b, h, l, l].
    query = query * jnp.asarray(cfg.head_dim**-0.5, query.dtype)
    # An explicit einsum (rather than jax.nn.dot_product_attention) because we
    # need dropout on the probabilities; XLA fuses it well on CPU/TPU/GPU.
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


class Encoder(nn.Module):
  """The encoder network; see the module docstring for the parameter tree.

  Attributes:
    config: sizes and numerics; `config.vocab_size` must be set.
  """

  config: EncoderConfig

  def setup(self):
    cfg = self.config
    if cfg.vocab_size is None:
      raise ValueError(
          "EncoderConfig.vocab_size is None; set it from the vocabulary, e.g. "
          "config.replace(vocab_size=vocabulary.vocab_size), before building "
          "the Encoder.")
    self.token_embed = Embedding(cfg, cfg.padded_vocab_size, axes.VOCAB, real_rows=cfg.vocab_size)
    # XLM's language embeddings are BERT's token-type table put to another
    # use, so the (tiny, replicated) rows share the `languages` axis name.
    self.type_embed = (
        Embedding(cfg, cfg.num_token_types, axes.LANGUAGES)
        if cfg.num_token_types else None)
    self.position_embed = Embedding(cfg, cfg.max_positions, axes.POSITIONS,
                                    sinusoidal=cfg.position_init == "sinusoidal")
    self.language_embed = (
        Embedding(cfg, cfg.num_languages + 1, axes.LANGUAGES)
        if cfg.num_languages else None)
    if cfg.pre_layer_norm:
      self.final_norm = _layer_norm(cfg, "final_norm")
    else:
      self.embed_norm = _layer_norm(cfg, "embed_norm")
    self.embed_dropout = nn.Dropout(rate=cfg.dropout_rate)
    layer = _layer_class(cfg)
    if cfg.scan_layers:
      self.layers = nn.scan(
          layer,
          variable_axes={"params": 0},
          split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_layers,
          metadata_params={nn.PARTITION_NAME: axes.LAYERS})(cfg)
    else:
      self.layers = [layer(cfg) for _ in range(cfg.num_layers)]
    self.mlm_head = MlmHead(cfg)
    if cfg.pointer_head:
      self.pointer_query, self.pointer_key = (
          _dense(cfg, cfg.embed_dim, axis=-1,
                 kernel_axes=(axes.EMBED, axes.EMBED_OUT),
                 bias_axes=(axes.EMBED_OUT,), name=name)
          for name in ("pointer_query", "pointer_key"))

  def __call__(self, tokens: Array, *, lang_ids: Array | None,
               positions: Array, segment_ids: Array, deterministic: bool,
               return_all_hidden: bool = False,
               input_embeddings: Array | None = None,
               up_to_layer: int | None = None) -> EncoderOutput:
    """Encodes a batch.

    Args:
      tokens: [batch, length] int token ids; 0 is padding.
      lang_ids: [batch, length] int language ids (0 on padding, 1..n); read only
        when config.num_languages > 0, may be None otherwise.
      positions: [batch, length] int positions within each example, in
        [0, config.num_positions).
      segment_ids: [batch, length] int packed-example ids, 0 on padding.
      deterministic: False enables dropout (needs a "dropout" rng).
      return_all_hidden: also return every layer's output.
      input_embeddings: optional [batch, length, embed] that replaces the token
        embedding lookup (e.g. the weighted embeddings of SCS code-switching);
        positions and language embeddings are still added.
      up_to_layer: run only layers 1..up_to_layer (0: the embeddings alone)
        and stop there, e.g. for DWA's no-grad self-labelling at layer l <
        num_layers. `hidden` is then the full pass's `all_hidden[up_to_layer]`
        (for pre-LN, the final LayerNorm only comes with the last layer) and
        `all_hidden` has up_to_layer + 1 entries. None runs every layer.
        Ignored by `init`, which always creates every layer.

    Returns:
      EncoderOutput(hidden [batch, length, embed], all_hidden or None).
    """
    cfg = self.config
    depth = cfg.num_layers if up_to_layer is None or self.is_initializing() else up_to_layer
    if not 0 <= depth <= cfg.num_layers:
      raise ValueError(f"up_to_layer={up_to_layer} is outside 0..{cfg.num_layers} for this encoder.")
    if input_embeddings is None:
      x = self.token_embed(tokens)
    else:
      x = input_embeddings.astype(cfg.dtype)
    if self.type_embed is not None:
      # Every token is of type 0 (see EncoderConfig.num_token_types).
      x = x + self.type_embed.table()[0].astype(cfg.dtype)
    if cfg.position_offset:
      positions = positions + cfg.position_offset
    x = x + self.position_embed(positions)
    if self.language_embed is not None:
      if lang_ids is None:
        raise ValueError("lang_ids is required when config.num_languages > 0.")
      x = x + self.language_embed(lang_ids)
    if not cfg.pre_layer_norm:
      x = self.embed_norm(x).astype(cfg.dtype)
    x = self.embed_dropout(x, deterministic=deterministic)
    x = _constrain(x, (axes.BATCH, axes.LENGTH, axes.EMBED))
    embedded = x
    mask = attention_mask(segment_ids)

    if cfg.scan_layers and depth < cfg.num_layers:
      x, layer_outputs = self._first_scanned_layers(x, mask, deterministic, depth)
    elif cfg.scan_layers:
      x, stacked = self.layers(x, mask, deterministic, return_all_hidden)
      layer_outputs = (tuple(stacked[i] for i in range(cfg.num_layers))
                       if return_all_hidden else ())
    else:
      outputs = []
      for layer in self.layers[:depth]:
        x, _ = layer(x, mask, deterministic, False)
        outputs.append(x)
      layer_outputs = tuple(outputs)

    if cfg.pre_layer_norm and depth == cfg.num_layers:
      x = self.final_norm(x).astype(cfg.dtype)
      # all_hidden[-1] is the final output for both LayerNorm placements.
      layer_outputs = layer_outputs[:-1] + (x,)

    if self.is_initializing():
      # Creates the MLM head too, so plain `init` yields the complete tree.
      self.mlm_logits(x[:, :1])
      if cfg.pointer_head:
        self.pointer_projections(x[:, :1])
    all_hidden = (embedded,) + layer_outputs if return_all_hidden else None
    return EncoderOutput(hidden=x, all_hidden=all_hidden)

  def _first_scanned_layers(self, x: Array, mask: Array, deterministic: bool,
                            depth: int) -> tuple[Array, tuple[Array, ...]]:
    """The first `depth` layers of a scanned stack: x [b, l, e] -> (x', their outputs).

    `self.layers` scans all num_layers; here one layer is applied with each of
    the first `depth` slices of the stacked parameters, so the program holds
    a scan of length `depth` and no work for the layers above.
    """
    if depth == 0:
      return x, ()
    stacked = nn.unbox(self.variables["params"]["layers"])
    first = jax.tree.map(lambda a: a[:depth], stacked)
    layer = EncoderLayer(self.config, parent=None)
    rngs = (jax.random.split(self.make_rng("dropout"), depth) if not deterministic
            else jnp.zeros((depth,), jnp.uint32))

    def body(h: Array, inputs: tuple[Any, Array]) -> tuple[Array, Array]:
      params, rng = inputs
      extra = {} if deterministic else {"rngs": {"dropout": rng}}
      h, _ = layer.apply({"params": params}, h, mask, deterministic, False, **extra)
      return h, h

    x, outputs = jax.lax.scan(body, x, (first, rngs))
    return x, tuple(outputs[i] for i in range(depth))

  def mlm_logits(self, hidden: Array) -> Array:
    """hidden [batch, predictions, embed] -> logits [batch, predictions, vocab].

    Run on the gathered masked positions only:
    `encoder.apply(variables, h, method=Encoder.mlm_logits)`. Float32 output;
    vocab = config.padded_vocab_size, padded ids at PADDED_LOGIT.
    """
    return self.mlm_head(hidden, self.token_embed.table())

  def pointer_projections(self, hidden: Array) -> tuple[Array, Array]:
    """The DWA pointer network's (queries, keys), each [batch, length, embed].

    XLM-Align (Chi et al. 2021, Eq. 12-13): two linear maps of the encoder's
    states. Needs `config.pointer_head`. Float32 output.
    """
    if not self.config.pointer_head:
      raise ValueError("pointer_projections needs EncoderConfig.pointer_head=True.")
    h = hidden.astype(self.config.dtype)
    return (self.pointer_query(h).astype(jnp.float32),
            self.pointer_key(h).astype(jnp.float32))

  @nn.nowrap
  def init_variables(self, rng: Array,
                     batch_shape: tuple[int, int] = (1, 8)) -> dict[str, Any]:
    """Initialises every parameter (encoder and MLM head) from dummy inputs.

    Args:
      rng: a PRNG key for the "params" stream.
      batch_shape: (batch, length) of the dummy inputs; parameter shapes do not
        depend on it, so the default suffices. Keep it small.

    Returns:
      The variables dict {"params": ...}, leaves boxed as
      `nn.LogicallyPartitioned`: use `nn.get_partition_spec(variables)` for the
      logical specs and `nn.unbox(variables)` for plain arrays. Runs jitted;
      wrap in `jax.eval_shape` for shapes only, or in `jax.jit` with
      out_shardings to initialise sharded.
    """
    batch, length = batch_shape
    zeros = jnp.zeros(batch_shape, jnp.int32)
    positions = jnp.broadcast_to(
        jnp.arange(length, dtype=jnp.int32) % self.config.num_positions,
        batch_shape)

    def init(rng: Array) -> dict[str, Any]:
      return self.init({"params": rng}, zeros, lang_ids=zeros,
                       positions=positions,
                       segment_ids=jnp.ones(batch_shape, jnp.int32),
                       deterministic=True)

    # One compiled program: initialising op by op (and each scan body) eagerly
    # is many times slower, even on CPU.
    return jax.jit(init)(rng)


def unstack_layers(params: dict[str, Any], num_layers: int) -> dict[str, Any]:
  """Converts scanned params (`layers` with a leading axis) to `layers_{i}`.

  Args:
    params: unboxed `variables["params"]` of a scan_layers=True encoder.
    num_layers: config.num_layers.

  Returns:
    The same tree as a scan_layers=False encoder expects.
  """
  params = dict(nn.unbox(params))
  stacked = params.pop("layers")
  for i in range(num_layers):
    params[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], stacked)
  return params


def stack_layers(params: dict[str, Any], num_layers: int) -> dict[str, Any]:
  """Inverse of `unstack_layers`: `layers_{i}` subtrees -> one `layers` tree."""
  params = dict(nn.unbox(params))
  per_layer = [params.pop(f"layers_{i}") for i in range(num_layers)]
  params["layers"] = jax.tree.map(lambda *a: jnp.stack(a), *per_layer)
  return params


# Parameters with a vocabulary axis (their leading one), padded to config.padded_vocab_size rows.
VOCAB_PARAMS = (("token_embed", "embedding"), ("mlm_head", "output_bias"))


def _encoder_params(params: Mapping[str, Any]) -> Mapping[str, Any]:
  """The encoder's params, also from a `{"params": ...}` variables dict."""
  if "token_embed" not in params and "params" in params:
    return params["params"]
  return params


def token_embedding_table(params: Mapping[str, Any], config: EncoderConfig | int) -> Array:
  """[vocab_size, embed] the real rows of the token embedding (no padding rows).

  Every direct reader of the table (dictionary induction, BLI, alignment
  scores, exports) takes it from here, so padded rows never show up as
  neighbours or exported tokens.

  Args:
    params: the encoder's (or a PretrainingModel's) params, or `{"params": ...}`.
    config: the encoder config, or the real vocabulary size.
  """
  vocab_size = config if isinstance(config, int) else config.vocab_size
  if vocab_size is None:
    raise ValueError("token_embedding_table needs EncoderConfig.vocab_size.")
  table = _encoder_params(params)["token_embed"]["embedding"]
  return table[:vocab_size] if table.shape[0] > vocab_size else table


def with_vocab_rows(params: Mapping[str, Any], rows: int) -> dict[str, Any]:
  """`params` with every VOCAB_PARAMS leaf cut to, or zero-padded to, `rows` rows.

  `rows = config.vocab_size` gives the real rows (export); `rows =
  config.padded_vocab_size` pads an unpadded tree for a padded model (import,
  warm start). Cutting drops only padding rows as long as rows >= vocab_size.
  NumPy leaves stay NumPy; the rest of the tree is shared, not copied.
  """
  out = dict(params)
  for module, name in VOCAB_PARAMS:
    if module not in out or name not in out[module]:
      continue
    leaf = out[module][name]
    have = leaf.shape[0]
    if have > rows:
      leaf = leaf[:rows]
    elif have < rows:
      xp = np if isinstance(leaf, np.ndarray) else jnp
      leaf = xp.pad(leaf, [(0, rows - have)] + [(0, 0)] * (leaf.ndim - 1))
    out[module] = {**out[module], name: leaf}
  return out
