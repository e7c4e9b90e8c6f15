"""Packing the aligner's attention segments into encoder rows of one shape.

The aligner's unit of attention is a segment: a whole pair with
`encoding="joint"`, each side alone (`<s> a </s>`, `<s> b </s>`) with
"separate". Bible verses have 10 to 120 subwords a side; padding each row to
a length bucket wastes a third of the encoder's work, and every bucket is one
more compile of the encoder. Here segments are packed, several to a row
(each its own `segment_ids` value, positions as laid out), into rows of one
length, `rows` at a time: one encoder shape per run, rows nearly full.

Segments are taken a window at a time (`pack_windows`), a pair's two sides
one after the other, so they land in the same or a nearby encoder batch and
the aligner keeps the states of a few batches only. The aligner alternates
long and short pairs, so every window has short segments to fill the rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np


class Segment(NamedTuple):
  """One attention segment: unpadded int32 [n] features, as `word_align.layout_pair` lays them out."""

  tokens: np.ndarray
  lang_ids: np.ndarray
  positions: np.ndarray


class PairSlots(NamedTuple):
  """Where a pair's subwords are: side a at `src_start` of segment `src`, side b at `tgt_start` of `tgt`."""

  src: int
  src_start: int
  num_src: int
  tgt: int
  tgt_start: int
  num_tgt: int


def segments_of(encoded: Sequence, *, separate: bool, restart: bool) -> tuple[list[Segment], list[PairSlots]]:
  """The segments of every `word_align.EncodedPair` and where each pair's subwords sit in them.

  Args:
    encoded: EncodedPairs (tokens, lang_ids, positions, src_words, tgt_words).
    separate: each side its own segment (needs the "restart" layout, whose
      side b is `<s> b </s>` with positions from 0); else the pair is one.
    restart: the pair layout is "restart" (side b opens with its own `<s>`).
  """
  segments: list[Segment] = []
  slots: list[PairSlots] = []
  for e in encoded:
    na, nb = len(e.src_words), len(e.tgt_words)
    if separate:
      cut = na + 2  # <s> a </s> | <s> b </s>
      segments.append(Segment(e.tokens[:cut], e.lang_ids[:cut], e.positions[:cut]))
      segments.append(Segment(e.tokens[cut:], e.lang_ids[cut:], e.positions[cut:]))
      slots.append(PairSlots(len(segments) - 2, 1, na, len(segments) - 1, 1, nb))
    else:
      segments.append(Segment(e.tokens, e.lang_ids, e.positions))
      tgt_start = na + (3 if restart else 2)
      slots.append(PairSlots(len(segments) - 1, 1, na, len(segments) - 1, tgt_start, nb))
  return segments, slots


def best_fit_decreasing(lengths: Sequence[int], *, row_length: int,
                        max_rows: int) -> tuple[list[list[int]], list[int]]:
  """Packs items into at most `max_rows` rows of `row_length`, longest first, each into the fullest row it fits.

  Args:
    lengths: item lengths, each at most `row_length`.

  Returns:
    (rows: item indices per row, in placement order; left: the indices that
    did not fit, for a later window).
  """
  # free[c]: rows with exactly c positions left. Lengths are bounded by the
  # row length, so the best fit is a scan over at most row_length capacities.
  free: list[list[int]] = [[] for _ in range(row_length + 1)]
  rows: list[list[int]] = []
  space: list[int] = []
  left = []
  for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    n = lengths[item]
    if not 0 < n <= row_length:
      raise ValueError(f"item of length {n} does not fit a row of {row_length}")
    row = next((free[c].pop() for c in range(n, row_length + 1) if free[c]), None)
    if row is None:
      if len(rows) == max_rows:
        left.append(item)
        continue
      row = len(rows)
      rows.append([])
      space.append(row_length)
    rows[row].append(item)
    space[row] -= n
    free[space[row]].append(row)
  return rows, left


def pack_windows(lengths: Sequence[int], order: Sequence[int], *, row_length: int,
                 rows: int) -> Iterator[list[list[int]]]:
  """Batches of at most `rows` rows of segment indices, segments taken in `order`, a window at a time.

  Each window holds the previous window's leftovers and then the next
  segments in `order` until they would fill `rows` rows; it is packed by
  `best_fit_decreasing` and what does not fit waits for the next one. Every
  segment is in exactly one batch; only the last batches may have fewer rows.
  """
  budget = rows * row_length
  waiting: list[int] = []
  queue = list(reversed(order))
  while waiting or queue:
    total = sum(lengths[i] for i in waiting)
    while queue and total < budget:
      waiting.append(queue.pop())
      total += lengths[waiting[-1]]
    packed, left = best_fit_decreasing([lengths[i] for i in waiting], row_length=row_length, max_rows=rows)
    yield [[waiting[i] for i in row] for row in packed]
    waiting = [waiting[i] for i in left]


class RowBatch(NamedTuple):
  """Encoder features of packed rows and where each segment went.

  Attributes:
    features: tokens, lang_ids, positions, segment_ids: int32 [rows, length].
    offsets: segment index -> (row, first column).
  """

  features: dict[str, np.ndarray]
  offsets: dict[int, tuple[int, int]]


def row_batch(segments: Sequence[Segment], packed: Sequence[Sequence[int]], *, rows: int,
              length: int) -> RowBatch:
  """The [rows, length] features of `packed` (segment indices per row); each segment its own segment id."""
  features = {k: np.zeros((rows, length), np.int32) for k in ("tokens", "lang_ids", "positions", "segment_ids")}
  offsets = {}
  for r, members in enumerate(packed):
    column = 0
    for k, index in enumerate(members):
      segment = segments[index]
      end = column + len(segment.tokens)
      features["tokens"][r, column:end] = segment.tokens
      features["lang_ids"][r, column:end] = segment.lang_ids
      features["positions"][r, column:end] = segment.positions
      features["segment_ids"][r, column:end] = k + 1
      offsets[index] = (r, column)
      column = end
  return RowBatch(features, offsets)
