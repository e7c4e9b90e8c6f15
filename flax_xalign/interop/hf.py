"""Hugging Face BERT / XLM-R checkpoints in and out of our encoder.

Two state-dict layouts share one body (`embeddings.*`, `encoder.layer.{i}.*`)
and differ in the prefix of the body and in the MLM head:

  layout  model_type            body prefix  MLM head         positions read
  bert    bert                  bert.        cls.predictions  row p
  xlmr    xlm-roberta, roberta  roberta.     lm_head          row p + pad + 1

Both map onto our post-LN encoder with `num_token_types = type_vocab_size`
(row 0 added to every token) and `position_offset` (0, or pad + 1 = 2 for
XLM-R). HF linear weights are [out, in]; our kernels are [in, out], with the
attention's heads split out: q/k/v [embed, heads, kv], out [heads, kv, embed].

The tensors are read here (transformers 5.x has no Flax BERT): a
`model.safetensors` with `safetensors.numpy` (no torch needed), a
`pytorch_model.bin` with torch when it is installed.

Tokenizers (the vocabulary files of a HF directory, both ways) are in
`interop/hf_tokenizers.py`; this module re-exports them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.interop.hf_tokenizers import (  # noqa: F401  (their old import path is this module)
    SENTENCEPIECE_FILE,
    WORDPIECE_FILE,
    compare_with_transformers,
    fairseq_order_sentencepiece,
    load_hf_vocabulary,
    model_order_sentencepiece,
    sentencepiece_proto,
    tokenizer_kind,
)
from flax_xalign.models.config import EncoderConfig

LAYOUTS = ("bert", "xlmr")
_MODEL_TYPES = {"bert": "bert", "xlm-roberta": "xlmr", "roberta": "xlmr"}
_BODY_PREFIX = {"bert": "bert.", "xlmr": "roberta."}
# Our MLM head's pieces -> the HF names (dense, LayerNorm, output bias).
_HEAD = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
             "cls.predictions.bias", "cls.predictions.decoder"),
    "xlmr": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "lm_head.decoder"),
}
_HEAD_PREFIX = {"bert": "cls.predictions.", "xlmr": "lm_head."}
# Checkpoint entries our encoder has no place for and that import skips:
# BERT's pooler and next-sentence head, and old position/type id buffers.
IGNORED_PREFIXES = ("pooler.", "cls.seq_relationship.")
IGNORED_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")
# (our path inside a layer, HF name inside `encoder.layer.{i}.`, how the kernel maps)
_LAYER_MAP = (
    (("attention", "query"), "attention.self.query", "heads_in"),
    (("attention", "key"), "attention.self.key", "heads_in"),
    (("attention", "value"), "attention.self.value", "heads_in"),
    (("attention", "out"), "attention.output.dense", "heads_out"),
    (("attention_norm",), "attention.output.LayerNorm", "norm"),
    (("mlp", "wi"), "intermediate.dense", "dense"),
    (("mlp", "wo"), "output.dense", "dense"),
    (("mlp_norm",), "output.LayerNorm", "norm"),
)
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


# --- Config ------------------------------------------------------------------


def layout_of(hf_config: Mapping[str, Any]) -> str:
  """"bert" or "xlmr" from a config.json's `model_type`; UserError otherwise."""
  model_type = hf_config.get("model_type")
  if model_type not in _MODEL_TYPES:
    raise UserError(f"model_type {model_type!r} is not supported; flax_xalign imports BERT (model_type 'bert') "
                    "and XLM-R/RoBERTa ('xlm-roberta', 'roberta') encoders.")
  return _MODEL_TYPES[model_type]


