"""How the aligner lays a pair out for the encoder, and its jitted link kernels.

`layout_pair` places one pair's per-word subwords the way the feature
converter lays out a training pair (both `pair_layout`s), keeping whole words
within the budget; `word_links` turns subword links into word links. The
kernels take hidden states to links for every requested layer and method in
one jitted call (`_jitted_links` for one pair per row, `_jitted_states` +
`_jitted_state_links` for the packed rows of `word_align.WordAligner`).
Split from `word_align` so each module stays one screenful of seams.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign import ops
from flax_xalign.data.vocab.specials import SpecialTokens, check_pair_layout

# Special tokens a pair adds, per layout (as the feature converter's PAIR_SPECIALS).
_PAIR_SPECIALS = {"restart": 4, "continuous": 3}


class EncodedPair(NamedTuple):
  """One pair in the TLM layout (unpadded int32 arrays) and its word map.

  Attributes:
    tokens, lang_ids, positions, pair_side: the model features, [n].
    src_words: [n_a] word index of each side-a subword.
    tgt_words: [n_b] word index of each side-b subword.
    truncated: words were dropped to fit the budget.
  """

  tokens: np.ndarray
  lang_ids: np.ndarray
  positions: np.ndarray
  pair_side: np.ndarray
  src_words: np.ndarray
  tgt_words: np.ndarray
  truncated: bool


def _words_that_fit(counts: Sequence[int], budget: int) -> int:
  """How many leading words (with `counts` subwords each) fit in `budget`."""
  total = 0
  for k, count in enumerate(counts):
    total += count
    if total > budget:
      return k
  return len(counts)


def layout_pair(src_pieces: Sequence[Sequence[int]], tgt_pieces: Sequence[Sequence[int]], *,
                src_lang_id: int, tgt_lang_id: int, max_length: int, max_side: int,
                specials: SpecialTokens, pair_layout: str = "restart") -> EncodedPair:
  """Lays out one pair of per-word subword ids as the feature converter does.

  "restart": `<s> a </s> <s> b </s>`, positions restarting at 0 on side b;
  "continuous": `<s> a </s> b </s>`, positions running on (pair_side 1 for
  `<s> a </s>`, 2 for `b </s>`).

  Args:
    src_pieces: subword ids of each source word.
    tgt_pieces: subword ids of each target word.
    src_lang_id, tgt_lang_id: language ids of the two sides.
    max_length: row length; both sides together keep at most max_length - 4
      ("restart") or max_length - 3 ("continuous") subwords, shared like
      `feature_converter.pair_budget`, whole words only. With "continuous"
      the positions of the whole row must fit the position table, so pass
      at most `num_positions`.
    max_side: most subwords one side may keep (positions must stay below the
      model's position table: num_positions - 2 with "restart").
    specials: the vocabulary's special ids (`<s>` and `</s>` frame the sides).
    pair_layout: "restart" or "continuous".
  """
  restart = check_pair_layout(pair_layout) == "restart"
  counts_a = [len(p) for p in src_pieces]
  counts_b = [len(p) for p in tgt_pieces]
  budget = max_length - _PAIR_SPECIALS[pair_layout]
  len_a, len_b = sum(counts_a), sum(counts_b)
  keep_a = min(len_a, max(budget // 2, budget - len_b), max_side)
  words_a = _words_that_fit(counts_a, keep_a)
  used_a = sum(counts_a[:words_a])
  words_b = _words_that_fit(counts_b, min(len_b, budget - used_a, max_side))
  src = [(w, t) for w in range(words_a) for t in src_pieces[w]]
  tgt = [(w, t) for w in range(words_b) for t in tgt_pieces[w]]
  na, nb = len(src), len(tgt)
  bos, eos = specials.bos, specials.eos
  opens_b = [bos] if restart else []  # Side b's own <s>.
  tokens = [bos] + [t for _, t in src] + [eos] + opens_b + [t for _, t in tgt] + [eos]
  span_a, span_b = na + 2, len(opens_b) + nb + 1
  positions_b = range(span_b) if restart else range(span_a, span_a + span_b)
  as_array = functools.partial(np.asarray, dtype=np.int32)
  return EncodedPair(
      tokens=as_array(tokens),
      lang_ids=as_array([src_lang_id] * span_a + [tgt_lang_id] * span_b),
      positions=as_array(list(range(span_a)) + list(positions_b)),
      pair_side=as_array([1] * span_a + [2] * span_b),
      src_words=as_array([w for w, _ in src]),
      tgt_words=as_array([w for w, _ in tgt]),
      truncated=used_a < len_a or sum(counts_b[:words_b]) < len_b)


def word_links(subword_links: np.ndarray, src_words: np.ndarray, tgt_words: np.ndarray) -> frozenset:
  """Word links from subword links: two words align if any of their subwords do.

  Args:
    subword_links: bool [n_a, n_b] links between the sides' subwords.
    src_words: int [n_a] word index of each side-a subword.
    tgt_words: int [n_b] word index of each side-b subword.
  """
  ii, jj = np.nonzero(subword_links)
  return frozenset(zip(src_words[ii].tolist(), tgt_words[jj].tolist()))


def _buckets(max_length: int) -> list[int]:
  sizes = [n for n in (16, 32, 64, 128, 256, 512, 1024, 2048) if n < max_length]
  return sizes + [max_length]


def _state_links(src: jax.Array, tgt: jax.Array, num_src: jax.Array, num_tgt: jax.Array, *,
                 methods: tuple[str, ...], options: ops.AlignmentSolver) -> dict[str, jax.Array]:
  """Links between two sides' subword states for every method.

  Args:
    src, tgt: [layers, rows, side, embed] states of side a and side b, from index 0 of each side.
    num_src, num_tgt: [rows] real subwords of each side; the rest is padding.
    methods: subset of METHODS.
    options: the AlignmentSolver.

  Returns:
    {method: bool [layers, rows, side, side]}; only [:num_src, :num_tgt] of
    a row can be True. A host method ("match") gets the float similarity
    instead, solved per pair by the caller.
  """
  similarity = options.scores(src, tgt)
  span = jnp.arange(similarity.shape[-1])
  valid_src = span[None, :] < num_src[:, None]
  valid_tgt = span[None, :] < num_tgt[:, None]
  mask = jnp.broadcast_to((valid_src[:, :, None] & valid_tgt[:, None, :])[None], similarity.shape)
  return {method: similarity if method in ops.align_solver.HOST_METHODS else options.links(similarity, mask, method)
          for method in methods}


def _layer_states(params: Any, features: Mapping[str, jax.Array], *, encoder: Any,
                  layers: tuple[int, ...]) -> jax.Array:
  """float32 [len(layers), rows, L] + [embed] hidden states of `layers`; the encoder stops at the deepest."""
  out = encoder.apply({"params": params}, features["tokens"], lang_ids=features["lang_ids"],
                      positions=features["positions"], segment_ids=features["segment_ids"],
                      deterministic=True, return_all_hidden=True, up_to_layer=max(layers))
  return jnp.stack([out.all_hidden[layer] for layer in layers]).astype(jnp.float32)


def _subword_links(params: Any, batch: Mapping[str, jax.Array], *, encoder: Any, layers: tuple[int, ...],
                   methods: tuple[str, ...], options: ops.AlignmentSolver) -> dict[str, jax.Array]:
  """Links between the two sides' subwords of one pair per row, for every layer and method.

  Args:
    params: encoder parameters.
    batch: `tokens, lang_ids, positions, segment_ids` [rows, L] and
      `tgt_start, num_src, num_tgt` [rows]; side a starts at index 1.
    encoder: the Flax Encoder.
    layers: hidden-state indices (0 = embeddings).
    methods: subset of METHODS.
    options: the AlignmentSolver.

  Returns:
    {method: bool [len(layers), rows, L - 3, L - 3]} (L - 3: the longest side
    of either layout), as `_state_links`.
  """
  hidden = _layer_states(params, batch, encoder=encoder, layers=layers)  # [k, b, L, e]
  side = hidden.shape[2] - 3
  span = jnp.arange(side)
  src = hidden[:, :, 1:1 + side]
  tgt_index = jnp.minimum(batch["tgt_start"][:, None] + span, hidden.shape[2] - 1)  # [b, side]
  tgt = jnp.take_along_axis(hidden, tgt_index[None, :, :, None], axis=2)
  return _state_links(src, tgt, batch["num_src"], batch["num_tgt"], methods=methods, options=options)


@functools.lru_cache(maxsize=64)
def _jitted_links(encoder: Any, layers: tuple[int, ...], methods: tuple[str, ...],
                  options: ops.AlignmentSolver) -> Callable:
  """One jitted `_subword_links` per (encoder config, layers, methods, options), shared by aligners."""
  return jax.jit(functools.partial(_subword_links, encoder=encoder, layers=layers, methods=methods,
                                   options=options))


@functools.lru_cache(maxsize=64)
def _jitted_states(encoder: Any, layers: tuple[int, ...]) -> Callable:
  """One jitted `_layer_states` per (encoder config, layers), shared by aligners and calls."""
  return jax.jit(functools.partial(_layer_states, encoder=encoder, layers=layers))


@functools.lru_cache(maxsize=64)
def _jitted_state_links(methods: tuple[str, ...], options: ops.AlignmentSolver) -> Callable:
  return jax.jit(functools.partial(_state_links, methods=methods, options=options))
