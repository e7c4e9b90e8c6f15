"""Orbax checkpoints: train state, data iterator, run manifest and assets, together.

Each checkpoint step directory holds four items written by one
CheckpointManager (async, keep N, atomic finalisation by rename):
  state/          the TrainState (params, optimiser state, step), sharded arrays
  data_iterator/  the data position of every process, in the item of the
                  data source that made the iterator (`DataSource.position`):
                  seqio's tf.data iterator as a tf.train.Checkpoint in
                  `data_iterator/`, a packed cache's Grain position as JSON
                  in `data_iterator_cache/`
  meta/           JSON: the run manifest (`run`, a RunSpec) and the
                  fingerprint of every asset at this step (`assets`)
  assets/         the assets' files at this step (dictionary.tsv, vocabulary
                  model, ...), written by each asset's own `save`
Resuming restores all four, so the next batch, the next RNG and the assets are
the ones an uninterrupted run would have used; restored asset files are checked
against the fingerprints in `meta`, so a file edited by hand is refused, never
trained with. `meta` is checked before anything is loaded: a MODEL_DIR made
with another vocabulary, model size or language set is refused, not mixed.
`meta` also records the data loop (`loop`: batch size, row lengths, task,
shards, seed, processes), since the iterator state only fits the pipeline that
wrote it.

A step whose files are missing, truncated or unreadable is *damaged*
(`DamagedCheckpointError`); one that does not fit this run's settings
(`checkpoint_fit`), or that the accelerator had no memory to restore, is not,
and stays where it is. With `CheckpointConfig.on_damaged="fallback"` (the
default) the run moves a damaged step to `MODEL_DIR/checkpoints_damaged/<step>`
(nothing is deleted) and resumes from the newest complete step; with "error"
it stops and says what to do. Disk-full errors while saving become one UserError, and the
temporary folder of the failed save is removed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from typing import Any, Callable, Mapping

import jax
import orbax.checkpoint as ocp
from etils import epath

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.assets.base import Asset, check_fingerprint
from flax_xalign.errors import UserError
from flax_xalign import storage
from flax_xalign.run_dir import CHECKPOINTS, DAMAGED, RunDir
from flax_xalign.training import checkpoint_fit, data_positions
from flax_xalign.training.checkpoint_errors import (  # noqa: F401  (checkpoints.DamagedCheckpointError: callers')
    DamagedCheckpointError, first_line, fresh_iterator_advice)
# The resume checks live beside the restore's own (checkpoint_fit); callers know them by these names too.
from flax_xalign.training.checkpoint_fit import COMPATIBILITY_FIELDS, check_compatible  # noqa: F401
# Orbax's noise around a failed save or restore is dropped by checkpoint_noise.install(), which the
# command-line process set-up calls (flax_xalign.cli.setup_process); a library import installs nothing.
from flax_xalign.training.checkpoint_noise import (  # pylint: disable=g-importing-member
    bound_store_retries as _bound_store_retries, disk_full as _disk_full, no_space_reason as _no_space_reason,
    out_of_memory as _out_of_memory, remove_failed_save as _remove_failed_save, store_error as _store_error)
from flax_xalign.training.data_positions import SEQIO_POSITION, DataPosition

STATE, META, ASSETS = "state", "meta", "assets"
LOOP = "loop"  # The meta entry describing the data loop the iterator state belongs to.
STEP_KEY = "step"  # The meta entry naming the step a folder was saved as.
LOG_INTERVAL = "log_interval"  # The meta entry with the metrics of the steps saved but not logged yet.
DAMAGED_DIR = DAMAGED
ON_DAMAGED = ("fallback", "error")
# The data-loop settings an iterator state depends on, with the setting a user changes for each.
LOOP_SETTINGS = (("batch_size", "BATCH_SIZE"), ("task_feature_lengths", "TASK_FEATURE_LENGTHS"),
                 ("task", "MIXTURE_OR_TASK_NAME"), ("data_shards", "train.data_shards"), ("seed", "train.seed"),
                 ("data", "train.data"))
LOOP_DEFAULTS = {"data": "seqio"}  # Records from before a setting was recorded hold its default.


class AssetsHandler(ocp.CheckpointHandler):
  """Writes each asset's files with its own `save` (the chief process only)."""

  def save(self, directory: epath.Path, args: "AssetsSave") -> None:
    if jax.process_index() != 0:
      return
    directory.mkdir(parents=True, exist_ok=True)
    for name, asset in args.assets.items():
      asset.save(os.fspath(directory), args.values[name])

  def restore(self, directory: epath.Path, args: "AssetsRestore") -> dict[str, Any]:
    return {name: asset.load(os.fspath(directory)) for name, asset in args.assets.items()}


