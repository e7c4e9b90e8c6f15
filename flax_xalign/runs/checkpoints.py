"""Reading a finished run's checkpoints: which steps exist, the manifest of a step, where its assets are.

The user-facing readers (`Run.open` is built on them; interop, reports and
tests call them directly). The Orbax items and the low-level reads that
training itself needs (a step's meta, its assets, parameters, a warm start)
are `training/checkpoints.py`'s, one layer down; nothing here creates or
changes a file.
"""

from __future__ import annotations

import os
import re
from typing import Any

from etils import epath

from flax_xalign import run_spec as run_spec_lib
from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.run_dir import RunDir
from flax_xalign.training import checkpoints as checkpoints_lib
from flax_xalign.training.checkpoints import DamagedCheckpointError, read_checkpoint_meta


def find_latest_step(model_dir: str) -> int | None:
  """The latest finished checkpoint step of MODEL_DIR, or None (no checkpoints/ folder, or no finished step)."""
  directory = storage.epath_of(RunDir(model_dir).checkpoints)
  if not directory.exists():  # Checked first: a manager would create checkpoints/ in a mistyped path.
    return None
  with checkpoints_lib.open_reader(directory) as manager:
    return manager.latest_step()


def read_run_spec(checkpoint_dir: str, *, step: int | None = None
                  ) -> tuple[int, run_spec_lib.RunSpec, dict[str, Any]]:
  """(step, run manifest, that step's asset fingerprints) of a MODEL_DIR or its checkpoints/ (latest by default)."""
  step, meta = read_checkpoint_meta(checkpoint_dir, step=step)
  run = run_spec_lib.from_meta(meta, where=checkpoint_dir)
  return step, run, dict(meta.get(checkpoints_lib.ASSETS, {}))


def read_run_at(model_dir: str, step: int) -> tuple[run_spec_lib.RunSpec, dict[str, Any]]:
  """(manifest, asset fingerprints) of one checkpoint step."""
  _, run, fingerprints = read_run_spec(model_dir, step=step)
  return run, fingerprints


def step_assets_dir(checkpoint_dir: str, step: int) -> str:
  """The `assets/` folder of a checkpoint step; UserError when there is no checkpoints folder."""
  return os.fspath(checkpoints_lib.checkpoints_dir(checkpoint_dir) / str(step) / checkpoints_lib.ASSETS)


