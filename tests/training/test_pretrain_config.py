"""`TrainConfig`: pretrain's settings as one frozen dataclass, gin-bound as `train`, the manifest derived from it."""

import dataclasses
import os

import gin
import numpy as np
import pytest

from flax_xalign.cli import configurables, gin_cli
from flax_xalign.errors import UserError
from flax_xalign.training import config as train_config
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.hooks import CheckpointHook, scalars_of
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import TrainConfig, assemble, pretrain

from tests.testlib import tiny_encoder_gin

# pretrain()'s keyword arguments before it took a TrainConfig (copied from the operative config.gin of a run
# made with that version): every one must still be a field, and gin must bind it as `train.<name>`.
OLD_KEYWORDS = (
    "asset_options", "assets_only", "axis_rules", "batch_size", "bitext_both_directions", "checkpoint",
    "data", "data_shards", "dictionary_rate", "encoder", "eval_batches", "eval_every", "eval_split",
    "fresh_data_iterator", "fsdp", "init_from_checkpoint", "languages", "log_every", "loss_normalization",
    "masking", "mixture_or_task_name", "model_dir", "monitors", "num_partitions", "objective_options",
    "objectives", "optimizer", "pair_layout", "peak_flops_per_device", "replicate_limit_bytes", "seed",
    "step_callback", "task_feature_lengths", "train_steps", "user_tasks", "write_config")
# Settings added since, each with a default (old gin files and keyword calls still run unchanged).
ADDED = ("cache_verify",)
REQUIRED = ("model_dir", "mixture_or_task_name", "task_feature_lengths", "batch_size", "train_steps", "encoder",
            "objectives")


def _config(encoder, **changes):
  settings = dict(model_dir="unused", mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
                  batch_size=6, train_steps=4, encoder=encoder, objectives={"mlm": 1.0, "tlm": 0.5})
  return TrainConfig(**{**settings, **changes})


def test_fields_are_the_old_keywords_with_their_defaults():
  assert sorted(train_config.field_names()) == sorted(OLD_KEYWORDS + ADDED)
  defaults = train_config.defaults()
  assert sorted(set(OLD_KEYWORDS + ADDED) - set(defaults)) == sorted(REQUIRED)
  # A few defaults written out by hand (the old signature's).
  assert defaults["log_every"] == 10 and defaults["eval_every"] == 0 and defaults["eval_batches"] == 20
  assert defaults["eval_split"] == "validation" and defaults["pair_layout"] == "restart"
  assert defaults["loss_normalization"] == "per_term" and defaults["replicate_limit_bytes"] == 64 * 2**20
  assert defaults["checkpoint"] == CheckpointConfig() and defaults["optimizer"] == OptimizerConfig()
  assert defaults["data"] == "seqio"  # Added with the packed cache; the old keywords keep their meaning.
  assert defaults["cache_verify"] == "auto"  # Hash below 1 GiB, sample above (docs/data.md).


def test_config_is_frozen_and_refuses_unknown_settings(tiny_encoder):
  config = _config(tiny_encoder)
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.seed = 3
  with pytest.raises(TypeError, match="batch_sise"):
    _config(tiny_encoder, batch_sise=3)
  with pytest.raises(TypeError, match="batch_sise"):
    config.replace(batch_sise=3)
  assert config.replace(seed=5).seed == 5 and config.seed == 0


def test_pretrain_takes_a_config_or_keywords_and_refuses_an_unknown_one(tmp_path, tiny_encoder):
  # Both fail in validation (batch 0), before anything is written: the call shapes reach the same checks.
  bad = _config(tiny_encoder, model_dir=str(tmp_path / "m"), batch_size=0)
  with pytest.raises(UserError, match="BATCH_SIZE"):
    pretrain(bad)
  with pytest.raises(UserError, match="BATCH_SIZE"):
    pretrain(**{f.name: getattr(bad, f.name) for f in dataclasses.fields(bad)})
  with pytest.raises(UserError, match="BATCH_SIZE"):
    pretrain(bad.replace(batch_size=6), batch_size=0)  # Keywords replace the config's fields.
  with pytest.raises(TypeError, match="batch_sise"):
    pretrain(bad, batch_sise=3)
  assert not (tmp_path / "m").exists()


