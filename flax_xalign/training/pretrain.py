"""`pretrain()`: assembles data, model, mesh and checkpoints, then trains.

This is the function `python -m flax_xalign.train` configures (gin name
`train`). Everything is a keyword argument, so notebooks and tests call it
directly. Bad input is found before MODEL_DIR is touched: the task is resolved,
the data read and the checkpoint's metadata compared before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Mapping, Sequence

import jax

from flax_xalign.data import dictionary as dictionary_lib
from flax_xalign.errors import UserError
from flax_xalign.models import flops as flops_lib
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.pretraining import MaskingConfig, PretrainingModel
from flax_xalign.objectives.masking import max_predictions_for
from flax_xalign.training import partitioning
from flax_xalign.training.checkpoints import (
    CheckpointConfig, Checkpointer, read_checkpoint_meta, warm_start_params)
from flax_xalign.training import metrics as metrics_lib
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.trainer import LoopConfig, Trainer, TrainResult, train as train_loop


def vocabulary_fingerprint(vocabulary: Any) -> dict[str, Any]:
  """Identifies a SentencePiece vocabulary by size and model-bytes hash."""
  return {
      "size": int(vocabulary.vocab_size),
      "sha256": hashlib.sha256(vocabulary.sp_model).hexdigest(),
  }


def resolve_encoder_config(encoder: EncoderConfig, *, vocab_size: int, num_languages: int) -> EncoderConfig:
  """Fills in the vocabulary size and language count the data implies."""
  if encoder.vocab_size is not None and encoder.vocab_size != vocab_size:
    raise UserError(
        f"EncoderConfig.vocab_size={encoder.vocab_size} but the task's vocabulary has {vocab_size} "
        "pieces; leave EncoderConfig.vocab_size unset (it is taken from the vocabulary)."
    )
  updates: dict[str, Any] = {"vocab_size": vocab_size}
  if encoder.num_languages:
    if encoder.num_languages < num_languages + 1:
      raise UserError(
          f"EncoderConfig.num_languages={encoder.num_languages} is too small for "
          f"{num_languages} languages (+1 for padding); raise it or set 0 to drop language embeddings."
      )
  return dataclasses.replace(encoder, **updates)


def build_data(
    name: str, *, feature_lengths: Mapping[str, int], batch_size: int, seed: int,
    split: str = "train", shuffle: bool = True, num_epochs: int | None = None, pack: bool = True,
):
  """This host's share of a global batch stream and its language list."""
  from flax_xalign.data import pipeline

  if batch_size % jax.process_count():
    raise UserError(f"BATCH_SIZE={batch_size} must be divisible by the {jax.process_count()} hosts.")
  return pipeline.get_dataset(
      name, split=split, feature_lengths=feature_lengths,
      batch_size=batch_size // jax.process_count(), seed=seed, shuffle=shuffle,
      shard_id=jax.process_index(), num_shards=jax.process_count(), pack=pack, num_epochs=num_epochs,
  )