@ocp.args.register_with_handler(AssetsHandler, for_save=True)
@dataclasses.dataclass
class AssetsSave(ocp.args.CheckpointArgs):
  assets: Mapping[str, Asset]
  values: Mapping[str, Any]


@ocp.args.register_with_handler(AssetsHandler, for_restore=True)
@dataclasses.dataclass
class AssetsRestore(ocp.args.CheckpointArgs):
  assets: Mapping[str, Asset]


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """When and how many checkpoints to keep, and what a damaged newest step does.

  Attributes:
    on_damaged: "fallback" moves a damaged step to MODEL_DIR/checkpoints_damaged/
      and resumes from the newest complete one; "error" stops with a message.
  """

  every_steps: int = 100
  keep: int = 3
  async_save: bool = True
  on_damaged: str = "fallback"


def check_config(config: CheckpointConfig) -> None:
  """UserError for an `on_damaged` not in ON_DAMAGED or a non-bool `async_save` (counts: validate.py)."""
  if not isinstance(config.async_save, bool):
    raise UserError(f"CheckpointConfig.async_save={config.async_save!r} must be True or False (unquoted); "
                    "e.g. --gin.CheckpointConfig.async_save=False.")
  if config.on_damaged not in ON_DAMAGED:
    raise UserError(f"CheckpointConfig.on_damaged={config.on_damaged!r} is not one of {', '.join(ON_DAMAGED)}; "
                    'e.g. --gin.CheckpointConfig.on_damaged="fallback".')


def loop_differences(saved: Mapping[str, Any] | None, loop: Mapping[str, Any]) -> list[str]:
  """'BATCH_SIZE=16 ... this run 32' for each data-loop setting that differs ([] without a record)."""
  if not saved:
    return []  # A checkpoint from before the loop was recorded: nothing to compare.
  out = []
  for key, setting in LOOP_SETTINGS:
    theirs, ours = saved.get(key, LOOP_DEFAULTS.get(key)), loop.get(key)
    if (key in saved or key in LOOP_DEFAULTS) and json.dumps(theirs, sort_keys=True) != json.dumps(ours, sort_keys=True):
      out.append(f"{setting}={json.dumps(theirs, sort_keys=True)}, this run {json.dumps(ours, sort_keys=True)}")
  return out


def check_loop(saved: Mapping[str, Any] | None, loop: Mapping[str, Any], *, step: int, where: str) -> None:
  """Refuses to restore an iterator written by another data loop (C6); names every difference."""
  differ = loop_differences(saved, loop)
  if differ:
    raise UserError(f"checkpoint step {step} of {where} was trained with another data loop:\n  "
                    + "\n  ".join(differ) + "\n  " + fresh_iterator_advice())


