"""`python -m flax_xalign.demo` (`make demo`) in-process: bad flags are one `error:` line (the contract tier);
the three stages end to end on the embedded Bible corpus, shortened, are the slow tier."""

import functools
import json

import pytest

from flax_xalign.cli import demo
from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.mark.parametrize("flags, keywords", [
    (["--start=nope"], ("--start", "nope")),
    (["--steps=abc"], ("--steps", "abc")),
    (["--steps=-1"], ("TRAIN_STEPS",)),
    (["--steps=0"], ("TRAIN_STEPS",)),  # Once silently ran demo.gin's 800 steps.
], ids=["unknown_start", "steps_not_a_number", "negative_steps", "zero_steps"])
def test_demo_refuses_bad_flags(flags, keywords, tmp_path, bible_data_dir, capfd):
  model_dir = tmp_path / "demo"
  outcome = harness.run_main(capfd, "demo", [f"--model_dir={model_dir}", *flags])
  harness.assert_user_error(outcome, *keywords)
  assert not (model_dir / "cold").exists()


@pytest.mark.slow  # Two short trainings, an evaluation and word alignment on the Bible: a minute of CPU.
def test_demo_runs_its_three_stages(tmp_path, bible_data_dir, monkeypatch, capsys):
  from flax_xalign import gin_cli

  # Shortened: 2 + 1 steps, 2 evaluation batches, 16 gold pairs, no eflomal peer (aligning every verse pair
  # of the New Testament; tests/evaluation cover it).
  run = gin_cli.run
  monkeypatch.setattr(gin_cli, "run", lambda argv, **kw: run([*argv, "--gin.evaluate.max_batches=2",
                                                               "--gin.evaluate.baseline_batches=2"], **kw))
  monkeypatch.setattr(demo, "aer_comparison", functools.partial(demo.aer_comparison, max_pairs=16))
  monkeypatch.setattr(demo, "statistical_peer", lambda: {})
  model_dir = tmp_path / "demo"
  assert demo.main([f"--model_dir={model_dir}", "--steps=2", "--align_steps=1"]) == 0
  out = capsys.readouterr().out
  for stage in ("demo 1/3", "demo 2/3", "demo 3/3", "Masked-token accuracy", "Word alignment"):
    assert stage in out, stage
  results = json.loads((model_dir / "aer.json").read_text())
  assert {"cold start", "XLM-Align"} <= set(results)
  assert (model_dir / "aer_layers.png").read_bytes().startswith(b"\x89PNG")
  for run in ("cold", "xlm_align"):
    assert (model_dir / run / "checkpoints").is_dir(), run
