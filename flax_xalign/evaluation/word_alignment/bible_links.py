"""eflomal over the embedded New Testament, written as the files a `TsvBitextTask` trains on.

`write_bible_links(folder)` aligns all 7,919 verse pairs (every book, unsupervised, as users run eflomal)
and writes, per split, `<split>.tsv` (Greek words<TAB>English words, the word lists the gold alignments
index) and `<split>.links` (Pharaoh, one line per pair). `xalign eflomal --bible`, the demo and the GPU
bundle call it.
"""

from __future__ import annotations

import os
from typing import Any

# The mark (`fileio.write_mark`) of a folder --bible created: only such a folder is written into again.
BIBLE_COMMAND = "xalign eflomal --bible"


def combine(result: Any, method: str) -> list:
  """eflomal's two directions as one list of links per pair: `forward`, `reverse` or a symmetrisation."""
  from flax_xalign.evaluation.word_alignment import statistical

  if method in ("forward", "reverse"):
    return list(getattr(result, method))
  return statistical.symmetrise(result.forward, result.reverse, method)


def own_files() -> set[str]:
  """The file names a --bible folder may hold."""
  from flax_xalign import fileio
  from flax_xalign.data.sources import bible

  return {f"{split}.{ext}" for split in bible.SPLITS for ext in ("tsv", "links")} | {"NOTICE", fileio.MARK}


def is_bible_links_folder(folder: str) -> bool:
  """Whether `folder` is an earlier --bible output: marked by it and holding only its files (a user's own
  train.tsv looks the same by name)."""
  from flax_xalign import fileio

  mark = fileio.read_mark(folder)
  return bool(mark) and mark["command"] == BIBLE_COMMAND and set(os.listdir(folder)) <= own_files()


def check_output_dir(output_dir: str) -> None:
  """UserError unless `output_dir` may receive --bible's files: new, empty, or an earlier --bible output (its
  mark and only its files); before any work."""
  from flax_xalign import fileio

  fileio.check_output_folder(output_dir, setting="--output_dir", owned=is_bible_links_folder,
                             what=f"an earlier --bible output (marked by {BIBLE_COMMAND}, {fileio.MARK})")


def write_bible_links(output_dir: str, *, symmetrize: str = "grow-diag-final-and", verbose: bool = False
                      ) -> tuple[Any, dict[str, list[int]]]:
  """eflomal over every New Testament verse pair; `<split>.tsv` + `<split>.links` per split into `output_dir`.

  Returns (the `statistical.EflomalResult` over all pairs, {split: indices of its pairs in that result}).
  A folder it creates (or finds empty) is marked as --bible's, so a rerun may write into it again.
  """
  from flax_xalign import fileio
  from flax_xalign.data.sources import bible
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import statistical

  pairs, _, _ = statistical.bible_corpus("test")
  by_split = {split: statistical.bible_corpus(split)[1] for split in bible.SPLITS}
  if verbose:
    print(f"eflomal: aligning all {len(pairs)} New Testament verse pairs ...", flush=True)
  result = statistical.run_eflomal(pairs)
  links = combine(result, symmetrize)
  fileio.mark_new_folder(output_dir, BIBLE_COMMAND, setting="--output_dir")
  written = []
  for split, indices in by_split.items():
    tsv = os.path.join(output_dir, f"{split}.tsv")
    aer.write_atomically(tsv, "".join(f"{' '.join(pairs[k][0])}\t{' '.join(pairs[k][1])}\n" for k in indices))
    statistical.write_links(os.path.join(output_dir, f"{split}.links"), [links[k] for k in indices])
    written += [f"{split}.tsv", f"{split}.links"]
    if verbose:
      print(f"wrote {tsv} and {split}.links ({len(indices)} pairs)", flush=True)
  aer.write_atomically(os.path.join(output_dir, "NOTICE"), bible.LICENSE_NOTICE)
  mark = fileio.read_mark(output_dir)
  if mark and mark["command"] == BIBLE_COMMAND:
    fileio.write_mark(output_dir, BIBLE_COMMAND, [*written, "NOTICE"])
  return result, by_split
