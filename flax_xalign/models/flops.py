"""FLOP and parameter counts of the encoder, for tokens/s and MFU logging.

Derivation (matmul FLOPs only; LayerNorm, GELU, softmax, biases and embedding
gathers are a few percent at these sizes and are left out, as is customary).

Notation: B batch, T length, p masked predictions per example, e embed_dim,
a = heads * head_dim, m mlp_dim, V vocab_size, L num_layers.

A matmul with an [n, k] x [k, f] product costs 2·n·k·f FLOPs forward. Its
backward needs two products of the same size (gradient w.r.t. the input and
w.r.t. the weight), so forward + backward = 3 x forward, i.e. 6 FLOPs per
weight per token (the "6·N" rule).

Per layer, the weights are q, k, v, out (4·e·a) and the MLP (2·e·m):
    weights:    6 · B·T · (4·e·a + 2·e·m)
Attention is bidirectional over all T keys of a row (packing does not skip any
work): QK^T and probs·V are each 2·T·a FLOPs per query token forward:
    attention:  3 · 2 · (2·T·a) · B·T = 12 · B · T² · a
The MLM head runs only on the B·p gathered positions: the transform dense (e·e)
and the tied vocabulary projection (e·V, whose gradient lands on the shared
embedding table):
    head:       6 · B·p · (e² + e·V)
Total per step = L · (weights + attention) + head.

The embedding tables (tokens, positions, languages, BERT's token types) are
gathers, not matmuls, so they add no FLOPs here; their rows do count in
`count_params`, which sums the leaves of the actual tree.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from flax_xalign.models.config import EncoderConfig


def _vocab_size(config: EncoderConfig) -> int:
  if config.vocab_size is None:
    raise ValueError(
        "EncoderConfig.vocab_size is None; FLOP counts need the vocabulary "
        "size, e.g. config.replace(vocab_size=...).")
  return config.vocab_size


def forward_flops_per_step(config: EncoderConfig, *, batch: int, length: int,
                           num_predictions: int) -> float:
  """Matmul FLOPs of one forward pass (encoder + MLM head), see module doc.

  Args:
    config: the encoder config (vocab_size set).
    batch: examples (rows) per step, over all devices.
    length: tokens per row.
    num_predictions: MLM predictions per row (the `p` of `[batch, p]`).
  """
  e, a, m = config.embed_dim, config.attention_dim, config.mlp_dim
  tokens = batch * length
  per_layer = 2 * tokens * (4 * e * a + 2 * e * m) + 4 * batch * length**2 * a
  head = 2 * batch * num_predictions * (e * e + e * _vocab_size(config))
  return float(config.num_layers * per_layer + head)


def train_flops_per_step(config: EncoderConfig, *, batch: int, length: int,
                         num_predictions: int) -> float:
  """Matmul FLOPs of one training step (forward + backward = 3 x forward).

  Equals L·(6·B·T·(4·e·a + 2·e·m) + 12·B·T²·a) + 6·B·p·(e² + e·V).
  Rematerialisation re-runs forward work that this count leaves out on
  purpose: MFU measures useful FLOPs.
  """
  return 3.0 * forward_flops_per_step(
      config, batch=batch, length=length, num_predictions=num_predictions)


def mfu(flops_per_sec: float, peak_flops: float) -> float:
  """Model FLOP utilisation: achieved / peak FLOP/s over the same devices.

  Raises:
    ValueError: if peak_flops is not positive.
  """
  if not peak_flops > 0:
    raise ValueError(f"peak_flops must be > 0, got {peak_flops!r}.")
  return flops_per_sec / peak_flops


# Dense bf16 peak FLOP/s of one JAX device, keyed by a prefix of
# `jax.Device.device_kind`. A TPU v3 JAX device is one core (half a chip); from
# v4 on a device is a whole (megacore) chip. H100/H200 are the SXM figures.
_PEAK_BF16_FLOPS = (
    ("TPU v3", 61.5e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5e", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),
    ("TPU v6 lite", 918e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA H100", 989e12),
    ("NVIDIA A100", 312e12),
)


def peak_flops_per_device(device: jax.Device | str) -> float | None:
  """Dense bf16 peak FLOP/s of one device, or None when unknown (e.g. CPU)."""
  kind = device if isinstance(device, str) else device.device_kind
  for prefix, peak in _PEAK_BF16_FLOPS:
    if kind.startswith(prefix):
      return peak
  return None


def count_params(params: Any) -> int:
  """Number of scalars in a (possibly `nn.LogicallyPartitioned`-boxed) tree.

  Works on arrays and on `jax.ShapeDtypeStruct`s from `jax.eval_shape`.
  """
  leaves = jax.tree.leaves(nn.unbox(params))
  return int(sum(int(np.prod(leaf.shape)) for leaf in leaves))
