"""Exact raw pair counts of the MLM-GC co-occurrence table (Ai & Fang 2023, §3.2): C[lang, d, a, b].

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
`coo_matrix` counter. `table.finalize` turns the counts into the weighted table.

The definitions (sequence, window, weights) are in the package docstring
(`flax_xalign.data.cooc`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from flax_xalign.errors import UserError

DEFAULT_WINDOW = 2
_KEY_LIMIT = 2**63
_CHUNK_TOKENS = 1 << 22  # Tokens per counted chunk: large enough to amortise the per-chunk work.
_DENSE_BINS = 1 << 22  # Dense (rank a, rank b) bins per (language, d) at most (int64 each: 32 MB)...
_DENSE_TOTAL = 1 << 25  # ... and over all (language, d) together (256 MB).
_MAX_FREQUENT = 1 << 11


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
