"""OptimizerConfig.trainable of anything but parameter-path names: one line before MODEL_DIR (issue 47, T07).

The 2026-12-01 probe's `--gin.OptimizerConfig.trainable=[1]` ended in a 63-line traceback
(`'int' object has no attribute 'strip'`, deep in the optimiser's first use).
"""

from __future__ import annotations

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract  # C1 checks, in-process: refused when gin builds the config.

CASES = [("an_integer", "[1]"), ("none_inside", "['mlm_head', None]"), ("a_dict", "{'mlm_head': 1}"),
         ("none", "None"), ("an_empty_name", "['']")]


@pytest.mark.parametrize("value", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_trainable_of_other_values_is_one_line_before_model_dir(value, tiny_corpus, tmp_path, capfd):
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="h47o")
  model_dir = tmp_path / "new_run"
  outcome = harness.run_main(capfd, "train", harness.train_argv(
      gin_file, model_dir, "--gin.TRAIN_STEPS=2", f"--gin.OptimizerConfig.trainable={value}"))
  harness.assert_user_error(outcome, "OptimizerConfig.trainable", "['mlm_head']", model_dir=model_dir, before=None)
  assert len(harness.error_message(outcome.err).splitlines()) == 1, outcome.err
