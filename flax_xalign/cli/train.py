r"""Pretraining entry point (t5x-style flags).

  python -m flax_xalign.train \
    --gin_file=gin_configs/runs/pretrain.gin --gin_file=gin_configs/models/tiny.gin \
    --gin.MODEL_DIR=\"runs/demo\" --gin.MIXTURE_OR_TASK_NAME=\"bible_grc_en_mlm_tlm\" \
    --gin.TRAIN_STEPS=200

Writes MODEL_DIR/config.gin, metrics.jsonl, TensorBoard events and Orbax
checkpoints under MODEL_DIR/checkpoints/. Rerunning with the same MODEL_DIR
resumes. On a multi-host TPU pod (see tpu_launch.sh) every worker runs this
same command and `jax.distributed.initialize()` joins them; several processes
on one machine join with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID (docs/MULTIHOST.md). With --gin.TRAIN_EVALS="['mlm']" and
--gin.TRAIN_EVALS_EVERY=N the registered evaluators (those of
`python -m flax_xalign.eval`) run on every N-th checkpoint and are logged to
metrics.jsonl as eval_<evaluator>_<key>.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import sys
from collections.abc import Sequence

from flax_xalign.cli import gin_cli


def main(argv: Sequence[str] | None = None) -> int:
  return gin_cli.train(argv)


if __name__ == "__main__":
  sys.exit(main())
