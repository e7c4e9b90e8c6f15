"""Fine-tuning loss and transfer scores: weighted cross-entropy, macro F1, BIO entity F1.

The loss is a jittable function of arrays; the scores are host-side NumPy /
Python over gold and predicted labels (conlleval's exact-span F1 for NER).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.evaluation.transfer.transfer_data import is_bio


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean cross-entropy over weighted slots.

  Args:
    logits: [..., classes] float32.
    labels: [...] int class indices.
    weights: [...] float; 0 marks slots that are not scored.

  Returns:
    (loss, metrics): loss = sum(weights * nll) / max(sum(weights), 1);
    metrics hold `loss` and `accuracy` with the same normaliser.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  normaliser = jnp.maximum(weights.sum(), 1.0)
  loss = (nll * weights).sum() / normaliser
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": (correct * weights).sum() / normaliser}


def macro_f1(gold: np.ndarray, predicted: np.ndarray) -> float:
  """Unweighted mean F1 over the classes that occur in `gold` or `predicted` ([n] ints)."""
  classes = np.union1d(gold, predicted)
  if not classes.size:
    return 0.0
  scores = []
  for c in classes:
    tp = np.sum((gold == c) & (predicted == c))
    denominator = np.sum(gold == c) + np.sum(predicted == c)
    scores.append(2.0 * tp / denominator)
  return float(np.mean(scores))


def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """Entity spans `(type, start, end)` (end exclusive) of a BIO tag sequence.

  conlleval's chunking: an entity starts at `B-X`, or at `I-X` that does not
  continue an `X` entity; it ends before `O`, `B-`, or a tag of another type.
  """
  spans, kind, start = set(), None, 0
  for i, tag in enumerate([*tags, "O"]):
    prefix, _, entity = tag.partition("-") if tag != "O" else ("O", "", "")
    if kind is not None and (prefix != "I" or entity != kind):
      spans.add((kind, start, i))
      kind = None
    if prefix in ("B", "I") and kind is None:
      kind, start = entity, i
  return spans


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
            ) -> dict[str, float]:
  """Micro entity precision, recall and F1 over sentences of BIO tags (exact spans)."""
  tp = num_gold = num_predicted = 0
  for g, p in zip(gold, predicted, strict=True):
    gs, ps = bio_spans(g), bio_spans(p)
    tp += len(gs & ps)
    num_gold += len(gs)
    num_predicted += len(ps)
  precision = tp / num_predicted if num_predicted else 0.0
  recall = tp / num_gold if num_gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1}


def default_metric(task: str, label_set: Sequence[str]) -> str:
  """The paper's headline metric: entity F1 for NER, accuracy for POS and sentences."""
  return "entity_f1" if task == "tagging" and is_bio(label_set) else "accuracy"
