"""Cosine normalisation and blockwise nearest neighbours over embedding tables.

One definition of "unit vector" for every cosine in the project (DWA's
self-labelling, the word aligner, the alignment score): `l2_normalize` divides
by the norm clamped to `eps` (1e-6), so an all-zero row stays zero instead of
becoming NaN. `nearest_neighbours` is `ops.csls.cosine_topk` at k = 1: it
searches `block` query rows at a time, so the [queries, candidates] similarity
matrix of a large vocabulary never exists at once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

NORM_EPS = 1e-6


def l2_normalize(x: jax.Array, *, axis: int = -1, eps: float = NORM_EPS) -> jax.Array:
  """`x / max(||x||, eps)` along `axis`, computed in float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=axis, keepdims=True), eps * eps))


@functools.partial(jax.jit, static_argnames=("block",))
def nearest_neighbours(table: jax.Array, queries: jax.Array, candidates: jax.Array, *,
                       block: int = 1024) -> jax.Array:
  """Cosine nearest neighbour among `candidates` for each query id.

  Args:
    table: [vocab, embed] embeddings.
    queries: [q] int ids (rows of `table`).
    candidates: [c] int ids (rows of `table`).
    block: query rows per similarity block.

  Returns:
    [q] int32: the candidate id nearest to each query (the first on ties).
  """
  from flax_xalign.ops.csls import cosine_topk  # csls imports l2_normalize from here

  top = cosine_topk(table[queries], table[candidates], k=1, block=block)
  return candidates[top.indices[:, 0]].astype(jnp.int32)