def pretrain(
    *,
    model_dir: str,
    mixture_or_task_name: str,
    task_feature_lengths: Mapping[str, int],
    batch_size: int,
    train_steps: int,
    encoder: EncoderConfig,
    objectives: Mapping[str, float],
    objective_options: Mapping[str, Any] | None = None,
    init_from_checkpoint: str | None = None,
    dictionary_rate: float = 0.25,
    masking: MaskingConfig = MaskingConfig(),
    optimizer: OptimizerConfig = OptimizerConfig(),
    num_partitions: int = 1,
    fsdp: bool = False,
    axis_rules: Sequence[tuple[str, str | None]] = (),
    checkpoint: CheckpointConfig = CheckpointConfig(),
    log_every: int = 10,
    eval_every: int = 0,
    eval_batches: int = 20,
    eval_split: str = "validation",
    seed: int = 0,
    peak_flops_per_device: float | None = None,
    user_tasks: Sequence[Any] = (),
    write_config: Callable[[str], None] | None = None,
    step_callback: Callable[[int, Mapping[str, Any]], None] | None = None,
) -> TrainResult:
  """Pretrains an encoder on a seqio task or mixture; resumes from MODEL_DIR.

  Returns the TrainResult (state, last step, whether it was interrupted).
  `objective_options` maps an objective name to its options (a config
  dataclass such as DwaConfig, or keyword arguments). `init_from_checkpoint`
  (a MODEL_DIR) warm-starts a new run from another run's latest parameters;
  parameters it lacks (e.g. the DWA pointer head) keep their initial values,
  and the optimiser state starts fresh. `user_tasks` are
  TextTask/TsvBitextTask/AlphaMixture definitions registered first; `write_config(model_dir)` writes the operative config once the run is
  known to be valid; `step_callback(step, metrics)` runs after every step.
  """
  for spec in user_tasks:
    spec.register()
  from flax_xalign import tasks as task_registry  # noqa: F401  (registers the embedded tasks)
  from flax_xalign.tasks import get_vocabulary

  length = int(task_feature_lengths["tokens"])
  train_ds, languages = build_data(
      mixture_or_task_name, feature_lengths=task_feature_lengths, batch_size=batch_size, seed=seed)
  vocabulary = get_vocabulary(mixture_or_task_name)
  encoder = resolve_encoder_config(
      encoder, vocab_size=int(vocabulary.vocab_size), num_languages=len(languages))
  if "dwa" in objectives and not encoder.pointer_head:
    encoder = encoder.replace(pointer_head=True)
  options, monitors, dictionary = _dictionary_setup(
      model_dir, mixture_or_task_name, objectives, dict(objective_options or {}),
      rate=dictionary_rate, seed=seed, vocab_size=encoder.vocab_size, languages=languages)
  model = PretrainingModel(encoder=Encoder(encoder), objectives=dict(objectives), masking=masking,
                           objective_options=options, monitors=monitors)
  meta = {
      "model": dataclasses.asdict(encoder),
      "vocabulary": vocabulary_fingerprint(vocabulary),
      "languages": list(languages),
      "task": mixture_or_task_name,
      "objectives": dict(objectives),
      "task_feature_lengths": dict(task_feature_lengths),
      "objective_options": {k: _describe(v) for k, v in (objective_options or {}).items()},
      "dictionary": None if dictionary is None else {"file": dictionary_lib.FILENAME, "pairs": len(dictionary),
                                                     "rate": dictionary_rate},
      "init_from_checkpoint": init_from_checkpoint,
      "synthetic_tasks": _synthetic_spec(mixture_or_task_name),
  }
  warm_start = None
  if init_from_checkpoint:
    warm_start = _warm_starter(init_from_checkpoint, meta)

  partitioner = partitioning.Partitioner(
      mesh=partitioning.make_mesh(num_partitions),
      rules=partitioning.logical_axis_rules(fsdp=fsdp, extra=axis_rules))
  loop = LoopConfig(
      train_steps=train_steps, batch_size=batch_size, length=length, seed=seed,
      log_every=log_every, eval_every=eval_every, checkpoint_every=checkpoint.every_steps,
      eval_batches=eval_batches,
      peak_flops_per_device=metrics_lib.peak_flops_per_device(peak_flops_per_device))
  trainer = Trainer(model=model, optimizer=optimizer, partitioner=partitioner, loop=loop)

  checkpointer = Checkpointer(model_dir, checkpoint)
  latest = checkpointer.latest_step()
  if latest is not None:
    checkpointer.check_compatible(latest, meta)  # Before anything is written.
  os.makedirs(model_dir, exist_ok=True)
  if dictionary is not None and jax.process_index() == 0 and not os.path.exists(
      os.path.join(model_dir, dictionary_lib.FILENAME)):
    dictionary_lib.save_in(model_dir, dictionary, getattr(vocabulary, "base", vocabulary))
  if write_config is not None and jax.process_index() == 0:
    write_config(model_dir)
  logger = metrics_lib.MetricsLogger(model_dir, resume_step=latest or 0, total_steps=train_steps)

  def eval_batches_fn():
    ds, _ = build_data(mixture_or_task_name, feature_lengths=task_feature_lengths,
                       batch_size=batch_size, seed=seed, split=eval_split, shuffle=False, num_epochs=1)
    return ds.as_numpy_iterator()

  step_flops = flops_lib.train_flops_per_step(
      encoder, batch=batch_size, length=length,
      num_predictions=max_predictions_for(length, masking.mask_rate))
  n_params = flops_lib.count_params(trainer.abstract_state.params)
  print(f"model: {n_params / 1e6:.2f}M parameters, {encoder.num_layers} layers, embed {encoder.embed_dim}; "
        f"mesh {dict(partitioner.mesh.shape)}; languages {list(languages)}; "
        f"objectives {dict(objectives)}", flush=True)
  try:
    return train_loop(
        trainer=trainer,
        train_iterator=iter(train_ds),
        eval_batches=eval_batches_fn if eval_every else None,
        checkpointer=checkpointer,
        logger=logger,
        meta=meta,
        flops_per_step=step_flops,
        step_callback=step_callback,
        init_params=warm_start,
    )
  finally:
    checkpointer.close()
    logger.close()


