"""`xalign assets` in-process (the contract tier): the explicit asset build of the shared run's
flags (tests/shared_run.py) gives the assets its training recorded, and bad input is one `error:` line. The
refusal matrix (train's flags) is in tests/hardening/test_eval_align_assets_inputs.py."""

import os

import pytest

from flax_xalign.runs.checkpoints import read_run_spec
from tests.hardening import harness

pytestmark = pytest.mark.contract


def test_assets_of_the_shared_runs_flags_match_what_training_recorded(shared_run, tmp_path, capfd):
  model_dir = tmp_path / "assets_only"
  outcome = harness.run_main(capfd, "assets", harness.train_argv(shared_run["gin"], model_dir))
  assert outcome.code == 0, harness.summary(outcome)
  _, _, recorded = read_run_spec(str(shared_run["dir"]))
  assert recorded, "the shared run records no asset"
  for name, fingerprint in recorded.items():
    assert f"  {name}: version {fingerprint.get('version')}, sha256 {str(fingerprint.get('sha256'))[:16]}" \
        in outcome.out, (name, outcome.out[-2000:])
  written = sorted(os.listdir(model_dir))
  assert "checkpoints" not in written and "config.gin" not in written, written  # Nothing but assets.


def test_assets_into_a_run_of_another_model_is_refused(shared_run, shared_run_copy, capfd):
  before = harness.tree_digest(shared_run_copy)
  outcome = harness.run_main(capfd, "assets", harness.train_argv(shared_run["gin"], shared_run_copy,
                                                                 "--gin.EncoderConfig.mlp_dim=48"))
  harness.assert_user_error(outcome, "mlp_dim", model_dir=shared_run_copy, before=before)
