"""An objective reading given word links of a task that has none is refused, whatever the spelling (issue 47).

The 2026-11-27 probe trained SO with `label_source='links'` on `bible_grc_en_tlm` at loss 0.0000 (exit 0):
the gin spelling `--gin.train.objective_options="{'so': @SoConfig()}" --gin.SoConfig.label_source="'links'"`
resolves to the SoConfig the run trains with, and the links check gave the Bible's loader (which never
gives links, unlike a TsvBitextTask with `links`) the benefit of the doubt. The Bible tasks are registered
here under the tiny corpus's vocabulary (`BibleTasks`: the same loaders as `bible_grc_en_tlm`), so no
8,000-piece vocabulary is trained; the refusal comes before MODEL_DIR exists.
"""

from __future__ import annotations

import pytest

from tests.hardening import harness
from tests.testlib import tiny_encoder_gin

pytestmark = pytest.mark.contract  # C1 checks, in-process: refused at assembly, nothing trains.

PREFIX = "h47_bible"


def _bible_gin(path, vocab: str) -> str:
  path.write_text(f"""
include 'runs/pretrain.gin'
{tiny_encoder_gin()}
train.user_tasks = [@BibleTasks()]
BibleTasks.prefix = '{PREFIX}'
BibleTasks.vocabulary_path = '{vocab}'
MIXTURE_OR_TASK_NAME = '{PREFIX}_grc_en_tlm'
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
CHECKPOINT_EVERY = 2
EVAL_EVERY = 0
""")
  return str(path)


CASES = [
    ("so_links_the_gin_way", ["--gin.train.objectives={'so': 1.0}", "--gin.train.objective_options={'so': @SoConfig()}",
                              "--gin.SoConfig.label_source='links'"], "SoConfig.label_source"),
    ("so_union_the_gin_way", ["--gin.train.objectives={'mlm': 1.0, 'so': 1.0}",
                              "--gin.train.objective_options={'so': @SoConfig()}",
                              "--gin.SoConfig.label_source='union'"], "SoConfig.label_source"),
    ("dwa_links_the_gin_way", ["--gin.train.objectives={'mlm': 1.0, 'dwa': 1.0}",
                               "--gin.train.objective_options={'dwa': @DwaConfig()}",
                               "--gin.DwaConfig.label_source='links'"], "DwaConfig.label_source"),
]


@pytest.mark.parametrize("case_id, flags, setting", CASES, ids=[c[0] for c in CASES])
def test_links_objective_on_the_bible_without_links_is_refused(case_id, flags, setting, tiny_corpus, tmp_path, capfd):
  del case_id
  model_dir = tmp_path / "new_run"
  gin_file = _bible_gin(tmp_path / "bible.gin", tiny_corpus["vocab"])
  outcome = harness.run_main(capfd, "train", harness.train_argv(gin_file, model_dir, "--gin.TRAIN_STEPS=2", *flags))
  harness.assert_user_error(outcome, setting, f"{PREFIX}_grc_en_tlm", "loss 0", model_dir=model_dir, before=None)
  assert "step 1" not in outcome.out, "a step was trained before the refusal"
