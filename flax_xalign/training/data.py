"""A task resolved once: seqio provider, languages, vocabulary, and its batches.

`resolve_task(name)` looks the name up in the tasks package (our registry or
plain seqio), fixes the language list and reads the vocabulary's manifest
record; `TaskData.dataset(...)` then builds this host's share of a global
batch stream through `flax_xalign.data.pipeline`, which never imports the
tasks package itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from flax_xalign.assets import vocabulary as vocabulary_asset
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
  """

  name: str
  provider: Any
  languages: tuple[str, ...]
  language_pairs: tuple[tuple[str, str], ...]
  vocabulary: Any
  vocabulary_spec: VocabularySpec
  definitions: tuple[dict[str, Any], ...] | None

  def dataset(self, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int,
              split: str = "train", shuffle: bool = True, num_epochs: int | None = None, pack: bool = True,
              pair_layout: str = "restart", both_directions: bool = False, data_shards: int | None = None):
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

    hosts, host = jax.process_count(), jax.process_index()
    shards = data_shards or hosts
    if shards % hosts or batch_size % shards:
      raise UserError(
          f"BATCH_SIZE={batch_size} and data_shards={shards} do not fit {hosts} host(s): data_shards must "
          f"be a multiple of the number of hosts and divide BATCH_SIZE (e.g. data_shards={hosts}).")
    per_host = shards // hosts
    return pipeline.concat_batches([
        pipeline.get_dataset(
            self.provider, languages=self.languages, split=split, feature_lengths=feature_lengths,
            batch_size=batch_size // shards, seed=seed, shuffle=shuffle, shard_id=shard, num_shards=shards,
            pack=pack, num_epochs=num_epochs, specials=self.vocabulary_spec.specials, pair_layout=pair_layout,
            both_directions=both_directions)
        for shard in range(host * per_host, (host + 1) * per_host)])


def resolve_task(name: str, *, languages: Sequence[str] | None = None) -> TaskData:
  """Resolves a registered task or mixture (UserError for unknown names)."""
  from flax_xalign import tasks

  provider, langs, vocabulary = tasks.registry.resolve(name, languages)
  return TaskData(
      name=name, provider=provider, languages=tuple(langs),
      language_pairs=tuple(tasks.registry.language_pairs(name)),
      vocabulary=vocabulary, vocabulary_spec=vocabulary_asset.spec_of(vocabulary),
      definitions=tasks.registry.describe(name))
