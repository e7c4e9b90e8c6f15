"""`pretrain()`: assembles data, model, mesh, assets and checkpoints, then trains.

Its settings are one frozen `TrainConfig` (training/config.py), which
`python -m flax_xalign.train` fills from gin (`train.<field>`); notebooks and
tests call `pretrain(TrainConfig(...))` or `pretrain(model_dir=..., ...)`
directly. It resolves the task (provider, languages, vocabulary), builds the
objectives and lets them adapt the encoder, writes the run manifest
(`RunSpec`), gets every asset the objectives require (built, loaded, or
restored from the checkpoint being resumed), and hands these collaborators to
the train loop. Bad input is found before MODEL_DIR is touched: the task is
resolved, objectives checked, assets built and the checkpoint's manifest and
data loop compared before anything is written; `config.gin` is written only
once the checkpoint being resumed is restored, so it always describes what
the checkpoints hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.assets import registry as asset_registry
from flax_xalign.assets import vocabulary as vocabulary_asset
from flax_xalign.data.vocab.specials import check_pair_layout
from flax_xalign.errors import UserError
from flax_xalign.fileio import check_output_folder, makedirs
from flax_xalign.models import flops as flops_lib
from flax_xalign.models.config import ARCHITECTURE_FIELDS, MODEL_GIN_FILE, EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import base as objectives_lib
from flax_xalign.objectives.masking import max_predictions_for
from flax_xalign.objectives.model import MaskingConfig, PretrainingModel
from flax_xalign.run_dir import NOT_A_RUN, RunDir, is_run_dir
from flax_xalign.training import asset_setup
from flax_xalign.training import checkpoints as checkpoints_lib
from flax_xalign.training import metrics as metrics_lib
from flax_xalign.training import model_dir as model_dir_lib
from flax_xalign.training import partitioning
from flax_xalign.training import validate
from flax_xalign.training.config import TrainConfig
from flax_xalign.training.data import resolve_task, task_vocabulary_files
from flax_xalign.training.data_source import DataSource
from flax_xalign.training.hooks import CheckpointHook
from flax_xalign.training.loop import TrainResult, train as train_loop
from flax_xalign.training.run_reader import SourceRun
from flax_xalign.training.trainer import LoopConfig, Trainer


def resolve_encoder_config(encoder: EncoderConfig, *, vocab_size: int, num_languages: int) -> EncoderConfig:
  """Fills in the vocabulary size and checks the language table the data implies."""
  if encoder.vocab_size is not None and encoder.vocab_size != vocab_size:
    raise UserError(
        f"EncoderConfig.vocab_size={encoder.vocab_size} but the task's vocabulary has {vocab_size} "
        "pieces; leave EncoderConfig.vocab_size unset (it is taken from the vocabulary)."
    )
  if encoder.num_languages and encoder.num_languages < num_languages + 1:
    raise UserError(
        f"EncoderConfig.num_languages={encoder.num_languages} is too small for "
        f"{num_languages} languages (+1 for padding); raise it or set 0 to drop language embeddings.")
  if encoder.attention_implementation == "cudnn" and jax.default_backend() != "gpu":
    raise UserError(
        f"EncoderConfig.attention_implementation='cudnn' needs an NVIDIA GPU, and this process runs on "
        f"{jax.default_backend()}; drop runs/nvidia_gpu.gin here, or set "
        "EncoderConfig.attention_implementation = 'xla' (the same function, fused by XLA).")
  return dataclasses.replace(encoder, vocab_size=vocab_size)


@dataclasses.dataclass(frozen=True)
class Assembly:
  """What a run is, resolved from its settings before any asset is built or file written.

  Attributes:
    data: the task's data source (languages, vocabulary, batches; seqio or a cache).
    encoder: the encoder config with the vocabulary size filled in and every
      objective's `adapt_encoder` applied.
    run: the run manifest (asset fingerprints not yet filled in).
    model: the pretraining model (encoder + objectives + masking).
    task_feature_lengths: {'tokens': row length}.
    masking: the masking config (its rate sets the MLM predictions per row).
    batch_features: optional batch features some objective reads (e.g.
      "link_groups", the tasks' word links: `ObjectiveBase.batch_features`).
  """

  data: DataSource
  encoder: EncoderConfig
  run: run_spec_lib.RunSpec
  model: PretrainingModel
  task_feature_lengths: Mapping[str, int]
  masking: MaskingConfig
  batch_features: tuple[str, ...] = ()

  @property
  def length(self) -> int:
    return int(self.task_feature_lengths["tokens"])


def assemble(config: TrainConfig) -> Assembly:
  """Resolves task, objectives, encoder, manifest and model of the run `config` describes.

  Shared by `pretrain` and the ahead-of-time compile check
  (`flax_xalign.cli.compile_check`), so both see the same model. Reads the
  fields that define the run (task, lengths, encoder, objectives and their
  options, masking, layout, optimizer, seed; not MODEL_DIR, batch size or
  schedule) and the task's vocabulary; builds no asset and touches no
  MODEL_DIR. The run manifest (`RunSpec`) is derived from `config` here.
  Raises UserError for settings the objectives or the row length refuse.
  """
  c = config
  for spec in c.user_tasks:
    spec.register()
  asset_options = {k: dict(v) for k, v in (c.asset_options or {}).items()}
  if c.dictionary_rate is not None:
    asset_options.setdefault("dictionary", {})["rate"] = c.dictionary_rate
  check_pair_layout(c.pair_layout, where="train.pair_layout")
  data = resolve_task(c.mixture_or_task_name, languages=c.languages, data=c.data, verify=c.cache_verify,
                      vocabulary_files=task_vocabulary_files(c.user_tasks, c.mixture_or_task_name))
  monitors = tuple(n for n in c.monitors if n not in c.objectives)
  built = objectives_lib.build([*c.objectives, *monitors], c.objective_options)
  encoder = objectives_lib.adapt_encoder(
      resolve_encoder_config(c.encoder, vocab_size=data.vocabulary_spec.size, num_languages=len(data.languages)),
      built.values())
  run = run_spec_lib.RunSpec(
      task=c.mixture_or_task_name, languages=data.languages, language_pairs=data.language_pairs,
      task_feature_lengths=dict(c.task_feature_lengths), task_definitions=data.definitions,
      vocabulary=data.vocabulary_spec, model=encoder, objectives=dict(c.objectives),
      objective_options={k: objectives_lib.describe_options(v) for k, v in (c.objective_options or {}).items()},
      monitors=monitors, asset_options=asset_options, seed=c.seed, init_from_checkpoint=c.init_from_checkpoint,
      pair_layout=c.pair_layout, bitext_both_directions=c.bitext_both_directions,
      optimizer=optimizer_record(c.optimizer))
  _check_row_length(int(c.task_feature_lengths["tokens"]), encoder)
  for obj in built.values():
    getattr(obj, "check", lambda run: None)(run)
  model = PretrainingModel(encoder=Encoder(encoder), objectives=dict(c.objectives), masking=c.masking,
                           objective_options=dict(c.objective_options or {}), monitor_objectives=monitors,
                           specials=data.vocabulary_spec.specials, vocab_copies=data.vocabulary_spec.factor,
                           loss_normalization=c.loss_normalization)
  batch_features = tuple(sorted({f for obj in built.values() for f in getattr(obj, "batch_features", ())}))
  if "link_groups" in batch_features:
    data.check_links_given([f"{type(getattr(obj, 'config', obj)).__name__}.label_source"
                            for obj in built.values() if "link_groups" in getattr(obj, "batch_features", ())])
  return Assembly(data=data, encoder=encoder, run=run, model=model,
                  task_feature_lengths=dict(c.task_feature_lengths), masking=c.masking,
                  batch_features=batch_features)


def make_partitioner(*, num_partitions: int = 1, fsdp: bool = False,
                     axis_rules: Sequence[tuple[str, str | None]] = (),
                     devices: Sequence[jax.Device] | None = None,
                     replicate_limit_bytes: int = partitioning.DEFAULT_REPLICATE_LIMIT_BYTES,
                     ) -> partitioning.Partitioner:
  """The run's mesh ('data' x 'model' over `devices`, default all) and rules table."""
  return partitioning.Partitioner(
      mesh=partitioning.make_mesh(num_partitions, devices=devices),
      rules=partitioning.logical_axis_rules(fsdp=fsdp, extra=axis_rules),
      replicate_limit_bytes=replicate_limit_bytes)


def train_flops(assembly: Assembly, *, batch_size: int) -> float:
  """All-slot matmul FLOPs of one train step over all devices, padding included (models/flops.py).

  What the compiled program computes, to compare with XLA's count; MFU is
  `batch_train_flops`'s count of real tokens, not this.
  """
  return flops_lib.train_flops_per_step(
      assembly.encoder, batch=batch_size, length=assembly.length,
      num_predictions=max_predictions_for(assembly.length, assembly.masking.mask_rate))


def batch_train_flops(assembly: Assembly) -> Callable[[Mapping[str, Any]], float]:
  """The model FLOPs of a train step on a host batch, for MFU (models/flops.py `model_train_flops`).

  Real tokens, attention over each token's segment and the MLM head on the
  expected predictions (mask rate x the regular tokens), from the batch's
  `segment_ids` and `tokens` with numpy: padding counts zero.
  """
  encoder, specials, rate = assembly.encoder, assembly.model.specials, assembly.masking.mask_rate

  def count(batch: Mapping[str, Any]) -> float:
    counts = flops_lib.count_tokens(batch["segment_ids"], mask_rate=rate,
                                    eligible=specials.is_regular(np.asarray(batch["tokens"])))
    return flops_lib.model_train_flops(encoder, counts)

  return count


def pretrain(config: TrainConfig | None = None, /, *, hooks: Sequence[CheckpointHook] = (),
             **settings: Any) -> TrainResult | run_spec_lib.RunSpec:
  """Pretrains an encoder on a seqio task or mixture; resumes from MODEL_DIR.

  Called as `pretrain(TrainConfig(...))`, `pretrain(config, seed=1)` (the
  keywords replace fields of `config`) or `pretrain(model_dir=..., ...)` with
  every setting a keyword; `TrainConfig` documents each of them. `hooks` are
  the caller's `CheckpointHook`s: each runs after the checkpoint of every
  `every`-th step (and of the last) and its numbers are logged to
  metrics.jsonl (e.g. the registered evaluators, built by the entry point).

  Returns the TrainResult (state, last step, whether it was interrupted), or
  with `assets_only` the run manifest after writing the run's assets into
  MODEL_DIR (`xalign assets`). Each checkpoint records the data
  loop (BATCH_SIZE, TASK_FEATURE_LENGTHS, task, data_shards, seed): resuming
  with other values is refused, unless `fresh_data_iterator`. A damaged
  newest checkpoint is moved to MODEL_DIR/checkpoints_damaged/ and the
  previous complete one resumed (`CheckpointConfig.on_damaged="error"`
  refuses instead).
  """
  c = TrainConfig(**settings) if config is None else config.replace(**settings)
  model_dir = model_dir_lib.check_model_dir(c.model_dir)
  # A user's own non-empty folder is never written into (its config.gin and metrics.jsonl were overwritten);
  # a folder of asset files only (dictionary.tsv, ... put there before the first run) is a run being prepared.
  check_output_folder(model_dir, setting="MODEL_DIR", owned=_run_or_prepared_assets,
                      what=NOT_A_RUN.replace(")", ", and holds other files than asset files)"))
  validate.check_settings(
      train_steps=c.train_steps, batch_size=c.batch_size, log_every=c.log_every, eval_every=c.eval_every,
      eval_batches=c.eval_batches, checkpoint=c.checkpoint, replicate_limit_bytes=c.replicate_limit_bytes,
      task_feature_lengths=c.task_feature_lengths, objectives=c.objectives, optimizer=c.optimizer,
      masking=c.masking, seed=c.seed, num_partitions=c.num_partitions, data_shards=c.data_shards)
  checkpoints_lib.check_config(c.checkpoint)
  hooks = tuple(hooks)
  _check_hooks(hooks, c.checkpoint)
  assembly = assemble(c)
  data, run, model = assembly.data, assembly.run, assembly.model
  for hook in hooks:  # E.g. the evaluators' splits, against the run's data: before MODEL_DIR exists.
    if hook.check is not None:
      hook.check(data)
  assets, notes = asset_registry.resolve(model.requires(), model.monitor_requires(), run)
  assets["vocabulary"] = vocabulary_asset.VocabularyAsset(data.vocabulary)
  for note in notes:
    print(f"note: {note}", flush=True)

  loop_record = checkpoints_lib.loop_record(
      batch_size=c.batch_size, task_feature_lengths=c.task_feature_lengths, task=c.mixture_or_task_name,
      data_shards=c.data_shards, seed=c.seed, train_steps=c.train_steps, source=data.kind)
  # Damaged newer steps are only listed here; they are moved once the run is known valid.
  latest, damaged = checkpoints_lib.newest_readable_step(model_dir, on_damaged=c.checkpoint.on_damaged)
  resume = None
  if latest is not None and latest > c.train_steps:
    # Nothing to train, and config.gin (which would say TRAIN_STEPS=c.train_steps) must not be rewritten.
    raise UserError(f"{model_dir} already holds checkpoint step {latest}, beyond TRAIN_STEPS={c.train_steps}: "
                    f"there is nothing to train. Set TRAIN_STEPS above {latest} to continue this run (the "
                    "learning-rate schedule then changes), or use another MODEL_DIR.")
  if latest is not None:
    saved, step_fingerprints = _check_resumable(model_dir, latest, run, loop_record,
                                                fresh_data_iterator=c.fresh_data_iterator)
    resume = (latest, saved, step_fingerprints)
  elif c.init_from_checkpoint:
    _check_warm_start(c.init_from_checkpoint, run)
  # Every split the run reads is made for it (a cache's rows were made once): refused here, not at the first
  # evaluation after MODEL_DIR was written; the train split first, so that a refused cache is not preceded by
  # a warning about its evaluation split.
  check = dict(feature_lengths=c.task_feature_lengths, pair_layout=c.pair_layout,
               both_directions=c.bitext_both_directions, links="link_groups" in assembly.batch_features)
  data.check_splits(["train"], **check)
  eval_every = c.eval_every
  if eval_every and not data.has_split(c.eval_split):
    print(f"warning: {data.where} has no {c.eval_split!r} split; training without evaluation "
          f"({data.how_to_add_split(c.eval_split)}, name another with train.eval_split, or set EVAL_EVERY=0)",
          file=sys.stderr, flush=True)
    eval_every = 0
  if eval_every:
    data.check_splits([c.eval_split], **check)
  run, run_assets = asset_setup.prepare(run, assets, model_dir=model_dir, resume=resume)
  if c.assets_only:
    written = []
    if jax.process_index() == 0:
      with model_dir_lib.lock(model_dir):
        written = asset_setup.write(model_dir, run_assets)
    print(f"assets of {model_dir}: " + (", ".join(written) + " written" if written else "already present"),
          flush=True)
    return run
  return _train(c.replace(model_dir=model_dir, eval_every=eval_every), assembly, run, run_assets,
                loop_record=loop_record, latest=latest, damaged=damaged, hooks=hooks)


def _train(c: TrainConfig, assembly: Assembly, run: run_spec_lib.RunSpec, run_assets: Any, *,
           loop_record: Mapping[str, Any], latest: int | None, damaged: Sequence[Any],
           hooks: Sequence[CheckpointHook]) -> TrainResult:
  """Builds the mesh, trainer, data and checkpointer of a valid run, then hands them to the loop."""
  data, encoder = assembly.data, assembly.encoder
  model_dir = RunDir(c.model_dir)  # The run's one RunDir: every writer below takes it.
  partitioner = make_partitioner(num_partitions=c.num_partitions, fsdp=c.fsdp, axis_rules=c.axis_rules,
                                 replicate_limit_bytes=c.replicate_limit_bytes)
  loop = LoopConfig(
      train_steps=c.train_steps, batch_size=c.batch_size, length=assembly.length, seed=c.seed,
      log_every=c.log_every, eval_every=c.eval_every, checkpoint_every=c.checkpoint.every_steps,
      eval_batches=c.eval_batches,
      peak_flops_per_device=metrics_lib.peak_flops_per_device(c.peak_flops_per_device))
  trainer = Trainer(model=assembly.model, optimizer=c.optimizer, partitioner=partitioner, loop=loop,
                    assets=run_assets)
  layout = {"pair_layout": c.pair_layout, "both_directions": c.bitext_both_directions,
            "data_shards": c.data_shards, "links": "link_groups" in assembly.batch_features}

  def train_batches():
    return data.batches(feature_lengths=c.task_feature_lengths, batch_size=c.batch_size, seed=c.seed, **layout)

  train_iterator = train_batches()

  # From here on MODEL_DIR is written: one writer at a time (process 0 holds the lock for the job).
  with model_dir_lib.lock(model_dir):  # (process 0 creates MODEL_DIR there; the others, which take no lock:)
    if jax.process_index() != 0:
      makedirs(model_dir, setting="MODEL_DIR")
    for error in damaged:  # Newest first; `latest` is the newest step whose meta reads.
      checkpoints_lib.warn_damaged(error, checkpoints_lib.move_damaged_step(error), latest)
    if jax.process_index() == 0:
      asset_setup.write(model_dir, run_assets)
    checkpointer = checkpoints_lib.Checkpointer(model_dir, c.checkpoint, position=data.position)
    loggers = []

    def make_logger(resume_step: int) -> metrics_lib.MetricsLogger:
      loggers.append(metrics_lib.MetricsLogger(model_dir, resume_step=resume_step, total_steps=c.train_steps))
      return loggers[-1]

    def before_training(resumed: int | None) -> None:
      if c.write_config is not None and jax.process_index() == 0:
        c.write_config(model_dir.path)

    def check_step(step: int) -> None:  # A step reached by falling back from a damaged one.
      if step != latest:  # The TRAIN_STEPS warning, if any, was given for `latest` already: once is enough.
        _check_resumable(model_dir, step, run, loop_record, fresh_data_iterator=c.fresh_data_iterator,
                         warn_train_steps=False)

    def eval_batches_fn():
      return data.batches(feature_lengths=c.task_feature_lengths, batch_size=c.batch_size, seed=c.seed,
                          split=c.eval_split, shuffle=False, num_epochs=1, **layout)

    step_flops = batch_train_flops(assembly)
    n_params = flops_lib.count_params(trainer.abstract_state.params)
    print(f"model: {n_params / 1e6:.2f}M parameters, {encoder.num_layers} layers, embed {encoder.embed_dim}; "
          f"mesh {dict(partitioner.mesh.shape)}; languages {list(data.languages)}; "
          f"objectives {dict(c.objectives)}", flush=True)
    try:
      result = train_loop(
          trainer=trainer,
          train_iterator=train_iterator,
          new_train_iterator=train_batches,
          eval_batches=eval_batches_fn if c.eval_every else None,
          checkpointer=checkpointer,
          logger=make_logger,
          run=run,
          flops_per_step=step_flops,
          step_callback=c.step_callback,
          init_params=_warm_starter(c.init_from_checkpoint) if c.init_from_checkpoint else None,
          loop_record=loop_record,
          restore_iterator=not c.fresh_data_iterator,
          check_step=check_step,
          before_training=before_training,
          checkpoint_hooks=hooks,
      )
    except BaseException:
      # Already failing (e.g. the bucket went away): closing may fail the same way, and must not hide why.
      with contextlib.suppress(Exception):
        checkpointer.close()
      for logger in loggers:
        with contextlib.suppress(Exception):
          logger.close()
      raise
    try:
      checkpointer.close()
    finally:
      for logger in loggers:
        logger.close()
    return result


def _check_hooks(hooks: Sequence[CheckpointHook], checkpoint: checkpoints_lib.CheckpointConfig) -> None:
  """A hook reads the checkpoint of its step: its steps must be checkpoint steps."""
  for hook in hooks:
    if hook.every <= 0 or hook.every % checkpoint.every_steps:
      raise UserError(
          f"{hook.name} runs every {hook.every} steps on the checkpoint of that step, but checkpoints are written "
          f"every {checkpoint.every_steps} steps (CHECKPOINT_EVERY); set {hook.setting} to a positive "
          f"multiple of {checkpoint.every_steps}.")


def _run_or_prepared_assets(folder: str) -> bool:
  """A flax_xalign run, or a folder of asset files a user prepared for a run's start."""
  return is_run_dir(folder) or set(os.listdir(folder)) <= asset_registry.prepared_files()


def _check_resumable(model_dir: str, step: int, run: run_spec_lib.RunSpec, loop: Mapping[str, Any], *,
                     fresh_data_iterator: bool, warn_train_steps: bool = True
                     ) -> tuple[run_spec_lib.RunSpec, dict[str, Any]]:
  """(the step's manifest, its asset fingerprints) after refusing a step this run cannot resume."""
  meta = checkpoints_lib.read_checkpoint_meta(model_dir, step=step)[1]
  saved = run_spec_lib.from_meta(meta, where=model_dir)
  where = RunDir.of(model_dir).checkpoints
  if not saved.objectives:
    raise UserError(
        f"{model_dir} holds an imported model, not a training run; train from it in a new MODEL_DIR with "
        f"--gin.INIT_FROM_CHECKPOINT=\"{model_dir}\" (train.init_from_checkpoint).")
  # Every setting that shapes the saved state (the optimiser's too) is compared here, before any restore.
  checkpoints_lib.check_compatible(saved, run, where=where, model_dir=model_dir)
  saved_loop = meta.get(checkpoints_lib.LOOP)
  if not fresh_data_iterator:
    checkpoints_lib.check_loop(saved_loop, loop, step=step, where=where)
  if warn_train_steps and saved_loop and saved_loop.get("train_steps") not in (None, loop["train_steps"]):
    print(f"warning: TRAIN_STEPS={loop['train_steps']} but checkpoint step {step} was trained with TRAIN_STEPS="
          f"{saved_loop['train_steps']}; the learning-rate schedule depends on it, so the steps after {step} "
          "follow another schedule than the first run's", file=sys.stderr, flush=True)
  return saved, dict(meta.get(checkpoints_lib.ASSETS, {}))


def optimizer_record(optimizer: Any) -> dict[str, Any]:
  """The optimiser settings as the manifest keeps them (JSON: tuples as lists, so a record reads back equal)."""
  return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(optimizer).items()}


