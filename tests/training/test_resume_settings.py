"""A checkpoint that does not fit this run's settings is refused in one line and never called damage (issue 47).

Only unreadable or inconsistent bytes are damage (moved to checkpoints_damaged/); a restore that fails
because the settings changed is one line naming the setting and the way forward, and moves nothing
(reliability review 2026-12-01: T16, T13, T07, S09). The resume check compares the settings that shape
the saved state before any restore (`checkpoint_fit.check_compatible`); the restore itself checks its
target against the saved tree, for callers that skipped that. No encoder is trained here: manifests
are built by hand, checkpoints are a toy state saved by `Checkpointer` or the fake model's loop of
tests/training/test_loop.py (the same trainer, optimiser and restore path as a run).
"""

import dataclasses
import errno
import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.errors import UserError, path_error
from flax_xalign.training import checkpoints
from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer, DamagedCheckpointError
from flax_xalign.training.optimizer import OptimizerConfig
from tests import testlib

VOCABULARY = run_spec_lib.VocabularySpec(file="vocabulary.model", sha256="cd" * 32, size=61, pieces=61)


def _spec(optimizer=OptimizerConfig(), **model):
  from flax_xalign.training.pretrain import optimizer_record

  return run_spec_lib.RunSpec(task="t", languages=("de", "en"), task_feature_lengths={"tokens": 19},
                              vocabulary=VOCABULARY, model=testlib.tiny_encoder_config(vocab_size=61, **model),
                              objectives={"mlm": 1.0}, optimizer=optimizer_record(optimizer))


def _refusal(saved, run) -> str:
  with pytest.raises(UserError) as caught:
    checkpoints.check_compatible(saved, run, where="/r/checkpoints", model_dir="/r")
  assert not isinstance(caught.value, DamagedCheckpointError)
  return str(caught.value)


# --- T07: OptimizerConfig.trainable of anything but strings -------------------------------------------------


@pytest.mark.parametrize("value", [[1], ["mlm_head", None], {"mlm_head": 1}, None, [""], 3])
def test_trainable_that_is_not_a_list_of_names_is_one_line(value):
  with pytest.raises(UserError) as caught:
    OptimizerConfig(trainable=value)
  message = str(caught.value)
  assert message.startswith(f"OptimizerConfig.trainable={value!r} must be a list of parameter-path prefixes")
  assert "\n" not in message and "['mlm_head']" in message


@pytest.mark.parametrize("value, kept", [(["mlm_head"], ("mlm_head",)), ("mlm_head", ("mlm_head",)),
                                         ((), ()), ([], ()), (("a", "b/c"), ("a", "b/c"))])
def test_trainable_names_are_kept_as_a_tuple(value, kept):
  assert OptimizerConfig(trainable=value).trainable == kept


# --- T16: settings that shape the saved optimiser state, compared before any restore -------------------------


def test_freezing_parameters_on_resume_is_refused_naming_trainable():
  message = _refusal(_spec(), _spec(OptimizerConfig(trainable=("mlm_head",))))
  assert "\n" not in message
  assert "OptimizerConfig.trainable=[] in the checkpoint, ['mlm_head'] in this run" in message
  assert "--gin.OptimizerConfig.trainable=\"[]\"" in message  # The saved setting, spelt for the shell.
  assert "new MODEL_DIR" in message and "--gin.INIT_FROM_CHECKPOINT=\"'/r'\"" in message
  assert "not damaged and nothing was changed" in message and "frozen parameters add entries" in message


def test_unfreezing_and_another_moment_dtype_are_refused_naming_each():
  saved = _spec(OptimizerConfig(trainable=("mlm_head",)))
  message = _refusal(saved, _spec(OptimizerConfig(mu_dtype="bfloat16")))
  assert "OptimizerConfig.trainable=['mlm_head'] in the checkpoint, [] in this run" in message
  assert "OptimizerConfig.mu_dtype=None in the checkpoint, 'bfloat16' in this run" in message
  assert "--gin.OptimizerConfig.trainable=\"['mlm_head']\" --gin.OptimizerConfig.mu_dtype=\"None\"" in message


