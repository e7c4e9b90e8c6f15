"""One tiny trained run per test process, for the test files that only need a finished MODEL_DIR.

Training even the tiny encoder costs seconds (an init, a data pipeline, a checkpoint), and the files
that read a run (evaluators, warm starts, induced dictionaries, resume refusals) used to train one each
with the same settings. `tiny_mix_run` trains it once per process (per xdist worker) and hands out
copies, so a test that writes into its MODEL_DIR (eval.json, a damaged step) never changes another's.
"""

import pathlib
import shutil

_TRAINED: dict[str, pathlib.Path] = {}


def tiny_mix_run(tmp_path_factory, tiny_corpus, name: str) -> pathlib.Path:
  """A fresh copy, `<tmp>/<name>/model`, of a 3-step MLM run on `tiny_mix` (de, en; the `tiny_corpus` fixture).

  The run: batch 6, TASK_FEATURE_LENGTHS {"tokens": 19}, the tests' tiny encoder, seed 0, one
  checkpoint at step 3 (synchronous save).
  """
  del tiny_corpus  # Registers tiny_mix; passed so that callers depend on the session fixture.
  if "tiny_mix" not in _TRAINED:
    from flax_xalign.training.checkpoints import CheckpointConfig
    from flax_xalign.training.optimizer import OptimizerConfig
    from flax_xalign.training.pretrain import pretrain
    from tests import testlib

    model_dir = tmp_path_factory.mktemp("shared_tiny_mix") / "model"
    pretrain(model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
             batch_size=6, train_steps=3, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
             optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
             checkpoint=CheckpointConfig(every_steps=3, keep=1, async_save=False), log_every=1, seed=0)
    _TRAINED["tiny_mix"] = model_dir
  copy = tmp_path_factory.mktemp(name) / "model"
  shutil.copytree(_TRAINED["tiny_mix"], copy)
  return copy