def _check_row_length(length: int, encoder: EncoderConfig) -> None:
  """Rows of `length` carry positions up to length - 1 (every pair layout): the table must hold them."""
  if length > encoder.num_positions:
    raise UserError(
        f"TASK_FEATURE_LENGTHS['tokens']={length} exceeds the model's {encoder.num_positions} positions "
        f"(EncoderConfig.max_positions={encoder.max_positions}, position_offset={encoder.position_offset}); "
        f"shorten the rows to at most {encoder.num_positions} or raise EncoderConfig.max_positions.")


def _check_warm_start(checkpoint_dir: str, run: run_spec_lib.RunSpec) -> None:
  """Refuses a warm start from a run with another vocabulary or language set (nothing written yet)."""
  source = SourceRun.open(checkpoint_dir).spec
  differ = [f"{name}: checkpoint {getattr(source.model, name)!r}, this run {getattr(run.model, name)!r}"
            for name in ARCHITECTURE_FIELDS
            if name != "num_languages" and getattr(source.model, name) != getattr(run.model, name)]
  if differ:
    model_gin = RunDir(checkpoint_dir).file(MODEL_GIN_FILE)
    hint = (f"add --gin_file={model_gin}" if os.path.exists(model_gin) else
            "use the model size the checkpoint was trained with")
    raise UserError(f"init_from_checkpoint={checkpoint_dir} has another architecture ({'; '.join(differ)}); "
                    f"{hint}.")
  checks = [("vocabulary", run.vocabulary.fingerprint(), source.vocabulary.fingerprint())]
  if source.model.num_languages:  # Language ids matter only to a model with language embeddings.
    checks.append(("languages", list(run.languages), list(source.languages)))
  for key, ours, theirs in checks:
    if ours != theirs:
      raise UserError(
          f"init_from_checkpoint={checkpoint_dir} was trained with a different {key} "
          f"({theirs!r}, this run: {ours!r}); warm-start from a run with the same "
          f"{key}, or train this one from scratch.")


def _warm_starter(checkpoint_dir: str) -> Callable[[Any], Any]:
  def init_params(params: Any) -> Any:
    params, missing = checkpoints_lib.warm_start_params(checkpoint_dir, params)
    print(f"warm start from {checkpoint_dir}" + (f"; newly initialised: {', '.join(missing)}" if missing else ""),
          flush=True)
    return params

  return init_params


__all__ = ["Assembly", "CheckpointHook", "TrainConfig", "assemble", "make_partitioner", "pretrain",
           "resolve_encoder_config", "train_flops", "batch_train_flops"]
