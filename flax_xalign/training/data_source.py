"""`DataSource`: a task's data as a run reads it, from one backend chosen once.

Two implementations, picked from `train.data` by `training.data.resolve_task`
(the one place that reads the setting, as maxtext's `create_data_iterator`
dispatches once on `dataset_type`):

  kind   class                          batches from                              position in a checkpoint
  seqio  `seqio_source.SeqioSource`     the task registry's tf.data pipeline      `data_iterator/` (tf.train.Checkpoint)
  cache  `cache_source.CacheSource`     a packed cache through Grain (no TF)      `data_iterator_cache/` (JSON)

Everything after that choice (the loop, the checkpointer, the evaluators, the
warnings) asks the source object; nothing tests which backend it is.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from flax_xalign.errors import UserError
from flax_xalign.run_spec import VocabularySpec
from flax_xalign.training.data_positions import DataPosition


@dataclasses.dataclass(frozen=True)
class DataSource(abc.ABC):
  """A resolved task or mixture: what a run takes from its data, and the batches.

  Attributes:
    name: the task or mixture name.
    languages: sorted language codes (language id = index + 1).
    language_pairs: (side a, side b) of its bitext tasks.
    vocabulary: the vocabulary of its `tokens` feature (`encode`/`decode`).
    vocabulary_spec: the vocabulary's manifest record (hash, size, specials).
    definitions: how to re-register its tasks elsewhere (None: plain seqio).
    kind: "seqio" or "cache": the checkpoint's loop record (`data`) holds it,
      so a run is not resumed from the other backend's position.
    position: the checkpoint item that saves the position of its batches.
  """

  name: str
  languages: tuple[str, ...]
  language_pairs: tuple[tuple[str, str], ...]
  vocabulary: Any
  vocabulary_spec: VocabularySpec
  definitions: tuple[dict[str, Any], ...] | None

  kind: ClassVar[str]
  position: ClassVar[DataPosition]

  @abc.abstractmethod
  def has_split(self, split: str) -> bool:
    """Whether batches of `split` can be made."""

  @abc.abstractmethod
  def batches(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int, split: str = "train",
              shuffle: bool = True, num_epochs: int | None = None, pack: bool = True, pair_layout: str = "restart",
              both_directions: bool = False, data_shards: int | None = None,
              links: bool = False) -> Iterator[dict[str, Any]]:
    """This host's share of each global batch (`batch_size` is global): dicts of int32 NumPy arrays.

    The iterator's position is what `position` saves. `data_shards` splits
    the examples among processes (default: one shard per process; see
    `SeqioSource.dataset`); `pair_layout` and `both_directions` say how
    translation pairs fill a row; `links` adds the tasks' word links
    (`link_groups`).
    """

  def check_splits(self, splits: Sequence[str], *, feature_lengths: Mapping[str, int], pack: bool = True,
                   pair_layout: str = "restart", both_directions: bool = False, links: bool = False) -> None:
    """Refuses (UserError, one line) data of `splits` that cannot feed this run; nothing is read yet.

    Called before MODEL_DIR is created for every split the run will read:
    the train split first, then the evaluation split. A source whose rows are made at
    the run's settings (seqio) has nothing to check; a packed cache's rows
    were made once, and each split must have been made for this run.
    """
    del splits, feature_lengths, pack, pair_layout, both_directions, links

  def check_links_given(self, settings: Sequence[str]) -> None:
    """Refuses (UserError) a run whose objectives learn from given word links (`settings` name them) when
    this data cannot carry any: the term would train at loss 0. Called while the run is assembled, before
    MODEL_DIR exists. A source that cannot tell yet says nothing here (a packed cache refuses itself when
    its batches are built, `CacheSource.batches`, also before MODEL_DIR)."""
    del settings

  @property
  @abc.abstractmethod
  def where(self) -> str:
    """Where the data comes from, for messages ("task NAME", "the packed cache DIR")."""

  @abc.abstractmethod
  def how_to_add_split(self, split: str) -> str:
    """The fix for a missing `split`, for messages."""


def check_shards(data_shards: int | None, batch_size: int, hosts: int) -> int:
  """The number of data shards (default: one per host); UserError when they do not fit the hosts and batch."""
  shards = data_shards or hosts
  if shards % hosts or batch_size % shards:
    raise UserError(
        f"BATCH_SIZE={batch_size} and data_shards={shards} do not fit {hosts} host(s): data_shards must "
        f"be a multiple of the number of hosts and divide BATCH_SIZE (e.g. data_shards={hosts}).")
  return shards
