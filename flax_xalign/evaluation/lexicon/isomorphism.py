"""Isomorphism of two languages' embedding spaces: gold-pair cosine ("MUSE cosine") and translation analogies.

Ai & Fang 2023, §4.2 / §5.1 / App. A.2.1, Tables 2 and 3.

**MUSE cosine** (Table 2; XLM's "cosine similarity of translation pairs"):
the mean cos(x_i, y_i) over the gold translation pairs of a lexicon, at the
EMBEDDING layer (rows of the input token-embedding table). A word is
represented by the mean of its pieces' rows ("for words split into 2+
sub-tokens, we average all the sub-token embeddings"); every piece the run's
tokeniser gives counts, a SentencePiece word-start piece `▁` included, as
the paper's averaging has no exception. A source with several gold
translations contributes one pair per listed translation (MUSE's files list
one pair per line and the mean is over lines), so a frequent word with many
translations weighs more. Pairs that cannot be represented are skipped and
counted by reason (`PairPieces.skipped`): a word that encodes to no piece
(empty), or one with the unknown piece (its row is not the word's). At a
contextual layer l > 0 a piece's vector is its mean state over its
occurrences in the language's text (`bli.contextual_means`), and a pair with a
piece that never occurs there is left out at that layer.

The number alone is hard to read: embedding spaces are anisotropic (every
row shares a common direction), so even unrelated words have cosine well
above 0. `pair_cosine` therefore also gives the **shuffled-pair baseline**:
the mean cos(x_i, y_j) over all mismatched pairs i != j, skipping those
that share a source word or a target word (so a shuffled pair is never a
gold translation) — the exact expectation over random re-pairings, with no
seed. The gap between the two is the isomorphism signal.

**Translation analogy** (our stand-in for Table 3). The paper's Table 3 uses
king/queen-style SEMANTIC analogies (King - Man + Woman = Queen, mono- and
cross-lingual), which need relation lists we do not have offline. From a
bilingual lexicon alone the relation we know is translation, so for two
gold pairs (a_src, a_tgt), (b_src, b_tgt) with different words on both sides
we test the parallelogram a_src - a_tgt + b_tgt ~= b_src: if the two spaces
are related by one consistent translation offset (a shift, the simplest
isomorphism), it holds exactly. Two readings of the same parallelogram:

* `translation`: a_src - a_tgt + b_tgt -> b_src, the pair a's translation
  offset carried onto b; candidates: the source words;
* `mono`: b_src - a_src + a_tgt -> b_tgt, a monolingual offset (between two
  source words) carried into the target language; candidates: the target
  words.

Both are 3CosAdd (Mikolov et al. 2013; Levy & Goldberg 2014): the three
input vectors are unit-normalised, their signed sum is the prediction, the
prediction is correct when its nearest candidate by cosine is the answer,
the query words themselves excluded (here the one input word that is a
candidate: a_src, resp. a_tgt). We report top-1 accuracy and the mean
cos(prediction, answer) (Table 3's quantity), over a deterministic sample of
quadruples (`sample_quadruples`, seeded), and as a floor the accuracy of the
plain nearest candidate of b_tgt (no offset: what BLI by NN would give on the
same queries). Unlike Table 3 these are translation relations, not gender or
other semantic ones, so the numbers are not comparable with the paper's.

Everything here is a pure NumPy function of arrays (float64 inside).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np

DEFAULT_QUADRUPLES = 2000
_EXAMPLES = 5  # Skipped words listed per reason.
_BLOCK = 1024  # Analogy queries scored per matrix product.

# Reasons a gold pair is skipped (each pair counted once, under the first that applies, source side first).
SOURCE_EMPTY = "source_empty"
SOURCE_UNKNOWN_PIECE = "source_unknown_piece"
TARGET_EMPTY = "target_empty"
TARGET_UNKNOWN_PIECE = "target_unknown_piece"
SOURCE_NOT_LANGUAGE_SPECIFIC = "source_not_in_language_vocab"
TARGET_NOT_LANGUAGE_SPECIFIC = "target_not_in_language_vocab"
WORD_REASONS = (SOURCE_EMPTY, SOURCE_UNKNOWN_PIECE, TARGET_EMPTY, TARGET_UNKNOWN_PIECE)
TOKEN_REASONS = (SOURCE_NOT_LANGUAGE_SPECIFIC, TARGET_NOT_LANGUAGE_SPECIFIC)


# ------------------------------------------------------------ gold pairs as pieces


@dataclasses.dataclass(frozen=True)
class PairPieces:
  """Gold translation pairs, each word as its token ids.

  Attributes:
    src: int32 [p, a] piece ids of each pair's source word, -1 padded (a >= 1).
    tgt: int32 [p, b] the same for the target word.
    src_word: int32 [p] which distinct source word the pair has (words with equal pieces are one word).
    tgt_word: int32 [p] the same for the target side.
    given: pairs the gold lists.
    skipped: reason -> pairs skipped.
    examples: reason -> a few skipped words, for messages.
  """
  src: np.ndarray
  tgt: np.ndarray
  src_word: np.ndarray
  tgt_word: np.ndarray
  given: int
  skipped: Mapping[str, int]
  examples: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  @property
  def pairs(self) -> int:
    return len(self.src)

  @property
  def coverage(self) -> float:
    return self.pairs / self.given if self.given else 0.0

  @property
  def identical(self) -> int:
    """Pairs whose two words are the same pieces (cosine 1 at every layer: shared or copied words)."""
    width = max(self.src.shape[1], self.tgt.shape[1])
    return int((_pad_to(self.src, width) == _pad_to(self.tgt, width)).all(axis=1).sum())

  def piece_ids(self, side: int) -> np.ndarray:
    """int64 [n] the distinct token ids of a side's words (side 0 = source)."""
    pieces = self.src if side == 0 else self.tgt
    return np.unique(pieces[pieces >= 0]).astype(np.int64)


