"""`check_settings`: what a user can type wrong on the command line, each refused with the setting named."""

import dataclasses

import pytest

from flax_xalign.errors import UserError
from flax_xalign.objectives.model import MaskingConfig
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.validate import check_settings

GOOD = dict(train_steps=4, batch_size=6, log_every=2, eval_every=0, eval_batches=2,
            checkpoint=CheckpointConfig(every_steps=2, keep=3), replicate_limit_bytes=0,
            task_feature_lengths={"tokens": 19}, objectives={"mlm": 1.0, "tlm": 0}, optimizer=OptimizerConfig(),
            masking=MaskingConfig(), seed=0, num_partitions=1, data_shards=None)


def _check(**changes):
  check_settings(**{**GOOD, **changes})


def test_good_settings_pass():
  _check()
  _check(data_shards=4, eval_every=5, objectives={"mlm": 1})


@pytest.mark.parametrize("changes, needles", [
    # Counts and intervals (moved from pretrain._check_counts).
    (dict(train_steps=0), ["TRAIN_STEPS=0", "integer >= 1", "--gin.TRAIN_STEPS="]),
    (dict(batch_size="32"), ["BATCH_SIZE='32'", "integer >= 1", "drop the quotes"]),
    (dict(batch_size=2.5), ["BATCH_SIZE=2.5"]),
    (dict(batch_size=True), ["BATCH_SIZE=True"]),
    (dict(log_every=0), ["LOG_EVERY=0"]),
    (dict(eval_every=-1), ["EVAL_EVERY=-1", "0 turns evaluation off"]),
    (dict(eval_batches=0), ["train.eval_batches=0"]),
    (dict(checkpoint=CheckpointConfig(every_steps=0)), ["CHECKPOINT_EVERY=0"]),
    (dict(checkpoint=CheckpointConfig(keep=0)), ["CheckpointConfig.keep=0"]),
    (dict(replicate_limit_bytes=-1), ["train.replicate_limit_bytes=-1", "67108864"]),
    (dict(seed="0"), ["SEED='0'"]),
    (dict(num_partitions=0), ["NUM_PARTITIONS=0"]),
    (dict(data_shards=0), ["train.data_shards=0", "None"]),
    # TASK_FEATURE_LENGTHS: exactly {'tokens': int >= 2}; a wrong key names the allowed one.
    (dict(task_feature_lengths={"token": 19}), ["'token'", "the only key allowed is 'tokens'"]),
    (dict(task_feature_lengths={"tokens": 19, "targets": 5}), ["'targets'", "only key allowed is 'tokens'"]),
    (dict(task_feature_lengths={}), ["lacks the key 'tokens'"]),
    (dict(task_feature_lengths=19), ["TASK_FEATURE_LENGTHS=19", "must be a dict"]),
    (dict(task_feature_lengths={"tokens": "19"}), ["TASK_FEATURE_LENGTHS['tokens']='19'", "drop the quotes"]),
    (dict(task_feature_lengths={"tokens": 1}), ["TASK_FEATURE_LENGTHS['tokens']=1", "integer >= 2"]),
    # Objective weights.
    (dict(objectives={"mlm": "1.0"}), ["objective 'mlm' is '1.0'", "number >= 0", "drop the quotes"]),
    (dict(objectives={"mlm": -1.0}), ["objective 'mlm' is -1.0"]),
    (dict(objectives={"mlm": float("nan")}), ["objective 'mlm' is nan"]),
    (dict(objectives={"mlm": 0, "tlm": 0.0}), ["every objective weight", "is 0"]),
    (dict(objectives={}), ["train.objectives={}", "non-empty dict"]),
    (dict(objectives=["mlm"]), ["train.objectives=['mlm']"]),
    # Optimiser and masking fields.
    (dict(optimizer=OptimizerConfig(learning_rate="1e-3")), ["OptimizerConfig.learning_rate='1e-3'", "> 0",
                                                              "drop the quotes"]),
    (dict(optimizer=OptimizerConfig(learning_rate=0.0)), ["OptimizerConfig.learning_rate=0.0"]),
    (dict(optimizer=OptimizerConfig(warmup_steps=-1)), ["OptimizerConfig.warmup_steps=-1"]),
    (dict(optimizer=OptimizerConfig(b2=1.0)), ["OptimizerConfig.b2=1.0", "[0, 1)"]),
    (dict(optimizer=OptimizerConfig(clip_norm=None)), ["OptimizerConfig.clip_norm=None"]),
    (dict(masking=MaskingConfig(mask_rate=0.0)), ["MaskingConfig.mask_rate=0.0", "(0, 1)"]),
    (dict(masking=MaskingConfig(replace_with_mask_rate=1.5)), ["MaskingConfig.replace_with_mask_rate=1.5"]),
])
def test_bad_settings_name_the_setting_and_the_fix(changes, needles):
  with pytest.raises(UserError) as raised:
    _check(**changes)
  message = str(raised.value)
  assert "\n" not in message and "e.g. " in message, message
  for needle in needles:
    assert needle in message, (needle, message)


def test_optional_groups_are_skipped_when_not_given():
  check_settings(**{k: v for k, v in GOOD.items()
                    if k not in ("task_feature_lengths", "objectives", "optimizer", "masking")})


def test_only_the_fields_a_config_has_are_read():
  @dataclasses.dataclass(frozen=True)
  class OldOptimizer:  # A config without some of today's fields (e.g. an experiment's own).
    learning_rate: float = 1e-3

  _check(optimizer=OldOptimizer())
  with pytest.raises(UserError, match="OptimizerConfig.learning_rate=-0.1"):
    _check(optimizer=OldOptimizer(learning_rate=-0.1))
