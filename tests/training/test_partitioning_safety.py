"""Partitioning safety on 8 fake CPU devices (data=2, model=4).

A vocabulary of 61 ids cannot be split 4 ways; padded to 64 the embedding is
really sharded and trains exactly like the unpadded model on one device; an
unpadded table above `replicate_limit_bytes` is refused with the fix, a small
one still falls back to replication (with a warning).

The 8-device part runs this file as a script in a subprocess (the device count
is fixed when JAX starts) and reads one JSON line back: those tests are in the
`subprocess` tier (one interpreter for all of them, a module fixture).
"""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import testlib

L, B, VOCAB, PADDED, WAYS = 13, 8, 61, 64, 4


def _batch(seed):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, VOCAB, size=(B, L)).astype(np.int32)
  tokens[:, 0], tokens[:, -1] = 3, 1
  seg = np.ones((B, L), np.int32)
  tokens[::3, 9:] = 0
  seg[::3, 9:] = 0
  pos = np.tile(np.arange(L, dtype=np.int32), (B, 1))
  lang = np.where(seg > 0, 1, 0).astype(np.int32)
  return {"tokens": tokens, "lang_ids": lang, "segment_ids": seg, "positions": pos, "pair_side": np.zeros_like(seg)}


def _trainer(devices, num_partitions, **config):
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.partitioning import Partitioner, make_mesh
  from flax_xalign.training.trainer import LoopConfig, Trainer
  from tests.testlib import tiny_encoder_config

  limit = config.pop("replicate_limit_bytes", None)
  cfg = tiny_encoder_config(vocab_size=VOCAB, num_heads=4, head_dim=8, num_languages=1, **config)
  model = PretrainingModel(encoder=Encoder(cfg), objectives={"mlm": 1.0})
  partitioner = Partitioner(mesh=make_mesh(num_partitions, devices),
                            **({} if limit is None else {"replicate_limit_bytes": limit}))
  return Trainer(model=model, optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0),
                 partitioner=partitioner, loop=LoopConfig(train_steps=10, batch_size=B, length=L))


def _train(trainer, params, steps=2):
  import jax

  state = trainer.init_state()
  state = state.replace(params=jax.device_put(params, trainer.state_shardings.params))
  losses = []
  with trainer.mesh_context():
    for seed in range(steps):
      state, metrics = trainer.step(state, _batch(seed))
      losses.append({k: float(metrics[k]) for k in ("loss", "mlm_accuracy")})
  return state, losses


def _padded_copy(params):
  """The unpadded tree with its vocabulary leaves grown to PADDED rows (random junk below row 61)."""
  rng = np.random.default_rng(7)
  out = {k: v for k, v in params.items()}
  table = np.asarray(params["token_embed"]["embedding"])
  bias = np.asarray(params["mlm_head"]["output_bias"])
  out["token_embed"] = {"embedding": np.concatenate(
      [table, rng.normal(size=(PADDED - VOCAB, table.shape[1])).astype(table.dtype)])}
  # Junk that would win every argmax if the padded logits were not masked.
  out["mlm_head"] = {**params["mlm_head"], "output_bias": np.concatenate(
      [bias, np.full(PADDED - VOCAB, 1e4, bias.dtype)])}
  return out