def _describe(options: Any) -> Any:
  """JSON-friendly record of an objective's options for the checkpoint meta."""
  if dataclasses.is_dataclass(options):
    return dataclasses.asdict(options)
  return {k: v for k, v in dict(options).items() if k != "dictionary"}


def _warm_starter(checkpoint_dir: str, meta: Mapping[str, Any]) -> Callable[[Any], Any]:
  """Checks `checkpoint_dir` against this run now; returns the params hook."""
  _, source = read_checkpoint_meta(checkpoint_dir)
  for key in ("vocabulary", "languages"):
    if key in source and source[key] != json.loads(json.dumps(meta[key])):
      raise UserError(
          f"init_from_checkpoint={checkpoint_dir} was trained with a different {key} "
          f"({source[key]!r}, this run: {meta[key]!r}); warm-start from a run with the same "
          f"{key}, or train this one from scratch.")

  def init_params(params: Any) -> Any:
    params, missing = warm_start_params(checkpoint_dir, params)
    print(f"warm start from {checkpoint_dir}" + (f"; newly initialised: {', '.join(missing)}" if missing else ""),
          flush=True)
    return params

  return init_params


def _dictionary_setup(model_dir: str, task: str, objectives: Mapping[str, float], options: dict[str, Any], *,
                      rate: float, seed: int, vocab_size: int, languages: Sequence[str]):
  """Dictionary, objective options and alignment monitor of a synthetic-language run.

  Returns (objective options with `dictionary=` filled in, monitors, the [n, 2]
  dictionary or None). The dictionary is read from MODEL_DIR when it exists
  (resume) and only drawn otherwise; the caller saves a fresh one.
  """
  from flax_xalign.data import dictionary as dictionary_lib
  from flax_xalign.evaluation.alignment_score import alignment_monitor
  from flax_xalign.objectives.dictionary_objectives import NEEDS_DICTIONARY
  from flax_xalign.tasks import synthetic as synthetic_tasks

  language = synthetic_tasks.language_of(task)
  needs = [name for name in objectives if name in NEEDS_DICTIONARY]
  if language is None or not language.transliterates:
    if needs:
      raise UserError(
          f"Objectives {needs} need a bilingual token dictionary, which this stack draws for transliterated "
          f"synthetic languages; {task!r} is not one. Use a synthetic_<transforms>_mlm mixture "
          "(flax_xalign.tasks.synthetic) with 'trans' among the transforms.")
    return options, {}, None
  id_map = language.id_map()
  dictionary, _ = dictionary_lib.load_or_draw(model_dir, id_map, rate=rate, seed=seed)
  for name in needs:
    kwargs = dict(options.get(name, {}))
    kwargs["dictionary"] = dictionary
    if name == "dict_mlm":
      derived = synthetic_tasks.derived_language_code(language)
      ids = {code: i + 1 for i, code in enumerate(sorted(languages))}
      kwargs.update(vocab_size=vocab_size, first_derived_id=language.vocab_size,
                    natural_lang_id=ids.get(synthetic_tasks.NATURAL, 0), derived_lang_id=ids.get(derived, 0))
    options[name] = kwargs
  return options, {"alignment": alignment_monitor(id_map, dictionary)}, dictionary


def _synthetic_spec(task: str) -> dict[str, Any] | None:
  """How to re-register a synthetic-language task (for evaluation tools)."""
  from flax_xalign.tasks import synthetic as synthetic_tasks

  spec = synthetic_tasks.spec_of(task)
  return None if spec is None else dataclasses.asdict(spec)
