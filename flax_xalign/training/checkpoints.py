"""Orbax checkpoints: train state, data-iterator state and run metadata, together.

Each checkpoint step directory holds three items written by one
CheckpointManager (async, keep N, atomic finalisation by rename):
  state/          the TrainState (params, optimiser state, step), sharded arrays
  data_iterator/  the tf.data iterator of every process (tf.train.Checkpoint)
  meta/           JSON: model config, vocabulary fingerprint, languages, task
Resuming restores all three, so the next batch and the next RNG are the ones an
uninterrupted run would have used. `meta` is checked before anything is loaded:
a MODEL_DIR made with another vocabulary or model size is refused, not mixed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Mapping

import jax
import orbax.checkpoint as ocp
from etils import epath

from flax_xalign.errors import UserError

STATE, DATA_ITERATOR, META = "state", "data_iterator", "meta"
# Meta keys whose mismatch makes a checkpoint unusable for this run.
COMPATIBILITY_KEYS = ("vocabulary", "model", "languages")


class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves each process's tf.data iterator with tf.train.Checkpoint."""

  def _prefix(self, directory: epath.Path) -> epath.Path:
    return directory / f"process_{jax.process_index()}" / "iterator"

  def save(self, directory: epath.Path, args: "DataIteratorSave") -> None:
    import tensorflow as tf  # Only the data pipeline needs TF.

    prefix = self._prefix(directory)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tf.train.Checkpoint(iterator=args.iterator).write(str(prefix))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore") -> Any:
    import tensorflow as tf

    prefix = self._prefix(directory)
    if not prefix.parent.exists():
      raise UserError(
          f"{directory} has no data-iterator state for process {jax.process_index()}; "
          "resume with the same number of hosts that wrote the checkpoint."
      )
    tf.train.Checkpoint(iterator=args.iterator).read(str(prefix)).assert_consumed()
    return args.iterator


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When and how many checkpoints to keep."""

  every_steps: int = 100
  keep: int = 3
  async_save: bool = True


class Checkpointer:
  """A CheckpointManager under `<model_dir>/checkpoints` with our three items."""

  def __init__(self, model_dir: str, config: CheckpointConfig = CheckpointConfig()):
    self.directory = epath.Path(os.path.abspath(model_dir)) / "checkpoints"  # Orbax wants absolute.
    self.config = config
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=config.keep,
            create=True,
            enable_async_checkpointing=config.async_save,
        ),
        item_handlers={
            STATE: ocp.StandardCheckpointHandler(),
            DATA_ITERATOR: DataIteratorHandler(),
            META: ocp.JsonCheckpointHandler(),
        },
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def read_meta(self, step: int) -> dict[str, Any]:
    restored = self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
    return dict(restored[META])

  def check_compatible(self, step: int, meta: Mapping[str, Any]) -> None:
    """Refuses a checkpoint whose model, vocabulary or languages differ."""
    saved = self.read_meta(step)
    for key in COMPATIBILITY_KEYS:
      ours = json.loads(json.dumps(meta.get(key)))  # tuples -> lists, as saved
      if key in saved and saved[key] != ours:
        raise UserError(
            f"{self.directory} holds a checkpoint (step {step}) made with a different {key}:\n"
            f"  checkpoint: {json.dumps(saved[key], sort_keys=True)}\n"
            f"  this run:   {json.dumps(ours, sort_keys=True)}\n"
            "Use a new MODEL_DIR for this configuration, or rerun with the settings the "
            "checkpoint was made with. Nothing in the directory was changed."
        )

  def save(self, step: int, state: Any, iterator: Any, meta: Mapping[str, Any], *, force: bool = False) -> bool:
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardSave(state),
            DATA_ITERATOR: DataIteratorSave(iterator),
            META: ocp.args.JsonSave(dict(meta)),
        }),
        force=force,
    )
    if saved:
      logging.info("checkpoint for step %d started (async)", step)
    return saved

  def restore(self, step: int, abstract_state: Any, iterator: Any) -> Any:
    """Restores state onto the shardings carried by `abstract_state`."""
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.StandardRestore(abstract_state),
            DATA_ITERATOR: DataIteratorRestore(iterator),
        }),
    )
    return restored[STATE]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _checkpoints_dir(checkpoint_dir: str) -> epath.Path:
  """`checkpoint_dir` or its `checkpoints/` folder; never creates anything."""
  directory = epath.Path(os.path.abspath(checkpoint_dir))
  if (directory / "checkpoints").exists():
    directory = directory / "checkpoints"
  if not directory.exists():
    raise UserError(f"No checkpoints at {checkpoint_dir}; point at a MODEL_DIR that holds checkpoints/.")
  return directory


def _latest(manager: ocp.CheckpointManager, directory: epath.Path, step: int | None) -> int:
  step = manager.latest_step() if step is None else step
  if step is None:
    raise UserError(f"{directory} holds no finished checkpoint.")
  return step


def read_checkpoint_meta(checkpoint_dir: str, *, step: int | None = None) -> tuple[int, dict[str, Any]]:
  """(step, meta) of a checkpoint, read without creating or changing anything."""
  directory = _checkpoints_dir(checkpoint_dir)
  with ocp.CheckpointManager(directory, item_handlers={META: ocp.JsonCheckpointHandler()}) as manager:
    step = _latest(manager, directory, step)
    restored = manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
  return step, dict(restored[META])


def restore_params(checkpoint_dir: str, abstract_params: Any, *, step: int | None = None) -> Any:
  """Loads only the parameters of a training checkpoint (e.g. a warm start).

  Args:
    checkpoint_dir: a MODEL_DIR or its `checkpoints/` folder.
    abstract_params: ShapeDtypeStructs (with shardings) of the target params;
      may be a subset of the saved tree.
    step: which step; the latest by default.
  """
  directory = _checkpoints_dir(checkpoint_dir)
  with ocp.CheckpointManager(directory, item_handlers={STATE: ocp.PyTreeCheckpointHandler()}) as manager:
    step = _latest(manager, directory, step)
    target = {"params": abstract_params}
    restored = manager.restore(
        step,
        args=ocp.args.Composite(**{
            STATE: ocp.args.PyTreeRestore(
                item=target,
                restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                partial_restore=True,
            )
        }),
    )
  return restored[STATE]["params"]


def warm_start_params(checkpoint_dir: str, params: Any, *, step: int | None = None) -> tuple[Any, list[str]]:
  """Overwrites `params` with every parameter a checkpoint also has.

  For continued pretraining (XLM-Align starts from an MLM+TLM run): parameters
  the checkpoint lacks (e.g. a new objective's head) keep their fresh values.

  Args:
    checkpoint_dir: a MODEL_DIR or its `checkpoints/` folder.
    params: the freshly initialised (sharded) parameter tree, nested dicts.
    step: which step; the latest by default.

  Returns:
    (params, names of the parameters that were not in the checkpoint).

  Raises:
    UserError: a parameter exists in both with different shapes.
  """
  from flax import traverse_util

  directory = _checkpoints_dir(checkpoint_dir)
  with ocp.CheckpointManager(directory, item_handlers={STATE: ocp.PyTreeCheckpointHandler()}) as manager:
    step = _latest(manager, directory, step)
    saved_tree = manager.item_metadata(step)[STATE].tree["params"]
  saved = traverse_util.flatten_dict(saved_tree)
  ours = traverse_util.flatten_dict(params)
  mismatched = [f"{'/'.join(k)}: checkpoint {tuple(saved[k].shape)} vs model {tuple(v.shape)}"
                for k, v in ours.items() if k in saved and tuple(saved[k].shape) != tuple(v.shape)]
  if mismatched:
    raise UserError(
        f"Cannot warm-start from {checkpoint_dir}: parameter shapes differ:\n  " + "\n  ".join(mismatched[:10])
        + "\nUse the model size (and vocabulary, languages) the checkpoint was trained with.")
  present = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in ours.items() if k in saved}
  if not present:
    raise UserError(f"{checkpoint_dir} shares no parameter with this model; is it a flax_xalign checkpoint?")
  restored = restore_params(str(directory), traverse_util.unflatten_dict(present), step=step)
  merged = {**ours, **traverse_util.flatten_dict(restored)}
  missing = sorted("/".join(k) for k in ours if k not in saved)
  return traverse_util.unflatten_dict(merged), missing
