"""The global co-occurrence table of MLM-GC (Ai & Fang 2023, §3.2): exact counts, then the weighted table.

Definitions (every counter, the Beam pipeline and the `cooc` asset share them):

* A *sequence* is one side of one example: `tokens` in language `lang`, and
  for bitext `tokens_b` in `lang_b` as a separate sequence. Pairs never cross
  sequences. Every id given is counted (unpacked seqio outputs hold no padding
  and no special ids).
* Window n: in a sequence x_0 .. x_{L-1}, every i < j with d = j - i <= n is
  one ordered occurrence (a = x_i, b = x_j, d). The raw counts
  C[lang, d, a, b] are exact int64, so shards merge in any order
  (`PairCounts.merge`).
* Distance weight 1 / (d + 1): next to the centre token c/2, at distance n
  c/(n+1), the centre itself 0 (the paper's [c/(n+1), .., c/2, 0, c/2, ..,
  c/(n+1)]). "the the" at distance >= 1 counts, on the diagonal X[a, a]
  (GloVe's behaviour); `drop_diagonal=True` removes X[a, a].
* c_lang = C_ref / C_lang, C_lang = tokens of language lang counted; the
  reference is `reference_language` ('en'), or, when the corpus has none, its
  first language in sorted order (the manifest and the log say so).
* X[a, b] = sum_lang c_lang * sum_{d=1..n} (C[lang,d,a,b] + C[lang,d,b,a]) / (d+1),
  in float64 and in a fixed order (languages sorted, d ascending; each term is
  c_lang * (integer sum / (d + 1))), so X is symmetric and X[a, a] gets
  2 C[lang, d, a, a] / (d + 1). Stored pre-logged: log_x = float32(log X) for
  X > 0 as CSR rows a (the centre token w_t), columns b ascending.

The counting core (`PairCounter`) buffers sequences per language into chunks
of ~4M tokens and counts each chunk in two parts: pairs whose tokens are both
among the language's F most frequent ids (F <= 2048, from its first chunk) go
to a dense `np.bincount` over rank pairs (on natural text most pairs: 86% of
the Bible's; bincount is ~4x faster per pair than a sort), the rest to one
sort of `a * V + b` per distance (uint32 when V <= 65536). Worker threads
count chunks side by side (NumPy's sort releases the GIL); sorted chunk
results merge log-structured (a run merges only with runs of similar size),
so no growing accumulator is re-merged per chunk. The result is the same for
any chunking, thread count or F. `bench/cooc.py` measures it against a SciPy
`coo_matrix` counter. `finalize` sums the weighted groups with SciPy's sparse
addition (a linear merge of sorted rows), in the fixed order above.

Sources: `task_sequences` / `task_batches` (a seqio task or mixture, every
member once, unpacked) and `text_sequences` (text files); `count_task` is the
one-pass local count. The manifest's `corpus_fingerprint` is the sha256 of the
counts themselves (languages, V, window, tokens, sequences, keys, counts), so
it is the same however the corpus was ordered or sharded (local or Beam).

Files (`save_table` / `load_table`): `cooc.npz` (indptr int64 [V+1], indices
int32 [nnz], log_x float32 [nnz]) and `cooc.json` (the manifest, `CoocTable.info`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

DEFAULT_WINDOW = 2
DEFAULT_REFERENCE_LANGUAGE = "en"
VERSION = 1
TABLE_FILE = "cooc.npz"
MANIFEST_FILE = "cooc.json"
WEIGHTS = ("X[a,b] = sum_lang c_lang * sum_{d=1..n} (C[lang,d,a,b] + C[lang,d,b,a]) / (d+1); "
           "c_lang = C_ref / C_lang; log_x = float32(log X), X > 0")
_KEY_LIMIT = 2**63
_CHUNK_TOKENS = 1 << 22  # Tokens per counted chunk: large enough to amortise the per-chunk work.
_DENSE_BINS = 1 << 22  # Dense (rank a, rank b) bins per (language, d) at most (int64 each: 32 MB)...
_DENSE_TOTAL = 1 << 25  # ... and over all (language, d) together (256 MB).
_MAX_FREQUENT = 1 << 11
_PROGRESS_SECONDS = 5.0
_BATCH = 1024  # Examples per host transfer when streaming a seqio task.


# ---------------------------------------------------------------- raw counts


@dataclasses.dataclass(frozen=True)
class PairCounts:
  """Exact raw counts C[lang, d, a, b]; keys sorted unique.

  Attributes:
    languages: sorted language codes; a language's index is its position.
    vocab_size: V, ids are in [0, V).
    window: n, distances d in [1, n].
    keys: int64 [m], key = ((lang * window + (d - 1)) * V + a) * V + b.
    counts: int64 [m] (> 0).
    tokens: int64 [len(languages)], tokens counted per language.
    sequences: sequences counted (length 0 and 1 included).
  """

  languages: tuple[str, ...]
  vocab_size: int
  window: int
  keys: np.ndarray
  counts: np.ndarray
  tokens: np.ndarray
  sequences: int = 0

  def merge(self, other: PairCounts) -> PairCounts:
    """The counts of both corpora; exact, associative and commutative (the result is canonical)."""
    if (self.languages, self.vocab_size, self.window) != (other.languages, other.vocab_size, other.window):
      raise ValueError(f"cannot merge counts of languages {self.languages}, V {self.vocab_size}, window "
                       f"{self.window} with {other.languages}, V {other.vocab_size}, window {other.window}")
    keys, counts = _merge_runs([(self.keys, self.counts), (other.keys, other.counts)])
    return dataclasses.replace(self, keys=keys, counts=counts, tokens=self.tokens + other.tokens,
                               sequences=self.sequences + other.sequences)

  def group_bounds(self) -> np.ndarray:
    """int64 [len(languages) * window + 1]: keys of group g = lang * window + d - 1 are [b[g], b[g+1])."""
    size = self.vocab_size * self.vocab_size
    starts = np.arange(len(self.languages) * self.window + 1, dtype=np.int64) * size
    return np.searchsorted(self.keys, starts)


def empty_counts(*, languages: Sequence[str], vocab_size: int, window: int) -> PairCounts:
  """Counts of an empty corpus (the identity of `PairCounts.merge`)."""
  languages = _check_settings(languages, vocab_size, window)
  return PairCounts(languages=languages, vocab_size=int(vocab_size), window=int(window),
                    keys=np.zeros(0, np.int64), counts=np.zeros(0, np.int64),
                    tokens=np.zeros(len(languages), np.int64), sequences=0)


def _check_settings(languages: Sequence[str], vocab_size: int, window: int) -> tuple[str, ...]:
  if isinstance(languages, str) or not languages or any(not isinstance(c, str) or not c for c in languages):
    raise UserError(f"languages must be a non-empty list of language codes such as ['de', 'en'], got "
                    f"{languages!r}.")
  languages = tuple(languages)
  if list(languages) != sorted(set(languages)):
    raise UserError(f"languages must be sorted and distinct (a language's index is its position), got "
                    f"{list(languages)}; pass {sorted(set(languages))}.")
  if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
    raise UserError(f"the window must be an integer >= 1 (n of the ±n window; the paper: 2), got {window!r}.")
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
    raise UserError(f"the vocabulary size must be an integer >= 1, got {vocab_size!r}.")
  if len(languages) * int(window) * int(vocab_size) ** 2 >= _KEY_LIMIT:
    raise UserError(f"{len(languages)} languages x window {window} x {vocab_size}^2 ids do not fit int64 pair "
                    "keys; count fewer languages per table or use a smaller window.")
  return languages


def _merge_runs(runs: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
  """Union of sorted unique (keys, counts) runs, counts of shared keys added.

  One stable argsort of the concatenation: NumPy's timsort finds the runs and
  merges them (O(n log runs)); the integer sums are exact in any order.
  """
  runs = [(k, c) for k, c in runs if len(k)]
  if len(runs) <= 1:
    return runs[0] if runs else (np.zeros(0, np.int64), np.zeros(0, np.int64))
  keys = np.concatenate([k for k, _ in runs])
  order = np.argsort(keys, kind="stable")
  keys = keys[order]
  counts = np.concatenate([c for _, c in runs])[order]
  starts = _starts(keys)
  return keys[starts], np.add.reduceat(counts, starts)


def _starts(sorted_keys: np.ndarray) -> np.ndarray:
  """Indices where a new key begins in a sorted array."""
  change = np.empty(len(sorted_keys), bool)
  change[:1] = True
  np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=change[1:])
  return np.flatnonzero(change)


def _run_lengths(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(unique keys, counts) of a sorted array."""
  starts = _starts(sorted_keys)
  return sorted_keys[starts], np.diff(np.append(starts, len(sorted_keys))).astype(np.int64)


