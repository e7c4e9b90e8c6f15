"""Fine-tuning loss and transfer scores: weighted cross-entropy, macro F1, BIO entity F1.

The loss is a jittable function of arrays; the scores are host-side NumPy /
Python over gold and predicted labels. Entity F1 is seqeval's (conlleval's
exact-span chunking), so NER numbers are comparable with the papers'.
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

  conlleval's chunking, as seqeval's default (conlleval-compatible) mode reads
  it: an entity starts at `B-X`, or at `I-X` that does not continue an `X`
  entity (IOB1); it ends before `O`, `B-`, or a tag of another type.
  """
  # Imported here: seqeval pulls in scikit-learn (about a second), which only
  # NER scoring needs, not every importer of the transfer package.
  from seqeval.metrics.sequence_labeling import get_entities
  # seqeval's ends are inclusive.
  return {(kind, start, end + 1) for kind, start, end in get_entities([str(t) for t in tags])}


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
            ) -> dict[str, float]:
  """Micro entity precision, recall and F1 over sentences of BIO tags (exact spans).

  seqeval's micro scores in its default mode, the conlleval numbers papers
  report; 0 where a ratio has nothing to divide by (no entity predicted or
  none in gold).

  Raises:
    ValueError: `gold` and `predicted` differ in the number of sentences or
      in the length of a sentence.
  """
  from seqeval.metrics.sequence_labeling import precision_recall_fscore_support
  # seqeval takes lists of str only; callers pass tuples and NumPy arrays.
  gold = [[str(t) for t in sentence] for sentence in gold]
  predicted = [[str(t) for t in sentence] for sentence in predicted]
  if len(gold) != len(predicted):
    raise ValueError(f"span_f1: {len(gold)} gold sentences but {len(predicted)} predicted.")
  if not gold:  # seqeval refuses an empty corpus; nothing was found, as with no entities.
    return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
  precision, recall, f1, _ = precision_recall_fscore_support(
      gold, predicted, average="micro", zero_division=0)
  return {"precision": float(precision), "recall": float(recall), "f1": float(f1)}


def default_metric(task: str, label_set: Sequence[str]) -> str:
  """The paper's headline metric: entity F1 for NER, accuracy for POS and sentences."""
  return "entity_f1" if task == "tagging" and is_bio(label_set) else "accuracy"
