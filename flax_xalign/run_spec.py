"""The run manifest: what a MODEL_DIR was trained on, in one typed record.

`RunSpec` names the task, its languages and translation-pair sides, the
vocabulary (file, fingerprint, special ids), the encoder config, the
objectives with their options, and the fingerprint of every asset the run
built. It is saved in every checkpoint's metadata (JSON, under the key
`run`), checked on resume, and read by evaluation, the aligner, the grid and
warm start: nothing parses config.gin.

    from flax_xalign.runs import Run
    run = Run.open("runs/demo").spec
    run.languages, run.vocabulary.specials.mask, run.model.num_layers

The manifest holds facts, not settings that may change between a run and its
resumption (steps, batch size, learning rate live in config.gin). The one
exception is `optimizer`, a record of the optimiser settings of the invocation
that wrote the checkpoint: objectives' checks read it (MLM-GC refuses a run
without LR warmup), and resumption compares only what of it shapes the saved
optimiser state (`optimizer.state_settings`: whether `trainable` freezes, the
moments' dtype); the rest may change.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from flax_xalign.data.vocab.spec import VocabularySpec  # noqa: F401  (the manifest's record; callers import it from here)
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.models.config import EncoderConfig

VERSION = 1
META_KEY = "run"
@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
  """The manifest of one training run.

  Attributes:
    task: the seqio task or mixture name.
    languages: the sorted language codes; language id = index + 1.
    language_pairs: (side a, side b) of each bitext task of the mixture.
    task_feature_lengths: {"tokens": row length}.
    task_definitions: how to re-register user-defined tasks in a fresh
      process (`flax_xalign.tasks.register_described`): TextTask /
      TsvBitextTask / AlphaMixture / ... arguments (absolute file and
      vocabulary paths, normalizer), or {"kind": "PythonModule"} naming the
      module whose import registers tasks defined in Python; () for embedded
      tasks and manifests written before they were recorded; None when the
      registering code is unknown (a script's __main__). Evaluation registers
      them itself (`flax_xalign.runs.tasks`).
    vocabulary: the vocabulary asset's record.
    model: the resolved encoder config (vocabulary size filled in).
    objectives: trained objective -> weight.
    objective_options: objective -> its options, as JSON.
    monitors: objectives evaluated only for their monitors.
    asset_options: asset -> the options it was built with.
    assets: asset -> fingerprint of the value the run started with.
    seed: the run's seed.
    init_from_checkpoint: the MODEL_DIR a new run was warm-started from.
    pair_layout: how translation pairs were laid out in rows
      (`data.specials.PAIR_LAYOUTS`); the aligner lays pairs out the same way.
    bitext_both_directions: each training pair was also seen as (b, a).
    optimizer: the optimiser settings of the invocation that wrote this
      manifest (`dataclasses.asdict(OptimizerConfig)`); {} in manifests
      written before it was recorded, or by imports. A record for checks;
      on resume only its state-shaping fields are compared
      (`optimizer.state_settings`), not the rest (not in `COMPATIBILITY_FIELDS`).
  """

  task: str
  languages: tuple[str, ...]
  language_pairs: tuple[tuple[str, str], ...] = ()
  task_feature_lengths: Mapping[str, int]
  task_definitions: tuple[dict[str, Any], ...] | None = ()
  vocabulary: VocabularySpec
  model: EncoderConfig
  objectives: Mapping[str, float]
  objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  monitors: tuple[str, ...] = ()
  asset_options: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  assets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  seed: int = 0
  init_from_checkpoint: str | None = None
  pair_layout: str = "restart"
  bitext_both_directions: bool = False
  optimizer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  version: int = VERSION

  def language_id(self, code: str) -> int:
    """The `lang_ids` value of a language (0 if the run does not have it)."""
    return self.languages.index(code) + 1 if code in self.languages else 0

  def options_of(self, asset: str) -> dict[str, Any]:
    return dict(self.asset_options.get(asset, {}))

  def replace(self, **changes: Any) -> "RunSpec":
    return dataclasses.replace(self, **changes)

  # ------------------------------------------------------------- JSON

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["languages"] = list(self.languages)
    out["language_pairs"] = [list(p) for p in self.language_pairs]
    out["monitors"] = list(self.monitors)
    return json.loads(json.dumps(out))  # Tuples -> lists, keys -> str: as saved.

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> "RunSpec":
    fields = dict(data)
    version = fields.pop("version", None)
    if version != VERSION:
      raise UserError(f"run manifest version {version!r} is not supported (this flax_xalign writes version "
                      f"{VERSION}); use the flax_xalign release that wrote it.")
    vocabulary = dict(fields.pop("vocabulary"))
    vocabulary["specials"] = SpecialTokens.from_dict(vocabulary["specials"])
    definitions = fields.pop("task_definitions", ())
    fields["languages"] = tuple(fields["languages"])
    fields["language_pairs"] = tuple(tuple(p) for p in fields.get("language_pairs", ()))
    fields["monitors"] = tuple(fields.get("monitors", ()))
    fields["model"] = EncoderConfig(**fields["model"])
    return cls(**fields, vocabulary=VocabularySpec(**vocabulary),
               task_definitions=None if definitions is None else tuple(definitions))


def from_meta(meta: Mapping[str, Any], *, where: str) -> RunSpec:
  """The RunSpec saved in a checkpoint's metadata; one clear error for old runs."""
  if META_KEY not in meta:
    raise UserError(
        f"{where} was written by a flax_xalign release before run manifests (its checkpoint metadata has "
        f"no {META_KEY!r} entry, keys: {sorted(meta)}). This release cannot resume or evaluate it: retrain "
        "into a new MODEL_DIR, or use the release that wrote it.")
  return RunSpec.from_json(meta[META_KEY])
