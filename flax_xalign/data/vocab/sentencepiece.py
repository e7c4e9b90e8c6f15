"""SentencePiece vocabularies: our own layout for training, any layout to load.

Every model trained here (`train_sentencepiece`, the CLI, the Bible model)
reserves the same ids, `flax_xalign.data.vocab.specials.PROJECT`:

====  =========  ============================================
id    piece      use
====  =========  ============================================
0     `<pad>`    padding (seqio's `PAD_ID`)
1     `</s>`     end of a sentence / side (seqio's EOS)
2     `<unk>`    unknown
3     `<s>`      start of a sentence / side
4     `<mask>`   MLM mask (a SentencePiece user-defined symbol)
====  =========  ============================================

`load_vocabulary` accepts any SentencePiece model that defines the five
specials (pad, eos, unk and bos ids, and a `<mask>` piece), wherever they are:
e.g. an imported XLM-R model rebuilt so that SentencePiece's ids are the
model's (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, text pieces, `<mask>` last).
Nothing downstream assumes our layout: every module reads the ids with
`specials.special_tokens_of` (the run manifest records them). seqio's
`SentencePieceVocabulary.pad_id` always answers 0, whatever the model says;
use `special_tokens_of(vocabulary).pad`.

Text is text: a literal `<mask>` (or `<s>`, `</s>`, `<pad>`, `<unk>`) in a
sentence is tokenised like any other characters, never into the special id.
SentencePiece matches USER_DEFINED pieces in the input, and `<mask>` is one
(ours and XLM-R's), so `TextVocabulary` encodes with a copy of the model in
which the special pieces are CONTROL symbols, which SentencePiece never reads
from text. The ids, the pieces and the file (so the vocabulary's sha256 in
run manifests) stay as they are. `load_vocabulary` and `LazyVocabulary` are
`TextVocabulary`s.

seqio's `SentencePieceVocabulary` with `extra_ids > 0` appends sentinels *and*
still reports `vocab_size` without them; we never use extra ids, so
`vocab_size` is exactly the piece count.

`bible_vocabulary()` builds the default Greek + English model from the
embedded corpus's training split and caches it with a manifest of its inputs.
It is a BPE model: on 2 CPU cores SentencePiece's BPE trainer needs ~2 s for
the ~42k balanced verses where its unigram trainer needs ~30 s, and BPE is
what XLM used. `train_sentencepiece` defaults to unigram for user corpora.

Command line (one sentence per line in each input file):

  xalign vocab --input=a.txt --input=b.txt \
      --vocab_size=8000 --output=/path/to/prefix   # writes prefix.model
"""


import dataclasses
import io
import json
import os
import pathlib
import random
import time
from typing import (Callable, Dict, Iterable, List, Optional, Sequence, Tuple,
                    Union)

import seqio
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from flax_xalign import storage
from flax_xalign import errors
from flax_xalign.data.sources import bible
from flax_xalign.data.sources import paths
from flax_xalign.data.vocab import specials
from flax_xalign.fileio import write_atomically

# The project's layout (flax_xalign.data.vocab.specials.PROJECT), used when training.
PAD_ID = specials.PROJECT.pad
EOS_ID = specials.PROJECT.eos
UNK_ID = specials.PROJECT.unk
BOS_ID = specials.PROJECT.bos
MASK_ID = specials.PROJECT.mask
NUM_SPECIAL_TOKENS = specials.PROJECT.first_regular
SPECIAL_PIECES = ("<pad>", "</s>", "<unk>", "<s>", "<mask>")

DEFAULT_SEED = 1234
# Trainer threads are fixed (not os.cpu_count()): the unigram trainer sums
# per-thread statistics, so a fixed count keeps every host of a multi-host run,
# and every rebuild, on bit-identical models.
NUM_THREADS = 2
PathLike = Union[str, os.PathLike]


def trainer_options(*, vocab_size: int, model_type: str = "unigram",
                    character_coverage: float = 0.9995,
                    input_sentence_size: int = 1_000_000) -> dict:
  """The SentencePiece trainer flags we use (also recorded in manifests)."""
  return dict(
      vocab_size=int(vocab_size), model_type=model_type,
      character_coverage=float(character_coverage),
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=BOS_ID,
      pad_piece=SPECIAL_PIECES[PAD_ID], eos_piece=SPECIAL_PIECES[EOS_ID],
      unk_piece=SPECIAL_PIECES[UNK_ID], bos_piece=SPECIAL_PIECES[BOS_ID],
      user_defined_symbols=[SPECIAL_PIECES[MASK_ID]],
      input_sentence_size=int(input_sentence_size),
      shuffle_input_sentence=True, num_threads=NUM_THREADS,
      max_sentence_length=16384, hard_vocab_limit=True,
      minloglevel=2)