def check_params_readable(checkpoint_dir: str, step: int) -> None:
  """DamagedCheckpointError unless every parameter saved at `step` reads back.

  The parameters are read into host memory and dropped: a truncated, emptied
  or deleted file under `state/` shows only when its bytes are read (Orbax's
  metadata records no file sizes). One read of the parameters, not of the
  optimiser state; the reader's restore that follows finds them in the page
  cache.
  """
  import jax
  import numpy as np
  import orbax.checkpoint as ocp

  directory = checkpoints_lib.checkpoints_dir(checkpoint_dir)
  step_dir = directory / str(step)
  state = checkpoints_lib.STATE
  _check_state_files(step_dir)
  try:
    with checkpoints_lib.open_reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
      metadata = manager.item_metadata(step)[state]
      if metadata is None or "params" not in metadata.tree:
        raise ValueError("its metadata (state/_METADATA) is missing or names no parameters")
      tree = metadata.tree["params"]
      target = {"params": jax.tree.map(lambda _: np.zeros((), np.float32), tree)}
      restore_args = {"params": jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)}
      manager.restore(step, args=ocp.args.Composite(**{state: ocp.args.PyTreeRestore(
          item=target, restore_args=restore_args, partial_restore=True)}))
  except DamagedCheckpointError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (Orbax's traceback becomes what is wrong, one line)
    read = _TENSORSTORE_READ.match(str(e))
    if read:  # TensorStore's message is a page long; its status and the array it failed on say enough.
      raise DamagedCheckpointError(step_dir, f"{state}/ is truncated or partly deleted: {read.group(1)} reading "
                                             f"{read.group(2).split('/')[0]}") from None
    raise checkpoints_lib.damage_of(step_dir, state, e) from None


def _check_state_files(step_dir: epath.Path) -> None:
  """DamagedCheckpointError when the step's `state/` or its `_METADATA` is missing."""
  for part in ("", "_METADATA"):
    if not (step_dir / checkpoints_lib.STATE / part).exists():
      raise DamagedCheckpointError(step_dir, f"{checkpoints_lib.STATE}/{part} is missing")


# "OUT_OF_RANGE: Error reading "params.x.kernel/0.0" in OCDBT database at ...": status and array name.
_TENSORSTORE_READ = re.compile(r'^\s*([A-Z_]+):.*?Error reading "([^"]+)"', re.DOTALL)


# Steps whose parameters read back in this process, by the (path, size, mtime) of every file under their
# state/: a run opened again (a driver scoring two things) is not read twice to know it is complete, and a
# file truncated or removed since is seen.
_READ_BACK: set[int] = set()


def _state_files_key(state_dir: str) -> int:
  if storage.is_url(state_dir):  # A bucket: each object's generation changes whenever it is rewritten.
    fs, inner = storage.filesystem(state_dir)
    try:
      found = fs.find(inner, detail=True)
    except FileNotFoundError:
      found = {}
    entries = [(name, int(info.get("size") or 0), str(info.get("generation") or info.get("updated") or ""))
               for name, info in found.items()]
    return hash((storage.absolute(state_dir), tuple(sorted(entries))))
  entries = []
  for folder, _, names in os.walk(state_dir):
    for name in names:
      path = os.path.join(folder, name)
      try:
        stat = os.stat(path)
      except OSError:
        continue
      entries.append((path, stat.st_size, stat.st_mtime_ns))
  return hash((os.path.realpath(state_dir), tuple(sorted(entries))))


def _check_once(checkpoint_dir: str, step: int) -> None:
  state_dir = os.path.join(os.fspath(checkpoints_lib.checkpoints_dir(checkpoint_dir)), str(step),
                           checkpoints_lib.STATE)
  key = _state_files_key(state_dir)
  if key not in _READ_BACK:
    check_params_readable(checkpoint_dir, step)
    _READ_BACK.add(key)


def newest_complete_step(model_dir: str) -> tuple[int | None, list[DamagedCheckpointError]]:
  """(the newest step whose manifest and parameters read back, the damaged newer ones); moves nothing.

  What every reader opens by default (`Run.open`). UserError when steps
  exist but none is complete.
  """
  return checkpoints_lib.newest_readable_step(model_dir, check=_check_once)


def check_requested_step(model_dir: str, step: int) -> None:
  """One-line UserError when an explicitly requested `step` is not there or its manifest or `state/` is
  missing (never a silent fallback). Its parameters are not read here: `Run.params` says so in the same
  words when they do not read back."""
  directory = checkpoints_lib.checkpoints_dir(model_dir)
  steps = sorted(int(n.name) for n in directory.iterdir() if n.name.isdigit())
  if step not in steps:
    raise UserError(f"{model_dir} has no checkpoint step {step} (its steps: {', '.join(map(str, steps)) or 'none'}); "
                    "ask for one of them, or leave the step out for the newest complete one.")
  try:
    read_checkpoint_meta(model_dir, step=step)
    _check_state_files(directory / str(step))
  except DamagedCheckpointError as e:
    raise requested_step_damaged(model_dir, e) from None


def requested_step_damaged(model_dir: str, error: DamagedCheckpointError) -> UserError:
  """The reader's one line for a damaged step it was asked for (training's advice to move it does not apply)."""
  return UserError(f"checkpoint step {error.step} of {model_dir} is damaged ({error.what}); ask for another "
                   "step, or leave the step out for the newest complete one.")
