"""`TrainConfig`: every setting of a pretraining run, in one frozen dataclass.

`pretrain(config)` trains with it; `assemble(config)` resolves the run it
describes (task, objectives, encoder, manifest) without touching MODEL_DIR;
the run manifest (`RunSpec`) is derived from it there. The gin edge
(`flax_xalign.cli.configurables`) registers this class under the name `train`,
so gin files keep binding `train.<field> = ...` and `--gin.train.<field>=...`,
and a binding of a name that is not a field is refused with the close match.
Library code never imports gin: this is a plain dataclass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from flax_xalign.models.config import EncoderConfig
from flax_xalign.objectives.model import MaskingConfig
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.partitioning import DEFAULT_REPLICATE_LIMIT_BYTES


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """The settings of `pretrain` (gin: `train.<field>`).

  Required: model_dir, mixture_or_task_name, task_feature_lengths, batch_size,
  train_steps, encoder, objectives.

  Attributes:
    model_dir: where the run lives (MODEL_DIR); a rerun resumes from it.
    mixture_or_task_name: the seqio task or mixture to train on.
    task_feature_lengths: {'tokens': row length}.
    batch_size: rows per global batch.
    train_steps: the step to train to (the learning-rate schedule's length).
    encoder: the encoder's config; its vocab_size is taken from the task.
    objectives: {objective name: loss weight}.
    objective_options: an objective's options (a config dataclass such as
      DwaConfig, or keyword arguments).
    monitors: objectives that are not trained but whose evaluation monitors
      run (the alignment score of an MLM baseline).
    asset_options: an asset's options (`{'dictionary': {'rate': 0.5}}`).
    languages: the language list of a plain seqio task that does not declare one.
    init_from_checkpoint: a MODEL_DIR whose latest parameters warm-start a new
      run; parameters it lacks (e.g. the DWA pointer head) keep their initial
      values, and the optimiser state starts fresh.
    dictionary_rate: shorthand for `asset_options={'dictionary': {'rate': ...}}`.
    masking: the masking config (rate, 80/10/10 split).
    loss_normalization: "per_term" (each term its own mean, then the weighted
      sum) or "pooled" (one mean over all predicted tokens, as the released
      XLM-Align code; see `PretrainingModel`).
    pair_layout: translation pairs as `<s> a </s> <s> b </s>` with positions
      restarting ("restart", the paper) or `<s> a </s> b </s>` with positions
      running on ("continuous", the released XLM-Align code); recorded in the
      run manifest so the aligner lays pairs out the same way.
    bitext_both_directions: also train on every pair swapped, (b, a), as the
      released code stores its bitext.
    optimizer: AdamW and its schedule.
    num_partitions: size of the 'model' mesh axis ('data' takes the rest).
    fsdp: shard the embed axis over 'data' too.
    axis_rules: extra (logical axis, mesh axis) rules, ahead of the defaults.
    replicate_limit_bytes: an array its rule cannot shard may be replicated up
      to this many bytes per device; bigger is an error naming the fix (e.g.
      EncoderConfig.vocab_pad_multiple).
    checkpoint: how often and how many checkpoints are kept, and what a
      damaged newest one does (`on_damaged`: fall back to the previous
      complete one, moving it to MODEL_DIR/checkpoints_damaged/, or refuse).
    log_every: steps between metrics.jsonl rows.
    eval_every: steps between held-out evaluations (0: none); a task without
      `eval_split` trains without evaluation (a warning says so).
    eval_batches: batches per evaluation.
    eval_split: the held-out split.
    seed: the seed of initialisation, data order and every step's RNG.
    data_shards: split the examples into that many shards, each filling its
      own rows of every global batch, and give each process its share: the
      global batch then depends on `data_shards` only, not on the number of
      processes (None: one shard per process; see `SeqioSource.dataset`).
    peak_flops_per_device: the peak used for MFU (default: the known peak of
      the device kind).
    user_tasks: TextTask/TsvBitextTask/AlphaMixture/SyntheticTasks
      definitions registered first.
    write_config: `write_config(model_dir)` writes the operative config once
      the run is known to be valid and the checkpoint it resumes is restored.
    step_callback: `step_callback(step, metrics)` runs after every step.
    assets_only: write the run's assets into MODEL_DIR and return the run
      manifest instead of training (`xalign assets`).
    data: where the batches come from: "seqio" (the task registry's pipeline,
      the default) or "cache:DIR", a packed cache written by
      `xalign cache --output=DIR` (no TensorFlow needed;
      README "Packed datasets"). The task, row length and pair layout must be
      the cache's; evaluation reads DIR/<eval_split> when it was built.
    cache_verify: how a packed cache (`data="cache:DIR"`) is verified at
      the start, before MODEL_DIR is created: "full" hashes every shard
      (sha256), "size" checks shard sizes, record counts and a seeded sample
      of records (size and value bounds), "auto" (the default) is "full"
      below 1 GiB of shards per split and "size" above (docs/data.md has
      the measurement behind the threshold). Either way every record read
      is checked for its size.
    fresh_data_iterator: resume the model with a new data iterator (the data
      order starts over). Otherwise each checkpoint records the data loop
      (BATCH_SIZE, TASK_FEATURE_LENGTHS, task, data_shards, seed) and
      resuming with other values is refused.
  """

  model_dir: str
  mixture_or_task_name: str
  task_feature_lengths: Mapping[str, int]
  batch_size: int
  train_steps: int
  encoder: EncoderConfig
  objectives: Mapping[str, float]
  objective_options: Mapping[str, Any] | None = None
  monitors: Sequence[str] = ()
  asset_options: Mapping[str, Mapping[str, Any]] | None = None
  languages: Sequence[str] | None = None
  init_from_checkpoint: str | None = None
  dictionary_rate: float | None = None
  masking: MaskingConfig = MaskingConfig()
  loss_normalization: str = "per_term"
  pair_layout: str = "restart"
  bitext_both_directions: bool = False
  optimizer: OptimizerConfig = OptimizerConfig()
  num_partitions: int = 1
  fsdp: bool = False
  axis_rules: Sequence[tuple[str, str | None]] = ()
  replicate_limit_bytes: int = DEFAULT_REPLICATE_LIMIT_BYTES
  checkpoint: CheckpointConfig = CheckpointConfig()
  log_every: int = 10
  eval_every: int = 0
  eval_batches: int = 20
  eval_split: str = "validation"
  seed: int = 0
  data_shards: int | None = None
  peak_flops_per_device: float | None = None
  user_tasks: Sequence[Any] = ()
  write_config: Callable[[str], None] | None = None
  step_callback: Callable[[int, Mapping[str, Any]], None] | None = None
  assets_only: bool = False
  fresh_data_iterator: bool = False
  data: str = "seqio"
  cache_verify: str = "auto"

  def replace(self, **changes: Any) -> "TrainConfig":
    """A copy with `changes` (unknown names raise TypeError, as the constructor does)."""
    return dataclasses.replace(self, **changes)


def field_names() -> tuple[str, ...]:
  """The settings' names, in declaration order (what `train.<name>` may bind)."""
  return tuple(f.name for f in dataclasses.fields(TrainConfig))


def defaults() -> dict[str, Any]:
  """{name: default} of the settings that have one."""
  return {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}


__all__ = ["TrainConfig", "defaults", "field_names"]
