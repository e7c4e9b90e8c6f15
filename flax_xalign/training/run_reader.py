"""Reading another finished run from inside training: the run a new one starts from.

A warm start (`INIT_FROM_CHECKPOINT`) checks the source's manifest, and an
asset built from another run's parameters (the induced dictionary's
`source`) needs those parameters, while the new run is being assembled.
`runs/` (the user-facing door, `Run.open`) sits above training, so this is
the reading training may do: the manifest, and every saved parameter as it
is, with no model rebuilt (training names no objective).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.training import checkpoints as checkpoints_lib

# (run, damaged steps, step read) a reader of this process has warned about: a run opened again (a driver
# scoring two things, a warm start and an induced dictionary reading one source) says nothing new.
_READER_WARNED: set[tuple[str, tuple[int, ...], int]] = set()


def warn_damaged_once(model_dir: str, damaged: list[checkpoints_lib.DamagedCheckpointError], step: int) -> None:
  """A reader's one warning line for the damaged steps newer than the `step` it reads, once per process.

  Keyed by the steps, not the text: which array fails first differs between reads. Readers move nothing.
  """
  key = (os.path.abspath(model_dir), tuple(e.step for e in damaged), int(step))
  if not damaged or key in _READER_WARNED:
    return
  _READER_WARNED.add(key)
  if len(damaged) == 1:
    what = f"checkpoint step {damaged[0].step} of {model_dir} is damaged ({damaged[0].what})"
  else:
    what = (f"checkpoint steps {', '.join(str(e.step) for e in damaged)} of {model_dir} are damaged ("
            + "; ".join(f"step {e.step}: {e.what}" for e in damaged) + ")")
  print(f"warning: {what}; reading step {step}, the newest complete one", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class SourceRun:
  """Another run's manifest, and its parameters on demand (what an asset's `build(run, source=...)` reads).

  Attributes:
    path: the MODEL_DIR (or its checkpoints/ folder) as given.
    step: the step read (the latest).
    spec: its run manifest at that step.
  """

  path: str
  step: int
  spec: run_spec_lib.RunSpec

  @classmethod
  def open(cls, path: str) -> "SourceRun":
    """The newest complete step's manifest; UserError when there is no checkpoint.

    As every reader does (`runs.Run.open`), a damaged newer step is named in
    one warning line and passed over; nothing is moved. Whether its
    parameters read back is checked when they are read (`params`).
    """
    model_dir = str(checkpoints_lib.checkpoints_dir(path).parent)  # `path` may be MODEL_DIR/checkpoints.
    step, damaged = checkpoints_lib.newest_readable_step(model_dir)
    step, meta = checkpoints_lib.read_checkpoint_meta(path, step=step)  # step None: its "no checkpoint" error.
    warn_damaged_once(model_dir, damaged, step)
    return cls(path=path, step=step, spec=run_spec_lib.from_meta(meta, where=path))

  def params(self) -> Any:
    """Every parameter saved at `step`, replicated over the devices (nested dicts of arrays)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import traverse_util
    from jax.sharding import NamedSharding, PartitionSpec

    from flax_xalign.training import partitioning

    directory = checkpoints_lib.checkpoints_dir(self.path)
    with checkpoints_lib.open_reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
      saved = traverse_util.flatten_dict(manager.item_metadata(self.step)[checkpoints_lib.STATE].tree["params"])
    replicated = NamedSharding(partitioning.make_mesh(1), PartitionSpec())
    abstract = {k: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=replicated) for k, m in saved.items()}
    return checkpoints_lib.restore_params(self.path, traverse_util.unflatten_dict(abstract), step=self.step)
