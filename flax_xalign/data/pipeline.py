"""The trainer's one call for data: a seqio provider -> batched model features.

    provider, languages, _ = flax_xalign.tasks.resolve("bible_grc_en_mlm_tlm")
    ds = get_dataset(provider, languages=languages, split="train",
                     feature_lengths={"tokens": 128}, batch_size=32, seed=0)
    for batch in ds.as_numpy_iterator(): ...  # dict of int32 [32, 128]

The provider is any seqio Task or Mixture (ours, or one registered directly
with seqio); names are resolved by the caller through `flax_xalign.tasks`, so
this module never imports the task families.

Training: `shuffle=True, num_epochs=None` (an endless, seeded stream; mixtures
sample tasks with their rates). Evaluation: `shuffle=False, num_epochs=1`; a
mixture is then read task after task in its listed order (seqio's sampler stops
at the first exhausted task, which would drop most of the other tasks' data).
Batches are `drop_remainder=True`, so a final partial batch is dropped.
Sharding (`shard_id`/`num_shards`) happens on examples before packing; every
host must pass the same seed. A host that reads several shards builds one
stream per shard and joins their batches row-wise (`concat_batches`), so the
global batch depends on the number of shards, never on the number of hosts.
"""

from collections.abc import Mapping, Sequence
from typing import Union

import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data import feature_converter
from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens

Provider = Union[seqio.Task, seqio.Mixture]


def tasks_of(provider: Provider) -> list[seqio.Task]:
  """The tasks of a mixture in its listed order (or `[provider]` for a task).

  `seqio.Mixture.tasks` sorts by name; the order the mixture lists them in is
  kept here, and tasks of sub-mixtures follow, sorted by name.
  """
  if not isinstance(provider, seqio.Mixture):
    return [provider]
  listed = {name: i for i, name in enumerate(provider.rate_per_task_name)}
  return sorted(provider.tasks,
                key=lambda task: (listed.get(task.name, len(listed)), task.name))


def _check_arguments(provider, split: str,
                     feature_lengths: Mapping[str, int], batch_size: int,
                     shard_id: int, num_shards: int) -> None:
  if not isinstance(provider, seqio.DatasetProviderBase):
    raise errors.UserError(
        f"get_dataset takes a seqio Task or Mixture, got {provider!r}; "
        "resolve a name with flax_xalign.tasks.resolve(name).")
  if set(feature_lengths) != {"tokens"}:
    raise errors.UserError(
        f"TASK_FEATURE_LENGTHS must have exactly one key, 'tokens' (the row "
        f"length), e.g. {{'tokens': 128}}; got {dict(feature_lengths)}.")
  if split not in provider.splits:
    raise errors.UserError(
        f"{provider.name!r} has no split {split!r}; it has "
        f"{', '.join(sorted(provider.splits))}.")
  if split == "train" and isinstance(provider, seqio.Mixture):
    # seqio leaves a member without the split out of the mixture, so its data would never be trained on.
    missing = [task for task in tasks_of(provider) if split not in task.splits]
    if missing:
      task = missing[0]
      raise errors.UserError(
          f"task {task.name!r} of mixture {provider.name!r} has no {split!r} split (it has "
          f"{', '.join(sorted(task.splits)) or 'none'}), so it would never be trained on; add {split!r} to its "
          "files= setting or leave it out of the mixture.")
  if batch_size < 1:
    raise errors.UserError(f"batch_size={batch_size} must be at least 1.")
  if not 0 <= shard_id < num_shards:
    raise errors.UserError(
        f"shard_id={shard_id} must lie in [0, num_shards={num_shards}).")


def _one_pass_of_mixture(mixture: seqio.Mixture, split: str,
                         lengths: Mapping[str, int], shuffle: bool,
                         seed: int | None, shard_info,
                         num_epochs: int) -> tf.data.Dataset:
  """One finite pass over every task, interleaved round-robin.

  Round-robin (rather than one task after another) means that an evaluation
  capped at a few batches still sees every task of the mixture.
  """
  datasets = []
  for task in tasks_of(mixture):
    keys = set(task.output_features)
    if split not in task.splits:
      continue
    ds = task.get_dataset(lengths, split=split, shuffle=shuffle, seed=seed,
                          shard_info=shard_info, num_epochs=num_epochs)
    datasets.append(ds.map(lambda ex, keys=keys: {k: ex[k] for k in keys}))
  if len(datasets) == 1:
    return datasets[0]
  order = tf.data.Dataset.range(len(datasets)).repeat()
  # Exhausted tasks are skipped; the pass ends when every task is exhausted.
  return tf.data.Dataset.choose_from_datasets(datasets, order, stop_on_empty_dataset=False)