class _Runs:
  """Sorted unique (keys, counts) runs merged log-structured: a run merges only with ones of similar size."""

  def __init__(self):
    self._stack: list[tuple[np.ndarray, np.ndarray]] = []

  def push(self, keys: np.ndarray, counts: np.ndarray) -> None:
    self._stack.append((keys, counts))
    merge = 1
    while merge < len(self._stack) and 2 * sum(len(k) for k, _ in self._stack[-merge:]) >= len(
        self._stack[-merge - 1][0]):
      merge += 1
    if merge > 1:
      self._stack[-merge:] = [_merge_runs(self._stack[-merge:])]

  def result(self) -> tuple[np.ndarray, np.ndarray]:
    keys, counts = _merge_runs(self._stack)
    self._stack = []
    return keys, counts


@dataclasses.dataclass
class _Dense:
  """One language's dense counts over its `frequent` ids: counts[d - 1, rank a * F + rank b]."""

  rank: np.ndarray  # int32 [V]: rank among the frequent ids, F for the others.
  frequent: np.ndarray  # int64 [F]: the frequent ids, ascending (so rank order is id order).
  counts: np.ndarray  # int64 [window, F * F]


def _count_chunk(ids: np.ndarray, left: np.ndarray, *, vocab_size: int, window: int,
                 dense: _Dense) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
  """Counts one language's chunk: per d, dense bincount arrays and sorted unique (a * V + b, count) of the rest.

  Args:
    ids: uint32 [N] the chunk's sequences back to back.
    left: uint8 [N] (int64 for windows >= 255) tokens from each token to the end of its sequence (itself
      included), capped at window + 1: the pair (i, i + d) is inside a sequence iff left[i] > d.
  """
  size = len(dense.frequent)
  small = vocab_size <= 1 << 16  # a * V + b fits uint32: a cheaper sort.
  rank = dense.rank[ids]
  is_frequent = rank < size
  binned, rare = [], []
  for d in range(1, window + 1):
    if len(ids) <= d:
      binned.append(None)
      rare.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
      continue
    valid = left[:-d] > d
    in_dense = valid & is_frequent[:-d] & is_frequent[d:]
    # Every position goes to bincount, the others to one spare bin: cheaper than selecting the dense ones.
    pair = rank[:-d] * size + rank[d:]
    np.putmask(pair, ~in_dense, size * size)
    binned.append(np.bincount(pair, minlength=size * size + 1)[:-1])
    in_rare = valid ^ in_dense
    if small:
      keys = (ids[:-d] * np.uint32(vocab_size) + ids[d:])[in_rare]
    else:
      keys = ids[:-d][in_rare].astype(np.int64) * vocab_size + ids[d:][in_rare]
    keys.sort()
    rare.append(_run_lengths(keys))
  return binned, rare


