"""`SeqioSource`: a task or mixture of the seqio registry, batched by the tf.data pipeline.

Its batches are `dataset(...)`'s, as every run before the packed cache read
them, and their position is TF's own iterator checkpoint (`data_iterator/`).
seqio and TensorFlow are imported only when a task is looked up or batched,
so that importing this module (as `training.data` does) costs a process
training from a packed cache nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax

from flax_xalign.assets import vocabulary as vocabulary_asset
from flax_xalign.training.data_positions import SEQIO_POSITION, DataPosition
from flax_xalign.training.data_source import DataSource, check_shards


@dataclasses.dataclass(frozen=True)
class SeqioSource(DataSource):
  """A registered seqio task or mixture (see `DataSource`).

  Attributes:
    provider: the seqio Task or Mixture.
  """

  provider: Any

  kind: ClassVar[str] = "seqio"
  position: ClassVar[DataPosition] = SEQIO_POSITION

  @classmethod
  def resolve(cls, name: str, *, languages: Sequence[str] | None = None,
              register_tasks: Callable[[], Any] | None = None) -> "SeqioSource":
    """Looks `name` up in the tasks package (our registry or plain seqio); UserError for unknown names.

    `register_tasks` runs first: it registers tasks the lookup needs (a
    run's recorded tasks, `runs.Run.register_tasks`).
    """
    from flax_xalign import tasks  # Imports seqio and TensorFlow.

    if register_tasks is not None:
      register_tasks()
    provider, langs, vocabulary = tasks.registry.resolve(name, languages)
    return cls(name=name, provider=provider, languages=tuple(langs),
               language_pairs=tuple(tasks.registry.language_pairs(name)), vocabulary=vocabulary,
               vocabulary_spec=vocabulary_asset.spec_of(vocabulary), definitions=tasks.registry.describe(name))

  @property
  def is_mixture(self) -> bool:
    """A seqio Mixture (not a task)."""
    return _is_mixture(self.provider)

  @property
  def where(self) -> str:
    return f"task {self.name}"

  def how_to_add_split(self, split: str) -> str:
    return "add that split to the task"

  def has_split(self, split: str) -> bool:
    """Whether the task, or every task of the mixture, has `split`."""
    return _provider_has_split(self.provider, split)

  def check_links_given(self, settings: Sequence[str]) -> None:
    """Decided for every task flax_xalign registered: our file tasks' loaders say which splits have a links
    file, and our other loaders (the Bible's, TFDS text, synthetic) never give links; a task whose loader is
    not ours and does not say (a plain seqio task, a user's Python loader) is given the benefit of the doubt."""
    from flax_xalign.errors import UserError
    from flax_xalign.tasks import tables

    members = tables.task_names(self.name)
    loaders = [tables.text_loader(name) for name in members]
    if any(loader is None or not (hasattr(loader, "links") or _our_loader(loader)) for loader in loaders):
      return
    if any("train" in dict(getattr(loader, "links", ())) for loader in loaders):
      return
    raise UserError(
        f"{' and '.join(settings)} read(s) given word links (not 'self'), but no task of "
        f"{self.name!r} ({', '.join(members)}) has a links file for its train split: the term would train at "
        "loss 0. Give the bitext task links (TsvBitextTask.links = {'train': 'FILE.pharaoh'}) or use "
        "label_source 'self'.")

  def batches(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int, split: str = "train",
              shuffle: bool = True, num_epochs: int | None = None, pack: bool = True, pair_layout: str = "restart",
              both_directions: bool = False, data_shards: int | None = None, links: bool = False):
    """`dataset(...)`'s batches as NumPy dicts, checkpointable by `position` (`pipeline.SeqioBatches`)."""
    from flax_xalign.data import pipeline

    return pipeline.SeqioBatches(self.dataset(
        feature_lengths=feature_lengths, batch_size=batch_size, seed=seed, split=split, shuffle=shuffle,
        num_epochs=num_epochs, pack=pack, pair_layout=pair_layout, both_directions=both_directions,
        data_shards=data_shards, links=links))

  def dataset(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int,
              split: str = "train", shuffle: bool = True, num_epochs: int | None = None, pack: bool = True,
              pair_layout: str = "restart", both_directions: bool = False, data_shards: int | None = None,
              links: bool = False):
    """This host's share of a global batch stream, as tf.data (`batch_size` is global).

    The examples are split into `data_shards` shards (default: one per host)
    and each shard fills `batch_size / data_shards` consecutive rows of every
    global batch; a host reads its `data_shards / hosts` shards. The global
    batches therefore depend on `data_shards` only: with `data_shards=2` one
    process and two processes train on the same examples in the same rows.
    `pair_layout` and `both_directions` say how translation pairs fill a row
    (`flax_xalign.data.feature_converter`). Seqio-only tools use the stream
    itself; nothing above `data/` iterates it.
    """
    from flax_xalign.data import pipeline

    hosts, host = jax.process_count(), jax.process_index()
    shards = check_shards(data_shards, batch_size, hosts)
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


def _our_loader(loader: Any) -> bool:
  """Whether flax_xalign defines `loader` (a function or an object of one of our classes)."""
  module = loader.__module__ if callable(loader) and hasattr(loader, "__code__") else type(loader).__module__
  return str(module).startswith("flax_xalign.")
