"""The errors of reading a checkpoint step, shared by the checkpointer and the data positions it saves.

`checkpoints.py` (the Checkpointer) and `data_positions.py` (the data iterator's saved position, an item
of every step) both report a damaged step the same way; this module is what both import, so neither
imports the other's.
"""

from __future__ import annotations

import re
from typing import Any

from etils import epath

from flax_xalign.errors import UserError
from flax_xalign.run_dir import DAMAGED

DAMAGED_DIR = DAMAGED


class DamagedCheckpointError(UserError):
  """A checkpoint step whose files are missing, truncated or unreadable.

  Attributes:
    step_dir: the step's folder.
    step: its step number.
    what: what is wrong, e.g. "state/ is missing".
  """

  def __init__(self, step_dir: Any, what: str):
    self.step_dir, self.what = epath.Path(step_dir), what
    self.step = int(self.step_dir.name)
    model_dir = self.step_dir.parent.parent
    super().__init__(
        f"checkpoint step {self.step} of {model_dir} is damaged ({what}). Move {self.step_dir} out of "
        f"{self.step_dir.parent} to resume from the previous step, or add "
        '--gin.CheckpointConfig.on_damaged="fallback" to have the run do that (into '
        f"{model_dir / DAMAGED_DIR}).")


def first_line(error: BaseException) -> str:
  """`Type: first line` of an error, without TF's op prefix or TensorStore's spec dump."""
  text = str(error).strip().splitlines()
  line = re.sub(r"\{\{[^}]*\}\}\s*", "", text[0] if text else "").split(" See full TensorStore details")[0]
  return f"{type(error).__name__}: {line[:160]}" if line else type(error).__name__


def fresh_iterator_advice() -> str:
  return ("Rerun with the checkpoint's values, or add --gin.train.fresh_data_iterator=True to resume the "
          "model with a new data iterator (the data order then starts over).")