def make_meta(run: "run_spec_lib.RunSpec", asset_fingerprints: Mapping[str, Any],
              loop: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """The `meta` item: the manifest, this step's asset fingerprints and the data loop (`loop_record`)."""
  meta = {run_spec_lib.META_KEY: run.to_json(), ASSETS: json.loads(json.dumps(dict(asset_fingerprints)))}
  if loop is not None:
    meta[LOOP] = json.loads(json.dumps(dict(loop)))
  return meta


def loop_record(*, batch_size: int, task_feature_lengths: Mapping[str, int], task: str,
                data_shards: int | None, seed: int, train_steps: int, source: str = "seqio") -> dict[str, Any]:
  """What the data iterator's state depends on (compared on resume), plus TRAIN_STEPS and the processes.

  `source` is the backend ("seqio" or "cache"), not the cache's folder: a
  cache may move; its position records which rows it belongs to.
  """
  return {"batch_size": int(batch_size), "task_feature_lengths": {k: int(v) for k, v in task_feature_lengths.items()},
          "task": task, "data_shards": data_shards or jax.process_count(), "seed": int(seed),
          "train_steps": int(train_steps), "processes": jax.process_count(), "data": source}


def check_meta_step(step_dir: epath.Path, meta: Mapping[str, Any]) -> None:
  """DamagedCheckpointError when the meta of a step folder records another step (the folder was renamed)."""
  recorded = meta.get(STEP_KEY)
  if recorded is not None and int(recorded) != int(step_dir.name):
    raise DamagedCheckpointError(step_dir, f"it holds the files of step {int(recorded)}: the folder was renamed; "
                                           f"name it {int(recorded)} again")


def damage_of(step_dir: epath.Path, item: str, error: BaseException) -> UserError:
  """What a failed read of `item` means: missing or unreadable (DamagedCheckpointError: an older step may be
  asked for), or what says nothing about the files: an accelerator out of memory while restoring (seen on
  a GPU shared by ten processes: every step would have been "damaged"), or a restore target that does not
  fit the saved tree (other settings: `checkpoint_fit`)."""
  if not (step_dir / item).exists():
    return DamagedCheckpointError(step_dir, f"{item}/ is missing")
  if checkpoint_fit.is_layout_error(error):
    return checkpoint_fit.layout_error(step_dir)
  if _out_of_memory(error):
    return UserError(f"out of accelerator memory restoring {step_dir}/{item} ({first_line(error)}); the "
                     "checkpoint is not damaged. Free the accelerator (other processes on it hold memory; "
                     "XLA_PYTHON_CLIENT_MEM_FRACTION caps each one) and rerun.")
  return DamagedCheckpointError(step_dir, f"{item}/ is unreadable: {first_line(error)}")


class Checkpointer:
  """A CheckpointManager under `<model_dir>/checkpoints` with our four items.

  `position` is the item the iterators handed to `save`/`restore` keep their
  place in: the data source's (`DataSource.position`); the default is a
  tf.data iterator's, as every run before the packed cache wrote.
  """

  def __init__(self, model_dir: str, config: CheckpointConfig = CheckpointConfig(), *,
               position: DataPosition = SEQIO_POSITION):
    self.directory = storage.epath_of(RunDir.of(model_dir).checkpoints)  # Orbax wants absolute (or a URL).
    if storage.is_url(os.fspath(self.directory)):
      _bound_store_retries()
    self.config, self.position = config, position
    self._saving: int | None = None
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=config.keep,
            create=True,
            enable_async_checkpointing=config.async_save,
        ),
        item_handlers={
            STATE: ocp.StandardCheckpointHandler(),
            **data_positions.handlers(),
            META: ocp.JsonCheckpointHandler(),
            ASSETS: AssetsHandler(),
        },
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def read_meta(self, step: int) -> dict[str, Any]:
    """The `meta` item of `step`; DamagedCheckpointError when it is missing or unreadable."""
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
      meta = restored[META]
      if not isinstance(meta, Mapping):
        raise ValueError(f"holds a {type(meta).__name__}, not an object")
    except Exception as e:  # pylint: disable=broad-except
      raise damage_of(self.directory / str(step), META, e) from None
    return dict(meta)

  def read_run(self, step: int) -> tuple["run_spec_lib.RunSpec", dict[str, Any]]:
    """(the manifest, this step's asset fingerprints); one clear error for pre-manifest runs."""
    meta = self.read_meta(step)
    run = run_spec_lib.from_meta(meta, where=f"{self.directory.parent}")
    return run, dict(meta.get(ASSETS, {}))

  def save(self, step: int, state: Any, iterator: Any, meta: Mapping[str, Any], *,
           assets: Mapping[str, Asset] | None = None, asset_values: Mapping[str, Any] | None = None,
           force: bool = False) -> bool:
    # The step is recorded in meta too: a renamed step folder is then seen for what it is.
    items = {STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave({**dict(meta), STEP_KEY: int(step)})}
    if iterator is not None:  # None: an imported model, which no data has touched yet.
      items[self.position.item] = self.position.save_args(iterator)
    if assets:
      items[ASSETS] = AssetsSave(dict(assets), dict(asset_values or {}))
    with self._no_space_guard():  # A previous async save's error surfaces here.
      self._saving = step
      saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
    if saved:
      logging.info("checkpoint for step %d started (async)", step)
    return saved

  def _no_space_guard(self):
    import contextlib

    @contextlib.contextmanager
    def guard():
      try:
        yield
      except Exception as e:  # pylint: disable=broad-except
        if not _disk_full(e):
          if storage.is_url(os.fspath(self.directory)) and not isinstance(e, UserError):
            self._saving = None  # (an async save fails at the next save or wait: which step it was is not known)
            raise _store_error(self.directory, first_line(e)) from None
          raise
        step, self._saving = self._saving, None
        self._remove_tmp(step)
        where = self.directory / str(step) if step is not None else self.directory
        raise UserError(f"no space left writing {where} ({_no_space_reason(e)}); free space or choose another "
                        "MODEL_DIR. The checkpoints before it are intact; rerun the same command to resume."
                        ) from None

    return guard()

  def _remove_tmp(self, step: int | None) -> None:
    """Removes the temporary folder of a save that failed (ours, never a finished step)."""
    if jax.process_index() != 0 or step is None or not self.directory.exists():
      return
    _remove_failed_save(os.fspath(self.directory), step)

  def check_step(self, step: int, items: tuple[str, ...] | None = None) -> None:
    """DamagedCheckpointError when one of `items` (default: state, the data position, meta) is missing."""
    step_dir = self.directory / str(step)
    for item in items or (STATE, self.position.item, META):
      if not (step_dir / item).exists():
        raise DamagedCheckpointError(step_dir, f"{item}/ is missing")

  def restore(self, step: int, abstract_state: Any, iterator: Any, *,
              assets: Mapping[str, Asset] | None = None) -> tuple[Any, dict[str, Any]]:
    """(state on the shardings of `abstract_state`, asset values checked against `meta`).

    `iterator` None leaves the data iterator alone (a fresh one). Assets the
    checkpoint does not hold (an objective added on resume) are left out of
    the returned values. Raises DamagedCheckpointError naming what is missing
    or unreadable; a state whose saved tree does not fit `abstract_state`
    (other settings) and an iterator state that reads back but does not fit
    the iterator are UserErrors that move nothing.
    """
    step_dir = self.directory / str(step)
    _, fingerprints = self.read_run(step)
    position = self.position if iterator is not None else None
    self.check_step(step, (STATE, META) + ((position.item,) if position else ()))
    if not (step_dir / STATE / "_METADATA").exists():
      raise DamagedCheckpointError(step_dir, f"{STATE}/ is unreadable: its _METADATA is missing")
    try:  # The target is checked against the saved tree first: a misfit is other settings, never damage.
      saved_tree = self._manager.item_metadata(step)[STATE]
    except Exception as e:  # pylint: disable=broad-except
      raise damage_of(step_dir, STATE, e) from None
    if saved_tree is not None:
      checkpoint_fit.check_state_layout(step_dir, saved_tree.tree, abstract_state)
    try:
      state = self._manager.restore(step, args=ocp.args.Composite(**{
          STATE: ocp.args.StandardRestore(abstract_state)}))[STATE]
    except Exception as e:  # pylint: disable=broad-except
      raise damage_of(step_dir, STATE, e) from None
    if position is not None:
      try:
        self._manager.restore(step, args=ocp.args.Composite(**{position.item: position.restore_args(iterator)}))
      except UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        problem = position.files_problem(step_dir)
        if problem:
          raise DamagedCheckpointError(step_dir, problem) from None
        raise UserError(f"the data-iterator state of checkpoint step {step} does not fit this run's input "
                        f"pipeline ({first_line(e)}). {fresh_iterator_advice()}") from None
    saved_assets = {n: a for n, a in (assets or {}).items() if n in fingerprints}
    values = {}
    if saved_assets:
      try:
        values = dict(self._manager.restore(step, args=ocp.args.Composite(**{
            ASSETS: AssetsRestore(saved_assets)}))[ASSETS])
      except UserError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        raise damage_of(step_dir, ASSETS, e) from None
    where = os.fspath(step_dir / ASSETS)
    for name, value in values.items():
      check_fingerprint(saved_assets[name], value, fingerprints[name], where=where)
    return state, values

  def move_damaged(self, error: DamagedCheckpointError) -> epath.Path:
    """Moves a damaged step to MODEL_DIR/checkpoints_damaged/<step> (process 0; all processes wait)."""
    target = move_damaged_step(error)
    self._manager.reload()
    return target

  def wait(self) -> None:
    with self._no_space_guard():
      self._manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()


