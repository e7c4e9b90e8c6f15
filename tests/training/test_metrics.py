"""metrics.jsonl on resume: later steps dropped, a torn line (a run killed mid-write) dropped with a warning."""

import json

from flax_xalign.training.metrics import MetricsLogger


def test_resume_drops_later_steps_and_a_torn_last_line(tmp_path, capsys):
  rows = [{"step": s, "loss": 1.0 / s} for s in (2, 4, 6)]
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "lo')
  logger = MetricsLogger(str(tmp_path), resume_step=4, total_steps=10)
  logger.close()
  assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:2]
  err = capsys.readouterr().err
  assert err.startswith("warning: dropped 1 unreadable line(s)") and "line 4" in err and err.count("\n") == 1


def test_a_torn_line_that_is_not_the_last_and_no_final_newline(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 2}\n{"st\n\n{"step": 4}')  # Two writers interleaved, then a cut before the newline.
  logger = MetricsLogger(str(tmp_path), resume_step=4)
  logger.write(6, {"loss": 0.5})
  logger.close()
  assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4, 6]
  assert "line 2" in capsys.readouterr().err
