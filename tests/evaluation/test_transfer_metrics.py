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
