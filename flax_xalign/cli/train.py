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
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign import errors
from flax_xalign.cli import common
from flax_xalign.cli._process import setup_process
from flax_xalign.errors import UserError

# Read by `distributed_settings` (jax 0.10.2 itself reads only JAX_COORDINATOR_ADDRESS).
NUM_PROCESSES_ENV, PROCESS_ID_ENV, MULTIHOST_ENV = "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "FLAX_XALIGN_MULTIHOST"


def distributed_settings(environ: Mapping[str, str]) -> dict[str, Any] | None:
  """The keyword arguments of `jax.distributed.initialize` for this process; None: run alone.

  * A Cloud TPU pod slice (`TPU_WORKER_HOSTNAMES` lists several hosts) or
    `FLAX_XALIGN_MULTIHOST=1` (Slurm, Open MPI, ...): no arguments, jax finds
    the coordinator and process ids in the cluster's environment.
  * `JAX_COORDINATOR_ADDRESS=host:port` with `JAX_NUM_PROCESSES=N` and
    `JAX_PROCESS_ID=i` (0 <= i < N): an explicit job, e.g. several processes on
    one machine (docs/MULTIHOST.md). Without the two counts jax's cluster
    detection must supply them.
  """
  address = environ.get("JAX_COORDINATOR_ADDRESS", "")
  count, index = environ.get(NUM_PROCESSES_ENV, ""), environ.get(PROCESS_ID_ENV, "")
  if (count or index) and not (address and count and index):
    raise UserError(
        f"a multi-process run needs JAX_COORDINATOR_ADDRESS=host:port, {NUM_PROCESSES_ENV}=N and "
        f"{PROCESS_ID_ENV}=i together (got JAX_COORDINATOR_ADDRESS={address!r}, "
        f"{NUM_PROCESSES_ENV}={count!r}, {PROCESS_ID_ENV}={index!r}); set all three, or none for one process.")
  if address and count:
    if not (count.isdigit() and index.isdigit() and int(index) < int(count)):
      raise UserError(f"{NUM_PROCESSES_ENV}={count!r} and {PROCESS_ID_ENV}={index!r} must be integers with "
                      f"0 <= {PROCESS_ID_ENV} < {NUM_PROCESSES_ENV}.")
    if int(count) == 1:
      return None
    return {"coordinator_address": address, "num_processes": int(count), "process_id": int(index)}
  if address or "," in environ.get("TPU_WORKER_HOSTNAMES", "") or environ.get(MULTIHOST_ENV) == "1":
    return {}
  return None


def maybe_initialize_distributed(environ: Mapping[str, str] | None = None) -> None:
  """Joins a multi-process job before anything touches a device; single-process runs skip this.

  On CPU the processes exchange arrays with jax's gloo collectives (the
  default of `jax_cpu_collectives_implementation` in jax 0.10.2).
  """
  settings = distributed_settings(os.environ if environ is None else environ)
  if settings is not None:
    import jax

    jax.distributed.initialize(**settings)


def enable_compilation_cache() -> None:
  """Persists compiled XLA programs, so a resumed or repeated run starts fast.

  $JAX_COMPILATION_CACHE_DIR wins; otherwise <data dir>/jax_cache.
  """
  import jax

  from flax_xalign.data.sources.paths import data_dir

  if not jax.config.jax_compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", str(data_dir() / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def evaluator_hook(model_dir: str, evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None,
                   every: int, *, num_layers: int | None = None) -> Any:
  """The training loop's hook that runs the registered evaluators `evals` every `every` steps.

  `TRAIN_EVALS=['word_align']`, `TRAIN_EVAL_OPTIONS={'word_align': {...}}` (as
  EVALS / EVAL_OPTIONS of `python -m flax_xalign.eval`) and
  `TRAIN_EVALS_EVERY=N` (a multiple of CHECKPOINT_EVERY). At each of those
  steps, once its checkpoint is written, the run is opened at that step and
  each evaluator's numbers are logged as `eval_<evaluator>_<key>`. Names and
  options are checked here, before training starts and before MODEL_DIR is
  created: names, every option's type and value, layers against
  `num_layers` (the model's), and that the files they read are there.
  """
  from flax_xalign.evaluation import registry
  from flax_xalign.runs import Run
  from flax_xalign.training.hooks import CheckpointHook

  registry.plan(evals, options, setting="TRAIN_EVALS", num_layers=num_layers)
  if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
    raise UserError(f"TRAIN_EVALS={list(evals)} needs TRAIN_EVALS_EVERY > 0 (got {every!r}): the steps between "
                    "evaluations, a multiple of CHECKPOINT_EVERY.")

  def run_evaluators(step: int) -> dict[str, Any]:
    print(f"  evaluators at step {step}: {', '.join(evals)}", flush=True)
    return registry.evaluate(Run.open(model_dir, step=step), evals, options, log=None)

  def check(data: Any) -> None:  # The run's data, once assembled: before MODEL_DIR exists.
    registry.check_data(evals, options, data, setting="TRAIN_EVALS")

  return CheckpointHook(name="evaluators", fn=run_evaluators, every=every, prefix="eval_",
                        setting="TRAIN_EVALS_EVERY", check=check)


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.cli import gin_cli

  setup_process()
  description = __doc__.splitlines()[0]
  try:
    gin_cli.check_flags(common.argv_of(argv), description=description,  # Usage errors before JAX and TF load.
                        prog=gin_cli.prog_of("train_job", {}))
    maybe_initialize_distributed()
  except UserError as e:
    return errors.report(e)
  enable_compilation_cache()
  code, result = common.gin_main(argv, description=description, configurable="train_job",
                                 write_config=gin_cli.write_operative_config)
  if code == 0 and result.interrupted:
    # Several processes stop together through jax's preemption service (a SIGTERM), not a signal of their own.
    import jax

    return 128 + (result.stop_signal or (signal.SIGTERM if jax.process_count() > 1 else signal.SIGINT))
  return code


if __name__ == "__main__":
  sys.exit(main())
