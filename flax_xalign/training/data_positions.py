"""The data position in a checkpoint: one Orbax item per data source (`DataSource.position`).

  data_iterator/        seqio: each process's tf.data iterator, a tf.train.Checkpoint
                        (process_<i>/iterator.*), as every run before the packed cache
  data_iterator_cache/  packed cache: each process's Grain position, JSON (process_<i>.json),
                        with what it belongs to (the shards' hashes, seed, batch, rows)

A `DataPosition` is one such item: its name, its handler and its save and
restore arguments. Each data source names its own (`SEQIO_POSITION`,
`CACHE_POSITION`), so a checkpointer saves whatever iterator it is handed
without asking which backend made it. TensorFlow is imported by the seqio
item only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp
from etils import epath

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.training.checkpoint_errors import DamagedCheckpointError, first_line, fresh_iterator_advice

DATA_ITERATOR, DATA_ITERATOR_CACHE = "data_iterator", "data_iterator_cache"


def _refuse_missing(directory: epath.Path, missing: str) -> None:
  """Raises for a process's missing position: another process count (UserError) or a damaged step."""
  written = sorted(p.name for p in directory.iterdir() if p.name.startswith("process_")) \
      if directory.exists() else []
  if written and len(written) != jax.process_count():
    raise UserError(
        f"{directory} holds the data-iterator state of {len(written)} process(es), this run has "
        f"{jax.process_count()}; resume with the number of processes that wrote the checkpoint, or "
        "add --gin.train.fresh_data_iterator=True to resume the model with a new data iterator.")
  raise DamagedCheckpointError(directory.parent, f"{directory.name}/{missing} is missing")


def _tf_iterator(iterator: Any) -> Any:
  """The tf.data iterator of the seqio backend (`SeqioBatches.tf_iterator`), or `iterator` itself."""
  return getattr(iterator, "tf_iterator", iterator)


@contextlib.contextmanager
def _local(folder: epath.Path, *, upload: bool) -> Iterator[str]:
  """`folder` itself when it is local; in a bucket, a local temporary copy of it (uploaded after the block when
  `upload`). tf.train.Checkpoint writes through TensorFlow's own file system, which is not our storage layer
  (it ignores an emulator and is absent from a host without the GCS plugin): it only ever sees local files."""
  if not storage.is_url(os.fspath(folder)):
    yield os.fspath(folder)
    return
  with tempfile.TemporaryDirectory(prefix="xalign_iterator_") as local:
    remote = os.fspath(folder)
    if not upload:
      for name in storage.listdir(remote):
        with open(os.path.join(local, name), "wb") as f:
          f.write(storage.read_bytes(storage.join(remote, name)))
    yield local
    if upload:
      for name in sorted(os.listdir(local)):
        with open(os.path.join(local, name), "rb") as f:
          storage.write_object(storage.join(remote, name), f.read())


class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves each process's tf.data iterator (the seqio backend) with tf.train.Checkpoint."""

  def _prefix(self, directory: epath.Path) -> epath.Path:
    return directory / f"process_{jax.process_index()}" / "iterator"

  def save(self, directory: epath.Path, args: "DataIteratorSave") -> None:
    import tensorflow as tf  # Only the data pipeline needs TF.

    prefix = self._prefix(directory)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with _local(prefix.parent, upload=True) as local:
      tf.train.Checkpoint(iterator=_tf_iterator(args.iterator)).write(os.path.join(local, prefix.name))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore") -> Any:
    import tensorflow as tf

    prefix = self._prefix(directory)
    if not prefix.parent.exists():
      _refuse_missing(directory, prefix.parent.name)
    with _local(prefix.parent, upload=False) as local:
      tf.train.Checkpoint(iterator=_tf_iterator(args.iterator)).read(
          os.path.join(local, prefix.name)).assert_consumed()
    return args.iterator