def _pad_to(pieces: np.ndarray, width: int) -> np.ndarray:
  return np.pad(pieces, ((0, 0), (0, width - pieces.shape[1])), constant_values=-1)


def _pack(rows: Sequence[Sequence[int]]) -> np.ndarray:
  width = max([len(r) for r in rows] + [1])
  out = np.full((len(rows), width), -1, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _word_classes(rows: Sequence[tuple[int, ...]]) -> np.ndarray:
  """int32 [p]: one index per distinct piece sequence, in order of first appearance."""
  index: dict[tuple[int, ...], int] = {}
  return np.asarray([index.setdefault(row, len(index)) for row in rows], np.int32)


def _pair_pieces(src_rows: list[tuple[int, ...]], tgt_rows: list[tuple[int, ...]], *, given: int,
                 skipped: Mapping[str, int], examples: Mapping[str, list[str]]) -> PairPieces:
  return PairPieces(src=_pack(src_rows), tgt=_pack(tgt_rows), src_word=_word_classes(src_rows),
                    tgt_word=_word_classes(tgt_rows), given=given, skipped=dict(skipped),
                    examples={k: tuple(v) for k, v in examples.items() if v})


def pieces_from_lexicon(lexicon: Mapping[str, Sequence[str]], *, encode: Callable[[str], Sequence[int]],
                        unknown_id: int | None, normalize: Callable[[str], str] = lambda word: word) -> PairPieces:
  """Every (source, translation) pair of a word lexicon as piece ids.

  Args:
    lexicon: {source word: [translations]} (`data.sources.lexicon.read_lexicon`).
    encode: text -> token ids (the run's vocabulary; a word alone, as at the start of a text).
    unknown_id: the vocabulary's unknown piece (a word holding it is skipped); None: none.
    normalize: the run's text normaliser, applied to every word before `encode`.

  Returns:
    The `PairPieces`; skips counted under `WORD_REASONS`.
  """
  skipped = {reason: 0 for reason in WORD_REASONS}
  examples: dict[str, list[str]] = {reason: [] for reason in WORD_REASONS}
  cache: dict[str, tuple[int, ...]] = {}

  def pieces(word: str) -> tuple[int, ...]:
    if word not in cache:
      cache[word] = tuple(int(i) for i in encode(normalize(word)))
    return cache[word]

  def problem(ids: tuple[int, ...], empty: str, unknown: str) -> str | None:
    if not ids:
      return empty
    if unknown_id is not None and unknown_id in ids:
      return unknown
    return None

  src_rows, tgt_rows = [], []
  given = 0
  for source, translations in lexicon.items():
    for target in translations:
      given += 1
      src_ids, tgt_ids = pieces(source), pieces(target)
      for word, reason in ((source, problem(src_ids, SOURCE_EMPTY, SOURCE_UNKNOWN_PIECE)),
                           (target, problem(tgt_ids, TARGET_EMPTY, TARGET_UNKNOWN_PIECE))):
        if reason is not None:
          skipped[reason] += 1
          if len(examples[reason]) < _EXAMPLES and word not in examples[reason]:
            examples[reason].append(word)
          break
      else:
        src_rows.append(src_ids)
        tgt_rows.append(tgt_ids)
  return _pair_pieces(src_rows, tgt_rows, given=given, skipped=skipped, examples=examples)


def pieces_from_token_pairs(pairs: np.ndarray, *, src_ids: np.ndarray | None = None,
                            tgt_ids: np.ndarray | None = None) -> PairPieces:
  """(source id, target id) token pairs (a synthetic run's token map) as one-piece words.

  Args:
    pairs: int [n, 2] (source token id, target token id).
    src_ids, tgt_ids: the ids each side may use (its language-specific vocabulary: tokens the run saw;
      an unseen token's row is its initialisation, noise for this measure); None: any.

  Returns:
    The `PairPieces`; skips counted under `TOKEN_REASONS`.
  """
  pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
  src_ok = np.ones(len(pairs), bool) if src_ids is None else np.isin(pairs[:, 0], np.asarray(src_ids))
  tgt_ok = np.ones(len(pairs), bool) if tgt_ids is None else np.isin(pairs[:, 1], np.asarray(tgt_ids))
  keep = src_ok & tgt_ok
  skipped = {SOURCE_NOT_LANGUAGE_SPECIFIC: int((~src_ok).sum()),
             TARGET_NOT_LANGUAGE_SPECIFIC: int((src_ok & ~tgt_ok).sum())}
  src_rows = [(int(s),) for s in pairs[keep, 0]]
  tgt_rows = [(int(t),) for t in pairs[keep, 1]]
  return _pair_pieces(src_rows, tgt_rows, given=len(pairs), skipped=skipped, examples={})


# ------------------------------------------------------------ word vectors and pair cosines


def word_vectors(table: np.ndarray, pieces: np.ndarray, *, row_valid: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
  """Each word's vector: the mean of its pieces' rows.

  Args:
    table: [r, e] one vector per row (the token-embedding table: rows = token ids).
    pieces: int [p, a] rows of `table`, -1 padded.
    row_valid: bool [r] rows that exist (False: e.g. a piece never seen in the text); None: all.

  Returns:
    (float32 [p, e] vectors, zero for an invalid word; bool [p] valid: at least one piece, all valid).
  """
  table = np.asarray(table)
  pieces = np.asarray(pieces, np.int64)
  present = pieces >= 0
  rows = np.where(present, pieces, 0)
  valid = present.any(axis=1)
  if row_valid is not None:
    valid &= (np.asarray(row_valid, bool)[rows] | ~present).all(axis=1)
  weights = present.astype(np.float64)
  sums = np.einsum("pa,pae->pe", weights, table[rows].astype(np.float64))
  means = sums / np.maximum(weights.sum(axis=1), 1.0)[:, None]
  return np.where(valid[:, None], means, 0.0).astype(np.float32), valid


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class PairCosine(NamedTuple):
  """`pair_cosine`'s result (NaN means when there is nothing to average)."""
  mean: float  # mean cos(x_i, y_i) over the valid pairs
  shuffled_mean: float  # mean cos(x_i, y_j) over valid mismatched pairs i != j sharing no word
  pairs: int  # valid pairs
  shuffled_pairs: int  # mismatched pairs averaged


def _pair_sum(u: np.ndarray, v: np.ndarray, group: np.ndarray) -> tuple[float, int]:
  """(sum over i, j in the same group of u_i . v_j, number of such (i, j))."""
  groups = int(group.max()) + 1 if len(group) else 0
  su = np.zeros((groups, u.shape[1]))
  sv = np.zeros((groups, v.shape[1]))
  np.add.at(su, group, u)
  np.add.at(sv, group, v)
  sizes = np.bincount(group, minlength=groups).astype(np.int64)
  return float(np.sum(su * sv)), int(np.sum(sizes * sizes))


def pair_cosine(x: np.ndarray, y: np.ndarray, *, src_word: np.ndarray | None = None,
                tgt_word: np.ndarray | None = None, mask: np.ndarray | None = None) -> PairCosine:
  """Mean cosine of translation pairs and of shuffled (mismatched) pairs.

  The shuffled mean averages cos(x_i, y_j) over every i != j whose words
  differ on both sides (src_word_i != src_word_j and tgt_word_i != tgt_word_j),
  in closed form: with u, v the unit rows, the sum over all (i, j) is
  (sum u) . (sum v), and the excluded (i, j) (same source word, or same
  target word, which includes i = j) are subtracted by inclusion-exclusion
  over the groups of equal words.

  Args:
    x: [p, e] source-side vectors of the pairs.
    y: [p, e] target-side vectors.
    src_word, tgt_word: int [p] word identity per side (pairs sharing one are never a shuffled pair);
      None: every pair its own word.
    mask: bool [p] pairs that take part; None: all.
  """
  p = len(x)
  valid = np.ones(p, bool) if mask is None else np.asarray(mask, bool)
  u, v = _unit(x)[valid], _unit(y)[valid]
  n = len(u)
  if n == 0:
    return PairCosine(float("nan"), float("nan"), 0, 0)
  cos = np.sum(u * v, axis=1)
  identity = np.arange(p)
  src_group = _dense(np.asarray(src_word if src_word is not None else identity)[valid])
  tgt_group = _dense(np.asarray(tgt_word if tgt_word is not None else identity)[valid])
  both = _dense(src_group.astype(np.int64) * (int(tgt_group.max()) + 1) + tgt_group)
  total = float(u.sum(axis=0) @ v.sum(axis=0))
  same_src, n_src = _pair_sum(u, v, src_group)
  same_tgt, n_tgt = _pair_sum(u, v, tgt_group)
  same_both, n_both = _pair_sum(u, v, both)
  count = n * n - (n_src + n_tgt - n_both)
  shuffled = (total - (same_src + same_tgt - same_both)) / count if count > 0 else float("nan")
  return PairCosine(float(cos.mean()), float(shuffled), n, int(count))


def _dense(labels: np.ndarray) -> np.ndarray:
  return np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1).astype(np.int64)


# ------------------------------------------------------------ analogies


class Analogy(NamedTuple):
  """Top-1 of analogy (or plain) queries against a candidate set."""
  accuracy: float  # fraction of queries whose nearest allowed candidate is the answer (NaN: no query)
  mean_cosine: float  # mean cos(query vector, answer's vector)
  predicted: np.ndarray  # int [q] the nearest allowed candidate of each query (-1: none allowed)


def nearest_candidate(queries: np.ndarray, candidates: np.ndarray, *, answers: np.ndarray,
                      exclude: np.ndarray | None = None) -> Analogy:
  """Top-1 candidate by cosine of every query, some candidates excluded per query.

  Args:
    queries: [q, e] query vectors (e.g. a 3CosAdd prediction).
    candidates: [n, e] candidate vectors.
    answers: int [q] the right candidate row per query.
    exclude: int [q, k] candidate rows a query may not return (its own input words), -1 padded; None: none.
  """
  queries, answers = np.asarray(queries), np.asarray(answers, np.int64)
  q = len(queries)
  exclude = np.full((q, 0), -1, np.int64) if exclude is None else np.asarray(exclude, np.int64).reshape(q, -1)
  cu = _unit(candidates)
  predicted = np.full(q, -1, np.int64)
  cosines = np.zeros(q)
  for start in range(0, q, _BLOCK):
    stop = min(start + _BLOCK, q)
    scores = _unit(queries[start:stop]) @ cu.T  # [block, n]
    rows = np.arange(stop - start)
    cosines[start:stop] = scores[rows, answers[start:stop]]
    for k in range(exclude.shape[1]):
      col = exclude[start:stop, k]
      scores[rows[col >= 0], col[col >= 0]] = -np.inf
    best = np.argmax(scores, axis=1)
    predicted[start:stop] = np.where(np.isfinite(scores[rows, best]), best, -1)
  accuracy = float((predicted == answers).mean()) if q else float("nan")
  return Analogy(accuracy, float(cosines.mean()) if q else float("nan"), predicted)


def three_cos_add(a: np.ndarray, b: np.ndarray, c: np.ndarray, candidates: np.ndarray, *, answers: np.ndarray,
                  exclude: np.ndarray | None = None) -> Analogy:
  """3CosAdd for a : b :: c : ?, the prediction unit(b) - unit(a) + unit(c).

  Args:
    a, b, c: [q, e] the three input vectors of each analogy.
    candidates: [n, e] the vectors the answer is sought among.
    answers: int [q] the right candidate row.
    exclude: int [q, k] candidate rows that are input words of the query, -1 padded.
  """
  return nearest_candidate(_unit(b) - _unit(a) + _unit(c), candidates, answers=answers, exclude=exclude)


def sample_quadruples(src_word: np.ndarray, tgt_word: np.ndarray, *, count: int, seed: int = 0,
                      mask: np.ndarray | None = None) -> np.ndarray:
  """Up to `count` distinct ordered pairs (a, b) of gold pairs with different words on both sides.

  Deterministic in `seed`: a fixed random order of all admissible (a, b),
  the first `count` of it; all of them when there are fewer.

  Args:
    src_word, tgt_word: int [p] word identity per side of the gold pairs.
    count: quadruples wanted.
    seed: of the order.
    mask: bool [p] pairs that may be used; None: all.

  Returns:
    int64 [m, 2] pair indices (a, b), m <= count.
  """
  src_word, tgt_word = np.asarray(src_word), np.asarray(tgt_word)
  usable = np.flatnonzero(np.ones(len(src_word), bool) if mask is None else np.asarray(mask, bool))
  n = len(usable)
  if n < 2 or count < 1:
    return np.zeros((0, 2), np.int64)
  rng = np.random.default_rng(seed)
  # Draw from the n * (n - 1) ordered pairs without building them: a random permutation of codes when small,
  # rejection from the whole range (few collisions at these sizes) when large.
  total = n * (n - 1)
  if total <= max(1 << 20, 4 * count):
    codes = rng.permutation(total)
  else:
    codes = np.unique(rng.integers(0, total, size=4 * count))
    codes = rng.permutation(codes)
  a = codes // (n - 1)
  b = codes % (n - 1)
  b = b + (b >= a)  # Skips b == a.
  ia, ib = usable[a], usable[b]
  ok = (src_word[ia] != src_word[ib]) & (tgt_word[ia] != tgt_word[ib])
  return np.stack([ia[ok], ib[ok]], axis=1)[:count].astype(np.int64)


def _representatives(word: np.ndarray) -> np.ndarray:
  """int [w] one pair index per word id 0..w-1 (its first pair); word ids must be dense."""
  values, first = np.unique(np.asarray(word, np.int64), return_index=True)
  if len(values) and (values[0] != 0 or values[-1] != len(values) - 1):
    raise ValueError("word ids must be 0..w-1 (as PairPieces numbers them)")
  return first


def translation_analogies(x: np.ndarray, y: np.ndarray, *, src_word: np.ndarray, tgt_word: np.ndarray,
                          quadruples: np.ndarray) -> dict[str, float | int]:
  """Both analogy readings of the module docstring on sampled quadruples, and the plain-NN floor.

  Args:
    x, y: [p, e] source / target vectors of the gold pairs (rows of equal words are equal).
    src_word, tgt_word: int [p] word ids per side, dense 0..w-1 over the pairs (`PairPieces`).
    quadruples: int [m, 2] pair indices (a, b) (`sample_quadruples`).

  Returns:
    {"accuracy", "mean_cosine" (translation reading), "mono_accuracy", "mono_mean_cosine",
     "nn_accuracy" (nearest source word of b_tgt, a_src excluded), "quadruples",
     "source_candidates", "target_candidates"}.
  """
  src_word, tgt_word = np.asarray(src_word, np.int64), np.asarray(tgt_word, np.int64)
  src_cands, tgt_cands = x[_representatives(src_word)], y[_representatives(tgt_word)]
  ia, ib = np.asarray(quadruples, np.int64).reshape(-1, 2).T
  translation = three_cos_add(y[ia], x[ia], y[ib], src_cands, answers=src_word[ib], exclude=src_word[ia, None])
  mono = three_cos_add(x[ia], x[ib], y[ia], tgt_cands, answers=tgt_word[ib], exclude=tgt_word[ia, None])
  plain = nearest_candidate(y[ib], src_cands, answers=src_word[ib], exclude=src_word[ia, None])
  return {"accuracy": translation.accuracy, "mean_cosine": translation.mean_cosine,
          "mono_accuracy": mono.accuracy, "mono_mean_cosine": mono.mean_cosine, "nn_accuracy": plain.accuracy,
          "quadruples": len(ia), "source_candidates": len(src_cands),
          "target_candidates": len(tgt_cands)}
