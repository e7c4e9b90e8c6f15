"""The worked example of docs/INTERFACES.md ("Run state") runs as written."""

import os
import pathlib
import re

from flax_xalign.runs.checkpoints import read_run_spec
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "INTERFACES.md"


def _example() -> str:
  text = DOC.read_text(encoding="utf-8")
  section = text[text.index("Worked example"):]
  code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  return code[:code.index("# train.objectives")]  # The rest needs a finished run.


def test_documented_asset_and_objective_train(tmp_path, tiny_corpus):
  exec(compile(_example(), str(DOC), "exec"), {})  # Registers `centroid` and `centered`.
  model_dir = tmp_path / "run"
  result = pretrain(model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
                    batch_size=6, train_steps=2, encoder=tiny_encoder_config(),
                    objectives={"mlm": 1.0, "centered": 0.1},
                    checkpoint=CheckpointConfig(every_steps=2, async_save=False), log_every=1, seed=2)
  assert result.last_step == 2 and "centered" in result.history[-1]
  assert os.path.exists(model_dir / "centroid.npz")
  assert os.path.exists(model_dir / "checkpoints" / "2" / "assets" / "centroid.npz")
  _, run, fingerprints = read_run_spec(str(model_dir))
  assert set(run.assets) == {"centroid", "vocabulary"} and run.assets["centroid"] == fingerprints["centroid"]
