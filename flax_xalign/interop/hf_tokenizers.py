"""Hugging Face tokenizer files in and out: the fairseq SentencePiece model of XLM-R, BERT's vocab.txt.

Tokenizers. The model's ids are the vocabulary's ids:
* An XLM-R directory carries the fairseq SentencePiece model
  (`sentencepiece.bpe.model`: `<unk>`, `<s>`, `</s>` then text pieces), read
  through fairseq's mapping: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, text
  piece k -> k + 1, `<mask>` = the last id. `model_order_sentencepiece`
  rebuilds it so that SentencePiece's own ids are the model's (`<s>`, `<pad>`,
  `</s>`, `<unk>`, text pieces, `<mask>` user-defined), and seqio and
  `specials.special_tokens_of` read it directly; `fairseq_order_sentencepiece`
  writes it back for export (`export_hf` re-orders other vocabularies' ids
  into fairseq's order first).
* A BERT directory carries `vocab.txt` (WordPiece), read by
  `flax_xalign.data.vocab.wordpiece.WordPieceVocabulary`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from flax_xalign.errors import UserError

SENTENCEPIECE_FILE = "sentencepiece.bpe.model"
WORDPIECE_FILE = "vocab.txt"
_FAIRSEQ_SPM_HEAD = ("<unk>", "<s>", "</s>")  # the first pieces of a fairseq SentencePiece model


def sentencepiece_proto(data: bytes):
  """The `ModelProto` of a serialized SentencePiece model."""
  from sentencepiece import sentencepiece_model_pb2

  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString(data)
  return proto


def _set_special_ids(proto, *, bos: int, pad: int, eos: int, unk: int) -> None:
  spec = proto.trainer_spec
  spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = bos, pad, eos, unk
  spec.bos_piece, spec.pad_piece, spec.eos_piece, spec.unk_piece = "<s>", "<pad>", "</s>", "<unk>"
  spec.vocab_size = len(proto.pieces)


def model_order_sentencepiece(fairseq_model: bytes) -> bytes:
  """A fairseq SentencePiece model rebuilt so that its ids are the XLM-R model's.

  Pieces: `<s>`, `<pad>`, `</s>` (control), `<unk>` (unknown), the text pieces
  in their order, `<mask>` (user-defined) last; scores, normaliser and model
  type are kept, so segmentation is unchanged and only the ids move by
  fairseq's offset.
  """
  source = sentencepiece_proto(fairseq_model)
  head = tuple(p.piece for p in source.pieces[:3])
  if head != _FAIRSEQ_SPM_HEAD:
    raise UserError(f"{SENTENCEPIECE_FILE} does not start with the fairseq pieces {_FAIRSEQ_SPM_HEAD} "
                    f"(found {head}); it is not an XLM-R SentencePiece model.")
  clashes = sorted({p.piece for p in source.pieces[3:]} & {"<pad>", "<mask>"})
  if clashes:
    raise UserError(f"{SENTENCEPIECE_FILE} already has text pieces {clashes}, which XLM-R's tokenizer adds "
                    "as special tokens; it is not an XLM-R SentencePiece model.")
  proto = sentencepiece_proto(fairseq_model)
  del proto.pieces[:]
  kinds = type(source.pieces[0])
  for piece, kind in (("<s>", kinds.CONTROL), ("<pad>", kinds.CONTROL), ("</s>", kinds.CONTROL),
                      ("<unk>", kinds.UNKNOWN)):
    proto.pieces.add(piece=piece, score=0.0, type=kind)
  proto.pieces.extend(source.pieces[3:])
  proto.pieces.add(piece="<mask>", score=0.0, type=kinds.USER_DEFINED)
  _set_special_ids(proto, bos=0, pad=1, eos=2, unk=3)
  return proto.SerializeToString()


def fairseq_order_sentencepiece(model: bytes, perm: np.ndarray) -> bytes:
  """The fairseq SentencePiece model of a vocabulary whose ids are `model`'s pieces.

  Args:
    model: a SentencePiece model whose piece ids are the model's ids.
    perm: `export_hf.fairseq_permutation(specials, size)`; text pieces are perm[4:-1].

  Returns:
    `<unk>`, `<s>`, `</s>` then the text pieces in perm order (no `<pad>` or
    `<mask>`: XLM-R tokenizers add them), as fairseq and transformers read it.
  """
  source = sentencepiece_proto(model)
  proto = sentencepiece_proto(model)
  del proto.pieces[:]
  kinds = type(source.pieces[0])
  for piece, kind in (("<unk>", kinds.UNKNOWN), ("<s>", kinds.CONTROL), ("</s>", kinds.CONTROL)):
    proto.pieces.add(piece=piece, score=0.0, type=kind)
  proto.pieces.extend(source.pieces[int(i)] for i in perm[4:-1])
  _set_special_ids(proto, bos=1, pad=-1, eos=2, unk=0)
  proto.trainer_spec.ClearField("pad_piece")
  return proto.SerializeToString()


TOKENIZER_JSON = "tokenizer.json"


def sentencepiece_tokenizer_json(fairseq_model: bytes) -> bytes | None:
  """`tokenizer.json` of a fairseq SentencePiece model (as `fairseq_order_sentencepiece` writes), or None.

  transformers builds its XLM-R tokenizer from `sentencepiece.bpe.model` only
  with `sentencepiece` and `protobuf` installed; with this file beside it
  the `tokenizers` backend alone suffices. It is what transformers derives
  itself: a unigram model over `<s>`, `<pad>`, `</s>`, `<unk>`, the text
  pieces with their scores and `<mask>` (fairseq ids), the model's
  normaliser (its precompiled character map), whitespace collapsed and
  marked with "▁", `<s> A </s>` around a sentence. None without the
  `tokenizers` package.
  """
  try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
  except ImportError:
    return None
  proto = sentencepiece_proto(fairseq_model)
  head = tuple(p.piece for p in proto.pieces[:3])
  if head != _FAIRSEQ_SPM_HEAD:
    raise UserError(f"expected a fairseq SentencePiece model starting with {_FAIRSEQ_SPM_HEAD}, found {head}.")
  vocab = ([("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
           + [(p.piece, float(p.score)) for p in proto.pieces[3:]] + [("<mask>", 0.0)])
  tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
  spec = proto.normalizer_spec
  steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
  if spec.remove_extra_whitespaces:
    steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
  tokenizer.normalizer = normalizers.Sequence(steps)
  scheme = "always" if spec.add_dummy_prefix else "never"
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=scheme)
  tokenizer.post_processor = processors.TemplateProcessing(
      single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
  tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "<pad>", "</s>", "<unk>")]
                               + [AddedToken("<mask>", lstrip=True, special=True)])
  return tokenizer.to_str().encode("utf-8")


def tokenizer_kind(path: str) -> str:
  """"sentencepiece" (XLM-R's fairseq model) or "wordpiece" (BERT's vocab.txt) of a HF directory."""
  if os.path.isfile(os.path.join(path, SENTENCEPIECE_FILE)):
    return "sentencepiece"
  if os.path.isfile(os.path.join(path, WORDPIECE_FILE)):
    return "wordpiece"
  raise UserError(f"{path} has no tokenizer flax_xalign can read: expected {SENTENCEPIECE_FILE} (XLM-R) or "
                  f"{WORDPIECE_FILE} (BERT WordPiece).")


def load_hf_vocabulary(path, *, scratch_dir: str) -> Any:
  """The vocabulary of a HF directory, whose ids are the model's.

  Args:
    path: the HF directory.
    scratch_dir: where the rebuilt SentencePiece model is written (seqio reads
      a file, lazily: keep the folder until the vocabulary has been saved).

  Returns:
    a `seqio.SentencePieceVocabulary` (XLM-R) or a
    `flax_xalign.data.vocab.wordpiece.WordPieceVocabulary` (BERT).
  """
  path = os.fspath(path)
  if tokenizer_kind(path) == "sentencepiece":
    from flax_xalign.data.vocab.sentencepiece import TextVocabulary

    with open(os.path.join(path, SENTENCEPIECE_FILE), "rb") as f:
      rebuilt = model_order_sentencepiece(f.read())
    target = os.path.join(scratch_dir, "vocabulary.model")
    with open(target, "wb") as f:
      f.write(rebuilt)
    return TextVocabulary(target, extra_ids=0)
  from flax_xalign.data.vocab.wordpiece import WordPieceVocabulary

  settings = os.path.join(path, "tokenizer_config.json")
  lower_case = True  # BertTokenizer's default
  if os.path.isfile(settings):
    with open(settings, encoding="utf-8") as f:
      lower_case = bool(json.load(f).get("do_lower_case", True))
  return WordPieceVocabulary(os.path.join(path, WORDPIECE_FILE), lower_case=lower_case)


def compare_with_transformers(path: str, vocabulary: Any, samples: list[str]) -> list[tuple[str, list, list]]:
  """Samples on which transformers' tokenizer of `path` and `vocabulary` disagree.

  Both encode without special tokens. Returns (text, ours, theirs) per
  disagreement; needs transformers (ImportError otherwise).
  """
  import transformers

  reference = transformers.AutoTokenizer.from_pretrained(path)
  out = []
  for text in samples:
    ours = [int(i) for i in vocabulary.encode(text)]
    theirs = list(reference(text, add_special_tokens=False)["input_ids"])
    if ours != theirs:
      out.append((text, ours, theirs))
  return out
