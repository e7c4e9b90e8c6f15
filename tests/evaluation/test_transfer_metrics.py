"""Fine-tuning loss and transfer scores, checked by hand."""

import numpy as np
import pytest

from flax_xalign.evaluation.transfer import transfer_data
from flax_xalign.evaluation.transfer import transfer_metrics
def test_bio_span_f1_by_hand():
  assert transfer_metrics.bio_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {
      ("PER", 0, 2), ("LOC", 3, 4)}
  # I- without a matching entity before it starts one (conlleval).
  assert transfer_metrics.bio_spans(["I-ORG", "I-ORG", "B-ORG", "I-PER"]) == {
      ("ORG", 0, 2), ("ORG", 2, 3), ("PER", 3, 4)}
  assert transfer_metrics.bio_spans(["O", "O"]) == set()
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-PER"]]
  # gold spans 3, predicted 4, correct 2 (LOC 3:4, ORG 0:1).
  scores = transfer_metrics.span_f1(gold, predicted)
  assert scores["precision"] == pytest.approx(2 / 4)
  assert scores["recall"] == pytest.approx(2 / 3)
  assert scores["f1"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
  assert transfer_metrics.span_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0,
                                                        "f1": 0.0}
  assert transfer_data.is_bio(["O", "B-PER", "I-PER"]) and not transfer_data.is_bio(["noun", "verb"])


@pytest.mark.parametrize("tags, spans", [
    # I- after O opens an entity (IOB1), as conlleval reads it.
    (["O", "I-PER", "I-PER", "O"], {("PER", 1, 3)}),
    # A change of type closes the entity and opens another, B- or not.
    (["B-PER", "I-LOC", "I-LOC"], {("PER", 0, 1), ("LOC", 1, 3)}),
    (["I-PER", "I-LOC", "B-LOC"], {("PER", 0, 1), ("LOC", 1, 2), ("LOC", 2, 3)}),
    # B- after an entity of the same type starts a new one; an entity may end the sentence.
    (["B-ORG", "B-ORG", "I-ORG"], {("ORG", 0, 1), ("ORG", 1, 3)}),
    # A type may contain a dash.
    (["B-MISC-X", "I-MISC-X", "O"], {("MISC-X", 0, 2)}),
    ([], set()),
])
def test_bio_spans_tricky_sequences_by_hand(tags, spans):
  assert transfer_metrics.bio_spans(tags) == spans


def test_span_f1_tricky_sentences_by_hand():
  gold = [["O", "I-PER", "I-PER", "O"], ["B-PER", "I-LOC", "I-LOC"], []]
  predicted = [["B-PER", "I-PER", "I-LOC", "O"], ["B-PER", "B-LOC", "I-LOC"], []]
  # gold: PER 1:3 | PER 0:1, LOC 1:3 -> 3 spans.
  # predicted: PER 0:2, LOC 2:3 | PER 0:1, LOC 1:3 -> 4 spans, 2 of them in gold.
  expected = {"precision": 2 / 4, "recall": 2 / 3, "f1": 2 * (2 / 4) * (2 / 3) / (2 / 4 + 2 / 3)}
  assert transfer_metrics.span_f1(gold, predicted) == pytest.approx(expected, rel=1e-15)
  # NumPy string arrays (what finetune.evaluate passes) score the same, as Python floats.
  as_arrays = transfer_metrics.span_f1([np.asarray(s, str) for s in gold],
                                       [np.asarray(s, str) for s in predicted])
  assert as_arrays == transfer_metrics.span_f1(gold, predicted)
  assert all(type(v) is float for v in as_arrays.values())
  # Nothing predicted: precision 0, not a division error; nothing at all: zeros.
  assert transfer_metrics.span_f1([["B-PER"]], [["O"]]) == {"precision": 0.0, "recall": 0.0,
                                                            "f1": 0.0}
  assert transfer_metrics.span_f1([], []) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
  with pytest.raises(ValueError):
    transfer_metrics.span_f1([["O"]], [["O"], ["O"]])


def test_macro_f1():
  gold, predicted = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])
  # class 0: p 1, r 1/2 -> 2/3; class 1: p 2/3, r 1 -> 4/5.
  assert transfer_metrics.macro_f1(gold, predicted) == pytest.approx((2 / 3 + 4 / 5) / 2)
  assert transfer_metrics.macro_f1(np.array([], int), np.array([], int)) == 0.0


def test_weighted_cross_entropy_by_hand():
  logits = np.array([[[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [5.0, 5.0, 5.0]]], np.float32)
  labels = np.array([[0, 2, 1]], np.int32)
  weights = np.array([[1.0, 1.0, 0.0]], np.float32)  # The last slot is padding.
  nll = [np.log(np.exp(row).sum()) - row[label]
         for row, label in zip(logits[0, :2].astype(np.float64), labels[0, :2])]
  loss, metrics = transfer_metrics.weighted_cross_entropy(logits, labels, weights)
  assert float(loss) == pytest.approx(np.mean(nll), rel=1e-6)
  assert float(metrics["loss"]) == float(loss)
  assert float(metrics["accuracy"]) == pytest.approx(0.5)  # Right on slot 0, wrong on slot 1.
  # No scored slot: the normaliser is 1, not 0.
  empty, _ = transfer_metrics.weighted_cross_entropy(logits, labels, np.zeros_like(weights))
  assert float(empty) == 0.0


def test_default_metric():
  assert transfer_metrics.default_metric("tagging", ("B-PER", "I-PER", "O")) == "entity_f1"
  assert transfer_metrics.default_metric("tagging", ("noun", "verb")) == "accuracy"
  assert transfer_metrics.default_metric("classification", ("no", "yes")) == "accuracy"
