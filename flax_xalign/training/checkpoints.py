"""Orbax checkpoints: train state, data iterator, run manifest and assets, together.

Each checkpoint step directory holds four items written by one
CheckpointManager (async, keep N, atomic finalisation by rename):
  state/          the TrainState (params, optimiser state, step), sharded arrays
  data_iterator/  the tf.data iterator of every process (tf.train.Checkpoint)
  meta/           JSON: the run manifest (`run`, a RunSpec) and the
                  fingerprint of every asset at this step (`assets`)
  assets/         the assets' files at this step (dictionary.tsv, vocabulary
                  model, ...), written by each asset's own `save`
Resuming restores all four, so the next batch, the next RNG and the assets are
the ones an uninterrupted run would have used; restored asset files are checked
against the fingerprints in `meta`, so a file edited by hand is refused, never
trained with. `meta` is checked before anything is loaded: a MODEL_DIR made
with another vocabulary, model size or language set is refused, not mixed.
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

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.assets.base import Asset, check_fingerprint
from flax_xalign.errors import UserError

STATE, DATA_ITERATOR, META, ASSETS = "state", "data_iterator", "meta", "assets"
# Run-manifest fields whose mismatch makes a checkpoint unusable for this run.
COMPATIBILITY_FIELDS = ("vocabulary", "model", "languages", "pair_layout", "bitext_both_directions")


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
  """When and how many checkpoints to keep."""

  every_steps: int = 100
  keep: int = 3
  async_save: bool = True


def make_meta(run: "run_spec_lib.RunSpec", asset_fingerprints: Mapping[str, Any]) -> dict[str, Any]:
  """The `meta` item: the manifest and this step's asset fingerprints."""
  return {run_spec_lib.META_KEY: run.to_json(), ASSETS: json.loads(json.dumps(dict(asset_fingerprints)))}


def check_compatible(saved: "run_spec_lib.RunSpec", run: "run_spec_lib.RunSpec", *, where: str) -> None:
  """Refuses to resume when vocabulary, model, languages or the bitext layout differ."""
  for field in COMPATIBILITY_FIELDS:
    ours, theirs = getattr(run, field), getattr(saved, field)
    if field == "vocabulary":
      ours, theirs = ours.fingerprint(), theirs.fingerprint()
    elif field == "model":
      ours, theirs = dataclasses.asdict(ours), dataclasses.asdict(theirs)
    elif field == "languages":
      ours, theirs = list(ours), list(theirs)
    if ours != theirs:
      raise UserError(
          f"{where} holds a checkpoint made with a different {field}:\n"
          f"  checkpoint: {json.dumps(theirs, sort_keys=True)}\n"
          f"  this run:   {json.dumps(ours, sort_keys=True)}\n"
          "Use a new MODEL_DIR for this configuration, or rerun with the settings the "
          "checkpoint was made with. Nothing in the directory was changed."
      )


