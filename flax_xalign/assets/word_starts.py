"""The `word_starts` asset: which ids begin a word, so objectives can group subwords into words on device.

awesome-align's self-training objective (`objectives/so.py`, `label_level='word'`)
takes its self-labels between words: a subword link makes its two words
aligned, and every subword pair of two aligned words becomes a label. The
batch carries token ids only; this table turns them into word boundaries,
`table[tokens]`, inside the jitted step.

Value: `{"table": bool [V]}`, V the run's vocabulary size
(`RunSpec.vocabulary.size`). A SentencePiece piece begins a word when it
starts with `▁` (as `tasks/links.py` counts words for given links); a
WordPiece piece when it does not start with `##` (BERT's basic words, which
also split punctuation off a whitespace word). A doubled synthetic
vocabulary (2V ids over a V-piece model) repeats the table for each copy.
File `word_starts.npz`. Special ids are in the table like any other; the
objectives mask them out.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign import storage
from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.assets.vocabulary import WORDPIECE, kind_of, model_bytes
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

FILENAME = "word_starts.npz"
SENTENCEPIECE_WORD_START = "\u2581"
WORDPIECE_CONTINUATION = "##"


def word_start_table(vocabulary: Any, size: int) -> np.ndarray:
  """bool [size]: the id's piece begins a word (module docstring), for a seqio vocabulary of `size` ids."""
  if kind_of(vocabulary) == WORDPIECE:
    pieces = [not token.startswith(WORDPIECE_CONTINUATION) for token in vocabulary.tokens]
  else:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_bytes(vocabulary))
    pieces = [processor.id_to_piece(i).startswith(SENTENCEPIECE_WORD_START) for i in range(processor.get_piece_size())]
  pieces = np.asarray(pieces, np.bool_)
  if size < len(pieces) or size % len(pieces):
    raise UserError(f"the vocabulary has {len(pieces)} pieces but the run {size} ids (not a whole number of "
                    "copies); the word_starts asset cannot tell which ids begin words.")
  return np.tile(pieces, size // len(pieces))


class WordStarts(Asset):
  """`word_starts`: bool [V], the id begins a word."""

  name = "word_starts"
  files = (FILENAME,)

  def build(self, run: "RunSpec") -> Value:
    from flax_xalign import tasks

    return {"table": word_start_table(tasks.get_vocabulary(run.task), run.vocabulary.size)}

  def save(self, directory: str, value: Value) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, table=np.asarray(value["table"], np.bool_))
    write_atomically(os.path.join(directory, FILENAME), buffer.getvalue())

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, FILENAME)
    try:
      with np.load(storage.open_file(path, "rb")) as data:
        return {"table": np.asarray(data["table"], np.bool_)}
    except (OSError, KeyError, ValueError) as e:
      raise UserError(f"{path} is not a word-start table written by flax_xalign ({e}); remove it and run again "
                      "(it is rebuilt from the vocabulary).") from e

  def check(self, value: Value, run: "RunSpec") -> None:
    found = np.shape(value["table"])
    if found != (run.vocabulary.size,):
      raise UserError(f"{FILENAME} covers {found} ids but the run's vocabulary has {run.vocabulary.size}; remove "
                      "it (it is rebuilt from the vocabulary) or use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    table = np.asarray(value["table"])
    return f"word_starts: {int(table.sum()):,} of {table.size:,} ids begin a word"


@registry.register("word_starts")
def _word_starts(run: "RunSpec") -> Asset:
  return WordStarts()