def get_dataset(provider: Provider, *, languages: Sequence[str], split: str,
                feature_lengths: Mapping[str, int], batch_size: int,
                seed: int | None, shuffle: bool = True,
                shard_id: int = 0, num_shards: int = 1, pack: bool = True,
                num_epochs: int | None = None,
                specials: SpecialTokens = PROJECT, pair_layout: str = "restart",
                both_directions: bool = False, links: bool = False) -> tf.data.Dataset:
  """Builds the batched model-feature dataset of a task or mixture.

  Args:
    provider: a seqio Task or Mixture (`flax_xalign.tasks.resolve(name)[0]`).
    languages: the sorted language list behind `lang_ids`
      (`flax_xalign.tasks.resolve(name, run_languages)[1]`).
    split: "train", "validation", "test" (or a user task's split).
    feature_lengths: `{"tokens": L}`, the row length.
    batch_size: rows per batch (per host).
    seed: seeds shuffling and mixture sampling; the same seed reproduces the
      same batches.
    shuffle: shuffle examples (False for evaluation).
    shard_id: this host's shard.
    num_shards: number of hosts reading disjoint shards.
    pack: pack several examples per row (segment ids 1..k).
    num_epochs: passes over the data; None repeats forever.
    specials: the vocabulary's special ids (`<s>`, `</s>` and the padding id).
    pair_layout: how a translation pair fills a row, "restart" or
      "continuous" (`feature_converter`, `specials.PAIR_LAYOUTS`).
    both_directions: also emit every translation pair swapped, (b, a).
    links: also emit `link_groups`, the tasks' word links per subword
      (`feature_converter`; zeros for tasks without links).

  Returns:
    A dataset of dicts of int32 `[batch_size, L]` tensors `tokens, lang_ids,
    segment_ids, positions, pair_side` (+ `link_groups`).

  Raises:
    UserError: not a provider, unknown split, bad lengths / shard arguments,
      languages or specials, or task features the converter cannot read.
  """
  _check_arguments(provider, split, feature_lengths, batch_size, shard_id,
                   num_shards)
  converter = feature_converter.XAlignFeatureConverter(
      languages, pack=pack, specials=specials, pair_layout=pair_layout,
      both_directions=both_directions, links=links)
  lengths = {"tokens": int(feature_lengths["tokens"])}
  shard_info = (seqio.ShardInfo(index=shard_id, num_shards=num_shards)
                if num_shards > 1 else None)
  if isinstance(provider, seqio.Mixture) and num_epochs is not None:
    ds = _one_pass_of_mixture(provider, split, lengths, shuffle, seed,
                              shard_info, num_epochs)
    ds = converter(ds, task_feature_lengths=lengths)
  else:
    ds = seqio.get_dataset(provider, task_feature_lengths=lengths,
                           feature_converter=converter, dataset_split=split,
                           shuffle=shuffle, num_epochs=num_epochs,
                           shard_info=shard_info, seed=seed, verbose=False)
  ds = ds.batch(batch_size, drop_remainder=True)
  options = tf.data.Options()
  options.deterministic = True
  return ds.with_options(options)


def converted_rows(provider: Provider, *, languages: Sequence[str], split: str,
                   feature_lengths: Mapping[str, int], seed: int | None, shuffle: bool = True,
                   pack: bool = True, num_epochs: int | None = None, specials: SpecialTokens = PROJECT,
                   pair_layout: str = "restart", both_directions: bool = False, shard_id: int = 0,
                   num_shards: int = 1):
  """The rows `get_dataset` batches, one by one, as dicts of int32 NumPy `[L]` arrays.

  What `xalign cache` writes to disk. Same arguments as
  `get_dataset` (one shard of `num_shards`); the rows come in the order that
  stream's batches hold them.
  """
  ds = get_dataset(provider, languages=languages, split=split, feature_lengths=feature_lengths, batch_size=1,
                   seed=seed, shuffle=shuffle, pack=pack, num_epochs=num_epochs, specials=specials,
                   pair_layout=pair_layout, both_directions=both_directions, shard_id=shard_id,
                   num_shards=num_shards).unbatch()
  return ds.as_numpy_iterator()


def concat_batches(datasets: Sequence[tf.data.Dataset]) -> tf.data.Dataset:
  """Joins batched datasets row-wise: batch i is the rows of batch i of each, in order.

  A host reading shards [s, s + k) of the data yields the rows that k hosts,
  one shard each, would have fed in that order. Ends with the shortest input.
  """
  if len(datasets) == 1:
    return datasets[0]
  joined = tf.data.Dataset.zip(tuple(datasets)).map(
      lambda *parts: {key: tf.concat([part[key] for part in parts], axis=0) for key in parts[0]})
  options = tf.data.Options()
  options.deterministic = True
  return joined.with_options(options)


class SeqioBatches:
  """The batches of `training.seqio_source.SeqioSource`: a tf.data stream's batches as dicts of NumPy arrays.

  Its position is TF's own iterator checkpoint (`tf_iterator`, written by the
  checkpoint item `data_iterator/` with tf.train.Checkpoint), so the batches
  and the checkpoints are those of every run before the data-source seam.
  """

  def __init__(self, dataset: tf.data.Dataset):
    self.tf_iterator = iter(dataset)

  def __iter__(self) -> "SeqioBatches":
    return self

  def __next__(self) -> dict:
    return {key: value.numpy() for key, value in next(self.tf_iterator).items()}