def move_damaged_step(error: DamagedCheckpointError) -> epath.Path:
  """Moves `error.step_dir` to MODEL_DIR/checkpoints_damaged/<step> (or <step>.1, ...); nothing is deleted.

  Process 0 moves; every process then waits for it, so all see the same steps.
  """
  base = error.step_dir.parent.parent / DAMAGED_DIR
  target, n = base / str(error.step), 0
  while target.exists():
    n += 1
    target = base / f"{error.step}.{n}"
  if jax.process_index() == 0:
    base.mkdir(parents=True, exist_ok=True)
    storage.move(os.fspath(error.step_dir), os.fspath(target))  # (a bucket: a copy, then the delete)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"moved damaged checkpoint {error.step}")
  return target


def warn_damaged(error: DamagedCheckpointError, target: epath.Path, resume_step: int) -> None:
  if jax.process_index() == 0:
    print(f"warning: checkpoint step {error.step} of {error.step_dir.parent.parent} is damaged ({error.what}); "
          f"moved it to {target} and resuming from step {resume_step}", file=sys.stderr, flush=True)


def newest_readable_step(model_dir: str, *, on_damaged: str = "fallback",
                         check: Callable[[str, int], None] | None = None
                         ) -> tuple[int | None, list[DamagedCheckpointError]]:
  """(the newest step whose meta and items are there, the damaged newer ones); moves nothing.

  With `on_damaged="error"` the first damaged step raises. UserError when
  steps exist but none is complete. `check(checkpoints_dir, step)` may
  raise DamagedCheckpointError for a candidate whose files are there but do
  not read back (the readers' `runs.checkpoints.check_params_readable`);
  training passes none: its restore reads the whole state and moves a step
  it cannot read.
  """
  directory = storage.epath_of(RunDir.of(model_dir).checkpoints)
  if not directory.exists():
    return None, []
  damaged = []
  with open_reader(directory) as manager:
    steps = sorted(manager.all_steps(), reverse=True)
    for step in steps:
      step_dir = directory / str(step)
      try:
        for item in (META, STATE):
          if not (step_dir / item).exists():
            raise DamagedCheckpointError(step_dir, f"{item}/ is missing")
        try:
          meta = manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
          if not isinstance(meta, Mapping):
            raise ValueError(f"holds a {type(meta).__name__}, not an object")
        except Exception as e:  # pylint: disable=broad-except
          raise damage_of(step_dir, META, e) from None
        check_meta_step(step_dir, meta)
        if check is not None:
          check(os.fspath(directory), step)
      except DamagedCheckpointError as e:
        if on_damaged == "error":
          raise
        damaged.append(e)
        continue
      return step, damaged
  if damaged:
    raise UserError(f"no complete checkpoint is left in {directory}: "
                    + "; ".join(f"step {e.step}: {e.what}" for e in damaged)
                    + f". Move the damaged steps aside (or to {directory.parent / DAMAGED_DIR}) to start afresh, "
                    "or use a new MODEL_DIR.")
  return None, []


