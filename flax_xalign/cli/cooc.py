r"""Counts the global co-occurrence table of MLM-GC (Ai & Fang 2023, §3.2), or shows what a table holds.

  xalign cooc --task=NAME --window=2 --output=DIR [--split=train] \
      [--languages=de,en] [--reference_language=en] [--drop_diagonal]
  xalign cooc --text=FILE:LANG [--text=FILE:LANG ...] --vocabulary=MODEL --output=DIR [--window=2]
  xalign cooc --inspect=DIR --token=PIECE_OR_ID [--top=10] [--vocabulary=MODEL]

Counting reads the split of a registered seqio task or mixture (every member
once, unpacked) or UTF-8 text files (one sentence per line, tokenised with a
SentencePiece model), prints a progress line with tokens/s every few seconds
and a summary, and writes `DIR/cooc.npz` (the CSR table, pre-logged) and
`DIR/cooc.json` (the manifest: window, weights, c_lang, tokens per language,
corpus fingerprint, source). Definitions: `flax_xalign.data.cooc`. Use the
directory as a run's table with `train.asset_options = {'cooc': {'path': DIR}}`.

--inspect prints the `--top` largest X[token, b] of a token, with pieces when
the vocabulary is known (the counted task's, the --text run's model, or
--vocabulary); a numeric --token is an id and works without one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign cooc", description=__doc__.split("\n")[0])
  parser.add_argument("--task", help="a registered seqio task or mixture to count")
  parser.add_argument("--text", action="append", default=[], metavar="FILE:LANG",
                      help="a text file (one sentence per line) and its language code; repeatable")
  parser.add_argument("--vocabulary", help="SentencePiece model for --text (and pieces for --inspect)")
  parser.add_argument("--split", default="train")
  parser.add_argument("--languages", help="comma-separated codes to count (default: the task's)")
  parser.add_argument("--window", type=int, default=2, help="n of the ±n window (the paper: 2)")
  parser.add_argument("--reference_language", default="en", help="c_lang = C_ref / C_lang")
  parser.add_argument("--drop_diagonal", action="store_true", help="leave out X[a, a]")
  parser.add_argument("--output", help="directory for cooc.npz and cooc.json")
  parser.add_argument("--inspect", metavar="DIR", help="a directory with a table to inspect")
  parser.add_argument("--token", help="with --inspect: a piece or an id")
  parser.add_argument("--top", type=int, default=10)
  return parser.parse_args(argv)


# ---------------------------------------------------------------- counting


def _text_inputs(specs: Sequence[str]) -> list[tuple[str, str]]:
  inputs = []
  for spec in specs:
    path, sep, lang = spec.rpartition(":")
    if not sep or not path or not lang:
      raise UserError(f"--text {spec!r}: expected FILE:LANG, e.g. --text=corpus.en.txt:en.")
    if not os.path.isfile(path):
      raise UserError(f"--text {spec!r}: {path} does not exist.")
    inputs.append((path, lang))
  return inputs


def count_text(inputs: Sequence[tuple[str, str]], *, vocabulary: str, window: int, reference_language: str,
               drop_diagonal: bool, log: Callable[[str], Any] = print) -> Any:
  """The table of text files [(path, language code)] tokenised with a SentencePiece model."""
  from flax_xalign.data import cooc
  from flax_xalign.data.sources import wheels

  start = time.perf_counter()
  languages = tuple(sorted({lang for _, lang in inputs}))
  _, vocab_size = cooc.encoder_of(vocabulary)  # UserError for a missing or bad model.
  counter = cooc.PairCounter(languages=languages, vocab_size=vocab_size, window=window)
  report = cooc.progress_logger(log, ", ".join(path for path, _ in inputs))
  lines = 0
  for path, lang in inputs:
    for index, ids in cooc.text_sequences([path], vocabulary=vocabulary, language=languages.index(lang)):
      counter.add(index, ids)
      lines += 1
      if lines % 4096 == 0:
        report(int(counter.tokens.sum()), lines)
  counts = counter.result()
  report(int(counts.tokens.sum()), lines, True)
  # The file's bytes are what a run's manifest hashes (a seqio vocabulary's sp_model).
  source = {"files": [{"path": os.path.abspath(p), "language": lang} for p, lang in inputs],
            "vocabulary": os.path.abspath(vocabulary), cooc.VOCABULARY_KEY: wheels.sha256_of(vocabulary)}
  table = cooc.finalize(counts, reference_language=reference_language, drop_diagonal=drop_diagonal,
                        source=source, seconds=time.perf_counter() - start, log=log)
  log(cooc.summary(table))
  return table


def check_files(args: argparse.Namespace) -> None:
  """--output is a new, empty or earlier cooc folder holding none of the inputs; the inputs can be read."""
  from flax_xalign import fileio
  from flax_xalign.data import cooc

  own = {cooc.TABLE_FILE, cooc.MANIFEST_FILE}
  texts = [spec.rpartition(":")[0] for spec in args.text]
  fileio.check_output_folder(args.output, inputs={"--text": texts, "--vocabulary": args.vocabulary},
                             owned=lambda folder: set(os.listdir(folder)) <= own,
                             what=f"a cooc table ({cooc.TABLE_FILE}, {cooc.MANIFEST_FILE})")
  for path in texts + ([args.vocabulary] if args.vocabulary else []):
    if path and (os.path.exists(path) or os.path.islink(path)):  # A missing one is named with its flag below.
      fileio.check_input_file(path, setting="--text" if path in texts else "--vocabulary")


def count(args: argparse.Namespace) -> None:
  from flax_xalign.data import cooc

  if bool(args.task) == bool(args.text):
    raise UserError("count either a task (--task=NAME) or text files (--text=FILE:LANG --vocabulary=MODEL), "
                    "or inspect a table (--inspect=DIR --token=PIECE).")
  if not args.output:
    raise UserError("--output=DIR is missing: the directory to write cooc.npz and cooc.json into.")
  if args.window < 1:
    raise UserError(f"--window must be an integer >= 1 (n of the ±n window; the paper: 2), got {args.window}.")
  check_files(args)
  if args.task:
    from flax_xalign.tasks import cooc_input  # (registers the embedded tasks)

    languages = [c for c in args.languages.split(",") if c] if args.languages else None
    table = cooc_input.count_task(args.task, split=args.split, languages=languages, window=args.window,
                                  reference_language=args.reference_language, drop_diagonal=args.drop_diagonal)
  else:
    if not args.vocabulary:
      raise UserError("--text needs --vocabulary=MODEL, the SentencePiece model to tokenise it with.")
    table = count_text(_text_inputs(args.text), vocabulary=args.vocabulary, window=args.window,
                       reference_language=args.reference_language, drop_diagonal=args.drop_diagonal)
  cooc.save_table(args.output, table)
  print(f"cooc: wrote {os.path.join(args.output, cooc.TABLE_FILE)} and {cooc.MANIFEST_FILE} "
        f"(fingerprint {table.info['corpus_fingerprint'][:12]})")


# ---------------------------------------------------------------- inspecting


def _sentencepiece(sp: Any, pieces: int) -> tuple[Callable[[int], str], Callable[[str], int]]:
  """(id -> piece, piece -> id or -1) of a SentencePiece processor (ids of a doubled vocabulary wrap)."""
  unk = sp.unk_id()

  def to_id(piece: str) -> int:
    ident = sp.piece_to_id(piece)
    return ident if ident != unk or piece == sp.id_to_piece(unk) else -1

  return (lambda i: sp.id_to_piece(int(i) % pieces)), to_id


def _vocabulary_of(info: dict[str, Any], path: str | None) -> tuple[Callable[[int], str], Callable[[str], int]] | None:
  """(id -> piece, piece -> id or -1) of --vocabulary, else of the table's source; None when unknown."""
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


