"""Whether a checkpoint fits this run: settings compared before a restore, and a restore's target checked.

A checkpoint that does not fit is a *settings* problem, never damage: its
step is left where it is (only unreadable or inconsistent files are moved to
checkpoints_damaged/, `checkpoints.DamagedCheckpointError`). Two checks, in
the order a resume meets them:

* `check_compatible` compares the saved run manifest with this run's before
  anything is restored: the vocabulary, language set, model (naming each
  EncoderConfig field that differs), pair layout, and the optimiser settings
  that shape the saved optimiser state (`optimizer.state_settings`).
* `check_state_layout` compares a restore's target tree with the state's
  saved metadata (array paths, shapes, dtypes) just before the bytes are
  read, for whatever the manifest cannot tell (a caller that skipped the
  first check, a release whose optimiser chain changed); `is_layout_error`
  recognises Orbax's own words for the same, should a mismatch get past it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.training import optimizer as optimizer_lib

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

# Run-manifest fields whose mismatch makes a checkpoint unusable for this run (languages before the model:
# the model's num_languages follows from them, and the languages are the difference a user made).
COMPATIBILITY_FIELDS = ("vocabulary", "languages", "model", "pair_layout", "bitext_both_directions")
_KEEP = ("Use a new MODEL_DIR for this configuration, or rerun with the settings the checkpoint was made "
         "with. Nothing in the directory was changed.")
# How each of `optimizer.state_settings` shapes the saved optimiser state.
_SHAPES = {"trainable": "frozen parameters add entries to the state",
           "mu_dtype": "the dtype the first moment is stored in"}
# What Orbax says when a restore's target does not fit the saved tree (tree, then shape).
_ORBAX_LAYOUT = re.compile(r"tree structures do not match|is not compatible with the stored shape")


def _gin(value: Any) -> str:
  """A value as gin (Python) spells it: 'bfloat16', ['mlm_head'], None, 2."""
  return repr(list(value) if isinstance(value, tuple) else value)


def model_differences(theirs: Any, ours: Any) -> list[str]:
  """'EncoderConfig.num_layers: 2 in the checkpoint, 3 in this run' for each field that differs.

  The attention kernel computes the same function on the same parameters: a
  run may resume on another backend with another one.
  """
  a, b = ({k: v for k, v in dataclasses.asdict(c).items() if k != "attention_implementation"}
          for c in (theirs, ours))
  return [f"EncoderConfig.{k}: {_gin(a.get(k))} in the checkpoint, {_gin(b.get(k))} in this run"
          for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_compatible(saved: "RunSpec", run: "RunSpec", *, where: str, model_dir: str | None = None) -> None:
  """Refuses to resume when vocabulary, languages, model, bitext layout or the optimiser state's shape differ.

  `where` (the checkpoints folder) is what the messages name; `model_dir`
  the run a warm start of a new MODEL_DIR would name (default `where`).
  """
  for field in COMPATIBILITY_FIELDS:
    ours, theirs = getattr(run, field), getattr(saved, field)
    if field == "model":
      differ = model_differences(theirs, ours)
      if differ:
        raise UserError(f"{where} holds a checkpoint made with a different model: {'; '.join(differ)}. {_KEEP}")
      continue
    if field == "vocabulary":
      ours, theirs = ours.fingerprint(), theirs.fingerprint()
    elif field == "languages":
      ours, theirs = list(ours), list(theirs)
    if ours != theirs:
      raise UserError(
          f"{where} holds a checkpoint made with a different {field}:\n"
          f"  checkpoint: {json.dumps(theirs, sort_keys=True)}\n"
          f"  this run:   {json.dumps(ours, sort_keys=True)}\n{_KEEP}")
  check_optimizer_state(saved, run, where=where, model_dir=model_dir or where)


def check_optimizer_state(saved: "RunSpec", run: "RunSpec", *, where: str, model_dir: str) -> None:
  """One-line UserError when the optimiser settings that shape its saved state differ (T16).

  A manifest from before the optimiser was recorded (`optimizer` {}) is
  not compared; `check_state_layout` still sees a state that does not fit.
  """
  if not saved.optimizer:
    return
  theirs = optimizer_lib.state_settings(saved.optimizer, param_dtype=saved.model.param_dtype)
  ours = optimizer_lib.state_settings(run.optimizer, param_dtype=run.model.param_dtype)
  differ = [key for key in theirs if theirs[key] != ours.get(key)]
  if not differ:
    return
  named = "; ".join(f"OptimizerConfig.{k}={_gin(saved.optimizer.get(k))} in the checkpoint, "
                    f"{_gin(run.optimizer.get(k))} in this run ({_SHAPES[k]})" for k in differ)
  flags = " ".join(f"--gin.OptimizerConfig.{k}=\"{_gin(saved.optimizer.get(k))}\"" for k in differ)
  raise UserError(
      f"{where} holds checkpoints whose optimiser state does not fit this run's: {named}. They are not "
      f"damaged and nothing was changed. Rerun with {flags}, or train in a new MODEL_DIR "
      f"(--gin.INIT_FROM_CHECKPOINT=\"'{model_dir}'\" starts it from these parameters).")


def _flat(tree: Any) -> dict[str, Any]:
  """{'opt_state/1/0/mu/encoder/k': leaf} of a saved metadata tree or a restore target (arrays only)."""
  import orbax.checkpoint as ocp

  serialised = ocp.tree.serialize_tree(tree, keep_empty_nodes=True)  # Our types as Orbax saves them: dicts, lists.
  return {"/".join(map(str, path)): leaf for path, leaf in ocp.tree.to_flat_dict(serialised).items()
          if hasattr(leaf, "shape")}


def state_differences(saved_tree: Any, target: Any) -> list[str]:
  """What keeps `target` from restoring `saved_tree` (a state's saved metadata tree): paths, shapes, dtypes."""
  saved, ours = _flat(saved_tree), _flat(target)
  out = []
  for label, names in (("only in the checkpoint", sorted(set(saved) - set(ours))),
                       ("only in this run", sorted(set(ours) - set(saved)))):
    if names:
      out.append(f"{len(names)} array(s) {label} (e.g. {names[0]})")
  for name in sorted(set(saved) & set(ours)):
    a, b = saved[name], ours[name]
    if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
      out.append(f"{name}: {tuple(a.shape)} {np.dtype(a.dtype)} in the checkpoint, "
                 f"{tuple(b.shape)} {np.dtype(b.dtype)} in this run")
  return out


def layout_error(step_dir: Any, differences: Sequence[str] = ()) -> UserError:
  """The one line for a train state that does not fit the restore's target (not damage: nothing is moved)."""
  tops = {d.split("(e.g. ")[-1].split("/")[0].split(":")[0] for d in differences}
  settings = [s for top, s in (("opt_state", "OptimizerConfig.trainable or OptimizerConfig.mu_dtype"),
                               ("params", "the model (EncoderConfig, the objectives and their heads)"))
              if top in tops] or ["the optimiser or the model"]
  found = f" ({'; '.join(differences[:3])})" if differences else ""
  return UserError(
      f"checkpoint step {int(step_dir.name)} of {step_dir.parent.parent} holds a train state of another layout "
      f"than this run's{found}: {' or '.join(settings)} differ(s) from the settings it was trained with (or "
      "another flax_xalign release wrote it). It is not damaged and nothing was moved; rerun with the settings "
      "it was trained with, or use a new MODEL_DIR.")


def check_state_layout(step_dir: Any, saved_tree: Any, target: Any) -> None:
  """`layout_error` when `target` (the restore's abstract state) does not fit the saved metadata tree."""
  differences = state_differences(saved_tree, target)
  if differences:
    raise layout_error(step_dir, differences)


def is_layout_error(error: BaseException) -> bool:
  """Whether a failed restore is Orbax refusing a target that does not fit the saved tree (no byte was read)."""
  return bool(_ORBAX_LAYOUT.search(str(error)))