# Reading back what training needs (a resumed step's meta and assets, a warm start's params);
# the user-facing readers (`runs.Run.open`, `runs.checkpoints`) are the layer above, built on these.


def open_reader(directory: epath.Path, *, state: ocp.CheckpointHandler | None = None) -> ocp.CheckpointManager:
  """A read-only manager that knows every item (so Orbax does not warn about the ones not read)."""
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False),
      item_handlers={STATE: state or ocp.StandardCheckpointHandler(), **data_positions.handlers(),
                     META: ocp.JsonCheckpointHandler(), ASSETS: AssetsHandler()})


def checkpoints_dir(checkpoint_dir: str) -> epath.Path:
  """`checkpoint_dir` (absolute) or its `checkpoints/` folder; never creates anything."""
  directory = storage.epath_of(checkpoint_dir)
  if (directory / CHECKPOINTS).exists():
    directory = directory / CHECKPOINTS
  if not directory.exists():
    raise UserError(f"No checkpoints at {checkpoint_dir}; point at a MODEL_DIR that holds checkpoints/.")
  return directory


def latest_of(manager: ocp.CheckpointManager, directory: epath.Path, step: int | None) -> int:
  step = manager.latest_step() if step is None else step
  if step is None:
    raise UserError(f"{directory} holds no finished checkpoint.")
  return step


