"""The files of an offline evaluation suite, read without TensorFlow, seqio or the run's tokenizer.

A suite is a folder with `suite.json` (its layout: `write_suite` in `suite.py` writes it, `score` in
`scoring.py` reads it) and plain files beside it: TSV and MUSE text, `.npz` arrays of token ids, and
`tokens.json`, every text the scorers tokenise mapped to the ids the run's vocabulary gave it when the
suite was written. Everything here imports only numpy and our own TF-free modules, so a GPU host
without seqio reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flax_xalign.errors import UserError

SUITE_JSON = "suite.json"
TOKENS_JSON = "tokens.json"
FORMAT = "flax_xalign.offline_suite"
VERSION = 1
# How each table of tokens.json was tokenised (the way its reference scorer calls the vocabulary):
LEXICON = "lexicon"      # vocabulary.encode(word), as bli.gold_from_lexicon / isomorphism.pieces_from_lexicon
SENTENCES = "sentences"  # retrieval.encode_sentences (the SentencePiece processor on whole sentences)
WORDS = "words"          # WordAligner.word_pieces (the processor on each normalised word)
TABLES = (LEXICON, SENTENCES, WORDS)
METRICS = ("bli", "retrieval", "mlm", "word_alignment")
_REBUILD = "write the suite again with write_suite (flax_xalign.evaluation.offline.suite)"


class TokenTable:
  """A vocabulary stand-in: `encode(text)` answers the ids recorded for `text` when the suite was written.

  Scorers that take a vocabulary (`retrieval.evaluate_retrieval`, `word_align.load_aligner`,
  `lexicon_eval.evaluate_lexicon` through `SuiteText`) call only `encode`, so they score the same ids as
  with the real vocabulary. A text the suite did not record is a UserError: the suite and the scorer
  disagree on what to tokenise, and guessing would change the numbers.
  """

  def __init__(self, table: Mapping[str, Sequence[int]], *, name: str):
    self.table = table
    self.name = name

  def encode(self, text: str) -> list[int]:
    try:
      return list(self.table[text])
    except KeyError:
      raise UserError(f"the suite's {self.name!r} token table has no entry for {text!r}: it was written for "
                      f"other settings (normaliser, data) than this scoring uses; {_REBUILD}.") from None


class Recorder:
  """Wraps `encode`; keeps every text it was asked for with its ids (to write a TokenTable)."""

  def __init__(self, encode):
    self._encode = encode
    self.table: dict[str, list[int]] = {}

  def encode(self, text: str) -> list[int]:
    if text not in self.table:
      self.table[text] = [int(i) for i in self._encode(text)]
    return list(self.table[text])


def save_ragged(path: str, rows: Sequence[Sequence[int]]) -> None:
  """int32 `ids` (all rows end to end) and int64 `offsets` [len(rows) + 1] in an .npz file."""
  lengths = np.asarray([len(r) for r in rows], np.int64)
  offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  ids = np.concatenate([np.asarray(r, np.int32) for r in rows]) if rows else np.zeros(0, np.int32)
  np.savez_compressed(path, ids=ids, offsets=offsets)


def load_ragged(path: str) -> list[np.ndarray]:
  with np.load(path) as f:
    ids, offsets = f["ids"], f["offsets"]
  return [ids[offsets[i]:offsets[i + 1]].astype(np.int64) for i in range(len(offsets) - 1)]


class SuiteText:
  """`lexicon_eval.TaskText`'s members fed from suite files: the text of one BLI pair (src -> pivot)."""

  def __init__(self, suite: "Suite", lang: str):
    entry = suite.bli["languages"][lang]
    self.suite, self.lang = suite, lang
    self.normalizer = suite.bli["normalize"]
    self._vocabularies = entry["vocabularies"]
    self._sentences = entry["sentences"]
    self._tokens = suite.tokens(LEXICON)

  def encode(self, text: str) -> list[int]:
    return self._tokens.encode(text)

  def vocabulary(self):
    raise UserError("a suite has no vocabulary to spell a dictionary with; score BLI without `output`.")

  def language_vocabularies(self, opts) -> tuple[np.ndarray, np.ndarray, str]:
    path = self.suite.path(self._vocabularies)
    with np.load(path) as f:
      ids, mask = f["ids"], f["mask"].astype(bool)
    sides = [self.lang, self.suite.bli["pivot"]]
    if (opts.src, opts.tgt) != tuple(sides):
      raise UserError(f"{path} holds the {sides[0]} -> {sides[1]} vocabularies, not {opts.src} -> {opts.tgt}.")
    return ids, mask, f"{path} (count > {self.suite.bli['min_count']} over {self.suite.bli['task']})"

  def sentences(self, code: str, opts) -> list[np.ndarray]:
    if code not in self._sentences:
      raise UserError(f"the suite has no {code!r} sentences for the {self.lang} BLI pair; {_REBUILD}.")
    rows = load_ragged(self.suite.path(self._sentences[code]))
    return rows[:opts.max_sentences]


class Suite:
  """A suite folder: its suite.json (`layout`) and the files it names."""

  def __init__(self, folder: str):
    self.folder = os.path.abspath(folder)
    path = os.path.join(self.folder, SUITE_JSON)
    if not os.path.isfile(path):
      raise UserError(f"{folder} is not an evaluation suite (no {SUITE_JSON}); {_REBUILD}.")
    try:
      with open(path, encoding="utf-8") as f:
        self.layout = json.load(f)
    except ValueError as e:
      raise UserError(f"{path} is not valid JSON ({e}); {_REBUILD}.") from None
    if self.layout.get("format") != FORMAT or self.layout.get("version") != VERSION:
      raise UserError(f"{path} is not a version-{VERSION} {FORMAT} suite (format {self.layout.get('format')!r}, "
                      f"version {self.layout.get('version')!r}); {_REBUILD}.")
    self._tokens: dict[str, TokenTable] | None = None

  def __getattr__(self, name: str) -> Any:
    if name in METRICS or name == "vocabulary":
      return self.layout[name]
    raise AttributeError(name)

  def path(self, relative: str) -> str:
    """The absolute path of a file the suite names; UserError when it is missing."""
    path = os.path.join(self.folder, relative)
    if not os.path.isfile(path):
      raise UserError(f"{path} is missing from the suite {self.folder} (suite.json names it); copy the whole "
                      f"suite folder, or {_REBUILD}.")
    return path

  def tokens(self, table: str) -> TokenTable:
    if self._tokens is None:
      with open(self.path(self.layout["tokens"]), encoding="utf-8") as f:
        tables = json.load(f)
      self._tokens = {name: TokenTable(tables.get(name, {}), name=name) for name in TABLES}
    return self._tokens[table]

  def check_run(self, run: Any) -> None:
    """UserError unless `run` has the vocabulary (sha256) the suite was tokenised with."""
    sha = run.spec.vocabulary.sha256
    if sha != self.vocabulary["sha256"]:
      raise UserError(f"{run.path} was trained with another vocabulary (sha256 {str(sha)[:12]}...) than the suite "
                      f"{self.folder} was tokenised with ({self.vocabulary['sha256'][:12]}..., from "
                      f"{self.vocabulary['run']}); write a suite with this run's vocabulary.")