class Checkpointer:
  """A CheckpointManager under `<model_dir>/checkpoints` with our four items."""

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
            ASSETS: AssetsHandler(),
        },
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def read_meta(self, step: int) -> dict[str, Any]:
    restored = self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
    return dict(restored[META])

  def read_run(self, step: int) -> tuple["run_spec_lib.RunSpec", dict[str, Any]]:
    """(the manifest, this step's asset fingerprints); one clear error for pre-manifest runs."""
    meta = self.read_meta(step)
    run = run_spec_lib.from_meta(meta, where=f"{self.directory.parent}")
    return run, dict(meta.get(ASSETS, {}))

  def save(self, step: int, state: Any, iterator: Any, meta: Mapping[str, Any], *,
           assets: Mapping[str, Asset] | None = None, asset_values: Mapping[str, Any] | None = None,
           force: bool = False) -> bool:
    items = {STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(dict(meta))}
    if iterator is not None:  # None: an imported model, which no data has touched yet.
      items[DATA_ITERATOR] = DataIteratorSave(iterator)
    if assets:
      items[ASSETS] = AssetsSave(dict(assets), dict(asset_values or {}))
    saved = self._manager.save(step, args=ocp.args.Composite(**items), force=force)
    if saved:
      logging.info("checkpoint for step %d started (async)", step)
    return saved

  def restore(self, step: int, abstract_state: Any, iterator: Any, *,
              assets: Mapping[str, Asset] | None = None) -> tuple[Any, dict[str, Any]]:
    """(state on the shardings of `abstract_state`, asset values checked against `meta`).

    Assets the checkpoint does not hold (an objective added on resume) are
    left out of the returned values.
    """
    items = {STATE: ocp.args.StandardRestore(abstract_state), DATA_ITERATOR: DataIteratorRestore(iterator)}
    _, fingerprints = self.read_run(step)
    saved_assets = {n: a for n, a in (assets or {}).items() if n in fingerprints}
    if saved_assets:
      items[ASSETS] = AssetsRestore(saved_assets)
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    values = dict(restored[ASSETS]) if saved_assets else {}
    where = os.fspath(self.directory / str(step) / ASSETS)
    for name, value in values.items():
      check_fingerprint(saved_assets[name], value, fingerprints[name], where=where)
    return restored[STATE], values

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _reader(directory: epath.Path, *, state: ocp.CheckpointHandler | None = None) -> ocp.CheckpointManager:
  """A read-only manager that knows every item (so Orbax does not warn about the ones not read)."""
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False),
      item_handlers={STATE: state or ocp.StandardCheckpointHandler(), DATA_ITERATOR: DataIteratorHandler(),
                     META: ocp.JsonCheckpointHandler(), ASSETS: AssetsHandler()})


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
  with _reader(directory) as manager:
    step = _latest(manager, directory, step)
    restored = manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
  return step, dict(restored[META])


def find_latest_step(model_dir: str) -> int | None:
  """The latest finished checkpoint step of MODEL_DIR, or None; creates nothing."""
  directory = epath.Path(os.path.abspath(model_dir)) / "checkpoints"
  if not directory.exists():
    return None
  with _reader(directory) as manager:
    return manager.latest_step()


def read_run_at(model_dir: str, step: int) -> tuple["run_spec_lib.RunSpec", dict[str, Any]]:
  """(manifest, asset fingerprints) of one checkpoint step; creates nothing."""
  _, run, fingerprints = read_run_spec(model_dir, step=step)
  return run, fingerprints


def read_run_spec(checkpoint_dir: str, *, step: int | None = None
                  ) -> tuple[int, "run_spec_lib.RunSpec", dict[str, Any]]:
  """(step, run manifest, that step's asset fingerprints), read without changing anything."""
  step, meta = read_checkpoint_meta(checkpoint_dir, step=step)
  run = run_spec_lib.from_meta(meta, where=checkpoint_dir)
  return step, run, dict(meta.get(ASSETS, {}))


def step_assets_dir(checkpoint_dir: str, step: int) -> str:
  """The `assets/` folder of a checkpoint step (where each asset's files are)."""
  return os.fspath(_checkpoints_dir(checkpoint_dir) / str(step) / ASSETS)


def load_step_assets(checkpoint_dir: str, step: int, assets: Mapping[str, Asset],
                     fingerprints: Mapping[str, Any]) -> dict[str, Any]:
  """Values of `assets` saved at `step`, each checked against its fingerprint."""
  directory = step_assets_dir(checkpoint_dir, step)
  values = {}
  for name, asset in assets.items():
    if name not in fingerprints:
      raise UserError(f"checkpoint step {step} of {checkpoint_dir} holds no asset {name!r}.")
    values[name] = asset.load(directory)
    check_fingerprint(asset, values[name], fingerprints[name], where=directory)
  return values


def restore_params(checkpoint_dir: str, abstract_params: Any, *, step: int | None = None) -> Any:
  """Loads only the parameters of a training checkpoint (e.g. a warm start).

  Args:
    checkpoint_dir: a MODEL_DIR or its `checkpoints/` folder.
    abstract_params: ShapeDtypeStructs (with shardings) of the target params;
      may be a subset of the saved tree.
    step: which step; the latest by default.
  """
  directory = _checkpoints_dir(checkpoint_dir)
  with _reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
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
  with _reader(directory, state=ocp.PyTreeCheckpointHandler()) as manager:
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
