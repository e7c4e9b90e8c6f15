"""`CacheSource`: a task read from a packed cache (`xalign cache`), with no TensorFlow.

Languages, pairs, vocabulary and task definitions come from the cache's
manifest; the batches from `flax_xalign.data.packed.read` (Grain), whose
position is saved as JSON in `data_iterator_cache/`. This module imports
neither seqio nor TensorFlow (tests/training/no_tf_train.py refuses them in a
training run from a cache).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import ClassVar

import jax

from flax_xalign import storage
from flax_xalign.data.packed import format as packed_format
from flax_xalign.data.packed import read as packed_read
from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.errors import UserError
from flax_xalign.training.data_positions import CACHE_POSITION, DataPosition
from flax_xalign.training.data_source import DataSource, check_shards


@dataclasses.dataclass(frozen=True)
class CacheSource(DataSource):
  """A task's packed cache (see `DataSource`).

  Attributes:
    directory: the cache folder (one sub-folder per split): a local folder, or a bucket's URL whose splits are
      staged on this host's disk when opened (`data.packed.staging`).
    verify: how each split is verified when first opened (`train.cache_verify`:
      "auto", "full" or "size"; `data.packed.format` says what each reads).
  """

  directory: str
  verify: str = "auto"
  _opened: dict[str, packed_format.PackedSplit] = dataclasses.field(default_factory=dict, compare=False, repr=False)

  kind: ClassVar[str] = "cache"
  position: ClassVar[DataPosition] = CACHE_POSITION

  @classmethod
  def open(cls, directory: str, name: str, *, languages: Sequence[str] | None = None, verify: str = "auto",
           vocabulary_files: Sequence[str] = ()) -> "CacheSource":
    """The cache at `directory`, read from its train split (verified as `verify` says).

    UserError unless it was built from task `name`, with the run's
    `languages` (None: any), and with the vocabulary of each file in
    `vocabulary_files` (the run's own task definitions name them): compared
    by sha256, so a vocabulary retrained under the same file name is refused.
    """
    packed = packed_format.open_split(directory, "train", verify=verify)
    manifest = packed.manifest
    if manifest.task != name:
      raise UserError(f"the packed cache {directory} was built from task {manifest.task!r}, this run trains "
                      f"{name!r} (MIXTURE_OR_TASK_NAME); set MIXTURE_OR_TASK_NAME={manifest.task!r} or build a "
                      f"cache of {name!r}.")
    if languages is not None and sorted(set(languages)) != list(manifest.languages):
      raise UserError(f"the packed cache {directory} holds languages {list(manifest.languages)}, this run asks for "
                      f"{sorted(set(languages))} (train.languages); rebuild the cache with them or drop the "
                      "setting.")
    for path in vocabulary_files:
      _check_vocabulary_file(path, packed)
    source = cls(name=name, languages=manifest.languages, language_pairs=manifest.language_pairs,
                 vocabulary=packed_format.file_vocabulary(packed), vocabulary_spec=manifest.vocabulary,
                 definitions=manifest.task_definitions, directory=directory, verify=verify)
    source._opened["train"] = packed  # pylint: disable=protected-access  (verified just now)
    return source

  @property
  def where(self) -> str:
    return f"the packed cache {self.directory}"

  def how_to_add_split(self, split: str) -> str:
    return f"build it with `xalign cache --task={self.name} --split={split} --output={self.directory}`"

  def has_split(self, split: str) -> bool:
    """Whether that split of the cache was built."""
    return packed_format.has_split(self.directory, split)

  def open_split(self, split: str) -> packed_format.PackedSplit:
    """The verified split (checked once per split, as `verify` says)."""
    if split not in self._opened:
      self._opened[split] = packed_format.open_split(self.directory, split, verify=self.verify)
    return self._opened[split]

  def check_splits(self, splits: Sequence[str], *, feature_lengths: Mapping[str, int], pack: bool = True,
                   pair_layout: str = "restart", both_directions: bool = False, links: bool = False) -> None:
    """Refuses, in one line, any of `splits` built for another run (see `DataSource.check_splits`).

    Each split is opened (verified) and compared with the run: task, languages, row length, layout,
    links, and its vocabulary's sha256 with the train split's (each split carries its own file).
    """
    for split in dict.fromkeys(splits):
      self._check_split(split, length=feature_lengths["tokens"], pack=pack, pair_layout=pair_layout,
                        both_directions=both_directions, links=links)

  def _check_split(self, split: str, *, length: int, pack: bool, pair_layout: str, both_directions: bool,
                   links: bool) -> packed_format.PackedSplit:
    packed = self.open_split(split)
    packed.check_run(task=self.name, length=length, pair_layout=pair_layout, both_directions=both_directions,
                     pack=pack, languages=self.languages, links=links)
    theirs, ours = packed.manifest.vocabulary.sha256, self.vocabulary_spec.sha256
    if theirs != ours:
      raise UserError(f"the {split!r} split of the packed cache {self.directory} was built with another "
                      f"vocabulary (sha256 {theirs[:12]}) than its train split ({ours[:12]}); rebuild it with "
                      f"`xalign cache --task={self.name} --split={split} --output={self.directory} --overwrite`.")
    return packed

  def batches(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int, split: str = "train",
              shuffle: bool = True, num_epochs: int | None = None, pack: bool = True, pair_layout: str = "restart",
              both_directions: bool = False, data_shards: int | None = None, links: bool = False):
    """Global batch b is rows [b*B, (b+1)*B) of the cache's seeded permutation (`data.packed.read`).

    Host h of H reads its rows [h*B/H, (h+1)*B/H): `data_shards` (still
    checked) does not change a cache's batches. `links` reads the rows'
    `link_groups` (a cache written with `xalign cache --links`); without it a
    batch holds the five converter features, whatever the rows carry.
    A run that needs links is refused when this split, or any other split
    built beside it (the evaluation's), lacks them: here, before a run
    writes its MODEL_DIR, not at its first evaluation.
    """
    hosts, host = jax.process_count(), jax.process_index()
    check_shards(data_shards, batch_size, hosts)
    packed = self._check_split(split, length=feature_lengths["tokens"], pack=pack, pair_layout=pair_layout,
                               both_directions=both_directions, links=links)
    if links:
      for other in sorted(storage.listdir(self.directory)):
        if other != split and self.has_split(other):
          self.open_split(other).check_links(links)
    per_host = batch_size // hosts
    return packed_read.PackedBatches(packed, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                     num_epochs=num_epochs, rows=(host * per_host, (host + 1) * per_host),
                                     features=packed_format.feature_names(links))


def _check_vocabulary_file(path: str, packed: packed_format.PackedSplit) -> None:
  """Refuses, in one line, a cache whose vocabulary is not the file `path` the run's task names (by sha256)."""
  if not os.path.isfile(path):
    raise UserError(f"the vocabulary {path} that this run's task names is missing; restore it, or drop the "
                    f"task definition and train from the packed cache {packed.location} with its own vocabulary.")
  ours, theirs = sha256_of(path), packed.manifest.vocabulary.sha256
  if ours != theirs:
    raise UserError(f"the packed cache {storage.dirname(packed.location)} was built with another vocabulary "
                    f"(sha256 {theirs[:12]}) than {path} (sha256 {ours[:12]}), which this run's task "
                    "names; rebuild the cache with this vocabulary (`xalign cache`), or point the task at the "
                    "cache's.")
