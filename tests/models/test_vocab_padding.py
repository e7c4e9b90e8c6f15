"""A padded vocabulary (`EncoderConfig.vocab_pad_multiple`) behaves like the unpadded one.

61 ids padded to 64 rows. The reference is always the unpadded model holding
the same real rows; the padded rows are filled with junk (and the padded output
bias with a huge value) so that any leak of them into a softmax, an argmax or
a nearest-neighbour search shows.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder, token_embedding_table, with_vocab_rows
from flax_xalign.objectives.model import PretrainingModel
from tests.testlib import tiny_encoder_config

VOCAB, PADDED = 61, 64
CONFIG = tiny_encoder_config(vocab_size=VOCAB, head_dim=8, max_positions=17, num_languages=0,
                             attention_dropout_rate=0.0)
PADDED_CONFIG = CONFIG.replace(vocab_pad_multiple=16)
B, L = 4, 13


def _init(config):
  # Jitted: an eager init runs (and compiles) every initialiser op by op, several times the cost of one compile.
  init = jax.jit(lambda key: nn.unbox(Encoder(config).init_variables(key, (2, 5)))["params"])
  return jax.tree.map(np.asarray, init(jax.random.key(0)))


@pytest.fixture(scope="module")
def params():
  """Unpadded params with a non-trivial output bias."""
  p = _init(CONFIG)
  rng = np.random.default_rng(1)
  p["mlm_head"] = {**p["mlm_head"], "output_bias": rng.normal(size=VOCAB).astype(np.float32)}
  return p


def _junk_padded(params):
  """`params` with 3 junk rows appended (built by hand, not with the code under test)."""
  rng = np.random.default_rng(2)
  table = params["token_embed"]["embedding"]
  out = dict(params)
  out["token_embed"] = {"embedding": np.concatenate(
      [table, rng.normal(size=(PADDED - VOCAB, table.shape[1])).astype(np.float32)])}
  out["mlm_head"] = {**params["mlm_head"], "output_bias": np.concatenate(
      [params["mlm_head"]["output_bias"], np.full(PADDED - VOCAB, 1e4, np.float32)])}
  return out


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, VOCAB, size=(B, L)).astype(np.int32)
  seg = np.ones((B, L), np.int32)
  seg[0, 9:] = 0
  tokens[seg == 0] = 0
  batch = {"tokens": tokens, "lang_ids": seg.copy(), "segment_ids": seg, "pair_side": np.zeros_like(seg),
           "positions": np.tile(np.arange(L, dtype=np.int32), (B, 1))}
  return {k: jnp.asarray(v) for k, v in batch.items()}


def test_padded_vocab_size_and_validation():
  assert CONFIG.padded_vocab_size == VOCAB
  assert PADDED_CONFIG.padded_vocab_size == PADDED
  assert CONFIG.replace(vocab_pad_multiple=61).padded_vocab_size == 61
  xlmr = EncoderConfig(vocab_size=250_002, vocab_pad_multiple=128, num_layers=1, embed_dim=8, num_heads=1,
                       head_dim=8, mlp_dim=8)
  assert xlmr.padded_vocab_size == 250_112
  assert EncoderConfig(num_layers=1, embed_dim=8, num_heads=1, head_dim=8, mlp_dim=8).padded_vocab_size is None
  for bad in (0, -128, 2.0, True, "128"):
    with pytest.raises(ValueError, match="vocab_pad_multiple"):
      CONFIG.replace(vocab_pad_multiple=bad)


def test_fresh_padded_model_has_zero_rows_and_the_unpadded_real_rows(params):
  padded = _init(PADDED_CONFIG)
  plain = params  # _init(CONFIG), only its output bias replaced.
  table = padded["token_embed"]["embedding"]
  assert table.shape == (PADDED, CONFIG.embed_dim)
  assert padded["mlm_head"]["output_bias"].shape == (PADDED,)
  np.testing.assert_array_equal(table[VOCAB:], 0.0)
  np.testing.assert_array_equal(table[:VOCAB], plain["token_embed"]["embedding"])


def test_mlm_loss_and_predictions_equal_the_unpadded_model(params):
  plain = PretrainingModel(encoder=Encoder(CONFIG), objectives={"mlm": 1.0})
  padded = PretrainingModel(encoder=Encoder(PADDED_CONFIG), objectives={"mlm": 1.0})
  rng = jax.random.key(3)
  # Jitted once per model (both seeds reuse the program); eager calls would run op by op.
  # One program per model (both seeds reuse it): eager calls would run op by op.
  run_a, run_b = (jax.jit(lambda p, b, m=m: (*m.loss_fn(p, b, rng, train=False),
                                              m.masked_predictions(p, b, rng)["predicted"]))
                  for m in (plain, padded))
  for seed in range(2):
    loss_a, metrics_a, pred_a = run_a(params, _batch(seed))
    loss_b, metrics_b, pred_b = run_b(_junk_padded(params), _batch(seed))
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-6)
    np.testing.assert_allclose(metrics_b["mlm_accuracy"], metrics_a["mlm_accuracy"])
    np.testing.assert_array_equal(pred_b, pred_a)


def test_padded_logits_are_masked_never_predicted_and_get_no_gradient(params):
  encoder = Encoder(PADDED_CONFIG)
  junk = _junk_padded(params)
  hidden = jax.random.normal(jax.random.key(4), (2, 7, CONFIG.embed_dim))
  mlm_logits = jax.jit(lambda p: encoder.apply({"params": p}, hidden, method=Encoder.mlm_logits))
  logits = np.asarray(mlm_logits(junk))
  assert logits.shape == (2, 7, PADDED)
  assert np.all(logits[..., VOCAB:] <= -1e8)
  assert np.all(logits.argmax(-1) < VOCAB)
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  np.testing.assert_array_equal(probs[..., VOCAB:], 0.0)
  top = np.asarray(jax.lax.top_k(logits, VOCAB)[1])
  assert top.max() < VOCAB
  # Reference: the unpadded model's logits are the real columns.
  plain = np.asarray(jax.jit(lambda p: Encoder(CONFIG).apply({"params": p}, hidden, method=Encoder.mlm_logits))(params))
  np.testing.assert_allclose(logits[..., :VOCAB], plain, rtol=1e-5, atol=1e-5)

  def total(p):
    return jnp.sum(jax.nn.log_softmax(encoder.apply({"params": p}, hidden, method=Encoder.mlm_logits))[..., 3])

  grads = jax.jit(jax.grad(total))(junk)
  np.testing.assert_array_equal(np.asarray(grads["token_embed"]["embedding"])[VOCAB:], 0.0)
  np.testing.assert_array_equal(np.asarray(grads["mlm_head"]["output_bias"])[VOCAB:], 0.0)


def test_padded_ids_gather_nan_like_any_out_of_range_id(params):
  batch = _batch()
  tokens = np.array(batch["tokens"])
  tokens[1, 2] = VOCAB + 1
  out = Encoder(PADDED_CONFIG).apply({"params": _junk_padded(params)}, jnp.asarray(tokens), lang_ids=None,
                                     positions=batch["positions"], segment_ids=batch["segment_ids"],
                                     deterministic=True)
  assert np.isnan(np.asarray(out.hidden)[1]).any()
  assert np.isfinite(np.asarray(out.hidden)[2]).all()


def test_token_embedding_table_and_with_vocab_rows(params):
  junk = _junk_padded(params)
  table = token_embedding_table(junk, PADDED_CONFIG)
  np.testing.assert_array_equal(table, params["token_embed"]["embedding"])
  assert token_embedding_table({"params": junk}, VOCAB).shape == (VOCAB, CONFIG.embed_dim)
  assert token_embedding_table(params, CONFIG) is params["token_embed"]["embedding"]
  grown = with_vocab_rows(params, PADDED)
  assert isinstance(grown["token_embed"]["embedding"], np.ndarray)
  np.testing.assert_array_equal(grown["token_embed"]["embedding"][VOCAB:], 0.0)
  np.testing.assert_array_equal(grown["mlm_head"]["output_bias"][:VOCAB], params["mlm_head"]["output_bias"])
  assert grown["layers"] is params["layers"]
  cut = with_vocab_rows(junk, VOCAB)
  np.testing.assert_array_equal(cut["token_embed"]["embedding"], params["token_embed"]["embedding"])
  np.testing.assert_array_equal(cut["mlm_head"]["output_bias"], params["mlm_head"]["output_bias"])


def _decoy_table(params):
  """Padded rows that are exact copies of real rows 10..12: a leak would make them top neighbours."""
  junk = _junk_padded(params)
  table = junk["token_embed"]["embedding"].copy()
  table[VOCAB:] = table[10:10 + PADDED - VOCAB] * 3.0
  return {**junk, "token_embed": {"embedding": table}}


def test_bli_and_induced_dictionary_never_return_a_padded_id(params):
  from flax_xalign.assets.induced_dictionary import InducedDictionary
  from flax_xalign.evaluation.lexicon import bli
  decoy = _decoy_table(params)
  table = np.asarray(bli.embedding_table(decoy, PADDED_CONFIG))
  assert table.shape == (VOCAB, CONFIG.embed_dim)
  queries = table[10:13]
  # Cosine retrieval over the whole table: NumPy reference on the real rows.
  unit = table / np.linalg.norm(table, axis=1, keepdims=True)
  expected = (queries / np.linalg.norm(queries, axis=1, keepdims=True) @ unit.T).argmax(1)
  for method in ("nn", "csls"):
    top = np.asarray(bli.induce(queries, table, method=method, k=5).indices)
    assert top.max() < VOCAB
  np.testing.assert_array_equal(np.asarray(bli.induce(queries, table, method="nn", k=5).indices)[:, 0], expected)

  asset = InducedDictionary(vocab=None, source=None, vocab_size=VOCAB)
  ids = np.stack([np.arange(5, 33), np.arange(33, 61)]).astype(np.int32)
  value = {"vocab_ids": ids, "vocab_mask": np.ones_like(ids, bool), "translation": np.full_like(ids, -1),
           "score": np.zeros(ids.shape, np.float32), "lang_ids": np.array([1, 2], np.int32)}
  induced = asset.induce(decoy, value)
  translation = np.asarray(induced["translation"])
  assert translation.max() < VOCAB and translation.min() >= 5


def test_hf_export_drops_the_padding_and_import_restores_it(params):
  from flax_xalign.interop import hf

  junk = _junk_padded(params)
  hf_config, state = hf.hf_state_from_params(junk, PADDED_CONFIG, layout="bert")
  assert hf_config["vocab_size"] == VOCAB
  words = [k for k in state if k.endswith("word_embeddings.weight")]
  assert len(words) == 1
  np.testing.assert_array_equal(state[words[0]], params["token_embed"]["embedding"])
  for key, value in state.items():
    assert PADDED not in np.shape(value), key
  imported = hf.encoder_config_from_hf(hf_config).replace(vocab_pad_multiple=16)
  back, fresh = hf.params_from_hf(state, imported, layout="bert")
  assert not fresh
  np.testing.assert_array_equal(back["token_embed"]["embedding"][:VOCAB], params["token_embed"]["embedding"])
  np.testing.assert_array_equal(back["token_embed"]["embedding"][VOCAB:], 0.0)
  np.testing.assert_array_equal(back["mlm_head"]["output_bias"][VOCAB:], 0.0)
  assert back["mlm_head"]["output_bias"].shape == (PADDED,)
