"""The weighted co-occurrence table of MLM-GC: finalise raw counts into X, save and load it.

X[a, b] = sum_lang c_lang * sum_{d=1..n} (C[lang,d,a,b] + C[lang,d,b,a]) / (d+1),
summed in a fixed order (the package docstring, `flax_xalign.data.cooc`, has
the definitions) and stored pre-logged as CSR. `finalize` sums the weighted
groups with SciPy's sparse addition (a linear merge of sorted rows). The
manifest's `corpus_fingerprint` is the sha256 of the counts themselves
(languages, V, window, tokens, sequences, keys, counts), so it is the same
however the corpus was ordered or sharded (local or Beam).

Files (`save_table` / `load_table`): `cooc.npz` (indptr int64 [V+1], indices
int32 [nnz], log_x float32 [nnz]) and `cooc.json` (the manifest, `CoocTable.info`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from flax_xalign import storage
from flax_xalign.data.cooc.counting import PairCounts
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

DEFAULT_REFERENCE_LANGUAGE = "en"
VERSION = 1
TABLE_FILE = "cooc.npz"
MANIFEST_FILE = "cooc.json"
# Key of `source` in the manifest: sha256 of the vocabulary the ids come from (`data.vocab.fingerprint`).
VOCABULARY_KEY = "vocabulary_sha256"
WEIGHTS = ("X[a,b] = sum_lang c_lang * sum_{d=1..n} (C[lang,d,a,b] + C[lang,d,b,a]) / (d+1); "
           "c_lang = C_ref / C_lang; log_x = float32(log X), X > 0")


@dataclasses.dataclass(frozen=True)
class CoocTable:
  """The symmetric weighted table, pre-logged, as CSR.

  Attributes:
    indptr: int64 [V + 1], rows a (the centre token w_t).
    indices: int32 [nnz], b, strictly increasing within each row.
    log_x: float32 [nnz], log X[a, b] (X > 0; absent pairs are X = 0).
    info: the manifest (JSON-able): see `finalize`.
  """

  indptr: np.ndarray
  indices: np.ndarray
  log_x: np.ndarray
  info: dict

  @property
  def vocab_size(self) -> int:
    return len(self.indptr) - 1

  def top_pairs(self, token_id: int, k: int = 10) -> list[tuple[int, float]]:
    """The k largest (b, X[a, b]) of row a = token_id, X descending (ties: b ascending)."""
    if not 0 <= int(token_id) < self.vocab_size:
      raise UserError(f"token id {token_id} is outside the table's vocabulary [0, {self.vocab_size}).")
    start, stop = int(self.indptr[token_id]), int(self.indptr[token_id + 1])
    order = np.argsort(-self.log_x[start:stop], kind="stable")[:max(int(k), 0)]
    return [(int(self.indices[start + i]), float(np.exp(np.float64(self.log_x[start + i])))) for i in order]


def fingerprint(counts: PairCounts) -> str:
  """sha256 of what the table is made of: languages, V, window, tokens and sequences per corpus, pair counts.

  It depends only on the multiset of counted sequences, not on their order or
  on how they were sharded, so the local and the Beam count agree.
  """
  digest = hashlib.sha256()
  digest.update(json.dumps({"languages": list(counts.languages), "vocab_size": counts.vocab_size,
                            "window": counts.window, "tokens": [int(t) for t in counts.tokens],
                            "sequences": int(counts.sequences)}, sort_keys=True).encode())
  digest.update(np.ascontiguousarray(counts.keys, "<i8").tobytes())
  digest.update(np.ascontiguousarray(counts.counts, "<i8").tobytes())
  return digest.hexdigest()


def reference_of(counts: PairCounts, reference_language: str) -> tuple[str, bool]:
  """(the reference language used, whether it is `reference_language`)."""
  present = [code for code, n in zip(counts.languages, counts.tokens) if n > 0]
  if not present:
    raise UserError("the corpus is empty: no token was counted. Count a task, split or files with text in it.")
  if reference_language in present:
    return reference_language, True
  return present[0], False


def _weighted_sum(counts: PairCounts, c_lang: Mapping[str, float]) -> Any:
  """X as a canonical float64 SciPy CSR matrix, summed in the fixed order of the module docstring.

  Per (language, d), in order: S = C + C^T (exact int64), then X = X + c_lang * (S / (d + 1)). SciPy's
  sparse sum is a linear merge of sorted rows that computes x + t where both have an entry and copies the
  one that does otherwise, so every entry is the left fold of its terms in group order.
  """
  from scipy import sparse

  size = counts.vocab_size
  bounds = counts.group_bounds()
  x = None
  for lang, code in enumerate(counts.languages):
    for d in range(1, counts.window + 1):
      g = lang * counts.window + d - 1
      keys = counts.keys[bounds[g]:bounds[g + 1]] - np.int64(g) * size * size
      if not len(keys):
        continue
      rows, cols = np.divmod(keys, size)
      indptr = np.zeros(size + 1, np.int64)
      np.cumsum(np.bincount(rows, minlength=size), out=indptr[1:])
      raw = sparse.csr_matrix((counts.counts[bounds[g]:bounds[g + 1]], cols, indptr), shape=(size, size))
      symmetric = (raw + raw.T).tocsr()
      term = sparse.csr_matrix(((symmetric.data.astype(np.float64) / (d + 1)) * c_lang[code], symmetric.indices,
                                symmetric.indptr), shape=(size, size))
      x = term if x is None else (x + term).tocsr()
  x.sum_duplicates()  # Canonical already; this only sets (and checks) the flag.
  return x


def finalize(counts: PairCounts, *, reference_language: str = DEFAULT_REFERENCE_LANGUAGE,
             drop_diagonal: bool = False, source: Mapping[str, Any] | None = None, seconds: float | None = None,
             log: Callable[[str], Any] | None = None) -> CoocTable:
  """The weighted symmetric table of raw counts (definitions: the module docstring).

  Args:
    counts: raw counts (one shard's or merged).
    reference_language: C_ref of c_lang = C_ref / C_lang; absent from the
      corpus: its first language in sorted order (recorded in the manifest).
    drop_diagonal: leave out X[a, a].
    source: what was counted (task/split or files), stored in the manifest.
    seconds: counting time for the manifest (None: finalize's own time).
    log: a line when the reference language falls back.

  Returns:
    The table; info holds version, vocab_size, window, weights, languages,
    reference_language (+ reference_language_requested when it fell back),
    c_lang, tokens, sequences, pairs (ordered occurrences counted), nnz,
    drop_diagonal, corpus_fingerprint, source, seconds.

  Raises:
    UserError: an empty corpus, or one without a single pair within the window.
  """
  start = time.perf_counter()
  reference, as_requested = reference_of(counts, reference_language)
  if not as_requested and log is not None:
    log(f"cooc: the corpus has no {reference_language!r} tokens; c_lang is relative to {reference!r} (the first "
        "language in sorted order).")
  if not len(counts.keys):
    raise UserError(f"the corpus has no pair of tokens within ±{counts.window} ({int(counts.tokens.sum()):,} tokens "
                    f"in {counts.sequences:,} sequences): every sequence is shorter than 2 tokens.")
  size = counts.vocab_size
  ref_tokens = int(counts.tokens[counts.languages.index(reference)])
  c_lang = {code: ref_tokens / int(n) for code, n in zip(counts.languages, counts.tokens) if n > 0}
  table = _weighted_sum(counts, c_lang)
  indptr, cols, x = table.indptr.astype(np.int64), table.indices, table.data
  if drop_diagonal:
    rows = np.repeat(np.arange(size), np.diff(indptr))
    keep = rows != cols
    cols, x = cols[keep], x[keep]
    indptr = np.zeros(size + 1, np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=size), out=indptr[1:])
  if not len(x):
    raise UserError("every pair of the corpus is a token next to itself, and drop_diagonal leaves none.")
  info = {
      "version": VERSION, "vocab_size": size, "window": counts.window, "weights": WEIGHTS,
      "languages": [code for code in counts.languages if code in c_lang],
      "reference_language": reference, "c_lang": c_lang,
      "tokens": {code: int(n) for code, n in zip(counts.languages, counts.tokens) if n > 0},
      "sequences": int(counts.sequences), "pairs": int(counts.counts.sum()), "nnz": len(x),
      "drop_diagonal": bool(drop_diagonal), "corpus_fingerprint": fingerprint(counts),
      "source": dict(source or {}),
      "seconds": round(float(seconds if seconds is not None else time.perf_counter() - start), 3),
  }
  if not as_requested:
    info["reference_language_requested"] = reference_language
  return CoocTable(indptr=indptr, indices=cols.astype(np.int32), log_x=np.log(x).astype(np.float32), info=info)


# ---------------------------------------------------------------- files


def save_table(directory: str, table: CoocTable) -> None:
  """Writes `cooc.npz` (indptr, indices, log_x) and `cooc.json` (info) into `directory`, each atomically."""
  buffer = io.BytesIO()
  np.savez(buffer, indptr=np.asarray(table.indptr, np.int64), indices=np.asarray(table.indices, np.int32),
           log_x=np.asarray(table.log_x, np.float32))
  write_atomically(os.path.join(directory, TABLE_FILE), buffer.getvalue())
  write_atomically(os.path.join(directory, MANIFEST_FILE), json.dumps(table.info, indent=1, sort_keys=True) + "\n")


def load_table(directory: str) -> CoocTable:
  """The table `save_table` wrote; UserError naming the file when it is missing or malformed."""
  table_path, manifest_path = os.path.join(directory, TABLE_FILE), os.path.join(directory, MANIFEST_FILE)
  fix = "count it again with `xalign cooc --task=NAME --output=DIR`"
  for path in (table_path, manifest_path):
    if not storage.isfile(path):
      raise UserError(f"{path} does not exist: {directory} holds no co-occurrence table; {fix}.")
  try:
    with storage.open_file(manifest_path, encoding="utf-8") as f:
      info = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{manifest_path} is not a JSON manifest ({e}); {fix}.") from e
  if not isinstance(info, dict) or not isinstance(info.get("vocab_size"), int) or "window" not in info:
    raise UserError(f"{manifest_path} lacks vocab_size/window: it was not written by `xalign cooc`; {fix}.")
  try:
    with np.load(storage.open_file(table_path, "rb"), allow_pickle=False) as data:
      arrays = {name: np.asarray(data[name]) for name in ("indptr", "indices", "log_x")}
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
    raise UserError(f"{table_path} is not a co-occurrence table (.npz with indptr, indices, log_x) ({e}); "
                    f"{fix}.") from e
  indptr, indices, log_x = arrays["indptr"], arrays["indices"], arrays["log_x"]
  problem = None
  if indptr.dtype != np.int64 or indices.dtype != np.int32 or log_x.dtype != np.float32:
    problem = f"dtypes {indptr.dtype}, {indices.dtype}, {log_x.dtype} (expected int64, int32, float32)"
  elif indptr.shape != (info["vocab_size"] + 1,) or indices.ndim != 1 or log_x.shape != indices.shape:
    problem = (f"shapes indptr {indptr.shape}, indices {indices.shape}, log_x {log_x.shape} for vocabulary size "
               f"{info['vocab_size']}")
  elif indptr[0] != 0 or indptr[-1] != len(indices) or (np.diff(indptr) < 0).any():
    problem = "indptr does not rise from 0 to nnz"
  elif len(indices) and (indices.min() < 0 or indices.max() >= info["vocab_size"]):
    problem = f"column ids outside [0, {info['vocab_size']})"
  elif info.get("nnz", len(indices)) != len(indices):
    problem = f"{len(indices)} entries but the manifest says {info['nnz']}"
  if problem:
    raise UserError(f"{table_path} is malformed ({problem}); the file was cut or edited: {fix}.")
  return CoocTable(indptr=indptr, indices=indices, log_x=log_x, info=info)


def summary(table: CoocTable) -> str:
  """One line: what was counted and how large the table is."""
  info = table.info
  tokens = ", ".join(f"{code} {n:,}" for code, n in info["tokens"].items())
  c_lang = ", ".join(f"{code} {c:.4g}" for code, c in info["c_lang"].items())
  megabytes = (table.indptr.nbytes + table.indices.nbytes + table.log_x.nbytes) / 2**20
  seconds = info.get("seconds", 0.0)
  rate = sum(info["tokens"].values()) / seconds if seconds else 0.0
  return (f"cooc: {info['sequences']:,} sequences, tokens {tokens} ({rate:,.0f} tokens/s); window ±{info['window']}, "
          f"reference {info['reference_language']}, c_lang {c_lang}; {info['nnz']:,} pairs over "
          f"{info['vocab_size']:,} ids ({megabytes:,.1f} MB)")
