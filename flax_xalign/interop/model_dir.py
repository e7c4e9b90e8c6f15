"""Writing an imported model as a normal MODEL_DIR.

An encoder brought in from elsewhere (a Hugging Face directory, the embedded
multilingual-e5-small) becomes a MODEL_DIR like a training run's, so
`INIT_FROM_CHECKPOINT`, `flax_xalign.eval`, `xalign align` and the
analyses accept it unchanged:

  MODEL_DIR/vocabulary.model | vocabulary.txt   the tokenizer (vocabulary asset)
  MODEL_DIR/origin.json                          where the weights came from
  MODEL_DIR/NOTICE                               the weights' licence notice, if any
  MODEL_DIR/model.gin                            its architecture as EncoderConfig bindings
  MODEL_DIR/checkpoints/0/{state,meta,assets}    params, run manifest, assets

The manifest of an import has no objectives (nothing trained it here) and no
data-iterator item; resuming "training" in it is refused with a pointer to
INIT_FROM_CHECKPOINT. Its `languages` are the ones the user declares (they
matter only to a model with language embeddings).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from flax_xalign.assets.vocabulary import VocabularyAsset, spec_of
from flax_xalign.errors import UserError
from flax_xalign.fileio import makedirs, write_atomically
from flax_xalign.models.config import MODEL_GIN_FILE, EncoderConfig, architecture_gin
from flax_xalign.run_dir import RunDir
from flax_xalign.run_spec import RunSpec


def write_model_dir(output: str, *, config: EncoderConfig, params: Mapping[str, Any], vocabulary: Any,
                    languages: Sequence[str] = (), language_pairs: Sequence[tuple[str, str]] = (),
                    origin: Mapping[str, Any] | None = None, notice: str | None = None,
                    task_feature_lengths: Mapping[str, int] | None = None) -> RunSpec:
  """Writes `params` (our encoder's tree) with its vocabulary as a MODEL_DIR; returns the manifest.

  Args:
    output: the new MODEL_DIR; refused if it already holds checkpoints.
    config: the encoder config (vocab_size set; equal to the vocabulary's ids).
    params: plain (unboxed) parameter tree of `Encoder(config)`, numpy or jax arrays.
    vocabulary: a seqio vocabulary whose ids are the model's ids (`assets.vocabulary.spec_of` reads it).
    languages: language codes the model will be used with (language ids only
      matter with language embeddings).
    language_pairs: (source, target) defaults for the aligner.
    origin: JSON-able description of the source (format, path, sha256, ...).
    notice: licence text kept as MODEL_DIR/NOTICE.
    task_feature_lengths: recorded for evaluation defaults ({"tokens": 128}).
  """
  from flax_xalign.runs.checkpoints import find_latest_step
  from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer, make_meta

  if find_latest_step(output) is not None:
    raise UserError(f"{output} already holds checkpoints; import into a new MODEL_DIR.")
  spec = spec_of(vocabulary)
  if config.vocab_size != spec.size:
    raise UserError(f"the model has {config.vocab_size} token embeddings but its vocabulary has {spec.size} ids; "
                    "they must be the same vocabulary.")
  rows = int(np.shape(params["token_embed"]["embedding"])[0])
  if rows != config.padded_vocab_size:
    raise UserError(f"the token embedding has {rows} rows but the config wants {config.padded_vocab_size} "
                    f"(vocab_size {config.vocab_size} padded to a multiple of {config.vocab_pad_multiple}); "
                    "pad or cut them with flax_xalign.models.encoder.with_vocab_rows.")
  asset = VocabularyAsset(vocabulary)
  run = RunSpec(task="", languages=tuple(sorted(set(languages))), language_pairs=tuple(map(tuple, language_pairs)),
                task_feature_lengths=dict(task_feature_lengths or {"tokens": 128}), task_definitions=None,
                vocabulary=spec, model=config, objectives={})
  value = asset.build(run)
  run = run.replace(assets={"vocabulary": asset.fingerprint(value)})
  makedirs(output, setting="--output")
  run_dir = RunDir(output)
  asset.save(run_dir.assets, value)
  write_atomically(run_dir.origin, json.dumps(dict(origin or {}), indent=2, sort_keys=True))
  if notice:
    write_atomically(run_dir.notice, notice)
  write_atomically(run_dir.file(MODEL_GIN_FILE), architecture_gin(config))
  state = {"params": jax.tree.map(np.asarray, dict(params)), "step": np.int32(0)}
  checkpointer = Checkpointer(output, CheckpointConfig(async_save=False))
  try:
    checkpointer.save(0, state, None, make_meta(run, run.assets), assets={"vocabulary": asset},
                      asset_values={"vocabulary": value}, force=True)
  finally:
    checkpointer.close()
  return run
