"""Reading a finished run's checkpoints: which steps exist, the manifest of a step, where its assets are.

The user-facing readers (`Run.open` is built on them; interop, reports and
tests call them directly). The Orbax items and the low-level reads that
training itself needs (a step's meta, its assets, parameters, a warm start)
are `training/checkpoints.py`'s, one layer down; nothing here creates or
changes a file.
"""

from __future__ import annotations

import os
from typing import Any

from etils import epath

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.run_dir import RunDir
from flax_xalign.training import checkpoints as checkpoints_lib
from flax_xalign.training.checkpoints import read_checkpoint_meta


def find_latest_step(model_dir: str) -> int | None:
  """The latest finished checkpoint step of MODEL_DIR, or None (no checkpoints/ folder, or no finished step)."""
  directory = epath.Path(os.path.abspath(RunDir(model_dir).checkpoints))
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
