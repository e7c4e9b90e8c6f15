"""The vocabulary as an asset: the SentencePiece model copied into MODEL_DIR.

A run directory is self-contained: `MODEL_DIR/vocabulary.model` (and a copy in
every checkpoint step) is the exact model the run tokenised with, and the run
manifest records its hash, the number of ids the model sees and the special
ids. Evaluation and the aligner load it from there, not from the task registry
or a path in config.gin.

Our SentencePiece layout (`flax_xalign.data.vocab`) and an imported XLM-R/BERT
vocabulary are two instances of the same record; only `SpecialTokens` differs.
The synthetic languages' doubled vocabulary (2V ids over a V-piece model) is
recorded with `factor=2`.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign.assets.base import Asset, Value
from flax_xalign.data.specials import SpecialTokens, special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec, VocabularySpec

FILENAME = "vocabulary.model"


def model_bytes(vocabulary: Any) -> bytes:
  """The serialized SentencePiece model of a seqio vocabulary."""
  data = getattr(vocabulary, "sp_model", None)
  if not data:
    raise UserError(f"vocabulary {vocabulary} is not SentencePiece-based; flax_xalign runs need a "
                    "SentencePiece model (train one with `python -m flax_xalign.data.vocab`).")
  return bytes(data)


def specials_of(vocabulary: Any) -> SpecialTokens:
  try:
    return special_tokens_of(vocabulary)
  except ValueError as e:
    raise UserError(f"vocabulary {vocabulary}: {e}") from e


def spec_of(vocabulary: Any) -> "VocabularySpec":
  """The manifest record of a seqio vocabulary (plain or doubled)."""
  from flax_xalign.run_spec import VocabularySpec

  data = model_bytes(vocabulary)
  base = getattr(vocabulary, "base", vocabulary)
  pieces = int(base.vocab_size)
  size = int(vocabulary.vocab_size)
  if size % pieces:
    raise UserError(f"vocabulary {vocabulary} reports {size} ids for a {pieces}-piece model; expected a "
                    "multiple of the piece count.")
  return VocabularySpec(file=FILENAME, sha256=hashlib.sha256(data).hexdigest(), size=size, pieces=pieces,
                        factor=size // pieces, specials=specials_of(vocabulary))


class VocabularyAsset(Asset):
  """`vocabulary`: the run's SentencePiece model (host only, never on device)."""

  name = "vocabulary"
  files = (FILENAME,)
  on_device = False

  def __init__(self, vocabulary: Any = None):
    self._vocabulary = vocabulary

  def build(self, run: "RunSpec") -> Value:
    vocabulary = self._vocabulary
    if vocabulary is None:
      from flax_xalign import tasks

      vocabulary = tasks.get_vocabulary(run.task)
    value = {"model": np.frombuffer(model_bytes(vocabulary), np.uint8).copy()}
    self.check(value, run)
    return value

  def save(self, directory: str, value: Value) -> None:
    write_atomically(os.path.join(directory, FILENAME), np.asarray(value["model"], np.uint8).tobytes())

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, FILENAME)
    try:
      with open(path, "rb") as f:
        data = f.read()
    except OSError as e:
      raise UserError(f"cannot read the run's vocabulary {path} ({e}).") from e
    return {"model": np.frombuffer(data, np.uint8).copy()}

  def fingerprint(self, value: Value) -> dict[str, Any]:
    # The plain file hash, so `sha256sum MODEL_DIR/vocabulary.model` matches the manifest.
    return {"version": self.version, "sha256": hashlib.sha256(np.asarray(value["model"]).tobytes()).hexdigest()}

  def check(self, value: Value, run: "RunSpec") -> None:
    found = self.fingerprint(value)["sha256"]
    if found != run.vocabulary.sha256:
      raise UserError(f"the vocabulary file ({FILENAME}) is not the task's SentencePiece model (sha256 "
                      f"{found[:12]}… vs {run.vocabulary.sha256[:12]}…); remove it or use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    return f"vocabulary: SentencePiece model, {np.asarray(value['model']).size:,} bytes"


def load_run_vocabulary(directory: str, spec: "VocabularySpec") -> Any:
  """The seqio vocabulary of a run from its asset directory, checked against the manifest.

  Args:
    directory: MODEL_DIR or a checkpoint's `assets/` folder.
    spec: the run manifest's vocabulary record.
  """
  import seqio

  path = os.path.join(directory, spec.file)
  if not os.path.isfile(path):
    raise UserError(f"{path} is missing: the run's vocabulary is copied there when training starts. "
                    "Restore it from checkpoints/<step>/assets/, or pass the SentencePiece model explicitly.")
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != spec.sha256:
    raise UserError(f"{path} is not the vocabulary the run manifest records (sha256 differs); restore it "
                    "from checkpoints/<step>/assets/.")
  vocabulary = seqio.SentencePieceVocabulary(path, extra_ids=0)
  if spec.factor == 1:
    return vocabulary
  from flax_xalign.tasks.synthetic import DoubledVocabulary

  return DoubledVocabulary(vocabulary, factor=spec.factor)
