"""The ways a checkpoint step can be damaged, the refusal `on_damaged="error"` must give and the error of
a full disk, for the two test files that check them: tests/training/test_loop_checkpoints.py (the loop
with a fake model, unit tier) and tests/training/test_checkpoint_faults.py (`pretrain`, slow tier)."""

import errno
import os
import shutil

import pytest

from flax_xalign.errors import UserError
from flax_xalign.training import data_positions
from flax_xalign.training.checkpoints import DamagedCheckpointError
from tests import testlib


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _largest(directory):
  return max((os.path.join(d, n) for d, _, names in os.walk(directory) for n in names), key=os.path.getsize)


def files(path):
  """The files under `path`, relative to it, sorted."""
  return sorted(os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names)


ITERATOR = os.path.join("data_iterator", "process_0")
# case -> (damage a step directory, what the warning or error says of it)
DAMAGE = {
    "state deleted": (lambda step: shutil.rmtree(step / "state"), "state/ is missing"),
    "state truncated": (lambda step: _truncate(_largest(step / "state")), "state/ is unreadable"),
    "state metadata deleted": (lambda step: os.remove(step / "state" / "_METADATA"), "state/ is unreadable"),
    "iterator deleted": (lambda step: shutil.rmtree(step / "data_iterator"), "data_iterator/ is missing"),
    "iterator truncated": (lambda step: _truncate(step / ITERATOR / "iterator.data-00000-of-00001"),
                           "data_iterator/ is unreadable"),
    "iterator index deleted": (lambda step: os.remove(step / ITERATOR / "iterator.index"),
                               "data_iterator/ is unreadable"),
    "meta deleted": (lambda step: shutil.rmtree(step / "meta"), "meta/ is missing"),
    "meta garbled": (lambda step: (step / "meta" / "metadata").write_text("{not json"), "meta/ is unreadable"),
}


def assert_error_refuses_and_changes_nothing(model_dir, step, case, train):
  """Damages `step` of `model_dir` as `case` says; `train(model_dir)` (on_damaged="error") must refuse
  with the message naming the step, the folder to move and the fallback switch, and change nothing."""
  damage, what = DAMAGE[case]
  damage(model_dir / "checkpoints" / str(step))
  before = testlib.tree_snapshot(model_dir)
  with pytest.raises(DamagedCheckpointError) as info:
    train(model_dir)
  message = str(info.value)
  assert f"checkpoint step {step} of {model_dir} is damaged ({what}" in message
  assert f"Move {model_dir / 'checkpoints' / str(step)} out of" in message
  assert 'CheckpointConfig.on_damaged="fallback"' in message
  # The state and the iterator are found damaged only when read: "error" still stops before training.
  assert not (model_dir / "checkpoints_damaged").exists()
  after = testlib.tree_snapshot(model_dir)
  assert {k: v for k, v in after.items() if k in before} == before


def assert_no_space_is_one_error(model_dir, step, monkeypatch, train):
  """With every data-iterator save failing for lack of space, `train(model_dir)` must end in one UserError
  naming the checkpoint of `step` and what to do, and leave no temporary checkpoint behind."""

  def full(self, directory, args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))

  monkeypatch.setattr(data_positions.DataIteratorHandler, "save", full)
  with pytest.raises(UserError, match=rf"^no space left writing .*checkpoints/{step} .*free space or choose "
                                      "another MODEL_DIR"):
    train(model_dir)
  assert not [n for n in os.listdir(model_dir / "checkpoints") if "tmp" in n]
