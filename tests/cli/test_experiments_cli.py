"""The experiment drivers (`xalign {align_mlm_grid,code_switch,mlm_gc}`)
in-process (the contract tier): a bad setting, objective or transform is one `error:` line, before
MODEL_DIR is made. Their tables are tested in tests/experiments/; their smoke runs train models (the
ALIGN-MLM grid's tiny end-to-end run is in the slow tier; code_switch and mlm_gc have none: their runs
are `train` runs, which the train contract covers)."""

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.mark.parametrize("entry, flags, keywords", [
    ("align_mlm_grid", ["--objectives=mlm,bert"], ("unknown objectives ['bert']",)),
    ("align_mlm_grid", ["--transforms=inv"], ("no transliteration",)),
    ("align_mlm_grid", ["--steps=many"], ("--steps", "many")),
    ("code_switch", ["--settings=synthetic,moon"], ("--settings='synthetic,moon'",
                                                    "synthetic, bible, debian, natural")),
    ("code_switch", ["--objectives=mlm,gc_output"], ("choose from mlm, tcs, scs, gc, tcs_gold",)),
    ("code_switch", ["--settings=synthetic", "--objectives=mlm,gc"], ("debian setting only", "mlm_gc")),
    ("code_switch", ["--settings=bible", "--objectives=mlm,tcs_gold"], ("true token map", "synthetic")),
    ("code_switch", ["--settings=natural", "--seeds=0"], ("--seeds=0 must be at least 1",)),
    ("code_switch", ["--settings=debian", "--debian_data=/nonexistent"], ("No Debian help data",
                                                                          "xalign debian_data")),
    ("mlm_gc", ["--settings=trans,moon"], ("choose from trans, trans_inv, natural, debian",)),
    ("mlm_gc", ["--objectives=mlm,tcs"], ("choose from mlm, gc, gc_output",)),
    ("mlm_gc", ["--settings=debian", "--debian_steps=0"], ("--debian_steps=0 must be at least 1",)),
], ids=["grid_unknown_objective", "grid_transform_without_transliteration", "grid_steps_not_a_number",
        "code_switch_unknown_setting", "code_switch_unknown_objective", "code_switch_gc_outside_debian", "code_switch_gold_outside_synthetic",
        "code_switch_no_seeds", "code_switch_no_debian_build", "mlm_gc_unknown_setting",
        "mlm_gc_unknown_objective", "mlm_gc_no_steps"])
def test_refuses_bad_flags_before_making_model_dir(entry, flags, keywords, tmp_path, capfd):
  model_dir = tmp_path / "runs"
  outcome = harness.run_main(capfd, entry, [f"--model_dir={model_dir}", *flags])
  harness.assert_user_error(outcome, *keywords)
  assert not model_dir.exists()