def test_manifest_is_derived_from_the_config(tiny_corpus, tiny_encoder):
  config = _config(tiny_encoder, seed=7, pair_layout="continuous", bitext_both_directions=True,
                   optimizer=OptimizerConfig(learning_rate=1e-3, warmup_steps=3), dictionary_rate=0.25,
                   monitors=("mlm", "align"))
  assembly = assemble(config)
  run = assembly.run
  assert run.task == "tiny_mix" and run.seed == 7 and run.objectives == {"mlm": 1.0, "tlm": 0.5}
  assert run.pair_layout == "continuous" and run.bitext_both_directions is True
  assert run.optimizer["learning_rate"] == 1e-3 and run.optimizer["warmup_steps"] == 3
  assert run.asset_options == {"dictionary": {"rate": 0.25}}
  assert run.monitors == ("align",)  # Trained objectives are not monitors too.
  assert dict(run.task_feature_lengths) == {"tokens": 19} and assembly.length == 19
  assert run.languages == ("de", "en") and run.model.vocab_size == 83  # From the task, not the config.
  assert assembly.model.masking is config.masking


def _parse(tmp_path, *bindings):
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(f"include 'runs/pretrain.gin'\n{tiny_encoder_gin()}\nMIXTURE_OR_TASK_NAME = 'tiny_mix'\n")
  configurables.register()
  args = gin_cli.parse_args([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'", *bindings],
                            description="test")
  gin_cli.parse_gin(args)


def test_gin_binds_train_fields_and_the_operative_config_lists_them(tmp_path):
  _parse(tmp_path, "--gin.BATCH_SIZE=5", "--gin.train.eval_batches=3", "--gin.train.pair_layout='continuous'")
  try:
    config = gin.get_configurable("flax_xalign.train")()
    assert isinstance(config, TrainConfig)
    assert config.batch_size == 5 and config.eval_batches == 3 and config.pair_layout == "continuous"
    assert config.model_dir == str(tmp_path / "m") and config.encoder.embed_dim == 24
    assert config.checkpoint.every_steps == 100 and config.optimizer.learning_rate == 5e-4  # runs/pretrain.gin
    operative = gin.operative_config_str()
    lines = {line.split(" = ")[0] for line in operative.splitlines() if line.startswith("train.")}
    assert lines == {f"train.{name}" for name in OLD_KEYWORDS + ADDED}
  finally:
    gin.clear_config()


def test_unknown_train_binding_is_refused_with_the_close_match(tmp_path):
  with pytest.raises(UserError, match=r"batch_sise.*Did you mean batch_size\?"):
    _parse(tmp_path, "--gin.train.batch_sise=3")
  gin.clear_config()


def test_a_hook_off_the_checkpoint_steps_is_refused_before_model_dir_is_touched(tmp_path, tiny_encoder):
  config = _config(tiny_encoder, model_dir=str(tmp_path / "m"), checkpoint=CheckpointConfig(every_steps=2))
  hook = CheckpointHook(name="evaluators", fn=lambda step: {}, every=3, setting="TRAIN_EVALS_EVERY")
  with pytest.raises(UserError, match="TRAIN_EVALS_EVERY to a positive multiple of 2"):
    pretrain(config, hooks=[hook])
  with pytest.raises(UserError, match="TRAIN_EVALS_EVERY"):
    pretrain(config, hooks=[dataclasses.replace(hook, every=0)])
  assert not os.path.exists(tmp_path / "m")


def test_scalars_of_flattens_numbers_and_leaves_the_rest_out():
  results = {"mlm": {"step": 4, "languages": {"de": {"accuracy": np.float32(0.25), "n": np.int64(7)}},
                     "ok": True, "name": "x", "curve": [1.0, 2.0], "none": None, "vector": np.ones(3),
                     "zero_d": np.array(0.5)}}
  assert scalars_of(results, prefix="eval_") == {
      "eval_mlm_step": 4, "eval_mlm_languages_de_accuracy": 0.25, "eval_mlm_languages_de_n": 7,
      "eval_mlm_zero_d": 0.5}
  assert scalars_of(None) == {} and scalars_of([1, 2]) == {}
