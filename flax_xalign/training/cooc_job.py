"""`xalign cooc`'s work: count a co-occurrence table (of a task or of text files) and write it, or inspect one.

The counting job (`flax_xalign.data.cooc.job.CoocJob`), its checks and the
counting of text files are data/'s; counting a registered task or mixture and
finding the vocabulary of a table counted from one need the task registry,
so the whole job lives above tasks/. It sits in training/ (beside
`cache_job`) rather than in tasks/ or assets/ because importing those
packages loads seqio and TensorFlow, or JAX: here the registry is imported
only when a task is read, after the flag and file checks, and text counting
and most inspections never load it. The printed lines are the command's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from flax_xalign.data import cooc
from flax_xalign.data.cooc import job as cooc_job
from flax_xalign.errors import UserError

# How `xalign cooc`'s first refusal names its other use.
INSPECT_ALTERNATIVE = ", or inspect a table (--inspect=DIR --token=PIECE)"


def count(job: cooc_job.CoocJob) -> cooc.CoocTable:
  """Checks the job and its files, counts the table (progress lines and a summary), writes it and says where."""
  cooc_job.check_job(job, alternatives=INSPECT_ALTERNATIVE)
  cooc_job.check_files(job.output, texts=job.texts, vocabulary=job.vocabulary)
  if job.task:
    from flax_xalign.tasks import cooc_input  # (registers the embedded tasks)

    languages = list(job.languages) if job.languages is not None else None
    table = cooc_input.count_task(job.task, split=job.split, languages=languages, window=job.window,
                                  reference_language=job.reference_language, drop_diagonal=job.drop_diagonal)
  else:
    if not job.vocabulary:
      raise UserError("--text needs --vocabulary=MODEL, the SentencePiece model to tokenise it with.")
    table = cooc_job.count_text(cooc_job.text_inputs(job.texts), vocabulary=job.vocabulary, window=job.window,
                                reference_language=job.reference_language, drop_diagonal=job.drop_diagonal)
  cooc.save_table(job.output, table)
  print(f"cooc: wrote {os.path.join(job.output, cooc.TABLE_FILE)} and {cooc.MANIFEST_FILE} "
        f"(fingerprint {table.info['corpus_fingerprint'][:12]})")
  return table


# ---------------------------------------------------------------- inspecting


Vocabulary = tuple[Callable[[int], str], Callable[[str], int]]  # (id -> piece, piece -> id or -1)


def _sentencepiece(sp: Any, pieces: int) -> Vocabulary:
  """(id -> piece, piece -> id or -1) of a SentencePiece processor (ids of a doubled vocabulary wrap)."""
  unk = sp.unk_id()

  def to_id(piece: str) -> int:
    ident = sp.piece_to_id(piece)
    return ident if ident != unk or piece == sp.id_to_piece(unk) else -1

  return (lambda i: sp.id_to_piece(int(i) % pieces)), to_id


def vocabulary_of(info: dict[str, Any], path: str | None) -> Vocabulary | None:
  """(id -> piece, piece -> id or -1) of the model at `path`, else of the table's source; None when unknown."""
  source = info.get("source", {})
  path = path or source.get("vocabulary")
  if path:
    import sentencepiece as spm

    if not os.path.isfile(path):
      raise UserError(f"--vocabulary {path} does not exist; pass the SentencePiece model the table was counted "
                      "with, or give --token as an id.")
    sp = spm.SentencePieceProcessor(model_file=path)
    return _sentencepiece(sp, sp.get_piece_size())
  if "task" not in source:
    return None
  from flax_xalign import tasks

  try:
    vocabulary = tasks.get_vocabulary(source["task"])
  except UserError:
    return None
  if isinstance(getattr(vocabulary, "tokens", None), tuple):  # WordPiece: the vocab.txt lines.
    index = {t: i for i, t in enumerate(vocabulary.tokens)}
    return (lambda i: vocabulary.tokens[int(i)]), (lambda piece: index.get(piece, -1))
  base = getattr(vocabulary, "base", vocabulary)
  if not hasattr(base, "tokenizer"):
    return None
  return _sentencepiece(base.tokenizer, int(base.vocab_size))


def _token_id(token: str, vocab: Vocabulary | None) -> int:
  """The id of a piece or an id (a word without its SentencePiece word-start marker too); UserError if none."""
  token = token.strip()
  if token.lstrip("-").isdigit():
    return int(token)
  if vocab is None:
    raise UserError(f"--token {token!r} is not an id and the table's vocabulary is unknown here (its task is not "
                    "registered); pass --vocabulary=MODEL or the token's id.")
  token_id = vocab[1](token)
  if token_id < 0:
    token_id = vocab[1]("▁" + token)  # A word without its SentencePiece word-start marker.
  if token_id < 0:
    raise UserError(f"--token {token!r} is not a piece of the table's vocabulary; give a piece (e.g. ▁{token}) "
                    "or an id.")
  return token_id


def inspect(directory: str, token: str | None, *, top: int = 10, vocabulary: str | None = None,
            out: Callable[[str], Any] = print) -> None:
  """Prints the `top` largest X[token, b] of the table in `directory`, with pieces when the vocabulary is known
  (`vocabulary`, the counted task's or the text run's model); `token` is a piece or an id."""
  if token is None:
    raise UserError("--inspect needs --token=PIECE_OR_ID, e.g. --token=▁the or --token=42.")
  table = cooc.load_table(directory)
  vocab = vocabulary_of(table.info, vocabulary)
  token_id = _token_id(token, vocab)
  piece = (lambda i: vocab[0](i)) if vocab is not None else (lambda i: "")
  pairs = table.top_pairs(token_id, top)
  info = table.info
  row = int(table.indptr[token_id + 1] - table.indptr[token_id])
  out(f"token {token_id} {piece(token_id)!r}: {row:,} partners within ±{info['window']} "
      f"(table {info['nnz']:,} pairs, languages {', '.join(info.get('languages', []))}, reference "
      f"{info.get('reference_language')})")
  out(f"{'rank':>4}  {'id':>7}  {'piece':<20} {'X':>12}  {'log X':>8}")
  for rank, (b, x) in enumerate(pairs, start=1):
    out(f"{rank:>4}  {b:>7}  {piece(b)!r:<20} {x:>12.4f}  {np.log(x):>8.4f}")
