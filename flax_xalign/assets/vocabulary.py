"""The vocabulary as an asset: the tokenizer's file copied into MODEL_DIR.

A run directory is self-contained: `MODEL_DIR/vocabulary.model` (a
SentencePiece model) or `MODEL_DIR/vocabulary.txt` (a BERT WordPiece
vocab.txt), and a copy in every checkpoint step, is the exact vocabulary the
run tokenised with, and the run manifest records its kind, its hash, the
number of ids the model sees and the special ids. Evaluation and the aligner
load it from there, not from the task registry or a path in config.gin.

Our SentencePiece layout (`flax_xalign.data.vocab.sentencepiece`), an imported XLM-R
SentencePiece model and an imported BERT WordPiece vocabulary are instances
of the same record; `SpecialTokens` differs, and `kind` says how to read the
file. The synthetic languages' doubled vocabulary (2V ids over a V-piece
model) is recorded with `factor=2`.

The WordPiece file is the checkpoint's vocab.txt byte for byte (so `sha256sum`
and Hugging Face tools read it as is). Whether it is uncased is not in the
file: the manifest records it (`VocabularySpec.lower_case`), and the asset's
value and fingerprint carry it, so resuming with the other casing is refused.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign import storage
from flax_xalign.assets.base import Asset, Value
from flax_xalign.data.vocab.specials import SpecialTokens, special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec, VocabularySpec

SENTENCEPIECE, WORDPIECE = "sentencepiece", "wordpiece"
FILENAME = "vocabulary.model"  # SentencePiece
WORDPIECE_FILENAME = "vocabulary.txt"
FILENAMES = {SENTENCEPIECE: FILENAME, WORDPIECE: WORDPIECE_FILENAME}
_WHAT = {SENTENCEPIECE: "SentencePiece model", WORDPIECE: "WordPiece vocab.txt"}


def kind_of(vocabulary: Any) -> str:
  """"wordpiece" for a `WordPieceVocabulary` (its `kind`), else "sentencepiece".

  Read from the attribute, not by type, so callers with SentencePiece
  vocabularies never import the WordPiece module.
  """
  kind = getattr(vocabulary, "kind", SENTENCEPIECE)
  if kind not in FILENAMES:
    raise UserError(f"vocabulary {vocabulary} is of kind {kind!r}; flax_xalign runs take "
                    f"{' or '.join(FILENAMES)} vocabularies.")
  return kind


def model_bytes(vocabulary: Any) -> bytes:
  """The file a seqio vocabulary is read from: SentencePiece model or vocab.txt."""
  if kind_of(vocabulary) == WORDPIECE:
    return bytes(vocabulary.model_bytes)
  data = getattr(vocabulary, "sp_model", None)
  if not data:
    raise UserError(f"vocabulary {vocabulary} is not SentencePiece-based; flax_xalign runs need a "
                    "SentencePiece model (train one with `xalign vocab`) or a "
                    "WordPiece vocab.txt (`flax_xalign.data.vocab.wordpiece.WordPieceVocabulary`).")
  return bytes(data)


def specials_of(vocabulary: Any) -> SpecialTokens:
  try:
    return special_tokens_of(vocabulary)
  except ValueError as e:
    raise UserError(f"vocabulary {vocabulary}: {e}") from e


def spec_of(vocabulary: Any) -> "VocabularySpec":
  """The manifest record of a seqio vocabulary (SentencePiece plain or doubled, or WordPiece)."""
  from flax_xalign.run_spec import VocabularySpec

  kind = kind_of(vocabulary)
  data = model_bytes(vocabulary)
  digest = hashlib.sha256(data).hexdigest()
  if kind == WORDPIECE:
    size = int(vocabulary.vocab_size)
    return VocabularySpec(file=WORDPIECE_FILENAME, sha256=digest, size=size, pieces=size, factor=1,
                          specials=specials_of(vocabulary), kind=WORDPIECE,
                          lower_case=bool(vocabulary.lower_case))
  base = getattr(vocabulary, "base", vocabulary)
  pieces = int(base.vocab_size)
  size = int(vocabulary.vocab_size)
  if size % pieces:
    raise UserError(f"vocabulary {vocabulary} reports {size} ids for a {pieces}-piece model; expected a "
                    "multiple of the piece count.")
  return VocabularySpec(file=FILENAME, sha256=digest, size=size, pieces=pieces,
                        factor=size // pieces, specials=specials_of(vocabulary))


class VocabularyAsset(Asset):
  """`vocabulary`: the run's tokenizer file (host only, never on device).

  Its value is `{"model": uint8 [file bytes]}`, and for WordPiece also
  `{"lower_case": bool []}`: the casing is not in vocab.txt, so `load` takes it
  from this asset (the vocabulary it was made for), and `check` and the
  fingerprint compare it with the manifest. `files` follows the kind.
  """

  name = "vocabulary"
  on_device = False

  def __init__(self, vocabulary: Any = None, *, kind: str | None = None, lower_case: bool | None = None):
    """The asset of `vocabulary`, or of the run's task's vocabulary.

    Args:
      vocabulary: the run's seqio vocabulary; None: `build` takes the task's.
      kind: "sentencepiece" (the default) or "wordpiece", when `vocabulary`
        is None (otherwise read from it).
      lower_case: a WordPiece vocabulary's casing, when `vocabulary` is None.
    """
    if vocabulary is not None:
      found = kind_of(vocabulary)
      found_case = bool(vocabulary.lower_case) if found == WORDPIECE else False
      if (kind is not None and kind != found) or (lower_case is not None and bool(lower_case) != found_case):
        raise ValueError(f"VocabularyAsset(kind={kind!r}, lower_case={lower_case!r}) contradicts its "
                         f"vocabulary {vocabulary} ({found}, lower_case={found_case}).")
      kind, lower_case = found, found_case
    kind = kind or SENTENCEPIECE
    if kind not in FILENAMES:
      raise ValueError(f"VocabularyAsset kind must be one of {sorted(FILENAMES)}, got {kind!r}.")
    if kind == SENTENCEPIECE and lower_case:
      raise ValueError("lower_case applies to WordPiece vocabularies only.")
    self._vocabulary = vocabulary
    self.kind = kind
    self.lower_case = bool(lower_case)

  @classmethod
  def for_spec(cls, spec: "VocabularySpec") -> "VocabularyAsset":
    """The asset that loads the vocabulary a manifest records (no vocabulary object needed)."""
    return cls(kind=spec.kind, lower_case=spec.lower_case if spec.kind == WORDPIECE else None)

  @property
  def files(self) -> tuple[str, ...]:  # Per instance: the file name depends on the kind.
    return (FILENAMES[self.kind],)

  def _value(self, data: bytes, lower_case: bool) -> Value:
    value = {"model": np.frombuffer(data, np.uint8).copy()}
    if self.kind == WORDPIECE:
      value["lower_case"] = np.asarray(lower_case, np.bool_)
    return value

  def build(self, run: "RunSpec") -> Value:
    vocabulary = self._vocabulary
    if vocabulary is None:
      from flax_xalign import tasks

      vocabulary = tasks.get_vocabulary(run.task)
    if kind_of(vocabulary) != self.kind:
      raise UserError(f"the vocabulary of task {run.task!r} is a {kind_of(vocabulary)} vocabulary, but the "
                      f"run's vocabulary asset expects {self.kind}.")
    value = self._value(model_bytes(vocabulary), bool(getattr(vocabulary, "lower_case", False)))
    self.check(value, run)
    return value

  def save(self, directory: str, value: Value) -> None:
    write_atomically(os.path.join(directory, self.files[0]), np.asarray(value["model"], np.uint8).tobytes())

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, self.files[0])
    try:
      with storage.open_file(path, "rb") as f:
        data = f.read()
    except OSError as e:
      raise UserError(f"cannot read the run's vocabulary {path} ({e}).") from e
    return self._value(data, self.lower_case)

  def fingerprint(self, value: Value) -> dict[str, Any]:
    # The plain file hash, so `sha256sum MODEL_DIR/vocabulary.model` (or .txt) matches the manifest.
    digest = hashlib.sha256(np.asarray(value["model"]).tobytes()).hexdigest()
    if self.kind == SENTENCEPIECE:
      return {"version": self.version, "sha256": digest}
    return {"version": self.version, "sha256": digest, "kind": WORDPIECE,
            "lower_case": bool(value["lower_case"])}

  def check(self, value: Value, run: "RunSpec") -> None:
    spec, file = run.vocabulary, self.files[0]
    if spec.kind != self.kind:
      raise UserError(f"the run's vocabulary is a {_WHAT[spec.kind]} ({spec.file}), not a {_WHAT[self.kind]} "
                      f"({file}); remove {file} or use a new MODEL_DIR.")
    found = self.fingerprint(value)["sha256"]
    if found != spec.sha256:
      raise UserError(f"the vocabulary file ({file}) is not the task's {_WHAT[self.kind]} (sha256 "
                      f"{found[:12]}… vs {spec.sha256[:12]}…); remove it or use a new MODEL_DIR.")
    if self.kind == WORDPIECE and bool(value["lower_case"]) != spec.lower_case:
      raise UserError(f"the vocabulary ({file}) is used with lower_case={bool(value['lower_case'])}, but the "
                      f"run records lower_case={spec.lower_case} (an {'un' if spec.lower_case else ''}cased "
                      "model); use the casing the model was trained with, or a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    size = np.asarray(value["model"]).size
    if self.kind == SENTENCEPIECE:
      return f"vocabulary: SentencePiece model, {size:,} bytes"
    case = "uncased" if bool(value["lower_case"]) else "cased"
    return f"vocabulary: WordPiece vocab.txt ({case}), {size:,} bytes"


def load_run_vocabulary(directory: str, spec: "VocabularySpec") -> Any:
  """The seqio vocabulary of a run from its asset directory, checked against the manifest.

  Args:
    directory: MODEL_DIR or a checkpoint's `assets/` folder.
    spec: the run manifest's vocabulary record.

  Returns:
    A `seqio.SentencePieceVocabulary` (a `DoubledVocabulary` for factor 2),
    or a `WordPieceVocabulary` for a "wordpiece" record.
  """
  path = os.path.join(directory, spec.file)
  if not storage.isfile(path):
    raise UserError(f"{path} is missing: the run's vocabulary is copied there when training starts. "
                    f"Restore it from checkpoints/<step>/assets/, or pass the {_WHAT[spec.kind]} explicitly.")
  with storage.open_file(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  if digest != spec.sha256:
    raise UserError(f"{path} is not the vocabulary the run manifest records (sha256 differs); restore it "
                    "from checkpoints/<step>/assets/.")
  if spec.kind == WORDPIECE:
    return _load_wordpiece(path, spec)
  from flax_xalign.data.vocab.sentencepiece import TextVocabulary  # Special spellings in text stay text.

  # seqio opens the model by name with TensorFlow's gfile, not our storage layer: a run in a bucket is read
  # from a local copy.
  vocabulary = TextVocabulary(storage.local_copy(path), extra_ids=0)
  if spec.factor == 1:
    return vocabulary
  from flax_xalign.tasks.synthetic import DoubledVocabulary

  return DoubledVocabulary(vocabulary, factor=spec.factor)


def _load_wordpiece(path: str, spec: "VocabularySpec") -> Any:
  from flax_xalign.data.vocab.wordpiece import WordPieceVocabulary

  if spec.factor != 1:
    raise UserError(f"the run manifest records a WordPiece vocabulary with factor={spec.factor}; only "
                    "SentencePiece vocabularies are doubled (synthetic languages).")
  vocabulary = WordPieceVocabulary(storage.read_bytes(path) if storage.is_url(path) else path,
                                   lower_case=spec.lower_case)
  if vocabulary.special_tokens() != spec.specials or vocabulary.vocab_size != spec.size:
    raise UserError(f"{path} reads as {vocabulary.vocab_size} ids with specials {vocabulary.special_tokens()}, "
                    f"but the run manifest records {spec.size} and {spec.specials}; this flax_xalign reads "
                    "vocab.txt differently from the release that wrote the run.")
  return vocabulary
