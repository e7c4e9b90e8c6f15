"""Resuming a MODEL_DIR with settings that do not match its checkpoints (C6), and what resume must allow.

A mismatch is refused with C1's error naming each difference and the fix, before MODEL_DIR is touched
(config.gin included, C8). The session's trained MODEL_DIR (steps 2 and 4) is copied per case.
"""

from __future__ import annotations

import json
import random

import pytest

from flax_xalign.data.vocab import sentencepiece as vocab_lib
from tests import testlib
from tests.hardening import harness
from tests.hardening.conftest import TRAINED_TAG
from tests.shared_run import write_shared_run_gin

pytestmark = pytest.mark.contract  # C1 checks, in-process and cheap per case.

T = TRAINED_TAG
SECOND_MIXTURE = f"""
h_mix2/AlphaMixture.name = '{T}_mix2'
h_mix2/AlphaMixture.tasks = ['{T}_en', '{T}_de_en']
"""

# (id, extra flags, gin `extra`, keywords of the error); a gin `extra` adds the mixture `hz_mix2`.
CASES = [
    ("other_model_size_mlp_dim", ["--gin.EncoderConfig.mlp_dim=48"], "", ("mlp_dim",)),
    ("other_model_depth", ["--gin.EncoderConfig.num_layers=3"], "", ("num_layers",)),
    ("other_languages", [f"--gin.MIXTURE_OR_TASK_NAME='{T}_en'", "--gin.train.objectives={'mlm': 1.0}"], "",
     ("languages",)),
    ("other_batch_size", ["--gin.BATCH_SIZE=4"], "", ("BATCH_SIZE", "fresh_data_iterator")),
    ("other_task_feature_lengths", ["--gin.TASK_FEATURE_LENGTHS={'tokens': 17}"], "",
     ("TASK_FEATURE_LENGTHS", "fresh_data_iterator")),
    ("other_task_same_languages", [f"--gin.MIXTURE_OR_TASK_NAME='{T}_mix2'"], SECOND_MIXTURE,
     (f"{T}_mix2", "fresh_data_iterator")),
    ("other_seed", ["--gin.SEED=1"], "", ("seed", "fresh_data_iterator")),
    ("other_data_shards", ["--gin.train.data_shards=2"], "", ("data_shards", "fresh_data_iterator")),
    ("other_batch_size_and_seed_named_together", ["--gin.BATCH_SIZE=4", "--gin.SEED=1"], "",
     ("BATCH_SIZE", "seed", "fresh_data_iterator")),
    ("bad_value_on_resume", ["--gin.LOG_EVERY=0"], "", ("LOG_EVERY",)),
    # The optimiser state's layout (issue 47, T16): refused before any restore, never called damage.
    ("other_trainable", ["--gin.OptimizerConfig.trainable=['mlm_head']"], "",
     ("OptimizerConfig.trainable", "INIT_FROM_CHECKPOINT", "not damaged")),
    ("other_mu_dtype", ["--gin.OptimizerConfig.mu_dtype='bfloat16'"], "", ("OptimizerConfig.mu_dtype",)),
]


@pytest.mark.parametrize("case_id, flags, extra, keywords", CASES, ids=[c[0] for c in CASES])
def test_mismatched_resume_is_refused(case_id, flags, extra, keywords, trained, trained_copy, tmp_path, capfd):
  del case_id
  # The run's own gin, over its own corpus copy: the tasks `hz_*` are registered with those files.
  gin_file = write_shared_run_gin(tmp_path / "run.gin", trained["corpus"], extra=extra,
                                  more_user_tasks=", @h_mix2/AlphaMixture()" if extra else "")
  before = harness.tree_digest(trained_copy)
  outcome = harness.run_main(capfd, "train", harness.train_argv(gin_file, trained_copy, "--gin.TRAIN_STEPS=6",
                                                                *flags))
  harness.assert_user_error(outcome, *keywords, model_dir=trained_copy, before=before)


def test_resume_with_other_vocabulary_is_refused(trained_copy, tiny_corpus, tmp_path, capfd):
  lines = [" ".join(w[::-1] for w in (en + " " + de).split()) for en, de in testlib.sentences(random.Random(7), 300)]
  other = vocab_lib.train_sentencepiece(lines, vocab_size=83, model_path=tmp_path / "other.model", model_type="bpe")
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="hz_vocab", vocab=str(other))
  before = harness.tree_digest(trained_copy)
  outcome = harness.run_main(capfd, "train", harness.train_argv(gin_file, trained_copy, "--gin.TRAIN_STEPS=6"))
  harness.assert_user_error(outcome, "vocabulary", model_dir=trained_copy, before=before)


