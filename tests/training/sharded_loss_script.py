"""Run in a subprocess with 8 fake CPU devices: 1-device vs (data=4, model=2).

Prints one JSON line: losses and parameter checksums after two train steps on
each mesh, from identical initial parameters and batches.
"""

import json
import sys

import jax
import numpy as np

from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.partitioning import Partitioner, make_mesh
from flax_xalign.training.trainer import LoopConfig, Trainer
from tests.testlib import tiny_encoder_config

L, B = 13, 8


def batch(seed):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, 61, size=(B, L)).astype(np.int32)
  tokens[:, 0], tokens[:, -1] = 3, 1
  seg = np.ones((B, L), np.int32)
  tokens[::3, 9:] = 0
  seg[::3, 9:] = 0
  side = np.zeros((B, L), np.int32)
  side[1::2, :6], side[1::2, 6:] = 1, 2
  side[seg == 0] = 0
  pos = np.tile(np.arange(L, dtype=np.int32), (B, 1))
  lang = np.where(seg > 0, 1 + (np.arange(L) >= 6), 0).astype(np.int32)
  return dict(tokens=tokens, lang_ids=lang, segment_ids=seg, positions=pos, pair_side=side)


def run(devices, num_partitions, init_params=None):
  # Four heads, so the 'heads' axis splits over the 2-way 'model' axis.
  cfg = tiny_encoder_config(vocab_size=61, num_heads=4, max_positions=17, attention_dropout_rate=0.1)
  model = PretrainingModel(encoder=Encoder(cfg), objectives={"mlm": 1.0, "tlm": 1.0})
  partitioner = Partitioner(mesh=make_mesh(num_partitions, devices))
  trainer = Trainer(model=model, optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0),
                    partitioner=partitioner, loop=LoopConfig(train_steps=10, batch_size=B, length=L))
  state = trainer.init_state()
  if init_params is not None:
    state = state.replace(params=jax.device_put(init_params, trainer.state_shardings.params))
  first_params = jax.device_get(state.params)
  losses = []
  with trainer.mesh_context():
    for seed in range(2):
      state, metrics = trainer.step(state, batch(seed))
      losses.append({k: float(metrics[k]) for k in ("loss", "mlm", "tlm")})
  params = jax.device_get(state.params)
  leaves = jax.tree.leaves(params)
  specs = [str(x.sharding.spec) for x in jax.tree.leaves(state.params)]
  return first_params, {"losses": losses, "checksum": float(sum(np.abs(x).sum() for x in leaves)),
                        "sharded_leaves": sum("model" in s or "data" in s for s in specs),
                        "mesh": dict(partitioner.mesh.shape)}


def main():
  devices = jax.devices()
  assert len(devices) == 8, devices
  params, single = run(devices[:1], 1)
  _, sharded = run(devices, 2, init_params=params)
  print(json.dumps({"single": single, "sharded": sharded}))


if __name__ == "__main__":
  sys.exit(main())
