"""Constants and a comparison shared by the offline-suite tests (their fixtures: conftest.py beside it)."""

import pytest

GOLD = {"dev": "haus house\nsieht sees\nläuft runs\ngrün green\ndas the\n",
        "test": "fluss river\nhund dog\nneu new\nrot red\nbaum tree\nkatze cat\nalt old\nklein small\nxyzzy house\n"}
SIZES = dict(eval_sentences=12, retrieval_pairs=9, mlm_batches=2, mlm_batch_size=4, baseline_batches=2, bible_pairs=5)
TASK = "hz_mix"
MIN_COUNT = 5


def close(a, b, path="result"):
  """Recursive equality, floats to 1e-6 (the same arrays through the same kernels)."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
    for key in a:
      close(a[key], b[key], f"{path}.{key}")
  elif isinstance(a, (list, tuple)):
    assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
    for i, (x, y) in enumerate(zip(a, b)):
      close(x, y, f"{path}[{i}]")
  elif isinstance(a, float) or isinstance(b, float):
    assert a == pytest.approx(b, abs=1e-6, nan_ok=True), f"{path}: {a} != {b}"  # RSIM of < 3 pairs is NaN.
  else:
    assert a == b, f"{path}: {a!r} != {b!r}"


def assert_filled(result):
  """Every metric family of `score`, with the fields the e5 Debian and word-alignment reports read, no None."""
  assert set(result["metrics"]) == {"bli", "retrieval", "mlm", "word_alignment"}

  def walk(value, path):
    assert value is not None, f"{path} is None"
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list)
                      else ()):
      walk(item, f"{path}.{key}")

  walk(result, "result")
  for split in ("dev", "test"):
    row = result["bli"]["de"][split]
    assert {"hit@1", "hit@5"} <= set(row["nn"]) and {"hit@1", "hit@5"} <= set(row["csls"])
    assert {"mean", "shuffled_mean"} <= set(row["muse_cosine"])
    assert {"rsim", "hit@1_nn", "hit@1_csls"} <= set(row["per_layer"])
  assert {"cosine", "csls"} == set(result["retrieval"]["de"]["best"])
  assert 0 <= result["mlm"]["overall"]["accuracy"] <= 1
  for row in result["word_alignment"]["test"]["by_method"].values():
    assert {"layer", "aer", "precision", "recall"} <= set(row)
