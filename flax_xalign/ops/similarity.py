"""Cosine normalisation: the one definition of "unit vector" in the project.

Every cosine (DWA's self-labelling, the word aligner, the alignment score,
CSLS) goes through `l2_normalize`, which divides by the norm clamped to `eps`
(1e-6), so an all-zero row stays zero instead of becoming NaN. This module is
a leaf of `ops/`: the searches built on it (`cosine_topk`,
`nearest_neighbours`) live in `ops/csls.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NORM_EPS = 1e-6


def l2_normalize(x: jax.Array, *, axis: int = -1, eps: float = NORM_EPS) -> jax.Array:
  """`x / max(||x||, eps)` along `axis`, computed in float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=axis, keepdims=True), eps * eps))