@pytest.mark.parametrize("saved, ours", [
    (OptimizerConfig(), OptimizerConfig(learning_rate=1e-3, warmup_steps=7, b2=0.99, clip_norm=0.5)),
    (OptimizerConfig(), OptimizerConfig(mu_dtype="float32")),  # None is the parameters' dtype: float32.
    (OptimizerConfig(trainable=("mlm_head",)), OptimizerConfig(trainable=("mlm_head", "encoder"))),
], ids=["schedule_and_betas", "mu_dtype_spelt_out", "other_prefixes_same_layout"])
def test_settings_that_leave_the_state_as_it_is_may_change(saved, ours):
  checkpoints.check_compatible(_spec(saved), _spec(ours), where="/r/checkpoints")


def test_a_manifest_without_an_optimiser_record_is_not_compared():
  saved = dataclasses.replace(_spec(), optimizer={})
  checkpoints.check_compatible(saved, _spec(OptimizerConfig(trainable=("mlm_head",))), where="/r/checkpoints")


# --- T13: another model size names each field that differs ----------------------------------------------------


def test_another_model_names_every_differing_field_with_both_values():
  message = _refusal(_spec(), _spec(num_layers=3, mlp_dim=48))
  tiny = testlib.tiny_encoder_config()
  assert f"EncoderConfig.mlp_dim: {tiny.mlp_dim} in the checkpoint, 48 in this run" in message
  assert f"EncoderConfig.num_layers: {tiny.num_layers} in the checkpoint, 3 in this run" in message
  assert "different model" in message and "\n" not in message
  assert "head_dim" not in message and "{" not in message  # No whole EncoderConfig JSON.


# --- the restore's own check: a target that does not fit the saved tree ----------------------------------------


def _toy_state():
  return {"step": jnp.int32(2), "params": {"w": jnp.ones((3,), jnp.float32)},
          "opt_state": {"mu": {"w": jnp.zeros((3,), jnp.float32)}}}


def _abstract(tree):
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


@pytest.fixture
def saved_step(tmp_path):
  """A MODEL_DIR with checkpoint step 2 of `_toy_state()` (no iterator, no assets)."""
  model_dir = tmp_path / "run"
  checkpointer = Checkpointer(str(model_dir), CheckpointConfig(async_save=False))
  checkpointer.save(2, _toy_state(), None, checkpoints.make_meta(_spec(), {}))
  checkpointer.close()
  return model_dir


def _other_trees():
  state = _toy_state()
  more = dict(state, opt_state={"mu": {"w": state["opt_state"]["mu"]["w"]}, "frozen": {"w": jnp.int32(0)}})
  shape = dict(state, params={"w": jnp.ones((4,), jnp.float32)})
  dtype = dict(state, opt_state={"mu": {"w": jnp.zeros((3,), jnp.bfloat16)}})
  return {"an_extra_entry": (more, "1 array(s) only in this run (e.g. opt_state/frozen/w)"),
          "another_shape": (shape, "params/w: (3,) float32 in the checkpoint, (4,) float32 in this run"),
          "another_dtype": (dtype, "opt_state/mu/w: (3,) float32 in the checkpoint, (3,) bfloat16 in this run")}


@pytest.mark.parametrize("case", sorted(_other_trees()))
def test_restoring_into_another_tree_is_a_settings_error_not_damage(saved_step, case):
  target, difference = _other_trees()[case]
  before = testlib.tree_snapshot(saved_step)
  checkpointer = Checkpointer(str(saved_step), CheckpointConfig(async_save=False))
  try:
    with pytest.raises(UserError) as caught:
      checkpointer.restore(2, _abstract(target), None)
  finally:
    checkpointer.close()
  message = str(caught.value)
  assert not isinstance(caught.value, DamagedCheckpointError), message
  assert difference in message and "not damaged and nothing was moved" in message and "\n" not in message
  assert testlib.tree_snapshot(saved_step) == before
  checkpointer = Checkpointer(str(saved_step), CheckpointConfig(async_save=False))
  try:  # The step itself is sound.
    restored, _ = checkpointer.restore(2, _abstract(_toy_state()), None)
  finally:
    checkpointer.close()
  np.testing.assert_array_equal(np.asarray(restored["params"]["w"]), np.ones(3))


