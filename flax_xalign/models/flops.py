"""FLOP and parameter counts of the encoder, for tokens/s and MFU logging.

Two counts live here; only the first is MFU.

**Model FLOPs on real tokens** (`model_train_flops`, what `mfu` is logged
from): the standard convention of PaLM's appendix B and maxtext's
`calculate_tflops_training_per_device`, applied to the tokens a batch really
holds. Matmul FLOPs only (LayerNorm, GELU, softmax, biases and embedding
gathers are a few percent and are left out, as is customary); forward +
backward = 3 x forward, i.e. 6 FLOPs per weight per token that goes through
it. Notation: e embed_dim, a = heads · head_dim, m mlp_dim, V vocab_size,
L num_layers; for a batch, n its real (non-padding) tokens, A the sum over
real tokens of the number of keys each attends over, p its MLM-predicted
slots:

    weights:    6 · N · n          N = L · (4·e·a + 2·e·m)   (q, k, v, out, MLP)
    attention:  12 · L · a · A     (QK^T and probs·V, 2·a FLOPs per key each, x3)
    MLM head:   6 · (e² + e·V) · p (transform dense, tied vocabulary projection)

A packed row attends within its segments (`segment_ids`, 0 = padding), so a
token of a segment of length s attends over S = s keys and A = Σ_segments s²;
padding slots count zero everywhere. p is the expected number of predictions,
mask_rate x the eligible (regular, non-padding) tokens: the masking draws
floor(rate·n + u) per row, whose mean is rate·n. The embedding tables are
gathers, not matmuls; the vocabulary projection is counted only where a loss
reads it (the predicted slots), so a model that computes logits at every
position does the same model FLOPs and more hardware FLOPs.

**All-slot FLOPs** (`forward_flops_per_step`, `train_flops_per_step`): what
the compiled program's matmuls do on a [B, T] batch with `num_predictions`
gathered slots per row: every slot including padding, attention over the
whole T x T square (masking skips no work), the head on all p slots. This is
the count to compare with XLA's cost analysis (cli/compile_check) and the
count `mfu` was logged from before; it is not MFU:

    L · (6·B·T·(4·e·a + 2·e·m) + 12·B·T²·a) + 6·B·p·(e² + e·V)

`count_params` sums the leaves of the actual tree (embedding rows included).
"""

from __future__ import annotations

from typing import Any, NamedTuple

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


class TokenCounts(NamedTuple):
  """What the model-FLOP count needs of a batch, summed over it.

  Attributes:
    tokens: real (non-padding) tokens, n.
    attended: Σ over real tokens of the keys each attends over, A
      (= Σ over segments of length²).
    predictions: MLM-predicted slots, p (an expectation: may be fractional).
  """

  tokens: float
  attended: float
  predictions: float


def count_tokens(segment_ids: Any, *, mask_rate: float, eligible: Any = None) -> TokenCounts:
  """The `TokenCounts` of a host batch, with numpy (cheap: one bincount).

  Args:
    segment_ids: [batch, length] int, the packed example of each slot, 0 on
      padding; a query attends to the keys of its row with its segment id.
    mask_rate: the MLM masking rate (`MaskingConfig.mask_rate`).
    eligible: [batch, length] bool, the tokens masking may choose (regular
      ids); default every real token. Padding is never eligible.
  """
  segment_ids = np.asarray(segment_ids)
  if segment_ids.ndim != 2:
    raise ValueError(f"segment_ids must be [batch, length], got shape {segment_ids.shape}.")
  real = segment_ids > 0
  eligible = real if eligible is None else np.asarray(eligible, bool) & real
  ids = segment_ids.astype(np.int64)
  rows = np.arange(ids.shape[0], dtype=np.int64)[:, None] * (int(ids.max(initial=0)) + 1)
  lengths = np.bincount((rows + ids)[real])  # Slots per (row, segment); padding left out.
  return TokenCounts(tokens=float(real.sum()), attended=float(np.sum(lengths.astype(np.float64) ** 2)),
                     predictions=float(mask_rate * eligible.sum()))


def encoder_matmul_params(config: EncoderConfig) -> int:
  """N: the weights every token goes through, L · (4·e·a + 2·e·m) (no embeddings, biases or norms)."""
  e, a, m = config.embed_dim, config.attention_dim, config.mlp_dim
  return config.num_layers * (4 * e * a + 2 * e * m)


def mlm_head_matmul_params(config: EncoderConfig) -> int:
  """The weights a predicted slot goes through in the MLM head: e² + e·V."""
  e = config.embed_dim
  return e * e + e * _vocab_size(config)


def model_train_flops(config: EncoderConfig, counts: TokenCounts) -> float:
  """Model FLOPs of one training step on a batch (forward + backward), see the module doc.

  6·N·n + 12·L·a·A + 6·(e² + e·V)·p for `counts` = (n, A, p).
  Rematerialisation, padding and masked-out attention are work this count
  leaves out on purpose: MFU measures useful FLOPs.
  """
  return float(6 * encoder_matmul_params(config) * counts.tokens
               + 12 * config.num_layers * config.attention_dim * counts.attended
               + 6 * mlm_head_matmul_params(config) * counts.predictions)


def forward_flops_per_step(config: EncoderConfig, *, batch: int, length: int,
                           num_predictions: int) -> float:
  """All-slot matmul FLOPs of one forward pass (encoder + MLM head); not MFU's count.

  Args:
    config: the encoder config (vocab_size set).
    batch: examples (rows) per step, over all devices.
    length: slots per row.
    num_predictions: MLM prediction slots per row (the `p` of `[batch, p]`).
  """
  e, a, m = config.embed_dim, config.attention_dim, config.mlp_dim
  tokens = batch * length
  per_layer = 2 * tokens * (4 * e * a + 2 * e * m) + 4 * batch * length**2 * a
  head = 2 * batch * num_predictions * (e * e + e * _vocab_size(config))
  return float(config.num_layers * per_layer + head)


def train_flops_per_step(config: EncoderConfig, *, batch: int, length: int,
                         num_predictions: int) -> float:
  """All-slot matmul FLOPs of one training step (3 x forward); compare with XLA's count, not a peak.

  Equals L·(6·B·T·(4·e·a + 2·e·m) + 12·B·T²·a) + 6·B·p·(e² + e·V).
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
