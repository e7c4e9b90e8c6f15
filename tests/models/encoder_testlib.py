"""Helpers shared by the model tests: one compiled init and jitted forwards.

Compiling an init costs seconds on CPU (one threefry + normal per parameter),
so the tests initialise one base config and derive the variables of its
variants (language table, pre-LN, unscanned layers) from it; `variables_for`
checks every derived tree against the real init's shapes via `jax.eval_shape`.
Each distinct (config, static flags) compiles a forward once per session.
"""

import functools

import flax.linen as nn
import jax
import numpy as np

from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.models.encoder import unstack_layers
from tests.testlib import tiny_encoder_config

BATCH, LENGTH = 3, 13
BASE_CONFIG = tiny_encoder_config(vocab_size=61, max_positions=17, num_languages=0,
                                  attention_dropout_rate=0.1)


@functools.lru_cache(maxsize=None)
def abstract_variables(config: EncoderConfig):
  """Boxed ShapeDtypeStructs of `Encoder(config)`'s variables (no compile)."""
  return jax.eval_shape(
      lambda: Encoder(config).init_variables(jax.random.key(0), (2, 5)))


@functools.lru_cache(maxsize=None)
def _base_params():
  # Host numpy copies: deriving the variants then costs no eager XLA compiles.
  variables = Encoder(BASE_CONFIG).init_variables(jax.random.key(0), (2, 5))
  return jax.tree.map(np.asarray, nn.unbox(variables)["params"])


@functools.lru_cache(maxsize=None)
def variables_for(config: EncoderConfig):
  """Unboxed variables for `config`, derived from the base init."""
  params = jax.tree.map(lambda x: x, _base_params())
  if config.num_languages:
    # A wide init so that language effects are far above float noise.
    rng = np.random.default_rng(7)
    params["language_embed"] = {"embedding": rng.normal(
        0.0, 0.5, (config.num_languages + 1, config.embed_dim)).astype(
            np.float32)}
  if config.pre_layer_norm:
    params["final_norm"] = params.pop("embed_norm")
  if not config.scan_layers:
    params = unstack_layers(params, config.num_layers)
  variables = {"params": params}
  expected = nn.unbox(abstract_variables(config))
  assert jax.tree.structure(variables) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(variables), jax.tree.leaves(expected)):
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
  return variables


@functools.partial(
    jax.jit, static_argnames=("config", "deterministic", "return_all_hidden"))
def encode(variables, batch, *, config, deterministic=True,
           return_all_hidden=True, dropout_rng=None, input_embeddings=None):
  """Jitted `Encoder(config).apply` on a conftest-style batch dict."""
  rngs = None if dropout_rng is None else {"dropout": dropout_rng}
  return Encoder(config).apply(
      variables, batch["tokens"], lang_ids=batch["lang_ids"],
      positions=batch["positions"], segment_ids=batch["segment_ids"],
      deterministic=deterministic, return_all_hidden=return_all_hidden,
      input_embeddings=input_embeddings, rngs=rngs)


@functools.partial(jax.jit, static_argnames=("config",))
def encode_embeddings_with_grad(variables, batch, input_embeddings, *, config):
  """Encodes from `input_embeddings`; returns (hidden, d sum(hidden**2) / d x).

  The gradient w.r.t. the inputs runs the whole backward pass through the
  attention (where padding NaNs would appear) at a fraction of the compile
  cost of the weight gradients.
  """

  def hidden_fn(x):
    return encode(variables, batch, config=config, return_all_hidden=False,
                  input_embeddings=x).hidden

  hidden, vjp = jax.vjp(hidden_fn, input_embeddings)
  (grad,) = vjp(2.0 * hidden)
  return hidden, grad


@functools.partial(jax.jit, static_argnames=("config",))
def mlm_logits(variables, hidden, *, config):
  return Encoder(config).apply(variables, hidden, method=Encoder.mlm_logits)
