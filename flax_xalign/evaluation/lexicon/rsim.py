"""Relational similarity (RSIM) and translation-pair cosine, per layer (Lu, Lu & Zhang 2023, App. B, Fig. 3, 7).

For s translation pairs (x_i, y_i), RSIM is the Pearson correlation between
the two vectors of intra-language cosines over the pairs i < j:

    a = (cos(x_i, x_j))_{i<j},   b = (cos(y_i, y_j))_{i<j},   RSIM = pearson(a, b)

(Vulić et al. 2020): how alike the two spaces' geometries are on the pairs,
whatever their relative position. `rsim` never builds a or b: it streams row
blocks of the two cosine matrices (memory O(block x s)) and sums, in two
passes (means, then centred moments) so thousands of pairs keep float32
accuracy. `mean_pair_cosine` is the paper's "average cosine similarity
between translation pairs" (Fig. 3a).

Plots: `plot_layers` is Fig. 3's shape (Hit@1 and mean cosine vs layer;
RSIM vs layer), `plot_delta_rsim` Fig. 7's (several models' RSIM per layer,
and each one's difference from a baseline's).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign import ops


def _block_moments(xn: jax.Array, yn: jax.Array, valid: jax.Array, center: jax.Array, block: int) -> jax.Array:
  """[6] sums (w, a, b, aa, bb, ab) of the centred cosines over the valid pairs i < j, by row blocks."""
  s = xn.shape[0]
  cols = jnp.arange(s)

  def body(i, acc):
    start = i * block
    rows = start + jnp.arange(block)
    cx = jax.lax.dynamic_slice_in_dim(xn, start, block) @ xn.T - center[0]  # [block, s]
    cy = jax.lax.dynamic_slice_in_dim(yn, start, block) @ yn.T - center[1]
    row_valid = jax.lax.dynamic_slice_in_dim(valid, start, block)
    w = ((rows[:, None] < cols[None, :]) & row_valid[:, None] & valid[None, :]).astype(jnp.float32)
    wa, wb = w * cx, w * cy
    return acc + jnp.stack([w.sum(), wa.sum(), wb.sum(), (wa * cx).sum(), (wb * cy).sum(), (wa * cy).sum()])

  return jax.lax.fori_loop(0, s // block, body, jnp.zeros((6,), jnp.float32))


@functools.partial(jax.jit, static_argnames=("block",))
def rsim(x: jax.Array, y: jax.Array, mask: jax.Array | None = None, *, block: int = 512) -> jax.Array:
  """Relational similarity of s translation pairs.

  Args:
    x: [s, e] source-side vectors of the pairs.
    y: [s, f] target-side vectors (f may differ from e).
    mask: bool [s]; False rows take no part (padding).
    block: rows of the cosine matrices per step.

  Returns:
    float32 scalar Pearson correlation; NaN with fewer than 2 valid pairs or a
    constant cosine vector.
  """
  s = x.shape[0]
  valid = jnp.ones((s,), bool) if mask is None else jnp.asarray(mask, bool)
  block = max(1, min(block, s))
  padded = -(-s // block) * block
  pad = ((0, padded - s), (0, 0))
  xn = jnp.pad(ops.l2_normalize(x.astype(jnp.float32)), pad)
  yn = jnp.pad(ops.l2_normalize(y.astype(jnp.float32)), pad)
  valid = jnp.pad(valid, (0, padded - s))
  first = _block_moments(xn, yn, valid, jnp.zeros((2,), jnp.float32), block)
  n = jnp.maximum(first[0], 1.0)
  center = first[1:3] / n
  m = _block_moments(xn, yn, valid, center, block)
  # Centred at the means, so the corrections below are tiny (rounding only).
  sab = m[5] - m[1] * m[2] / n
  saa = m[3] - m[1] * m[1] / n
  sbb = m[4] - m[2] * m[2] / n
  return jnp.where(first[0] >= 1, sab / jnp.sqrt(saa * sbb), jnp.nan)


@jax.jit
def mean_pair_cosine(x: jax.Array, y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Mean cos(x_i, y_i) over the valid pairs: float32 scalar (NaN when none); x [s, e], y [s, e]."""
  valid = jnp.ones((x.shape[0],), bool) if mask is None else jnp.asarray(mask, bool)
  cos = jnp.sum(ops.l2_normalize(x.astype(jnp.float32)) * ops.l2_normalize(y.astype(jnp.float32)), axis=-1)
  count = valid.sum()
  return jnp.where(count > 0, jnp.sum(jnp.where(valid, cos, 0.0)) / jnp.maximum(count, 1), jnp.nan)