def encoder_config_from_hf(hf_config: Mapping) -> EncoderConfig:
  """Our `EncoderConfig` of a BertModel/BertForMaskedLM or XLMRoberta* config.json.

  Raises:
    UserError: an architecture our encoder does not implement (another
      activation than exact GELU, relative positions, a decoder, a hidden
      size the heads do not divide).
  """
  layout = layout_of(hf_config)
  get = hf_config.get
  if get("hidden_act", "gelu") != "gelu":
    raise UserError(f"hidden_act {get('hidden_act')!r} is not supported: our encoder uses the exact (erf) GELU "
                    "of BERT and XLM-R ('gelu').")
  if get("position_embedding_type", "absolute") != "absolute":
    raise UserError(f"position_embedding_type {get('position_embedding_type')!r} is not supported; only "
                    "learned absolute positions ('absolute') are.")
  if get("is_decoder") or get("add_cross_attention"):
    raise UserError("this config describes a decoder (is_decoder / add_cross_attention); flax_xalign imports "
                    "bidirectional encoders only.")
  hidden, heads = int(hf_config["hidden_size"]), int(hf_config["num_attention_heads"])
  if hidden % heads:
    raise UserError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}.")
  pad = get("pad_token_id")
  offset = 0
  if layout == "xlmr":
    # fairseq positions: the first real token reads row padding_idx + 1.
    offset = (1 if pad is None else int(pad)) + 1
  default_types = 2 if layout == "bert" else 1
  return EncoderConfig(
      vocab_size=int(hf_config["vocab_size"]),
      num_layers=int(hf_config["num_hidden_layers"]),
      embed_dim=hidden,
      num_heads=heads,
      head_dim=hidden // heads,
      mlp_dim=int(hf_config["intermediate_size"]),
      max_positions=int(get("max_position_embeddings", 512)),
      position_offset=offset,
      num_token_types=int(get("type_vocab_size", default_types)),
      dropout_rate=float(get("hidden_dropout_prob", 0.1)),
      attention_dropout_rate=float(get("attention_probs_dropout_prob", 0.1)),
      layer_norm_epsilon=float(get("layer_norm_eps", 1e-12)),
      initializer_std=float(get("initializer_range", 0.02)),
  )


# --- Import: state dict -> params ----------------------------------------------


def _check_layout(layout: str) -> None:
  if layout not in LAYOUTS:
    raise UserError(f"layout {layout!r} is not one of {LAYOUTS}.")


def _normalized_keys(state: Mapping[str, Any], layout: str) -> dict[str, Any]:
  """Keys without the body prefix, old `gamma`/`beta` LayerNorm names renamed."""
  other = [p for l, p in _BODY_PREFIX.items() if l != layout]
  out = {}
  for key, value in state.items():
    if any(key.startswith(p) for p in other):
      raise UserError(f"state-dict key {key!r} belongs to another layout than {layout!r}; pass the layout of "
                      "the checkpoint's model_type.")
    name = key[len(_BODY_PREFIX[layout]):] if key.startswith(_BODY_PREFIX[layout]) else key
    if "LayerNorm." in name or "layer_norm." in name:
      name = name.replace(".gamma", ".weight").replace(".beta", ".bias")
    if name in out:
      raise UserError(f"state-dict key {key!r} appears both with and without the {_BODY_PREFIX[layout]!r} prefix.")
    out[name] = value
  return out


class _Reader:
  """Takes tensors out of a normalized state dict, checking shapes and dtype."""

  def __init__(self, state: dict[str, Any], dtype: Any):
    self.state, self.dtype, self.used = state, dtype, set()

  def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.state:
      raise UserError(f"the checkpoint has no {name!r} (expected shape {list(shape)}); it is not a complete "
                      "BERT/XLM-R encoder of this config.")
    value = np.asarray(self.state[name])
    if tuple(value.shape) != tuple(shape):
      raise UserError(f"{name!r} has shape {list(value.shape)}; the config implies {list(shape)}.")
    self.used.add(name)
    return value.astype(self.dtype)

  def linear(self, name: str, kind: str, cfg: EncoderConfig, n_in: int, n_out: int) -> dict[str, np.ndarray]:
    weight = self.take(f"{name}.weight", (n_out, n_in))
    bias = self.take(f"{name}.bias", (n_out,))
    if kind == "heads_in":
      return {"kernel": weight.T.reshape(n_in, cfg.num_heads, cfg.head_dim),
              "bias": bias.reshape(cfg.num_heads, cfg.head_dim)}
    if kind == "heads_out":
      return {"kernel": weight.T.reshape(cfg.num_heads, cfg.head_dim, n_out), "bias": bias}
    return {"kernel": np.ascontiguousarray(weight.T), "bias": bias}

  def norm(self, name: str, width: int) -> dict[str, np.ndarray]:
    return {"scale": self.take(f"{name}.weight", (width,)), "bias": self.take(f"{name}.bias", (width,))}