def script() -> dict:
  """What the subprocess measures (see the tests below)."""
  import jax

  from flax_xalign.errors import UserError
  from flax_xalign.training import partitioning

  devices = jax.devices()
  assert len(devices) == 8, devices
  out = {}

  single = _trainer(devices[:1], 1)
  params = jax.device_get(single.init_state().params)
  _, out["single_losses"] = _train(single, params)

  padded = _trainer(devices, WAYS, vocab_pad_multiple=16)
  state, out["padded_losses"] = _train(padded, _padded_copy(params))
  table = state.params["token_embed"]["embedding"]
  out["table_spec"] = [str(a) for a in table.sharding.spec]
  out["table_shards"] = sorted({tuple(s.data.shape) for s in table.addressable_shards})
  out["bias_spec"] = [str(a) for a in state.params["mlm_head"]["output_bias"].sharding.spec]
  mu = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
        if "token_embed" in jax.tree_util.keystr(path)]
  out["moment_shards"] = sorted({tuple(s.data.shape) for leaf in mu for s in leaf.addressable_shards})
  # No gradient reaches the padded rows: their first Adam moments stay exactly zero.
  out["padded_moments_zero"] = bool(all(np.all(np.asarray(leaf)[VOCAB:] == 0) for leaf in mu))

  # Unpadded, small: replicated with a warning.
  records = []
  handler = logging.Handler()
  handler.emit = records.append
  logging.getLogger().addHandler(handler)
  small = _trainer(devices, WAYS)
  logging.getLogger().removeHandler(handler)
  out["small_spec"] = [str(a) for a in small.state_shardings.params["token_embed"]["embedding"].spec]
  out["warnings"] = [r.getMessage() for r in records if r.levelno == logging.WARNING]

  # Unpadded, above the limit: refused.
  try:
    _trainer(devices, WAYS, replicate_limit_bytes=1024)
    out["refusal"] = None
  except UserError as e:
    out["refusal"] = str(e)
  # The padded model under the same limit is fine: every vocab leaf divides.
  _trainer(devices, WAYS, vocab_pad_multiple=16, replicate_limit_bytes=1024)

  # Assets go through the same check, named.
  part = partitioning.Partitioner(mesh=partitioning.make_mesh(WAYS, devices), replicate_limit_bytes=1024)
  try:
    part.logical_sharding(("vocab", None), (VOCAB, 24), name="lang_vocab/ids", dtype=np.int32)
    out["asset_refusal"] = None
  except UserError as e:
    out["asset_refusal"] = str(e)
  out["asset_small_spec"] = [str(a) for a in part.logical_sharding(("vocab",), (VOCAB,), name="x").spec]
  return out


@pytest.fixture(scope="module")
def measured():
  env = {**os.environ, "XLA_FLAGS": testlib.xla_flags_with_devices(8), "JAX_PLATFORMS": "cpu",
         "TF_CPP_MIN_LOG_LEVEL": "3"}
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-m", "tests.training.test_partitioning_safety"], check=False, env=env,
                        capture_output=True, text=True, timeout=600, cwd=repo)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
def test_padded_embedding_is_sharded_with_its_moments(measured):
  assert measured["table_spec"] == ["model", "None"]
  assert measured["bias_spec"] == ["model"]
  assert measured["table_shards"] == [[PADDED // WAYS, 24]]
  assert [PADDED // WAYS, 24] in measured["moment_shards"]


@pytest.mark.subprocess
def test_padded_sharded_training_matches_unpadded_single_device(measured):
  for single, padded in zip(measured["single_losses"], measured["padded_losses"]):
    np.testing.assert_allclose(padded["loss"], single["loss"], rtol=1e-5)
    np.testing.assert_allclose(padded["mlm_accuracy"], single["mlm_accuracy"], rtol=1e-6)
  assert measured["padded_moments_zero"]


@pytest.mark.subprocess
def test_small_unshardable_table_still_replicates_with_one_warning(measured):
  assert measured["small_spec"] == ["None", "None"]
  embedding = [w for w in measured["warnings"] if "token_embed/embedding" in w]
  # Parameters and both Adam moments have the same case: one warning for it.
  assert len(embedding) == 1, measured["warnings"]
  assert "(61, 24)" in embedding[0] and "4-way" in embedding[0]


@pytest.mark.subprocess
def test_big_unshardable_table_is_refused_with_the_fix(measured):
  message = measured["refusal"]
  assert message is not None
  assert "params/token_embed/embedding (61, 24)" in message
  assert "dimension 0 (vocab, size 61)" in message and "4-way mesh axis model" in message
  # 128 = lcm(4, 128): ceil(61 / 128) * 128 divides the 4-way axis.
  assert "EncoderConfig.vocab_pad_multiple=128" in message
  assert "NUM_PARTITIONS" in message and "replicate_limit_bytes" in message


@pytest.mark.subprocess
def test_asset_refusal_names_the_asset(measured):
  assert "lang_vocab/ids (61, 24)" in measured["asset_refusal"]
  assert measured["asset_small_spec"] == ["None"]


def test_limit_counts_bytes_per_device():
  """A dimension other shardings still split counts only its share."""
  from flax_xalign.training import partitioning

  class FakeMesh:
    def __init__(self):
      self.shape = {"data": 2, "model": 4}
      self.devices = np.zeros((2, 4))

  part = partitioning.Partitioner(mesh=FakeMesh(), replicate_limit_bytes=100)  # type: ignore[arg-type]
  from jax.sharding import PartitionSpec as P

  spec, dropped = part._fit(P("model", "data"), (61, 8), name="t", itemsize=4, logical=("vocab", "embed"))
  assert spec == P(None, "data")
  assert dropped[0].bytes_per_device == 61 * 8 * 4 // 2 and dropped[0].ways == 4


if __name__ == "__main__":
  print(json.dumps(script()))
