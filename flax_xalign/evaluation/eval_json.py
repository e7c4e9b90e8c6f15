"""MODEL_DIR/eval.json has two layouts; neither writer replaces the other's file.

`python -m flax_xalign.eval` writes the masked-token accuracy of `evaluate`
(`{"step", "task", "split", "languages", ...}`) or, with EVALS, the
registered evaluators' results keyed by evaluator (`{"mlm": {...},
"word_align": {...}}`), both to eval.json by default. A file of the other
layout is refused before any work, with the setting that writes elsewhere.
"""

from __future__ import annotations

import json
import os

from flax_xalign import storage
from flax_xalign.errors import UserError

MLM, EVALUATORS = "masked-token accuracy (evaluate)", "evaluators' results (EVALS)"


def layout_of(path: str) -> str | None:
  """MLM, EVALUATORS, or None (no file, or not a JSON object either writer made)."""
  try:
    with storage.open_file(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(data, dict) or not data:
    return None
  if "step" in data and "split" in data:
    return MLM
  if all(isinstance(v, dict) for v in data.values()):
    return EVALUATORS
  return None


def check_layout(path: str, layout: str, *, setting: str) -> None:
  """UserError when `path` holds the other layout (`setting` is the flag that names another file)."""
  found = layout_of(path)
  if found is not None and found != layout:
    name = os.path.basename(path)
    other = "evaluators.json" if layout == EVALUATORS else "eval_mlm.json"
    raise UserError(f"{path} holds the {found}, and this command would replace it with the {layout}; write to "
                    f"another file with --gin.{setting}=\"'{other}'\", or move {name} aside.")