def test_orbax_refusing_a_target_is_not_damage_either(saved_step):
  """Should a misfit get past the target check, Orbax's own refusal (no byte read) is not called damage."""
  step_dir = saved_step / "checkpoints" / "2"
  target = dict(_toy_state(), extra=jnp.int32(0))
  with ocp.CheckpointManager(saved_step / "checkpoints", item_handlers={"state": ocp.StandardCheckpointHandler()},
                             options=ocp.CheckpointManagerOptions(create=False)) as manager:
    with pytest.raises(ValueError) as orbax_error:
      manager.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(target))))
  error = checkpoints.damage_of(step_dir, "state", orbax_error.value)
  assert not isinstance(error, DamagedCheckpointError) and "not damaged" in str(error)
  # A truncated file is still damage.
  truncated = checkpoints.damage_of(step_dir, "state", ValueError("OUT_OF_RANGE: Error reading \"params.w/0\""))
  assert isinstance(truncated, DamagedCheckpointError)


def test_a_resume_that_freezes_parameters_past_the_settings_check_moves_nothing(tmp_path, monkeypatch):
  """The loop's restore with a trainer whose optimiser state has the freeze transform's entries added (the
  probe's T16 without `pretrain`'s check): one UserError naming the optimiser settings; no step is moved."""
  from tests.training import test_loop

  model_dir = tmp_path / "run"
  test_loop._train(model_dir, steps=4)  # pylint: disable=protected-access
  before = testlib.tree_snapshot(model_dir)
  monkeypatch.setattr(test_loop, "OptimizerConfig", functools.partial(OptimizerConfig, trainable=("w",)))
  with pytest.raises(UserError) as caught:
    test_loop._train(model_dir, steps=6)  # pylint: disable=protected-access
  message = str(caught.value)
  assert not isinstance(caught.value, DamagedCheckpointError), message
  assert message.startswith(f"checkpoint step 4 of {model_dir} holds a train state of another layout")
  assert "OptimizerConfig.trainable" in message and "nothing was moved" in message
  assert testlib.tree_snapshot(model_dir) == before
  assert not (model_dir / "checkpoints_damaged").exists()
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]


def test_a_state_without_its_metadata_is_still_damage(saved_step):
  os.remove(saved_step / "checkpoints" / "2" / "state" / "_METADATA")
  checkpointer = Checkpointer(str(saved_step), CheckpointConfig(async_save=False))
  try:
    with pytest.raises(DamagedCheckpointError, match=r"state/ is unreadable: its _METADATA is missing"):
      checkpointer.restore(2, _abstract(_toy_state()), None)
  finally:
    checkpointer.close()


# --- S09: a full disk while an asset is saved into the first checkpoint --------------------------------------


def test_no_space_saving_an_asset_is_one_clean_line(tmp_path, monkeypatch):
  def full(self, directory, args):  # What an asset's save raises: fileio's own one-line UserError.
    path = os.path.join(os.fspath(directory), "vocabulary.model")
    try:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as e:
      raise path_error(e, path, doing="write") from e

  monkeypatch.setattr(checkpoints.AssetsHandler, "save", full)
  model_dir = tmp_path / "run"
  checkpointer = Checkpointer(str(model_dir), CheckpointConfig(async_save=False))
  with pytest.raises(UserError) as caught:
    checkpointer.save(1, _toy_state(), None, {}, assets={"v": object()}, asset_values={"v": 0})
  shutil.rmtree(model_dir, ignore_errors=True)
  message = str(caught.value)
  assert message == (f"no space left writing {model_dir / 'checkpoints' / '1'} (No space left on device); free "
                     "space or choose another MODEL_DIR. The checkpoints before it are intact; rerun the same "
                     "command to resume."), message
