"""A task resolved once: its languages, vocabulary and batches, from seqio or from a packed cache.

`resolve_task(name)` looks the name up in the tasks package (our registry or
plain seqio), fixes the language list and reads the vocabulary's manifest
record; `resolve_task(name, data="cache:DIR")` reads all of that from the
cache's manifest instead, importing neither seqio nor TensorFlow.
`TaskData.batches(...)` is the loop's one call for data (the seam, as
maxtext's `create_data_iterator`): this host's share of each global batch as
a checkpointable iterator of NumPy batches, whose `backend` names the
checkpoint item that saves its position:

  backend  source                                  its position in a checkpoint
  seqio    `flax_xalign.data.pipeline` (tf.data)    `data_iterator/` (tf.train.Checkpoint)
  cache    `flax_xalign.data.packed` (Grain)        `data_iterator_cache/` (JSON, `get_state`)

`TaskData.dataset(...)` (the tf.data stream itself) stays for seqio-only
tools; nothing above `data/` iterates it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from flax_xalign.assets import vocabulary as vocabulary_asset
from flax_xalign.data.packed import format as packed_format
from flax_xalign.errors import UserError
from flax_xalign.run_spec import VocabularySpec


@dataclasses.dataclass(frozen=True)
class TaskData:
  """A resolved task or mixture.

  Attributes:
    name: the task or mixture name.
    provider: the seqio Task or Mixture.
    languages: sorted language codes (language id = index + 1).
    language_pairs: (side a, side b) of its bitext tasks.
    vocabulary: the seqio vocabulary of its `tokens` feature.
    vocabulary_spec: the vocabulary's manifest record (hash, size, specials).
    definitions: how to re-register it elsewhere (None: a plain seqio task).
    cache: the packed cache folder the batches come from (None: seqio).
  """

  name: str
  provider: Any
  languages: tuple[str, ...]
  language_pairs: tuple[tuple[str, str], ...]
  vocabulary: Any
  vocabulary_spec: VocabularySpec
  definitions: tuple[dict[str, Any], ...] | None
  cache: str | None = None
  _opened: dict[str, packed_format.PackedSplit] = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def source(self) -> str:
    """"seqio" or "cache" (what `batches` reads, and the loop record's `data`)."""
    return "seqio" if self.cache is None else "cache"

  @property
  def is_mixture(self) -> bool:
    """A seqio Mixture (not a task, not a cache)."""
    return _is_mixture(self.provider)

  def has_split(self, split: str) -> bool:
    """Whether batches of `split` can be made (a cache: whether that split was built)."""
    if self.cache is not None:
      return packed_format.has_split(self.cache, split)
    return _provider_has_split(self.provider, split)

  def batches(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int, split: str = "train",
              shuffle: bool = True, num_epochs: int | None = None, pack: bool = True, pair_layout: str = "restart",
              both_directions: bool = False, data_shards: int | None = None, links: bool = False):
    """This host's share of each global batch: an iterator of dicts of int32 NumPy arrays.

    Same arguments as `dataset`. From seqio, the batches are exactly
    `dataset(...)`'s; from a cache, global batch b is rows [b*B, (b+1)*B) of
    the cache's seeded permutation (`flax_xalign.data.packed.read`) and host
    h of H reads its rows [h*B/H, (h+1)*B/H): `data_shards` (still checked)
    does not change a cache's batches. `links` adds the tasks' word links
    (`link_groups`), which only seqio reads today.
    """
    hosts, host = jax.process_count(), jax.process_index()
    _check_shards(data_shards, batch_size, hosts)
    if self.cache is not None and links:
      raise UserError(f"this run's objectives learn from given word links (link_groups), which a packed cache "
                      f"does not store yet; train from seqio (train.data='seqio') instead of {self.cache}.")
    if self.cache is None:
      from flax_xalign.data import pipeline

      return pipeline.SeqioBatches(self.dataset(
          feature_lengths=feature_lengths, batch_size=batch_size, seed=seed, split=split, shuffle=shuffle,
          num_epochs=num_epochs, pack=pack, pair_layout=pair_layout, both_directions=both_directions,
          data_shards=data_shards, links=links))
    from flax_xalign.data.packed import read

    packed = self.open_cache(split)
    packed.check_run(task=self.name, length=feature_lengths["tokens"], pair_layout=pair_layout,
                     both_directions=both_directions, pack=pack, languages=self.languages)
    per_host = batch_size // hosts
    return read.PackedBatches(packed, batch_size=batch_size, seed=seed, shuffle=shuffle, num_epochs=num_epochs,
                              rows=(host * per_host, (host + 1) * per_host))

  def open_cache(self, split: str) -> packed_format.PackedSplit:
    """The verified split of this task's cache (sha256 of every shard checked once per split)."""
    if split not in self._opened:
      self._opened[split] = packed_format.open_split(self.cache, split)
    return self._opened[split]

  def dataset(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int,
              split: str = "train", shuffle: bool = True, num_epochs: int | None = None, pack: bool = True,
              pair_layout: str = "restart", both_directions: bool = False, data_shards: int | None = None,
              links: bool = False):
    """This host's share of a global batch stream (`batch_size` is global).

    The examples are split into `data_shards` shards (default: one per host)
    and each shard fills `batch_size / data_shards` consecutive rows of every
    global batch; a host reads its `data_shards / hosts` shards. The global
    batches therefore depend on `data_shards` only: with `data_shards=2` one
    process and two processes train on the same examples in the same rows.
    `pair_layout` and `both_directions` say how translation pairs fill a row
    (`flax_xalign.data.feature_converter`).
    """
    from flax_xalign.data import pipeline

    if self.cache is not None:
      raise ValueError("TaskData.dataset is the seqio stream; a task read from a cache has batches() only")
    hosts, host = jax.process_count(), jax.process_index()
    shards = _check_shards(data_shards, batch_size, hosts)
    per_host = shards // hosts
    return pipeline.concat_batches([
        pipeline.get_dataset(
            self.provider, languages=self.languages, split=split, feature_lengths=feature_lengths,
            batch_size=batch_size // shards, seed=seed, shuffle=shuffle, shard_id=shard, num_shards=shards,
            pack=pack, num_epochs=num_epochs, specials=self.vocabulary_spec.specials, pair_layout=pair_layout,
            both_directions=both_directions, links=links)
        for shard in range(host * per_host, (host + 1) * per_host)])


def _is_mixture(provider: Any) -> bool:
  return getattr(provider, "tasks", None) is not None and not hasattr(provider, "source")


def _provider_has_split(provider: Any, split: str) -> bool:
  """Whether a seqio task, or every task of a mixture, has `split`."""
  if _is_mixture(provider):
    tasks = provider.tasks
    return bool(tasks) and all(_provider_has_split(task, split) for task in tasks)
  splits = getattr(provider, "splits", None)
  return splits is None or split in splits


def _check_shards(data_shards: int | None, batch_size: int, hosts: int) -> int:
  shards = data_shards or hosts
  if shards % hosts or batch_size % shards:
    raise UserError(
        f"BATCH_SIZE={batch_size} and data_shards={shards} do not fit {hosts} host(s): data_shards must "
        f"be a multiple of the number of hosts and divide BATCH_SIZE (e.g. data_shards={hosts}).")
  return shards


def resolve_task(name: str, *, languages: Sequence[str] | None = None, data: str = "seqio") -> TaskData:
  """Resolves a registered task or mixture (UserError for unknown names).

  `data="cache:DIR"` reads the task from the packed cache at DIR (its train
  split's manifest and vocabulary file), without importing seqio; the cache
  must have been built from the task `name`.
  """
  cache = packed_format.parse_source(data)
  if cache is not None:
    return _from_cache(name, cache, languages)
  from flax_xalign import tasks

  provider, langs, vocabulary = tasks.registry.resolve(name, languages)
  return TaskData(
      name=name, provider=provider, languages=tuple(langs),
      language_pairs=tuple(tasks.registry.language_pairs(name)),
      vocabulary=vocabulary, vocabulary_spec=vocabulary_asset.spec_of(vocabulary),
      definitions=tasks.registry.describe(name))


def _from_cache(name: str, cache: str, languages: Sequence[str] | None) -> TaskData:
  packed = packed_format.open_split(cache, "train")
  manifest = packed.manifest
  if manifest.task != name:
    raise UserError(f"the packed cache {cache} was built from task {manifest.task!r}, this run trains "
                    f"{name!r} (MIXTURE_OR_TASK_NAME); set MIXTURE_OR_TASK_NAME={manifest.task!r} or build a "
                    f"cache of {name!r}.")
  if languages is not None and sorted(set(languages)) != list(manifest.languages):
    raise UserError(f"the packed cache {cache} holds languages {list(manifest.languages)}, this run asks for "
                    f"{sorted(set(languages))} (train.languages); rebuild the cache with them or drop the setting.")
  data = TaskData(name=name, provider=None, languages=manifest.languages, language_pairs=manifest.language_pairs,
                  vocabulary=packed_format.file_vocabulary(packed), vocabulary_spec=manifest.vocabulary,
                  definitions=manifest.task_definitions, cache=cache)
  data._opened["train"] = packed  # pylint: disable=protected-access  (verified just now)
  return data
