"""MFU as the trainer logs it: the step's model FLOPs counted on its host batch, over the interval's time."""

import types

import numpy as np
import pytest

from tests.models.encoder_testlib import BASE_CONFIG
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.training import metrics as metrics_lib
from flax_xalign.training import pretrain as pretrain_lib


class _Clock:
  def __init__(self):
    self.now = 100.0

  def perf_counter(self):
    return self.now


def test_batch_train_flops_counts_real_tokens_segments_and_regular_ids():
  # PROJECT ids: 0 pad, 1 </s>, 3 <s>, regular from 5. Row 0 packs <s> a b </s> | <s> c </s> and 2
  # padding slots; row 1 is all padding. Tiny config (e 24, a 30, m 40, V 61, L 2): per real token
  # 6·N = 57,600, per attended key 720, per predicted slot 12,240 (tests/models/test_flops.py).
  tokens = np.array([[3, 9, 10, 1, 3, 11, 1, 0, 0], [0] * 9], np.int32)
  segment_ids = np.array([[1, 1, 1, 1, 2, 2, 2, 0, 0], [0] * 9], np.int32)
  assembly = types.SimpleNamespace(encoder=BASE_CONFIG, model=types.SimpleNamespace(specials=PROJECT),
                                   masking=types.SimpleNamespace(mask_rate=0.2))
  count = pretrain_lib.batch_train_flops(assembly)
  n, attended, predictions = 7, 4**2 + 3**2, 0.2 * 3  # Regular ids: 9, 10, 11.
  assert count({"tokens": tokens, "segment_ids": segment_ids}) == pytest.approx(
      57_600 * n + 720 * attended + 12_240 * predictions)


def test_throughput_mfu_is_model_flops_over_time_and_peak(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(metrics_lib, "time", clock)
  flops_of = {4: 1e12, 3: 3e12}  # A fake count: by the batch's real tokens.
  meter = metrics_lib.Throughput(step_flops=lambda b: flops_of[int((b["segment_ids"] > 0).sum())],
                                 peak_flops=2e12, num_devices=2)
  meter.add_batch({"segment_ids": np.array([[1, 1, 2, 2, 0]])})
  meter.add_batch({"segment_ids": np.array([[1, 1, 1, 0, 0]])})
  clock.now += 0.5
  summary = meter.summary()
  assert summary["tokens_per_sec"] == pytest.approx((4 + 3) / 0.5)
  assert summary["steps_per_sec"] == pytest.approx(4.0)
  assert summary["model_tflops_per_sec"] == pytest.approx(8.0)
  assert summary["mfu"] == pytest.approx(4e12 / 0.5 / 4e12)
  meter.reset()
  assert meter.summary() == {}


def test_throughput_with_a_fixed_count_and_no_peak(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr(metrics_lib, "time", clock)
  meter = metrics_lib.Throughput(step_flops=5e11, peak_flops=None, num_devices=1)
  meter.add_batch({"segment_ids": np.ones((2, 3), np.int32)})
  clock.now += 2.0
  summary = meter.summary()
  assert summary["model_tflops_per_sec"] == pytest.approx(0.25) and "mfu" not in summary