def inspect(args: argparse.Namespace, out: Callable[[str], Any] = print) -> None:
  from flax_xalign.data import cooc

  if args.token is None:
    raise UserError("--inspect needs --token=PIECE_OR_ID, e.g. --token=▁the or --token=42.")
  table = cooc.load_table(args.inspect)
  vocab = _vocabulary_of(table.info, args.vocabulary)
  token = args.token.strip()
  if token.lstrip("-").isdigit():
    token_id = int(token)
  elif vocab is None:
    raise UserError(f"--token {token!r} is not an id and the table's vocabulary is unknown here (its task is not "
                    "registered); pass --vocabulary=MODEL or the token's id.")
  else:
    token_id = vocab[1](token)
    if token_id < 0:
      token_id = vocab[1]("▁" + token)  # A word without its SentencePiece word-start marker.
    if token_id < 0:
      raise UserError(f"--token {token!r} is not a piece of the table's vocabulary; give a piece (e.g. ▁{token}) "
                      "or an id.")
  piece = (lambda i: vocab[0](i)) if vocab is not None else (lambda i: "")
  pairs = table.top_pairs(token_id, args.top)
  info = table.info
  row = int(table.indptr[token_id + 1] - table.indptr[token_id])
  out(f"token {token_id} {piece(token_id)!r}: {row:,} partners within ±{info['window']} "
      f"(table {info['nnz']:,} pairs, languages {', '.join(info.get('languages', []))}, reference "
      f"{info.get('reference_language')})")
  out(f"{'rank':>4}  {'id':>7}  {'piece':<20} {'X':>12}  {'log X':>8}")
  for rank, (b, x) in enumerate(pairs, start=1):
    out(f"{rank:>4}  {b:>7}  {piece(b)!r:<20} {x:>12.4f}  {np.log(x):>8.4f}")


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, lambda args: inspect(args) if args.inspect else count(args), argv)


if __name__ == "__main__":
  sys.exit(main())
