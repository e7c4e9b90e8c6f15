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

from collections.abc import Mapping
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.models import axes
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.layers import (  # noqa: F401  (the layers' old import path is this module)
    PADDED_LOGIT,
    _MASK_VALUE,
    Embedding,
    EncoderLayer,
    MlmHead,
    Mlp,
    Projection,
    SelfAttention,
    _constrain,
    _dense,
    _init,
    _kernel_init,
    _layer_class,
    _layer_norm,
    attention_mask,
    sinusoidal_init,
    zero_padded_init,
)

Array = jax.Array


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