class CacheIteratorHandler(ocp.CheckpointHandler):
  """Saves each process's packed-cache position (`PackedBatches.get_state()`, JSON) as process_<i>.json."""

  def _path(self, directory: epath.Path) -> epath.Path:
    return directory / f"process_{jax.process_index()}.json"

  def save(self, directory: epath.Path, args: "CacheIteratorSave") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    self._path(directory).write_text(json.dumps(args.iterator.get_state(), sort_keys=True))

  def restore(self, directory: epath.Path, args: "CacheIteratorRestore") -> Any:
    path = self._path(directory)
    if not path.exists():
      _refuse_missing(directory, path.name)
    try:
      state = json.loads(path.read_text())
      if not isinstance(state, dict) or "position" not in state:
        raise ValueError("not a saved data position")
    except ValueError as e:
      raise DamagedCheckpointError(
          directory.parent, f"{DATA_ITERATOR_CACHE}/{path.name} is unreadable: {first_line(e)}") from None
    try:
      args.iterator.set_state(state)
    except UserError as e:  # Another cache, seed, batch or rows: the run may start the data order afresh.
      raise UserError(f"checkpoint step {directory.parent.name}: {e}. {fresh_iterator_advice()}"
                      ) from None
    return args.iterator


@ocp.args.register_with_handler(CacheIteratorHandler, for_save=True)
@dataclasses.dataclass
class CacheIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(CacheIteratorHandler, for_restore=True)
@dataclasses.dataclass
class CacheIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


def _tf_files_problem(step_dir: epath.Path) -> str | None:
  """What is wrong with this process's tf.train.Checkpoint files, or None when every tensor reads back (CRC)."""
  import tensorflow as tf

  folder = step_dir / DATA_ITERATOR / f"process_{jax.process_index()}"
  try:
    with _local(folder, upload=False) as local:
      prefix = os.path.join(local, "iterator")
      reader = tf.train.load_checkpoint(prefix)
      dtypes = reader.get_variable_to_dtype_map()
      tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=list(dtypes), shape_and_slices=[""] * len(dtypes),
                           dtypes=list(dtypes.values()))
  except Exception as e:  # pylint: disable=broad-except  (any failure to read back is damage)
    return f"{DATA_ITERATOR}/ is unreadable: {first_line(e)}"
  return None


def _json_files_problem(step_dir: epath.Path) -> str | None:
  del step_dir  # The JSON handler reports an unreadable file itself, as damage.
  return None


@dataclasses.dataclass(frozen=True)
class DataPosition:
  """The checkpoint item that saves a batch iterator's position, and how (Orbax wants one class per direction).

  Attributes:
    item: the item's folder in a step (`data_iterator`, `data_iterator_cache`).
    handler: its Orbax CheckpointHandler class.
    save_args: wraps an iterator for saving (`save_args(iterator)`).
    restore_args: wraps an iterator whose position is set from the step.
    files_problem: step folder -> why this process's saved position is
      unreadable (None: readable, so a failed restore means another pipeline).
  """

  item: str
  handler: type[ocp.CheckpointHandler]
  save_args: type[ocp.args.CheckpointArgs]
  restore_args: type[ocp.args.CheckpointArgs]
  files_problem: Callable[[epath.Path], str | None]


SEQIO_POSITION = DataPosition(DATA_ITERATOR, DataIteratorHandler, DataIteratorSave, DataIteratorRestore,
                              _tf_files_problem)
CACHE_POSITION = DataPosition(DATA_ITERATOR_CACHE, CacheIteratorHandler, CacheIteratorSave, CacheIteratorRestore,
                              _json_files_problem)
# Every item a step may hold: a reader registers all of them, whichever source wrote the step.
POSITIONS = (SEQIO_POSITION, CACHE_POSITION)


def handlers() -> dict[str, ocp.CheckpointHandler]:
  """{item: handler} for every data position (for a CheckpointManager's `item_handlers`)."""
  return {position.item: position.handler() for position in POSITIONS}
