"""Joining a multi-process job and the persistent compilation cache: what a training process does first.

`python -m flax_xalign.train` calls `maybe_initialize_distributed()` once its flags are checked and before
anything touches a device, then `enable_compilation_cache()`. On a multi-host TPU pod (tpu_launch.sh) every
worker runs the same command and `jax.distributed.initialize()` joins them; several processes on one machine
join with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (docs/MULTIHOST.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

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