def train_sentencepiece(sentences: Iterable[str], *, vocab_size: int,
                        model_path: PathLike, model_type: str = "unigram",
                        character_coverage: float = 0.9995,
                        seed: int = DEFAULT_SEED,
                        input_sentence_size: int = 1_000_000) -> pathlib.Path:
  """Trains a SentencePiece model with the fixed special ids.

  Deterministic: the same sentences, options and seed give the same model bytes.
  The file is written atomically (a temporary file renamed into place).

  Args:
    sentences: training text, one sentence per item (empty ones are skipped).
    vocab_size: number of pieces, specials included.
    model_path: where to write the `.model` file.
    model_type: "unigram", "bpe", "char" or "word".
    character_coverage: fraction of characters covered by the alphabet.
    seed: seeds SentencePiece's sampling of sentences and seed pieces.
    input_sentence_size: at most this many sentences are sampled for training.

  Returns:
    The model path.

  Raises:
    UserError: no text, or a vocabulary too large for the text.
  """
  corpus = [s.strip() for s in sentences]
  corpus = [s for s in corpus if s]
  if not corpus:
    raise errors.UserError(
        "Cannot train a SentencePiece model on an empty corpus; pass files "
        "with at least one non-empty line.")
  if vocab_size <= NUM_SPECIAL_TOKENS:
    raise errors.UserError(
        f"vocab_size={vocab_size} leaves no room for text pieces after the "
        f"{NUM_SPECIAL_TOKENS} special tokens; use a larger --vocab_size.")
  options = trainer_options(
      vocab_size=vocab_size, model_type=model_type,
      character_coverage=character_coverage,
      input_sentence_size=input_sentence_size)
  # SentencePiece samples with its own generator; fix it, and pre-shuffle with
  # our own seeded generator so the sample does not depend on input order ties.
  spm.set_random_generator_seed(seed)
  random.Random(seed).shuffle(corpus)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus),
                                   model_writer=model, **options)
  except RuntimeError as e:
    raise errors.UserError(
        f"SentencePiece could not train a {vocab_size}-piece {model_type} "
        f"model on {len(corpus)} sentences ({e}); use a smaller vocab_size or "
        "more text.") from e
  path = pathlib.Path(model_path)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_atomically(path, model.getvalue())
  return path


def check_special_ids(processor: spm.SentencePieceProcessor,
                      path: PathLike) -> specials.SpecialTokens:
  """The special ids of a SentencePiece model; UserError if it lacks one.

  Any layout is accepted (ours, XLM-R's, ...) as long as the model defines
  pad, eos, unk and bos ids, a `<mask>` piece, and text pieces besides them.

  Raises:
    UserError: naming `path` and what is missing.
  """
  try:
    found = specials.special_tokens_of(processor)
  except ValueError as e:
    raise errors.UserError(
        f"SentencePiece model {path} lacks special tokens flax_xalign needs "
        f"(<pad>, </s>, <unk>, <s> ids and a <mask> piece): {e}") from e
  size = processor.get_piece_size()
  low, high = found.regular_range(size)
  if low >= high:
    raise errors.UserError(
        f"SentencePiece model {path} has no text pieces besides its special "
        f"tokens ({found}, {size} pieces); retrain it with `xalign vocab`.")
  return found


def text_only_model(sp_model: bytes) -> bytes:
  """The serialized model with the special pieces that SentencePiece would read from text made CONTROL.

  A USER_DEFINED piece is matched wherever its spelling occurs in the input;
  a CONTROL piece never is (its id is only ever given, as `<s>` and `</s>`
  are). Only the five `SPECIAL_PIECES` are changed, so a user's own
  user-defined symbols keep matching; ids, pieces and scores are unchanged.
  Returns `sp_model` itself when no piece needs changing.
  """
  proto = sentencepiece_model_pb2.ModelProto.FromString(sp_model)
  kinds = sentencepiece_model_pb2.ModelProto.SentencePiece
  changed = False
  for piece in proto.pieces:
    if piece.piece in SPECIAL_PIECES and piece.type == kinds.USER_DEFINED:
      piece.type = kinds.CONTROL
      changed = True
  return proto.SerializeToString() if changed else sp_model


