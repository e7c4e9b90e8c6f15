"""The MLM-GC miniature's driver: its table, training-time fallback and argument errors (runs are its command)."""

import json

from flax_xalign.experiments import harness, mlm_gc


def _row(objective, mean, shuffled, pos=None):
  return {"setting": "trans", "objective": objective, "seconds": 90.0, "pairs": 1420,
          "muse_cosine": {"mean": mean, "shuffled_mean": shuffled}, "analogy": {"accuracy": 0.0125},
          "nn": {"hit@1": 0.015}, "csls": {"hit@1": 0.026}, "pos": pos, "mlm_accuracy": 0.101}


def test_table_has_one_row_per_model():
  table = mlm_gc.format_table([_row("mlm", 0.2793, 0.133), _row("gc", 0.26, 0.108, {"sup": 0.86, "zs": 0.382,
                                                                                      "delta": 0.478})])
  lines = table.splitlines()
  assert len(lines) == 4
  assert lines[2] == "| trans | MLM | 0.279 | 0.133 | 1.2 | 1.5 | 2.6 | 1,420 | – | – | – | 10.1 | 1.5 |"
  assert "| MLM-GC (Eq. 3) |" in lines[3] and "| 86.0 | 38.2 | 47.8 |" in lines[3]


def test_missing_measurements_show_as_dashes():
  row = {"setting": "natural", "objective": "gc_output", "seconds": 0.0, "pairs": None}
  assert mlm_gc.format_table([row]).splitlines()[2].count("–") == 10


def test_training_time_falls_back_to_the_logged_step_rates(tmp_path):
  lines = [{"step": 100, "steps_per_sec": 4.0}, {"step": 100, "eval_loss": 1.0},
           {"step": 300, "steps_per_sec": 2.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  assert harness.logged_train_seconds(str(tmp_path)) == 100 / 4.0 + 200 / 2.0
  assert harness.logged_train_seconds(str(tmp_path / "absent")) is None
