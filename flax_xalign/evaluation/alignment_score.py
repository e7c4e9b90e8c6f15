"""The ALIGN-MLM alignment score of a token-embedding table.

Deshpande et al. 2021 / Tang et al.: for a transliterated synthetic language
every natural token `i` has exactly one counterpart `id_map[i]` in the derived
vocabulary. A natural token scores 1 when, among all derived tokens, its
nearest neighbour by cosine over the *input* embeddings is its counterpart.
The alignment is the mean over natural tokens.

Two numbers are reported: `all` (every translatable natural token: the paper's
number, which includes tokens the training dictionary supervised directly) and
`heldout` (only tokens not in the training dictionary: leak-free). Tokens left
shared by a partial vocabulary overlap are their own counterpart and are not
scored.

The search is blockwise (`block` query rows at a time) and jitted, so the
[V, V] similarity matrix of a 40k vocabulary never exists at once.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

NUM_SPECIAL_TOKENS = 5


def scored_ids(id_map: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(natural ids that have a distinct counterpart, the derived vocabulary)."""
  id_map = np.asarray(id_map)
  ids = np.arange(len(id_map))
  regular = ids >= NUM_SPECIAL_TOKENS
  return ids[regular & (id_map != ids)], np.unique(id_map[regular])


def _scoring_sets(id_map: np.ndarray, dictionary: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(queries, candidates, each query's counterpart, held-out mask over queries)."""
  queries, candidates = scored_ids(id_map)
  held = np.ones(len(queries), bool)
  if dictionary is not None and len(dictionary):
    held = ~np.isin(queries, np.asarray(dictionary)[:, 0])
  return queries, candidates, np.asarray(id_map)[queries], held


@functools.partial(jax.jit, static_argnames=("block",))
def nearest_neighbours(table: jax.Array, queries: jax.Array, candidates: jax.Array, *, block: int = 1024) -> jax.Array:
  """Cosine nearest neighbour among `candidates` for each query id.

  Args:
    table: [vocab, embed] embeddings.
    queries: [q] int ids.
    candidates: [c] int ids.
    block: query rows per similarity block.

  Returns:
    [q] int32: the candidate id nearest to each query.
  """
  unit = table.astype(jnp.float32)
  unit = unit * jax.lax.rsqrt(jnp.maximum(jnp.sum(unit * unit, axis=-1, keepdims=True), 1e-12))
  cand = unit[candidates]  # [c, e]
  q = queries.shape[0]
  padded = -(-q // block) * block
  rows = jnp.pad(queries, (0, padded - q)).reshape(-1, block)

  def one_block(ids: jax.Array) -> jax.Array:
    return jnp.argmax(unit[ids] @ cand.T, axis=-1)

  best = jax.lax.map(one_block, rows).reshape(-1)[:q]
  return candidates[best].astype(jnp.int32)


def alignment_score(table: Any, id_map: np.ndarray, *, dictionary: np.ndarray | None = None,
                    block: int = 1024) -> dict[str, float]:
  """Alignment over all translatable tokens and over those outside `dictionary`.

  Args:
    table: [vocab, embed] input token embeddings (vocab >= max derived id + 1).
    id_map: [V] natural id -> derived id.
    dictionary: optional [n, 2] training dictionary (natural, derived) pairs.
    block: query rows per similarity block.

  Returns:
    {"all", "heldout", "count_all", "count_heldout"}; scores in [0, 1]
    (heldout is NaN when every token is in the dictionary).
  """
  queries, candidates, targets, held = _scoring_sets(id_map, dictionary)
  nearest = np.asarray(nearest_neighbours(jnp.asarray(table), jnp.asarray(queries),
                                          jnp.asarray(candidates), block=block))
  hit = nearest == targets
  return {
      "all": float(hit.mean()) if len(hit) else float("nan"),
      "heldout": float(hit[held].mean()) if held.any() else float("nan"),
      "count_all": int(len(hit)),
      "count_heldout": int(held.sum()),
  }


def alignment_monitor(id_map: np.ndarray, dictionary: np.ndarray | None = None, *, block: int = 1024):
  """A `PretrainingModel.monitors` entry: params -> {all, heldout} (jit-friendly)."""
  queries, candidates, targets, held = _scoring_sets(id_map, dictionary)
  queries_j, candidates_j = jnp.asarray(queries), jnp.asarray(candidates)
  targets_j, held_j = jnp.asarray(targets), jnp.asarray(held, jnp.float32)

  def monitor(params: Any) -> dict[str, jax.Array]:
    nearest = nearest_neighbours(params["token_embed"]["embedding"], queries_j, candidates_j, block=block)
    hit = (nearest == targets_j).astype(jnp.float32)
    return {"all": jnp.mean(hit), "heldout": jnp.sum(hit * held_j) / jnp.maximum(jnp.sum(held_j), 1.0)}

  return monitor