class TextVocabulary(seqio.SentencePieceVocabulary):
  """A seqio SentencePiece vocabulary that reads special-token spellings in text as text.

  `tokenizer` (the SentencePiece processor that callers encode batches with,
  e.g. the aligner) and `encode` / `encode_tf` use `text_only_model(sp_model)`;
  its ids and pieces are the model's. `sp_model` (so the manifest hash),
  decoding (`<mask>` still decodes to "<mask>") and equality are seqio's, on
  the model file as it is.
  """

  _text_context: Optional[Tuple[bytes, spm.SentencePieceProcessor]] = None

  def _text_model(self) -> Tuple[bytes, spm.SentencePieceProcessor]:
    if self._text_context is None:
      model = self._model_context()
      data = text_only_model(model.sp_model)
      processor = (model.tokenizer if data is model.sp_model
                   else spm.SentencePieceProcessor(model_proto=data))
      self._text_context = (data, processor)
    return self._text_context

  @property
  def tokenizer(self) -> spm.SentencePieceProcessor:
    return self._text_model()[1]

  def _encode(self, s: str) -> Sequence[int]:
    return self.tokenizer.EncodeAsIds(s)

  def _encode_tf(self, s):
    import tensorflow_text as tf_text  # pylint: disable=g-import-not-at-top

    return tf_text.SentencepieceTokenizer(model=self._text_model()[0]).tokenize(s)

  def _decode(self, ids) -> str:
    processor = self._model_context().tokenizer  # The file's own: CONTROL pieces decode to "".
    size = processor.GetPieceSize()
    return processor.DecodeIds([processor.unk_id() if i >= size else int(i) for i in ids])

  def __getstate__(self):
    state = super().__getstate__()
    state.pop("_text_context", None)
    return state


def load_vocabulary(path: PathLike) -> seqio.SentencePieceVocabulary:
  """Loads a SentencePiece model as a seqio vocabulary, checking special ids.

  Args:
    path: a `.model` file: written by `train_sentencepiece` (or the CLI), or
      any model with the five specials (`check_special_ids`), such as an
      imported XLM-R model's `vocabulary.model`. Read its ids with
      `specials.special_tokens_of(vocabulary)`.

  Returns:
    A `TextVocabulary` (a `seqio.SentencePieceVocabulary`) with no extra ids,
    so its `vocab_size` equals the number of pieces.

  Raises:
    UserError: the file is missing, unreadable or lacks a special token.
  """
  path = str(path)
  if not storage.isfile(path):
    raise errors.UserError(
        f"SentencePiece model {path} does not exist; train one with `xalign vocab "
        "--input=FILE --vocab_size=N --output=PREFIX` or fix the path.")
  # seqio opens the model by name with TensorFlow's gfile, not our storage layer: a URL is read from a local copy.
  vocabulary = TextVocabulary(storage.local_copy(path), extra_ids=0)
  try:
    processor = vocabulary.tokenizer
  except Exception as e:  # SentencePiece raises several types on bad bytes.
    raise errors.UserError(
        f"{path} is not a readable SentencePiece model ({e}); retrain it with "
        "`xalign vocab`.") from e
  check_special_ids(processor, path)
  return vocabulary


class LazyVocabulary(TextVocabulary):
  """A SentencePiece vocabulary whose model file is found (or built) on use.

  Registering a seqio task needs a vocabulary object, but training the Bible
  vocabulary at import time would be slow; `resolve()` runs on first use and
  returns the model path, which is then checked like `load_vocabulary`.
  `resolve` should be a frozen dataclass (or module function) so that two
  vocabularies with equal resolvers compare equal, as seqio mixtures require.
  """

  def __init__(self, resolve: Callable[[], PathLike]):
    self._resolve = resolve
    super().__init__("", extra_ids=0)

  def _resolved_path(self) -> str:
    if not self._sentencepiece_model_file:
      path = str(self._resolve())
      load_vocabulary(path)  # Validates before we commit to the path.
      # seqio reads the model by name through TensorFlow's gfile: a URL is read from this process's local copy.
      self._sentencepiece_model_file = storage.local_copy(path)
    return self._sentencepiece_model_file

  def _model_context(self):
    self._resolved_path()
    return super()._model_context()

  @property
  def sentencepiece_model_file(self) -> str:
    return self._resolved_path()

  def __getstate__(self):
    state = super().__getstate__()
    state["_sentencepiece_model_file"] = ""  # Compare/pickle by resolver.
    return state

  def __hash__(self):
    return hash(self._resolve)

  def __str__(self) -> str:
    return f"LazyVocabulary(resolve={self._resolve!r})"


@dataclasses.dataclass(frozen=True)
class FixedPath:
  """A `LazyVocabulary` resolver for a model file given by the user."""
  path: str

  def __call__(self) -> str:
    return self.path


