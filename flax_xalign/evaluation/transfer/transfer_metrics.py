"""Fine-tuning loss and transfer scores: weighted cross-entropy, macro F1, BIO entity F1.

The loss is a jittable function of arrays; the scores are host-side NumPy /
Python over gold and predicted labels. Entity F1 is conlleval's (exact spans,
its chunking rules, as seqeval's default mode applies them), so NER numbers
are comparable with the papers'.
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


# conlleval's chunk boundaries, as (previous tag, tag) prefix pairs; a change of entity type ends the
# previous chunk and starts one as well (see `bio_spans`). "." is conlleval's sentence-boundary tag.
_ENDS_AFTER = {("E", t) for t in "BIESO."} | {("S", t) for t in "BIESO."} | {
    (p, t) for p in "BI" for t in "BSO"}
_STARTS_AT = {(p, t) for p in "BIESO." for t in "BS"} | {(p, t) for p in "ESO" for t in "EI"}


def _prefix_and_type(tag: str) -> tuple[str, str]:
  """("B", "PER") for "B-PER"; the type is what follows the first dash ("MISC-X" in "B-MISC-X")."""
  prefix, _, kind = str(tag).partition("-")
  return prefix[:1], kind or "_"


def bio_spans(tags: Sequence[str]) -> set[tuple[str, int, int]]:
  """Entity spans `(type, start, end)` (end exclusive) of a BIO (or IOBES) tag sequence.

  conlleval's chunking: an entity starts at `B-X` (or `S-X`), or at `I-X` / `E-X` that does not continue
  an `X` entity (IOB1 reading); it ends before `O`, `B-`, `S-` or a tag of another type, and after `E-`
  or `S-`. seqeval's default (conlleval-compatible) mode reads sequences the same way; the tests check
  hand-worked cases, and this code no longer imports seqeval, whose scikit-learn (which Keras then
  imports on every TensorFlow import) cost every process that reads a dataset about a second.
  """
  spans, begin = set(), 0
  previous, previous_kind = "O", ""
  for i, tag in enumerate([*tags, "O"]):  # A closing "O" ends an entity that ends the sentence.
    prefix, kind = _prefix_and_type(tag)
    type_change = kind != previous_kind
    if (previous, prefix) in _ENDS_AFTER or (previous not in ("O", ".") and type_change):
      spans.add((previous_kind, begin, i))
    if (previous, prefix) in _STARTS_AT or (prefix not in ("O", ".") and type_change):
      begin = i
    previous, previous_kind = prefix, kind
  return spans


def span_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
            ) -> dict[str, float]:
  """Micro entity precision, recall and F1 over sentences of BIO tags (exact spans).

  The conlleval numbers papers report (seqeval's micro scores in its default
  mode); 0 where a ratio has nothing to divide by (no entity predicted or none
  in gold).

  Raises:
    ValueError: `gold` and `predicted` differ in the number of sentences or
      in the length of a sentence.
  """
  if len(gold) != len(predicted):
    raise ValueError(f"span_f1: {len(gold)} gold sentences but {len(predicted)} predicted.")
  true = found = correct = 0
  for n, (g, p) in enumerate(zip(gold, predicted)):
    if len(g) != len(p):
      raise ValueError(f"span_f1: sentence {n} has {len(g)} gold tags but {len(p)} predicted.")
    g_spans, p_spans = bio_spans(list(g)), bio_spans(list(p))
    true, found, correct = true + len(g_spans), found + len(p_spans), correct + len(g_spans & p_spans)
  precision = correct / found if found else 0.0
  recall = correct / true if true else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": float(precision), "recall": float(recall), "f1": float(f1)}


def default_metric(task: str, label_set: Sequence[str]) -> str:
  """The paper's headline metric: entity F1 for NER, accuracy for POS and sentences."""
  return "entity_f1" if task == "tagging" and is_bio(label_set) else "accuracy"
