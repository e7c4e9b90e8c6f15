"""The TCS/SCS miniature's driver: table, RSIM summary and argument errors (the runs are its own command)."""

import pytest

from flax_xalign.experiments import code_switch


def _row(objective, rsim, pos=None):
  return {"setting": "synthetic", "objective": objective, "nn": {"hit@1": 0.05, "hit@5": 0.125},
          "csls": {"hit@1": 0.1, "hit@5": 0.25}, "pairs": 1088, "rsim_top_half": rsim, "pos": pos,
          "mlm_accuracy": 0.117, "per_layer": {"layers": [0, 1, 2, 3, 4], "rsim": [0.9, 0.5, 0.4, 0.3, rsim]}}


def test_top_half_rsim_averages_layers_above_half_the_depth():
  curves = {"layers": [0, 1, 2, 3, 4], "rsim": [0.9, 0.5, 0.4, 0.3, 0.1]}
  assert code_switch.top_half_mean(curves) == pytest.approx((0.3 + 0.1) / 2)  # layers 3 and 4 of 4
  odd = {"layers": [0, 1, 2, 3], "rsim": [1.0, 0.6, 0.2, 0.4]}
  assert code_switch.top_half_mean(odd) == pytest.approx((0.2 + 0.4) / 2)  # layers 2 and 3 of 3 (> 1.5)


def test_table_has_one_row_per_model_in_percent():
  table = code_switch.format_table([_row("start", 0.33), _row("mlm", 0.35, {"sup": 0.462, "zs": 0.389,
                                                                                "delta": 0.073})])
  lines = table.splitlines()
  assert len(lines) == 4
  assert "| synthetic | starting model | 5.0 | 12.5 | 10.0 | 25.0 | 1,088 | 0.330 | – | – | – | 11.7 |" == lines[2]
  assert "| + MLM (baseline) |" in lines[3] and "| 46.2 | 38.9 | 7.3 |" in lines[3]