# ------------------------------------------------------------ Bible model

# Bump when the recipe below changes in a way the manifest does not capture.
BIBLE_RECIPE_VERSION = 1
# Language balance: each language's text is repeated r_l = round((C_max /
# C_l) ** (1 - alpha)) times (C = characters in the training split), i.e. the
# trainer sees language shares proportional to C_l ** alpha, as XLM samples
# text for its BPE with alpha = 0.5. For the Bible this repeats the Greek NT
# twice against the English OT + NT once.
BIBLE_ALPHA = 0.5
BIBLE_MODEL_TYPE = "bpe"


def _bible_inputs(vocab_size: int, seed: int) -> dict:
  return {
      "recipe_version": BIBLE_RECIPE_VERSION,
      "corpus": {"package": bible.PACKAGE_SPEC,
                 "wheel_sha256": bible.WHEEL_SHA256},
      "split": {"train": "all books not below",
                "validation": sorted(bible.VALIDATION_BOOKS),
                "test": sorted(bible.TEST_BOOKS)},
      "text": {"en": "english_verses('train') (BSB OT+NT)",
               "grc": "greek_verses('train') (SBLGNT)"},
      "alpha": BIBLE_ALPHA,
      "seed": seed,
      "trainer": trainer_options(vocab_size=vocab_size,
                                 model_type=BIBLE_MODEL_TYPE),
      "sentencepiece": spm.__version__,
  }


def bible_training_text(data_dir: Optional[PathLike] = None
                        ) -> Tuple[List[str], Dict[str, int]]:
  """The balanced Greek + English training text of the Bible vocabulary.

  Returns:
    (sentences, repeats): verses of the training split, each language repeated
    `repeats[lang]` times (see `BIBLE_ALPHA`).
  """
  texts = {
      "en": [t for _, t in bible.english_verses("train", data_dir=data_dir)],
      "grc": [t for _, t in bible.greek_verses("train", data_dir=data_dir)],
  }
  chars = {lang: sum(map(len, lines)) for lang, lines in texts.items()}
  most = max(chars.values())
  repeats = {lang: max(1, round((most / chars[lang]) ** (1.0 - BIBLE_ALPHA)))
             for lang in texts}
  sentences = []
  for lang in sorted(texts):
    sentences.extend(texts[lang] * repeats[lang])
  return sentences, repeats


def bible_vocabulary(vocab_size: int = 8000,
                     data_dir: Optional[PathLike] = None,
                     *, seed: int = DEFAULT_SEED) -> pathlib.Path:
  """Returns the path of the Greek + English Bible SentencePiece model.

  Trained on the training split only (no validation/test book leaks into the
  vocabulary), cached as `<data_dir>/vocab/bible_grc_en_bpe<N>.model` next
  to a JSON manifest of its inputs (corpus sha256, split, vocab size, trainer
  options, seed, recipe and SentencePiece versions); rebuilt only when those
  change.

  Args:
    vocab_size: number of pieces including the 5 specials.
    data_dir: the data directory; `paths.data_dir()` when None.
    seed: trainer seed.

  Returns:
    The `.model` path.
  """
  root = pathlib.Path(data_dir or paths.data_dir())
  stem = root / "vocab" / f"bible_grc_en_{BIBLE_MODEL_TYPE}{vocab_size}"
  model_path = stem.with_suffix(".model")
  manifest_path = stem.with_suffix(".json")
  inputs = _bible_inputs(vocab_size, seed)
  if model_path.exists() and _manifest_inputs(manifest_path) == inputs:
    return model_path
  bible.ensure_wheel(root)
  print(f"flax_xalign: training the {vocab_size}-piece Bible SentencePiece "
        f"model into {model_path} (once; a few seconds)", flush=True)
  start = time.time()
  sentences, repeats = bible_training_text(root)
  train_sentencepiece(sentences, vocab_size=vocab_size, model_path=model_path,
                      model_type=BIBLE_MODEL_TYPE, seed=seed)
  manifest = {"inputs": inputs,
              "built": {"repeats": repeats, "sentences": len(sentences),
                        "seconds": round(time.time() - start, 1)}}
  write_atomically(manifest_path,
                    (json.dumps(manifest, indent=2, sort_keys=True) + "\n"
                     ).encode("utf-8"))
  return model_path


def _manifest_inputs(path: pathlib.Path) -> Optional[dict]:
  try:
    with storage.open_file(path, encoding="utf-8") as f:
      return json.load(f).get("inputs")
  except (OSError, ValueError, AttributeError):
    return None