class PairCounter:
  """Accumulates C[lang, d, a, b] over sequences added one by one or in flat batches; `result()` at the end.

  Chunks are counted by `threads` worker threads (0: in the calling thread).
  """

  def __init__(self, *, languages: Sequence[str], vocab_size: int, window: int = DEFAULT_WINDOW,
               threads: int = 2, chunk_tokens: int = _CHUNK_TOKENS, max_frequent: int = _MAX_FREQUENT):
    self.languages = _check_settings(languages, vocab_size, window)
    self.vocab_size = int(vocab_size)
    self.window = int(window)
    self.tokens = np.zeros(len(self.languages), np.int64)
    self.sequences = 0
    self._chunk_tokens = int(chunk_tokens)
    self._max_frequent = int(max_frequent)
    self._pending: list[list[np.ndarray]] = [[] for _ in self.languages]
    self._lengths: list[list[int]] = [[] for _ in self.languages]
    self._pending_tokens = [0] * len(self.languages)
    self._dense: list[_Dense | None] = [None] * len(self.languages)
    self._runs = [_Runs() for _ in range(len(self.languages) * self.window)]
    self._pool = concurrent.futures.ThreadPoolExecutor(threads) if threads > 0 else None
    self._futures: list[tuple[int, concurrent.futures.Future]] = []
    self._threads = max(threads, 1)

  # -- input

  def add(self, lang: int, ids: np.ndarray) -> None:
    """One sequence of language index `lang` (ids are checked when its chunk is counted)."""
    self.add_sequences(((lang, ids),))

  def add_sequences(self, sequences: Iterable[tuple[int, np.ndarray]]) -> None:
    """(language index, ids) sequences; the loop is kept lean: it runs once per sentence."""
    pending, lengths, pending_tokens = self._pending, self._lengths, self._pending_tokens
    chunk, count = self._chunk_tokens, len(self.languages)
    sequences_seen = 0
    for lang, ids in sequences:
      if type(ids) is not np.ndarray:
        ids = np.asarray(ids)
      if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise UserError(f"a sequence must be a 1-D array of integer token ids, got {ids.dtype} {ids.shape}.")
      if not 0 <= lang < count:
        self._bad_lang(lang)
      sequences_seen += 1
      size = ids.size
      if size:
        pending[lang].append(ids)
        lengths[lang].append(size)
        pending_tokens[lang] += size
        if pending_tokens[lang] >= chunk:
          self._flush(lang)  # Starts new inner lists of `pending` and `lengths`.
    self.sequences += sequences_seen

  def add_batch(self, lang: int, ids: np.ndarray, lengths: np.ndarray) -> None:
    """Sequences of language index `lang` back to back: ids [sum(lengths)], lengths [sequences]."""
    ids, lengths = np.asarray(ids).reshape(-1), np.asarray(lengths, np.int64).reshape(-1)
    if ids.dtype.kind not in "iu":
      raise UserError(f"token ids must be integers, got {ids.dtype}.")
    if not 0 <= lang < len(self.languages):
      self._bad_lang(lang)
    if (lengths < 0).any() or lengths.sum() != ids.size:
      raise ValueError(f"lengths {lengths.sum()} do not add up to the {ids.size} ids")
    self.sequences += len(lengths)
    lengths = lengths[lengths > 0]
    ends = np.cumsum(lengths)
    first = 0  # Whole sequences, cut into pieces that fill the pending chunk.
    while first < len(lengths):
      done = int(ends[first - 1]) if first else 0
      room = self._chunk_tokens - self._pending_tokens[lang]
      last = max(int(np.searchsorted(ends, done + room, side="right")), first + 1)
      self._pending[lang].append(ids[done:int(ends[last - 1])])
      self._lengths[lang].extend(lengths[first:last].tolist())
      self._pending_tokens[lang] += int(ends[last - 1]) - done
      first = last
      if self._pending_tokens[lang] >= self._chunk_tokens:
        self._flush(lang)

  def _bad_lang(self, lang: int) -> None:
    raise UserError(f"language index {lang} is outside the {len(self.languages)} languages "
                    f"{list(self.languages)}.")

  def _flush(self, lang: int) -> None:
    parts = self._pending[lang]
    if not parts:
      return
    ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
    lengths = np.asarray(self._lengths[lang], np.int64)
    self._pending[lang], self._lengths[lang], self._pending_tokens[lang] = [], [], 0
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= self.vocab_size:
      raise UserError(f"token id {low if low < 0 else high} is outside the vocabulary [0, {self.vocab_size}); "
                      "count with the vocabulary (size) the ids were made with.")
    ids = ids.astype(np.uint32, copy=False)
    self.tokens[lang] += ids.size
    ends = np.repeat(np.cumsum(lengths), lengths)
    left = np.minimum(ends - np.arange(len(ids)), self.window + 1).astype(np.uint8 if self.window < 255 else np.int64)
    if self._dense[lang] is None:
      self._dense[lang] = self._new_dense(ids)
    dense = self._dense[lang]
    work = lambda: _count_chunk(ids, left, vocab_size=self.vocab_size, window=self.window, dense=dense)
    if self._pool is None:
      self._collect(lang, work())
      return
    self._futures.append((lang, self._pool.submit(work)))
    while len(self._futures) > self._threads:  # Bounded: at most one queued chunk per worker.
      done_lang, future = self._futures.pop(0)
      self._collect(done_lang, future.result())

  def _new_dense(self, ids: np.ndarray) -> _Dense:
    """The language's frequent ids, from its first chunk (any choice is exact; this one makes it fast)."""
    groups = len(self.languages) * self.window
    # F^2 bins pay off when the chunk has about as many pairs; a small shard gets a small table.
    size = min(self._max_frequent, int(np.sqrt(min(_DENSE_BINS, _DENSE_TOTAL // groups, len(ids)))),
               self.vocab_size)
    unigram = np.bincount(ids, minlength=self.vocab_size)
    frequent = np.argsort(-unigram, kind="stable")[:size]
    frequent = np.sort(frequent[unigram[frequent] > 0]).astype(np.int64)
    rank = np.full(self.vocab_size, len(frequent), np.int32)
    rank[frequent] = np.arange(len(frequent), dtype=np.int32)
    return _Dense(rank=rank, frequent=frequent,
                  counts=np.zeros((self.window, len(frequent) ** 2), np.int64))

  def _collect(self, lang: int, result: tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]) -> None:
    binned, rare = result
    dense = self._dense[lang]
    for d in range(self.window):
      if binned[d] is not None:
        dense.counts[d] += binned[d]
      if len(rare[d][0]):
        self._runs[lang * self.window + d].push(*rare[d])

  # -- output

  def result(self) -> PairCounts:
    """The counts of everything added (the counter is spent afterwards)."""
    for lang in range(len(self.languages)):
      self._flush(lang)
    for lang, future in self._futures:
      self._collect(lang, future.result())
    self._futures = []
    if self._pool is not None:
      self._pool.shutdown()
    size = self.vocab_size
    all_keys, all_counts = [], []
    for lang, dense in enumerate(self._dense):
      for d in range(self.window):
        runs = [self._runs[lang * self.window + d].result()]
        if dense is not None:
          cells = np.flatnonzero(dense.counts[d])  # Row-major over ascending ids: sorted keys.
          f = len(dense.frequent)
          runs.append((dense.frequent[cells // f] * size + dense.frequent[cells % f], dense.counts[d][cells]))
        keys, counts = _merge_runs([(k.astype(np.int64), c) for k, c in runs])
        all_keys.append(keys + np.int64(lang * self.window + d) * size * size)
        all_counts.append(counts)
    return PairCounts(languages=self.languages, vocab_size=size, window=self.window,
                      keys=np.concatenate(all_keys).astype(np.int64), counts=np.concatenate(all_counts),
                      tokens=self.tokens.copy(), sequences=self.sequences)


def count_sequences(sequences: Iterable[tuple[int, np.ndarray]], *, languages: Sequence[str], vocab_size: int,
                    window: int = DEFAULT_WINDOW, threads: int = 2) -> PairCounts:
  """Raw pair counts of (language index, int ids [L]) sequences: the per-shard counting function.

  Raises:
    UserError: bad languages / window / vocabulary size, a language index out
      of range, or ids outside [0, vocab_size).
  """
  counter = PairCounter(languages=languages, vocab_size=vocab_size, window=window, threads=threads)
  counter.add_sequences(sequences)
  return counter.result()


# ---------------------------------------------------------------- the table


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
  fix = "count it again with `python -m flax_xalign.cooc --task=NAME --output=DIR`"
  for path in (table_path, manifest_path):
    if not os.path.isfile(path):
      raise UserError(f"{path} does not exist: {directory} holds no co-occurrence table; {fix}.")
  try:
    with open(manifest_path, encoding="utf-8") as f:
      info = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{manifest_path} is not a JSON manifest ({e}); {fix}.") from e
  if not isinstance(info, dict) or not isinstance(info.get("vocab_size"), int) or "window" not in info:
    raise UserError(f"{manifest_path} lacks vocab_size/window: it was not written by flax_xalign.cooc; {fix}.")
  try:
    with np.load(table_path, allow_pickle=False) as data:
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


# ---------------------------------------------------------------- sources


def _member_batches(task: Any, *, split: str, languages: Sequence[str],
                    vocab_size: int) -> Iterator[dict[str, np.ndarray]]:
  """One task's split as ragged batches of sides: flat ids, lengths and the language index of each side.

  The pattern of `assets.lang_vocab._member_sides`, keeping sequence boundaries.
  """
  import tensorflow as tf

  ds = task.get_dataset(None, split=split, shuffle=False, num_epochs=1, trim_output_features=False)
  spec = ds.element_spec
  if "tokens" not in spec:
    raise UserError(f"task {task.name!r} has no 'tokens' feature (it has {sorted(spec)}); the co-occurrence "
                    "counter counts the token ids of 'tokens' (and 'tokens_b').")
  if "lang" not in spec and len(languages) != 1:
    raise UserError(f"task {task.name!r} has no 'lang' feature, so its tokens cannot be counted for one of "
                    f"{list(languages)}; count it alone with one language (--languages=xx) or add 'lang'.")
  known = tf.constant(list(languages))
  index_of = tf.range(len(languages), dtype=tf.int32)

  def index(lang):  # -1: a language not counted.
    return tf.reduce_sum(tf.where(tf.equal(known, lang), index_of + 1, 0)) - 1

  def sides(ex):
    out = {"ids": tf.cast(tf.reshape(ex["tokens"], [-1]), tf.int32),
           "lang": index(ex["lang"]) if "lang" in ex else tf.constant(0, tf.int32)}
    if "tokens_b" in ex and "lang_b" in ex and ex["tokens_b"].shape.as_list() != [0]:  # Text tasks: [0].
      out["ids_b"] = tf.cast(tf.reshape(ex["tokens_b"], [-1]), tf.int32)
      out["lang_b"] = index(ex["lang_b"])
    return out

  ds = ds.map(sides, num_parallel_calls=tf.data.AUTOTUNE).ragged_batch(_BATCH)

  def flat(batch):
    out = {}
    for side in ("", "_b"):
      if f"ids{side}" in batch:
        out[f"ids{side}"] = batch[f"ids{side}"].flat_values
        out[f"lengths{side}"] = batch[f"ids{side}"].row_lengths()
        out[f"lang{side}"] = batch[f"lang{side}"]
    return out

  options = tf.data.Options()
  options.deterministic = True
  yield from ds.map(flat).with_options(options).as_numpy_iterator()


def _split_by_language(ids: np.ndarray, lengths: np.ndarray,
                       langs: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """(lang, ids, lengths) of the sequences of each counted language in a flat batch (-1: skipped)."""
  for lang in np.unique(langs):
    if lang < 0:
      continue
    rows = langs == lang
    if rows.all():
      yield int(lang), ids, lengths
    else:
      yield int(lang), ids[np.repeat(rows, lengths)], lengths[rows]


def _members(task: str, split: str) -> list[Any]:
  from flax_xalign import tasks
  from flax_xalign.data import pipeline

  members = [t for t in pipeline.tasks_of(tasks.get_provider(task)) if split in t.splits]
  if not members:
    raise UserError(f"no task of {task!r} has a split {split!r}; count a split it has (--split).")
  return members


def task_batches(task: str, *, split: str, languages: Sequence[str], vocab_size: int,
                 stats: dict[str, Any] | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """`task_sequences` in flat batches, for `PairCounter.add_batch`: (lang index, int32 ids, int64 lengths).

  `stats` (optional) gets 'examples' (read), 'skipped' (non-empty sides in
  other languages) and 'member' (the task being read) added up.
  """
  stats = {} if stats is None else stats
  stats.setdefault("examples", 0)
  stats.setdefault("skipped", 0)
  for member in _members(task, split):
    stats["member"] = member.name
    for batch in _member_batches(member, split=split, languages=languages, vocab_size=vocab_size):
      stats["examples"] += len(batch["lang"])
      for side in ("", "_b"):
        if f"ids{side}" not in batch:
          continue
        ids, lengths, langs = batch[f"ids{side}"], batch[f"lengths{side}"], batch[f"lang{side}"]
        stats["skipped"] += int(((langs < 0) & (lengths > 0)).sum())
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
          raise UserError(f"task {member.name!r} ({split}) yields token ids outside [0, {vocab_size}); its "
                          "vocabulary is not the one counted with.")
        yield from _split_by_language(ids, lengths, langs)


def task_sequences(task: str, *, split: str = "train", languages: Sequence[str],
                   vocab_size: int) -> Iterator[tuple[int, np.ndarray]]:
  """(language index, int32 ids) per side of every example of a task or mixture's split (members once, unpacked).

  Sides in languages not in `languages` are skipped.
  """
  for lang, ids, lengths in task_batches(task, split=split, languages=tuple(languages), vocab_size=vocab_size):
    for sequence in np.split(ids, np.cumsum(lengths)[:-1]):
      yield lang, sequence


def encoder_of(vocabulary: Any) -> tuple[Callable[[str], Sequence[int]], int]:
  """(text -> ids, vocabulary size) of a seqio vocabulary, an object with `encode`, or a SentencePiece file."""
  if isinstance(vocabulary, (str, os.PathLike)):
    import sentencepiece as spm

    path = os.fspath(vocabulary)
    if not os.path.isfile(path):
      raise UserError(f"--vocabulary {path} does not exist; pass a SentencePiece .model file.")
    try:
      processor = spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:
      raise UserError(f"--vocabulary {path} is not a SentencePiece model ({e}).") from e
    return processor.encode, int(processor.get_piece_size())
  return vocabulary.encode, int(vocabulary.vocab_size)


def text_sequences(paths: Sequence[str], *, vocabulary: Any, language: int = 0) -> Iterator[tuple[int, np.ndarray]]:
  """(language, int32 ids) per non-blank line of UTF-8 text files (one sentence per line).

  Args:
    paths: the files.
    vocabulary: a seqio vocabulary (or anything with `encode(text)` and
      `vocab_size`) or the path of a SentencePiece model.
    language: the language index the sequences get.
  """
  from flax_xalign.fileio import utf8_lines

  encode, _ = encoder_of(vocabulary)
  for path in ([paths] if isinstance(paths, str) else paths):
    if not os.path.isfile(path):
      raise UserError(f"text file {path} does not exist; pass UTF-8 files with one sentence per line.")
    for _, line in utf8_lines(path, what=path):
      if line.strip():
        yield language, np.asarray(encode(line.strip()), np.int32)


# ---------------------------------------------------------------- counting a task


def progress_logger(log: Callable[[str], Any] | None, what: str) -> Callable[[int, int, bool], None]:
  """A callback(tokens, examples, last) that logs a line every few seconds (and the last one)."""
  start = time.perf_counter()
  last = [start]

  def report(tokens: int, examples: int, final: bool = False) -> None:
    now = time.perf_counter()
    if log is not None and (final or now - last[0] >= _PROGRESS_SECONDS):
      last[0] = now
      log(f"cooc: counting {what}: {examples:,} examples, {tokens:,} tokens, "
          f"{tokens / max(now - start, 1e-9):,.0f} tokens/s")

  return report


def count_task(task: str, *, split: str = "train", languages: Sequence[str] | None = None,
               window: int = DEFAULT_WINDOW, reference_language: str = DEFAULT_REFERENCE_LANGUAGE,
               drop_diagonal: bool = False, log: Callable[[str], Any] | None = print) -> CoocTable:
  """The table of a registered seqio task or mixture's split, in one streaming pass.

  Args:
    task: a task or mixture name (each member task is read once; rates play no part).
    split: the split to count.
    languages: the languages counted (others are skipped); None: the task's.
    window, reference_language, drop_diagonal: see `finalize`.
    log: progress lines every few seconds and a summary; None: quiet.

  Raises:
    UserError: unknown task, no member with `split`, a bad window, ids outside
      the task's vocabulary, or an empty corpus.
  """
  from flax_xalign import tasks

  start = time.perf_counter()
  if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
    raise UserError(f"the window must be an integer >= 1 (n of the ±n window; the paper: 2), got {window!r}.")
  vocab_size = int(tasks.get_vocabulary(task).vocab_size)
  languages = tuple(sorted(set(languages))) if languages is not None else tuple(tasks.languages_of(task))
  counter = PairCounter(languages=languages, vocab_size=vocab_size, window=window)
  stats = {"examples": 0, "skipped": 0, "member": task}
  report = progress_logger(log, f"{task}:{split}")
  seen = 0
  for lang, ids, lengths in task_batches(task, split=split, languages=languages, vocab_size=vocab_size,
                                         stats=stats):
    counter.add_batch(lang, ids, lengths)
    seen += ids.size
    report(seen, stats["examples"])
  counts = counter.result()
  report(int(counts.tokens.sum()), stats["examples"], True)
  if stats["skipped"] and log is not None:
    log(f"cooc: skipped {stats['skipped']:,} sides in languages other than {list(languages)}")
  source = {"task": task, "split": split, "examples": stats["examples"], "skipped_sides": stats["skipped"]}
  table = finalize(counts, reference_language=reference_language, drop_diagonal=drop_diagonal, source=source,
                   seconds=time.perf_counter() - start, log=log)
  if log is not None:
    log(summary(table))
  return table


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
