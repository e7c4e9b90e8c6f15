"""Bilingual token dictionaries: the seeded draw and the TSV file format.

DICT-MLM and ALIGN-MLM read a dictionary of (natural id, derived id) pairs.
For a transliterated synthetic language the true translation of natural token
`i` is `id_map[i]` (= i + V), and the dictionary is a fixed random fraction of
those pairs (Tang et al.: 25% by default, 50% as an option). Unlike the authors'
code, which redraws its dictionary from the torch RNG at every start, the draw
is the run's `dictionary` asset (`flax_xalign.assets.dictionary`): written to
`MODEL_DIR/dictionary.tsv` and to every checkpoint before it is trained with,
so a resumed run trains with the same pairs, and the file tells a reader
exactly which tokens were supervised (the leak-free alignment score excludes
them).

File format (UTF-8 TSV with a header): `natural_id  derived_id  piece`; the
piece column is informational (the natural token's SentencePiece string).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

FILENAME = "dictionary.tsv"
HEADER = ("natural_id", "derived_id", "piece")


def draw(id_map: np.ndarray, *, rate: float, seed: int) -> np.ndarray:
  """A random dictionary: [n, 2] int32 (natural id, derived id) pairs, sorted.

  Args:
    id_map: [V] natural id -> derived id (`SyntheticLanguage.id_map()`); ids
      mapped to themselves (special and shared tokens) are never drawn.
    rate: fraction of the translatable ids to include, in (0, 1].
    seed: the run's seed; the same seed gives the same dictionary.
  """
  if not 0.0 < rate <= 1.0:
    raise UserError(f"dictionary rate must be in (0, 1], got {rate!r} (the paper uses 0.25 or 0.5).")
  id_map = np.asarray(id_map)
  ids = np.arange(len(id_map))
  candidates = ids[id_map != ids]
  if not len(candidates):
    raise UserError("The language has no translated tokens (no transliteration): a token dictionary needs "
                    "transliteration ('trans') in the synthetic language's transforms.")
  count = max(1, int(round(rate * len(candidates))))
  chosen = np.sort(np.random.default_rng(seed).choice(candidates, size=count, replace=False))
  return np.stack([chosen, id_map[chosen]], axis=1).astype(np.int32)


def save(path: str, pairs: np.ndarray, pieces: Sequence[str] | None = None) -> None:
  """Writes the TSV atomically (temporary file, then rename)."""
  pairs = np.asarray(pairs)
  lines = ["\t".join(HEADER)]
  for k, (src, tgt) in enumerate(pairs):
    piece = pieces[k] if pieces is not None else ""
    lines.append(f"{int(src)}\t{int(tgt)}\t{piece.replace(chr(9), ' ')}")
  write_atomically(path, "\n".join(lines) + "\n")


def load(path: str) -> np.ndarray:
  """[n, 2] int32 pairs from a dictionary TSV; bad lines name the line."""
  pairs = []
  with storage.open_file(path, encoding="utf-8") as f:
    header = f.readline().rstrip("\n").split("\t")
    if tuple(header[:2]) != HEADER[:2]:
      raise UserError(f"{path}:1: expected the header {'<TAB>'.join(HEADER)}, got {header!r}.")
    for number, line in enumerate(f, start=2):
      if not line.strip():
        continue
      cols = line.rstrip("\n").split("\t")
      try:
        pairs.append((int(cols[0]), int(cols[1])))
      except (ValueError, IndexError):
        raise UserError(f"{path}:{number}: expected 'natural_id<TAB>derived_id[<TAB>piece]', got {line.strip()!r}.")
  if not pairs:
    raise UserError(f"{path} holds no dictionary pairs.")
  return np.asarray(pairs, np.int32).reshape(-1, 2)