def test_fresh_data_iterator_resumes_with_another_batch_size(trained, trained_copy, capfd):
  """C6's documented way out: the model resumes, the data order restarts."""
  outcome = harness.run_main(capfd, "train", harness.train_argv(
      trained["gin"], trained_copy, "--gin.TRAIN_STEPS=5", "--gin.BATCH_SIZE=4",
      "--gin.train.fresh_data_iterator=True"))
  assert outcome.code == 0, harness.summary(outcome)
  assert 5 in harness.checkpoint_steps(trained_copy) or 5 in harness.metrics_losses(trained_copy)


def test_other_train_steps_resumes_with_a_warning(trained, trained_copy, capfd):
  """C6: a different TRAIN_STEPS is allowed but warns once (the learning-rate schedule depends on it)."""
  outcome = harness.run_main(capfd, "train", harness.train_argv(trained["gin"], trained_copy, "--gin.TRAIN_STEPS=5"))
  assert outcome.code == 0, harness.summary(outcome)
  warnings = [l for l in harness.warning_lines(outcome.err + outcome.out) if "TRAIN_STEPS" in l]
  assert len(warnings) == 1, (outcome.err + outcome.out)[-2000:]


def test_torn_last_metrics_line_does_not_block_resume(trained, trained_copy, capfd):
  """C8: a crash mid-write leaves half a JSON row; it is dropped with a warning."""
  with open(trained_copy / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 5, "loss": 3.1')
  outcome = harness.run_main(capfd, "train", harness.train_argv(trained["gin"], trained_copy, "--gin.TRAIN_STEPS=5"))
  assert outcome.code == 0, harness.summary(outcome)
  assert any("metrics.jsonl" in l for l in harness.warning_lines(outcome.err + outcome.out)), outcome.err[-2000:]
  with open(trained_copy / "metrics.jsonl", encoding="utf-8") as f:
    for line in f:
      json.loads(line)  # Every line whole again.


def test_stale_lock_of_a_finished_run_does_not_block(trained, trained_copy, capfd):
  """C5: the lock file stays after a run; an unheld lock with a dead owner is no obstacle."""
  (trained_copy / ".lock").write_text(json.dumps({"pid": 999999, "host": "elsewhere", "started": "2020-01-01",
                                                  "command": "train"}))
  outcome = harness.run_main(capfd, "train", harness.train_argv(trained["gin"], trained_copy, "--gin.TRAIN_STEPS=5"))
  assert outcome.code == 0, harness.summary(outcome)
  assert (trained_copy / ".lock").exists()


def test_train_steps_below_the_newest_checkpoint_is_refused_and_changes_nothing(trained, trained_copy, capfd):
  """The run holds step 4; TRAIN_STEPS=3 has nothing to train and must not rewrite config.gin."""
  before = harness.tree_digest(trained_copy)
  outcome = harness.run_main(capfd, "train", harness.train_argv(trained["gin"], trained_copy, "--gin.TRAIN_STEPS=3"))
  harness.assert_user_error(outcome, "step 4", "TRAIN_STEPS=3", "nothing to train", model_dir=trained_copy,
                            before=before)


def test_freezing_parameters_on_resume_moves_no_checkpoint(trained, trained_copy, capfd):
  """T16 of the 2026-12-01 probe: both sound checkpoints were moved to checkpoints_damaged/ ("state/ is
  unreadable"). Another `trainable` is other settings: one line naming it, both steps where they were."""
  outcome = harness.run_main(capfd, "train", harness.train_argv(
      trained["gin"], trained_copy, "--gin.TRAIN_STEPS=6", "--gin.OptimizerConfig.trainable=['mlm_head']"))
  harness.assert_user_error(outcome, "OptimizerConfig.trainable=[] in the checkpoint, ['mlm_head'] in this run")
  assert len(harness.error_message(outcome.err).splitlines()) == 1, outcome.err
  assert harness.checkpoint_steps(trained_copy) == [2, 4]
  assert not (trained_copy / "checkpoints_damaged").exists()
  assert "damaged" not in outcome.err.replace("not damaged", ""), outcome.err