def _layer_sizes(cfg: EncoderConfig, kind: str, path: tuple[str, ...]) -> tuple[int, int]:
  e, a, m = cfg.embed_dim, cfg.attention_dim, cfg.mlp_dim
  if kind == "heads_in":
    return e, a
  if kind == "heads_out":
    return a, e
  return (e, m) if path == ("mlp", "wi") else (m, e)


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
  for name in path[:-1]:
    tree = tree.setdefault(name, {})
  tree[path[-1]] = value


def _fresh_mlm_head(config: EncoderConfig, seed: int) -> dict[str, Any]:
  """The MLM head as `Encoder` initialises it (same initialisers), from `seed`."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from flax_xalign.models.encoder import MlmHead

  hidden = jnp.zeros((1, 1, config.embed_dim), config.compute_dtype)
  embedding = jnp.zeros((config.vocab_size, config.embed_dim), config.params_dtype)
  variables = jax.jit(MlmHead(config).init)(jax.random.key(seed), hidden, embedding)
  return jax.tree.map(np.asarray, nn.unbox(variables)["params"])


def _head_params(reader: _Reader, config: EncoderConfig, layout: str,
                 token_embedding: np.ndarray) -> dict[str, Any] | None:
  """Our `mlm_head` subtree from the checkpoint, or None when it has no head."""
  dense, norm, bias, decoder = _HEAD[layout]
  if not any(k.startswith(_HEAD_PREFIX[layout]) for k in reader.state):
    return None
  e, v = config.embed_dim, config.vocab_size
  if f"{decoder}.weight" in reader.state:
    tied = np.asarray(reader.state[f"{decoder}.weight"]).astype(reader.dtype)
    if tied.shape != token_embedding.shape or not np.array_equal(tied, token_embedding):
      raise UserError(f"the checkpoint's MLM decoder ({decoder}.weight) differs from the word embeddings: our MLM "
                      "head is tied to the token embedding, so an untied output layer cannot be imported.")
    reader.used.add(f"{decoder}.weight")
  if bias not in reader.state and f"{decoder}.bias" in reader.state:
    bias = f"{decoder}.bias"
  elif f"{decoder}.bias" in reader.state:
    if not np.array_equal(np.asarray(reader.state[f"{decoder}.bias"]), np.asarray(reader.state[bias])):
      raise UserError(f"the checkpoint's {decoder}.bias differs from {bias}; HF ties them, and our head has one "
                      "output bias.")
    reader.used.add(f"{decoder}.bias")
  return {"transform": reader.linear(dense, "dense", config, e, e), "norm": reader.norm(norm, e),
          "output_bias": reader.take(bias, (v,))}


def params_from_hf(state: Mapping[str, np.ndarray], config: EncoderConfig, *, layout: str,
                   seed: int = 0) -> tuple[dict, list[str]]:
  """Our plain parameter tree from a HF state dict, and the names initialised fresh.

  Args:
    state: tensor name -> array, with or without the `bert.` / `roberta.`
      prefix (BertModel or BertForMaskedLM, XLMRobertaModel or ...ForMaskedLM).
    config: from `encoder_config_from_hf` (scan_layers decides whether the
      layers are stacked under `layers` or kept as `layers_{i}`).
    layout: "bert" or "xlmr".
    seed: seeds the parameters the checkpoint lacks (the MLM head of a bare
      BertModel), initialised as our encoder initialises them.

  Returns:
    (params, fresh): the tree of `Encoder(config)` as numpy arrays in
    config.param_dtype, and the "/"-joined paths of the parameters that were
    initialised here (e.g. "mlm_head/transform/kernel").

  Raises:
    UserError: a missing or misshapen tensor, an untied MLM decoder, or
      entries our encoder has no place for (named).
  """
  import jax

  _check_layout(layout)
  if config.num_languages or config.pre_layer_norm or config.pointer_head:
    raise UserError("a HF BERT/XLM-R checkpoint has no language embeddings, pre-LN layers or pointer head; "
                    "use the config from encoder_config_from_hf.")
  if config.attention_dim != config.embed_dim:
    raise UserError(f"HF encoders have heads x head_dim = hidden_size; the config has {config.attention_dim} != "
                    f"{config.embed_dim}.")
  reader = _Reader(_normalized_keys(state, layout), config.params_dtype)
  e = config.embed_dim
  params: dict[str, Any] = {
      "token_embed": {"embedding": reader.take("embeddings.word_embeddings.weight", (config.vocab_size, e))},
      "position_embed": {"embedding": reader.take("embeddings.position_embeddings.weight",
                                                  (config.max_positions, e))},
      "embed_norm": reader.norm("embeddings.LayerNorm", e),
  }
  if config.num_token_types:
    params["type_embed"] = {"embedding": reader.take("embeddings.token_type_embeddings.weight",
                                                     (config.num_token_types, e))}
  layers = []
  for i in range(config.num_layers):
    layer: dict[str, Any] = {}
    for path, name, kind in _LAYER_MAP:
      hf_name = f"encoder.layer.{i}.{name}"
      if kind == "norm":
        _set(layer, path, reader.norm(hf_name, e))
      else:
        _set(layer, path, reader.linear(hf_name, kind, config, *_layer_sizes(config, kind, path)))
    layers.append(layer)
  if config.scan_layers:
    params["layers"] = jax.tree.map(lambda *a: np.stack(a), *layers)
  else:
    params.update({f"layers_{i}": layer for i, layer in enumerate(layers)})
  fresh: list[str] = []
  head = _head_params(reader, config, layout, params["token_embed"]["embedding"])
  if head is None:
    head = _fresh_mlm_head(config, seed)
    fresh = sorted("/".join(("mlm_head", *(k.key for k in path)))
                   for path, _ in jax.tree_util.tree_leaves_with_path(head))
  params["mlm_head"] = head
  if config.padded_vocab_size != config.vocab_size:  # Inert zero rows for a padded vocabulary.
    from flax_xalign.models.encoder import with_vocab_rows

    params = with_vocab_rows(params, config.padded_vocab_size)
  unused = sorted(k for k in reader.state if k not in reader.used and k not in IGNORED_KEYS
                  and not k.startswith(IGNORED_PREFIXES))
  if unused:
    shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    raise UserError(f"the checkpoint has {len(unused)} tensors our encoder has no place for: {shown}. "
                    "flax_xalign imports the encoder and its MLM head (task heads are not imported).")
  return params, fresh


# --- Export: params -> state dict -----------------------------------------------


# The ids config.json records when the caller passes no vocabulary's specials.
_DEFAULT_IDS = {"bert": {"pad": 0}, "xlmr": {"bos": 0, "pad": 1, "eos": 2}}


def hf_config_of(config: EncoderConfig, *, layout: str, specials: SpecialTokens | None = None) -> dict[str, Any]:
  """The config.json of `config` in `layout` (an *ForMaskedLM architecture)."""
  _check_layout(layout)
  ids = (_DEFAULT_IDS[layout] if specials is None else
         {"bos": specials.bos, "pad": specials.pad, "eos": specials.eos})
  offset = 0 if layout == "bert" else ids["pad"] + 1
  out = {
      "architectures": ["BertForMaskedLM" if layout == "bert" else "XLMRobertaForMaskedLM"],
      "model_type": "bert" if layout == "bert" else "xlm-roberta",
      "vocab_size": config.vocab_size,
      "hidden_size": config.embed_dim,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "intermediate_size": config.mlp_dim,
      "hidden_act": "gelu",
      "hidden_dropout_prob": config.dropout_rate,
      "attention_probs_dropout_prob": config.attention_dropout_rate,
      "max_position_embeddings": config.num_positions + offset,
      "type_vocab_size": max(config.num_token_types, 1),
      "initializer_range": config.initializer_std,
      "layer_norm_eps": config.layer_norm_epsilon,
      "position_embedding_type": "absolute",
      "pad_token_id": ids["pad"],
      "tie_word_embeddings": True,
  }
  if layout == "xlmr":
    out.update(bos_token_id=ids["bos"], eos_token_id=ids["eos"])
  return out


def hf_state_from_params(params, config: EncoderConfig, *, layout: str,
                         specials: SpecialTokens | None = None) -> tuple[dict, dict]:
  """(config.json dict, state dict) of our encoder in a HF *ForMaskedLM layout.

  Keys carry the body prefix (`bert.` / `roberta.`) plus the MLM head; the
  tied decoder weight is left out, as `save_pretrained` does. Positions are
  re-based to the layout's convention (BERT reads row p, XLM-R row
  p + pad + 1); a model without a token-type table gets one zero row. The
  DWA pointer projections (a training head) have no HF place and are dropped.

  Args:
    params: the (boxed or plain) tree of `Encoder(config)`.
    config: its config.
    layout: "bert" or "xlmr".
    specials: the vocabulary's ids (pad, and for XLM-R bos/eos, go into the
      config); the layout's usual ids when None.

  Raises:
    UserError: language embeddings, pre-LN layers, or heads x head_dim !=
      embed (no HF BERT/XLM-R equivalent).
  """
  import flax.linen as nn
  import jax

  _check_layout(layout)
  if config.num_languages:
    raise UserError(f"the model has language embeddings ({config.num_languages} languages) and the {layout} "
                    "layout has no place for them; HF BERT/XLM-R cannot represent this model.")
  if config.pre_layer_norm:
    raise UserError(f"the model uses pre-LN layers; the {layout} layout is post-LN.")
  if config.attention_dim != config.embed_dim:
    raise UserError(f"heads x head_dim = {config.attention_dim} differs from embed_dim = {config.embed_dim}; "
                    "HF encoders need them equal.")
  hf_config = hf_config_of(config, layout=layout, specials=specials)
  from flax_xalign.models.encoder import with_vocab_rows

  # HF has one row per token id: the padding rows of a padded vocabulary stay behind.
  p = with_vocab_rows(jax.tree.map(lambda x: np.asarray(x, np.float32), nn.unbox(dict(params))), config.vocab_size)
  if config.scan_layers:
    layers = [jax.tree.map(lambda a, i=i: a[i], p["layers"]) for i in range(config.num_layers)]
  else:
    layers = [p[f"layers_{i}"] for i in range(config.num_layers)]
  body = _BODY_PREFIX[layout]
  e = config.embed_dim
  # HF row j holds our row j + shift; rows before our table (a larger HF
  # offset) are never read by a real token and are written as zeros.
  shift = config.position_offset - (hf_config["max_position_embeddings"] - config.num_positions)
  table = p["position_embed"]["embedding"]
  positions = (table[shift:] if shift >= 0 else
               np.concatenate([np.zeros((-shift, e), np.float32), table]))
  types = p["type_embed"]["embedding"] if config.num_token_types else np.zeros((1, e), np.float32)
  state = {
      f"{body}embeddings.word_embeddings.weight": p["token_embed"]["embedding"],
      f"{body}embeddings.position_embeddings.weight": positions,
      f"{body}embeddings.token_type_embeddings.weight": types,
      f"{body}embeddings.LayerNorm.weight": p["embed_norm"]["scale"],
      f"{body}embeddings.LayerNorm.bias": p["embed_norm"]["bias"],
  }
  for i, layer in enumerate(layers):
    for path, name, kind in _LAYER_MAP:
      leaf = layer
      for part in path:
        leaf = leaf[part]
      prefix = f"{body}encoder.layer.{i}.{name}"
      if kind == "norm":
        state[f"{prefix}.weight"], state[f"{prefix}.bias"] = leaf["scale"], leaf["bias"]
        continue
      n_in, n_out = _layer_sizes(config, kind, path)
      state[f"{prefix}.weight"] = leaf["kernel"].reshape(n_in, n_out).T
      state[f"{prefix}.bias"] = leaf["bias"].reshape(n_out)
  dense, norm, bias, decoder = _HEAD[layout]
  head = p["mlm_head"]
  state.update({f"{dense}.weight": head["transform"]["kernel"].T, f"{dense}.bias": head["transform"]["bias"],
                f"{norm}.weight": head["norm"]["scale"], f"{norm}.bias": head["norm"]["bias"],
                bias: head["output_bias"], f"{decoder}.bias": head["output_bias"]})
  return hf_config, {k: np.ascontiguousarray(v) for k, v in state.items()}


# --- Reading a HF directory -------------------------------------------------------


def read_hf_config(path: str) -> dict[str, Any]:
  config_path = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise UserError(f"{path} is not a directory; pass a Hugging Face model directory (config.json + weights).")
  if not os.path.isfile(config_path):
    raise UserError(f"{path} has no config.json; pass a Hugging Face model directory (save_pretrained's output).")
  try:
    with open(config_path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise UserError(f"cannot read {config_path} ({e}).") from e


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  # bfloat16 tensors load as ml_dtypes.bfloat16 (registered with numpy by
  # jax, which models.config imports); params_from_hf casts them.
  import safetensors
  import safetensors.numpy

  try:
    return dict(safetensors.numpy.load_file(path))
  except safetensors.SafetensorError as e:  # A truncated or damaged file (a download that stopped).
    raise UserError(f"cannot read {path}: not a complete safetensors file ({e}); download or save it "
                    "again.") from e


def _load_torch(path: str) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError as e:
    raise UserError(f"{path} is a PyTorch checkpoint and torch is not installed; `pip install "
                    "'flax_xalign[interop]'`, or convert it to model.safetensors.") from e
  state = torch.load(path, map_location="cpu", weights_only=True)
  return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
          for k, v in state.items()}


def load_hf_state(path: str) -> dict[str, np.ndarray]:
  """The tensors of a HF model directory (single or sharded safetensors / PyTorch files)."""
  for name in WEIGHT_FILES:
    loader = _load_safetensors if name.endswith(".safetensors") else _load_torch
    single, index = os.path.join(path, name), os.path.join(path, name + ".index.json")
    if os.path.isfile(single):
      return loader(single)
    if os.path.isfile(index):
      with open(index, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
      state: dict[str, np.ndarray] = {}
      for shard in shards:
        state.update(loader(os.path.join(path, shard)))
      return state
  raise UserError(f"{path} has no weights: expected one of {', '.join(WEIGHT_FILES)} (or a sharded *.index.json).")


def load_hf_directory(path) -> tuple[dict, dict, str]:
  """(config.json dict, state dict of numpy arrays, layout) of a HF model directory."""
  path = os.fspath(path)
  hf_config = read_hf_config(path)
  layout = layout_of(hf_config)
  return hf_config, load_hf_state(path), layout
