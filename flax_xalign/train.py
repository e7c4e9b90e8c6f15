r"""Pretraining entry point (t5x-style flags).

  python -m flax_xalign.train \
    --gin_file=gin_configs/runs/pretrain.gin --gin_file=gin_configs/models/tiny.gin \
    --gin.MODEL_DIR=\"runs/demo\" --gin.MIXTURE_OR_TASK_NAME=\"bible_grc_en_mlm_tlm\" \
    --gin.TRAIN_STEPS=200

Writes MODEL_DIR/config.gin, metrics.jsonl, TensorBoard events and Orbax
checkpoints under MODEL_DIR/checkpoints/. Rerunning with the same MODEL_DIR
resumes. On a multi-host TPU pod (see tpu_launch.sh) every worker runs this
same command and `jax.distributed.initialize()` joins them.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (must precede gin file parsing on gin 0.5)
import os
import sys
from typing import Sequence

def maybe_initialize_distributed() -> None:
  """Joins a multi-host job; single-process runs skip this."""
  import jax

  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  multi = (
      "," in hosts
      or os.environ.get("JAX_COORDINATOR_ADDRESS")
      or os.environ.get("FLAX_XALIGN_MULTIHOST") == "1"
  )
  if multi:
    jax.distributed.initialize()


def enable_compilation_cache() -> None:
  """Persists compiled XLA programs, so a resumed or repeated run starts fast.

  $JAX_COMPILATION_CACHE_DIR wins; otherwise <data dir>/jax_cache.
  """
  import jax

  from flax_xalign.data.paths import data_dir

  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", str(data_dir() / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign import gin_cli

  argv = list(sys.argv[1:] if argv is None else argv)
  maybe_initialize_distributed()
  enable_compilation_cache()
  code, result = gin_cli.run(argv, description=__doc__.splitlines()[0], configurable="train",
                             write_config=gin_cli.write_operative_config)
  if code == 0 and result.interrupted:
    return 128 + (result.stop_signal or 2)
  return code


if __name__ == "__main__":
  sys.exit(main())