def read_checkpoint_meta(checkpoint_dir: str, *, step: int | None = None) -> tuple[int, dict[str, Any]]:
  """(step, meta) of a checkpoint (a MODEL_DIR or its checkpoints/), read without creating or changing anything."""
  directory = checkpoints_dir(checkpoint_dir)
  with open_reader(directory) as manager:
    step = latest_of(manager, directory, step)
    try:
      meta = manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))[META]
      if not isinstance(meta, Mapping):
        raise ValueError(f"holds a {type(meta).__name__}, not an object")
    except Exception as e:  # pylint: disable=broad-except
      raise damage_of(directory / str(step), META, e) from None
  check_meta_step(directory / str(step), meta)
  return step, dict(meta)


def load_step_assets(checkpoint_dir: str, step: int, assets: Mapping[str, Asset],
                     fingerprints: Mapping[str, Any]) -> dict[str, Any]:
  """Values of `assets` saved at `step`, each checked against its fingerprint."""
  directory = os.fspath(checkpoints_dir(checkpoint_dir) / str(step) / ASSETS)
  values = {}
  for name, asset in assets.items():
    if name not in fingerprints:
      raise UserError(f"checkpoint step {step} of {checkpoint_dir} holds no asset {name!r}.")
    values[name] = asset.load(directory)
    check_fingerprint(asset, values[name], fingerprints[name], where=directory)
  return values


def restore_params(checkpoint_dir: str, abstract_params: Any, *, step: int | None = None) -> Any:
  """Only the parameters of checkpoint `step` (the latest by default) of a MODEL_DIR or its checkpoints/.

  `abstract_params` are ShapeDtypeStructs (with shardings) of the target params, maybe a subset of the saved tree.
  """
  directory = checkpoints_dir(checkpoint_dir)
  with open_reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
    step = latest_of(manager, directory, step)
    target = {"params": abstract_params}
    try:
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
    except UserError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (Orbax's 100-line traceback becomes one line)
      raise damage_of(directory / str(step), STATE, e) from None
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

  directory = checkpoints_dir(checkpoint_dir)
  with open_reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
    step = latest_of(manager, directory, step)
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
