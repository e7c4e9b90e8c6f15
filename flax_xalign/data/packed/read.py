"""Batches of a packed cache through Grain: global shuffle by seed, this process's rows, exact resume.

    packed = format.open_split("cache/", "train")
    batches = PackedBatches(packed, batch_size=32, seed=0, rows=(0, 32))
    batch = next(batches)          # {"tokens": int32 [32, L], "lang_ids": ..., ...}
    state = batches.get_state()    # JSON; set_state(state) continues with the next batch

The global stream is the cache's rows in a seeded permutation, reshuffled
every epoch (Grain's `MapDataset.shuffle` over `repeat`: an index shuffle,
O(1) memory, any row reachable in O(1)). Global batch `b` is rows
`[b * B, (b + 1) * B)` of that stream, and a process reads only its rows
`[lo, hi)` of every batch. A global batch therefore depends on the cache, the
seed and BATCH_SIZE alone: not on the number of processes nor `data_shards`,
which only decide who reads which rows. The iterator's state is the index of
the next batch, so saving and restoring it is exact whatever was prefetched.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from flax_xalign.data.packed import format as format_lib
from flax_xalign.errors import UserError

BACKEND = "cache"  # Written into each saved position, checked when one is restored.


class _HostRows(grain.MapDataset):
  """Batch b -> the records of rows [lo, hi) of global batch b of `parent`."""

  def __init__(self, parent: grain.MapDataset, *, batch_size: int, lo: int, hi: int, where: str):
    super().__init__(parent)
    self._batch_size, self._lo, self._hi, self._where = batch_size, lo, hi, where
    n = len(parent)
    self._length = sys.maxsize if n >= sys.maxsize else n // batch_size

  def __len__(self) -> int:
    return self._length

  def __str__(self) -> str:
    return f"_HostRows(batch_size={self._batch_size}, rows=[{self._lo}, {self._hi}))"

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.slice(index)
    if index >= self._length:
      raise IndexError(f"batch {index} of {self._length}")
    start = index * self._batch_size
    try:
      return self._parent._getitems(list(range(start + self._lo, start + self._hi)))  # pylint: disable=protected-access
    except RuntimeError as e:  # Riegeli's message for a damaged chunk (e.g. a shard changed after it was opened).
      raise UserError(f"{self._where} cannot be read ({str(e).splitlines()[0][:160]}); rebuild the cache "
                      "(or restore its files).") from None


class PackedBatches:
  """A checkpointable iterator of this process's rows of each global batch of a packed split.

  Attributes:
    packed: the verified split.
  """

  def __init__(self, packed: format_lib.PackedSplit, *, batch_size: int, seed: int | None, shuffle: bool = True,
               num_epochs: int | None = None, rows: tuple[int, int] | None = None,
               features: Sequence[str] | None = None, num_threads: int = 2, prefetch: int = 4):
    """Reads `packed`.

    Args:
      packed: a split opened (and verified) by `format.open_split`; every
        record read is checked for the manifest's record size (UserError).
      batch_size: rows of a global batch.
      seed: the shuffle's seed (all processes pass the same one).
      shuffle: False reads the rows in their written order (evaluation).
      num_epochs: passes over the rows; None repeats forever (training).
      rows: [lo, hi) of each global batch this process reads; default all.
      features: the features a batch holds (default every one the rows
        carry); UserError for one they do not carry.
      num_threads: Grain's reader threads.
      prefetch: batches read ahead (their state is not part of ours).
    """
    lo, hi = rows or (0, batch_size)
    if not 0 <= lo < hi <= batch_size:
      raise ValueError(f"rows {rows} are not a non-empty range of a batch of {batch_size}")
    packed.check_batch(batch_size)
    self.packed, self.batch_size, self.rows = packed, batch_size, (lo, hi)
    self.seed, self.shuffle, self.num_epochs = seed, shuffle, num_epochs
    m = packed.manifest
    records = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(packed.paths))
    if shuffle:
      records = records.shuffle(seed=int(seed or 0) % 2**32)
    if num_epochs != 1:
      records = records.repeat(num_epochs)
    dtype = format_lib.record_dtype(m.features, m.length)
    missing = sorted(set(features or ()) - set(dtype.names))
    if missing:
      raise UserError(f"the packed cache {packed.location} holds no feature {', '.join(missing)} (its rows "
                      f"carry {', '.join(dtype.names)}); rebuild it with `xalign cache`.")
    where = f"the packed cache {packed.directory}"
    # `decode` refuses a record of another size than `dtype`'s before reading its bytes (here, on every batch,
    # not only in the sample `open_split` checked).
    batches = _HostRows(records, batch_size=batch_size, lo=lo, hi=hi, where=where).map(
        functools.partial(format_lib.decode, dtype=dtype, names=None if features is None else tuple(features),
                          where=where))
    self._dataset = batches.to_iter_dataset(grain.ReadOptions(num_threads=num_threads,
                                                              prefetch_buffer_size=prefetch))
    self._iterator = iter(self._dataset)

  def __iter__(self) -> "PackedBatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._iterator)

  @property
  def identity(self) -> dict[str, Any]:
    """What a saved position means only together with: the rows (by their shards' hashes) and the order."""
    shards = hashlib.sha256(json.dumps([s.sha256 for s in self.packed.manifest.shards]).encode()).hexdigest()
    return {"shards_sha256": shards, "examples": self.packed.manifest.examples, "batch_size": self.batch_size,
            "rows": list(self.rows), "seed": self.seed, "shuffle": self.shuffle}

  def get_state(self) -> dict[str, Any]:
    return {"backend": BACKEND, "position": self._iterator.get_state(), **self.identity}

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues after the batch `state` was taken at; refuses a state of another cache or order."""
    differ = [f"{k} {state.get(k)!r} (this run: {v!r})" for k, v in self.identity.items() if state.get(k) != v]
    if state.get("backend") != BACKEND or differ:
      what = "; ".join(differ) or f"backend {state.get('backend')!r}"
      raise UserError(f"the saved data position belongs to another packed cache or order ({what})")
    self._iterator.set_state(state["position"])
