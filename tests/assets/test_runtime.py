"""Assets are step arguments: AOT lowering sees them abstractly; one program serves new values."""

import jax
import numpy as np

from flax_xalign.assets.runtime import RunAssets
from flax_xalign.assets.dictionary import SyntheticDictionary
from flax_xalign.data.transforms.synthetic import SyntheticLanguage
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.training import partitioning
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.trainer import LoopConfig, Trainer
from tests.testlib import tiny_encoder_config

V, B, L = 23, 4, 11


def _batch(seed):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, 2 * V, size=(B, L)).astype(np.int32)
  tokens[:, 0], tokens[:, -1] = 3, 1
  return {"tokens": tokens, "lang_ids": np.ones((B, L), np.int32), "segment_ids": np.ones((B, L), np.int32),
          "positions": np.tile(np.arange(L, dtype=np.int32), (B, 1)), "pair_side": np.zeros((B, L), np.int32)}


def test_step_compiles_ahead_of_time_with_abstract_assets_and_reuses_the_program():
  language = SyntheticLanguage(transforms="trans", vocab_size=V, seed=0)
  asset = SyntheticDictionary(language, rate=0.5, lang_ids=(1, 2))
  first = asset.build(type("Run", (), {"seed": 0})())
  second = asset.build(type("Run", (), {"seed": 1})())
  assert first["pairs"].shape == second["pairs"].shape and not np.array_equal(first["pairs"], second["pairs"])
  model = PretrainingModel(encoder=Encoder(tiny_encoder_config(vocab_size=2 * V, num_languages=0)),
                           objectives={"mlm": 1.0, "align": 10.0})
  assets = RunAssets({"dictionary": asset}, {"dictionary": first}, run=None)
  trainer = Trainer(model=model, optimizer=OptimizerConfig(), loop=LoopConfig(train_steps=4, batch_size=B, length=L),
                    partitioner=partitioning.Partitioner(mesh=partitioning.make_mesh(1)), assets=assets)
  abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _batch(0).items()}
  with trainer.mesh_context():
    lowered = trainer.train_step.lower(trainer.abstract_state, abstract_batch, trainer.base_rng, assets.abstract())
    compiled = lowered.compile()
  # The dictionary is an input of the program, not a constant folded into it.
  asset_inputs = jax.tree.leaves(lowered.args_info[0][3])
  assert len(asset_inputs) == 3 and {tuple(a.shape) for a in asset_inputs} == {first["pairs"].shape, (len(first["mask"]),), (2,)}

  losses = {}
  for name, value in (("first", first), ("second", second)):
    assets.set_values({"dictionary": value})
    state = trainer.init_state()
    with trainer.mesh_context():
      _, metrics = compiled(state, trainer.shard(_batch(0)), trainer.base_rng, assets.device)
    losses[name] = float(metrics["align"])
  assert losses["first"] != losses["second"]  # The new dictionary was used ...
  assert trainer.trace_counts["train_step"] == 1  # ... by the one program compiled ahead of time.