# ------------------------------------------------------------ plots


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _finish(plt: Any, fig: Any, axes: Sequence[Any], layers: Sequence[int], path: str, title: str | None) -> str:
  """Layer ticks and grids on `axes`, the title, then the PNG written atomically; returns `path`."""
  from flax_xalign.fileio import save_figure

  for ax in axes:
    ax.set_xticks(layers)
    ax.grid(alpha=0.3)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  save_figure(fig, path)
  plt.close(fig)
  return path


def plot_layers(per_layer: Mapping[str, Sequence[float]], path: str, *, title: str | None = None) -> str:
  """Fig. 3's shape: (a) Hit@1 and mean translation-pair cosine vs layer, (b) RSIM vs layer.

  Args:
    per_layer: `layers` (ints), `mean_cosine`, `rsim`, and Hit@1 curves under
      `hit@1` or `hit@1_<method>` keys (each a list over `layers`).
    path: PNG to write (atomically).
    title: figure title.

  Returns:
    `path`.
  """
  plt = _pyplot()
  layers = list(per_layer["layers"])
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  hit_keys = [k for k in per_layer if k.startswith("hit@1")]
  for key in hit_keys:
    left.plot(layers, [100 * v for v in per_layer[key]], marker="o", label=key.replace("_", " "))
  left.set_xlabel("layer")
  left.set_ylabel("Hit@1 (%)")
  cosine = left.twinx()
  cosine.plot(layers, per_layer["mean_cosine"], color="tab:red", marker="s", linestyle="--",
              label="mean cosine of pairs")
  cosine.set_ylabel("mean cosine of translation pairs")
  handles = left.get_legend_handles_labels()[0] + cosine.get_legend_handles_labels()[0]
  left.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="best")
  left.set_title("(a) alignment accuracy and pair cosine")
  right.plot(layers, per_layer["rsim"], marker="o", color="tab:green")
  right.set_xlabel("layer")
  right.set_ylabel("RSIM")
  right.set_title("(b) RSIM")
  return _finish(plt, fig, (left, right), layers, path, title)


def delta_rsim(rsims: Mapping[str, Sequence[float]], baseline: str) -> dict[str, np.ndarray]:
  """{model: its RSIM per layer minus the baseline's} for every model but the baseline."""
  if baseline not in rsims:
    raise ValueError(f"baseline {baseline!r} is not one of {sorted(rsims)}")
  base = np.asarray(rsims[baseline], np.float64)
  out = {}
  for label, values in rsims.items():
    values = np.asarray(values, np.float64)
    if values.shape != base.shape:
      raise ValueError(f"{label!r} has {values.shape[0]} layers, the baseline {base.shape[0]}")
    if label != baseline:
      out[label] = values - base
  return out


def plot_delta_rsim(rsims: Mapping[str, Sequence[float]], baseline: str, path: str, *,
                    layers: Sequence[int] | None = None, title: str | None = None) -> str:
  """Fig. 7's shape: (a) every model's RSIM per layer (baseline dashed), (b) ΔRSIM = model - baseline.

  Args:
    rsims: {model label: RSIM per layer}, all of one length.
    baseline: the label to subtract (e.g. "MLM").
    path: PNG to write (atomically).
    layers: the layer numbers (default 0..n-1).
    title: figure title.
  """
  deltas = delta_rsim(rsims, baseline)
  plt = _pyplot()
  layers = list(range(len(rsims[baseline]))) if layers is None else list(layers)
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
  for label, values in rsims.items():
    left.plot(layers, values, marker="o", linestyle="--" if label == baseline else "-", label=label)
  left.set_ylabel("RSIM")
  left.set_title("(a) RSIM per layer")
  for label, values in deltas.items():
    right.plot(layers, values, marker="o", label=f"{label} - {baseline}")
  right.axhline(0.0, color="black", linewidth=0.8)
  right.set_ylabel("ΔRSIM")
  right.set_title(f"(b) ΔRSIM against {baseline}")
  for ax in (left, right):
    ax.set_xlabel("layer")
    ax.legend(fontsize=8)
  return _finish(plt, fig, (left, right), layers, path, title)
