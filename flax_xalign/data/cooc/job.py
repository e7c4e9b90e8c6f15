"""The counting job of `xalign cooc` and `xalign cooc_beam`: its options, their checks, and counting text files.

`CoocJob` is what both commands count; the checks here are the ones both
make before any work (the flag combination, the output folder). Counting UTF-8
text files with a SentencePiece model needs nothing above `data/` and is
`count_text`; counting a registered task, inspecting a table and the whole
job need the task registry and live in `flax_xalign.training.cooc_job` (the
Beam job: `flax_xalign.training.cooc_beam_job`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.data.cooc.counting import DEFAULT_WINDOW
from flax_xalign.data.cooc.table import DEFAULT_REFERENCE_LANGUAGE
from flax_xalign.errors import UserError


@dataclasses.dataclass(frozen=True)
class CoocJob:
  """A co-occurrence table to count: of a registered task or mixture, or of text files (one of the two).

  Attributes:
    output: the folder for cooc.npz and cooc.json.
    task: a registered seqio task or mixture; or
    texts: `FILE:LANG` specs, text files (one sentence per line) and their language codes,
      tokenised with `vocabulary` (a SentencePiece model).
    split: the split of the task to count.
    languages: the language codes to count (None: the task's).
    window, reference_language, drop_diagonal: the table's definition (`flax_xalign.data.cooc`).
  """

  output: str | None = None
  task: str | None = None
  texts: tuple[str, ...] = ()
  vocabulary: str | None = None
  split: str = "train"
  languages: tuple[str, ...] | None = None
  window: int = DEFAULT_WINDOW
  reference_language: str = DEFAULT_REFERENCE_LANGUAGE
  drop_diagonal: bool = False


def check_job(job: CoocJob, *, alternatives: str = "") -> None:
  """UserError for a job that counts both or neither of a task and texts, has no output or a bad window.

  `alternatives` ends the first message with the command's other uses (`xalign cooc`'s --inspect).
  """
  if bool(job.task) == bool(job.texts):
    raise UserError("count either a task (--task=NAME) or text files (--text=FILE:LANG --vocabulary=MODEL)"
                    f"{alternatives}.")
  if not job.output:
    raise UserError("--output=DIR is missing: the directory to write cooc.npz and cooc.json into.")
  if job.window < 1:
    raise UserError(f"--window must be an integer >= 1 (n of the ±n window; the paper: 2), got {job.window}.")


def check_files(output: str, *, texts: Sequence[str], vocabulary: str | None) -> None:
  """`output` is a new, empty or earlier cooc folder holding none of the inputs; the inputs can be read.

  `texts` are `FILE:LANG` specs; a missing file is left to be named with its flag when it is read.
  """
  from flax_xalign import fileio
  from flax_xalign.data.cooc.table import MANIFEST_FILE, TABLE_FILE

  own = {TABLE_FILE, MANIFEST_FILE}
  paths = [spec.rpartition(":")[0] for spec in texts]
  fileio.check_output_folder(output, inputs={"--text": paths, "--vocabulary": vocabulary},
                             owned=lambda folder: set(os.listdir(folder)) <= own,
                             what=f"a cooc table ({TABLE_FILE}, {MANIFEST_FILE})")
  for path in paths + ([vocabulary] if vocabulary else []):
    if path and (os.path.exists(path) or os.path.islink(path)):  # A missing one is named with its flag below.
      fileio.check_input_file(path, setting="--text" if path in paths else "--vocabulary")


def text_inputs(specs: Sequence[str]) -> list[tuple[str, str]]:
  """[(path, language code)] of local `FILE:LANG` specs; UserError for a malformed spec or a missing file."""
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
