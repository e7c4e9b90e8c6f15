"""The experiment drivers (`python -m flax_xalign.experiments.{align_mlm_grid,code_switch,mlm_gc}`)
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
    ("code_switch", ["--settings=synthetic,moon"], ("--settings='synthetic,moon'", "synthetic, natural")),
    ("code_switch", ["--objectives=mlm,gc"], ("choose from mlm, tcs, scs",)),
    ("mlm_gc", ["--settings=trans,moon"], ("choose from trans, trans_inv, natural",)),
    ("mlm_gc", ["--objectives=mlm,tcs"], ("choose from mlm, gc, gc_output",)),
], ids=["grid_unknown_objective", "grid_transform_without_transliteration", "grid_steps_not_a_number",
        "code_switch_unknown_setting", "code_switch_unknown_objective", "mlm_gc_unknown_setting",
        "mlm_gc_unknown_objective"])
def test_refuses_bad_flags_before_making_model_dir(entry, flags, keywords, tmp_path, capfd):
  model_dir = tmp_path / "runs"
  outcome = harness.run_main(capfd, entry, [f"--model_dir={model_dir}", *flags])
  harness.assert_user_error(outcome, *keywords)
  assert not model_dir.exists()
