"""Damaged checkpoints, a full disk and resuming with a new iterator, through the loop with the fake model.

The same behaviours as tests/training/test_checkpoint_faults.py (which runs them through `pretrain` with
the tiny encoder, in the `slow` tier), at the cost of a 3-parameter quadratic model: a 4-step run writes
checkpoints 2 and 4, step 4 is damaged, and the resumed run must redo steps 3 and 4 from step 2 along the
independent optax reference of tests/training/test_loop.py.
"""

import os
import shutil

import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.training.checkpoints import DamagedCheckpointError, newest_readable_step
from tests import testlib
from tests.training.damage import DAMAGE, assert_error_refuses_and_changes_nothing, assert_no_space_is_one_error
from tests.training.damage import files as _files
from tests.training.test_loop import B, DATA, _counter_file, _reference, _rows, _train, quadratic


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
  """A finished 4-step run: checkpoints 2 and 4."""
  model_dir = tmp_path_factory.mktemp("loop_faults") / "run"
  _train(model_dir, steps=4)
  return model_dir


def _copy(four_steps, tmp_path):
  shutil.copytree(four_steps, tmp_path / "run")
  return tmp_path / "run"


@pytest.mark.fast("state truncated", "iterator truncated", "meta garbled")
@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_newest_step_falls_back_to_the_previous_one(four_steps, tmp_path, capsys, case):
  model_dir = _copy(four_steps, tmp_path)
  damage, what = DAMAGE[case]
  damage(model_dir / "checkpoints" / "4")
  damaged_files = _files(model_dir / "checkpoints" / "4")
  capsys.readouterr()
  result, _ = _train(model_dir, steps=4)  # Step 4 is damaged: 3 and 4 are trained again from step 2.
  err = capsys.readouterr().err
  warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1 and "Traceback" not in err, err
  assert warnings[0].startswith(f"warning: checkpoint step 4 of {model_dir} is damaged ({what}")
  assert warnings[0].endswith(f"moved it to {model_dir / 'checkpoints_damaged' / '4'} and resuming from step 2")
  # Nothing deleted: the damaged step is kept, file for file, outside checkpoints/.
  assert _files(model_dir / "checkpoints_damaged" / "4") == damaged_files
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
  losses, w = _reference(4)
  rows = _rows(model_dir)
  assert result.last_step == 4 and sorted(rows) == [1, 2, 3, 4]
  np.testing.assert_allclose([rows[s]["loss"] for s in rows], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.state.params["w"]), w, rtol=1e-5, atol=1e-6)
  assert _counter_file(model_dir, 4) == [2] * 5  # The asset of step 4, recomputed along the way.


@pytest.mark.fast("iterator truncated")
@pytest.mark.parametrize("case", ["state deleted", "iterator truncated", "meta garbled"])
def test_on_damaged_error_refuses_and_changes_nothing(four_steps, tmp_path, case):
  assert_error_refuses_and_changes_nothing(_copy(four_steps, tmp_path), 4, case,
                                           lambda model_dir: _train(model_dir, steps=4, on_damaged="error"))


def test_newest_readable_step_lists_damaged_steps_and_moves_nothing(four_steps, tmp_path):
  """What `pretrain` decides before it writes anything: the step to resume and the damaged newer ones."""
  model_dir = _copy(four_steps, tmp_path)
  assert newest_readable_step(str(model_dir)) == (4, [])
  shutil.rmtree(model_dir / "checkpoints" / "4" / "meta")
  before = testlib.tree_snapshot(model_dir)
  step, damaged = newest_readable_step(str(model_dir))
  assert step == 2 and [(e.step, e.what) for e in damaged] == [(4, "meta/ is missing")]
  with pytest.raises(DamagedCheckpointError, match=r"checkpoint step 4 of .* is damaged \(meta/ is missing\)"):
    newest_readable_step(str(model_dir), on_damaged="error")
  assert testlib.tree_snapshot(model_dir) == before
  (model_dir / "checkpoints" / "2" / "meta" / "metadata").write_text("[1, 2]")  # JSON, but not an object.
  before = testlib.tree_snapshot(model_dir)
  with pytest.raises(UserError, match=r"no complete checkpoint is left in .*step 4: meta/ is missing; "
                                      r"step 2: meta/ is unreadable"):
    newest_readable_step(str(model_dir))
  assert testlib.tree_snapshot(model_dir) == before
  assert newest_readable_step(str(tmp_path / "nowhere")) == (None, [])


def test_no_complete_step_left_is_a_clear_error(four_steps, tmp_path):
  model_dir = _copy(four_steps, tmp_path)
  for step in ("2", "4"):
    shutil.rmtree(model_dir / "checkpoints" / step / "meta")
  with pytest.raises(UserError, match="no complete checkpoint is left"):
    _train(model_dir, steps=4)


def test_missing_orbax_step_metadata_still_resumes_from_that_step(four_steps, tmp_path, capsys):
  model_dir = _copy(four_steps, tmp_path)
  shutil.rmtree(model_dir / "checkpoints" / "4")  # As if the run had stopped after step 2.
  os.remove(model_dir / "checkpoints" / "2" / "_CHECKPOINT_METADATA")
  capsys.readouterr()
  result, _ = _train(model_dir, steps=4)
  out = capsys.readouterr()
  assert f"resumed from {model_dir / 'checkpoints'}/2" in out.out and "warning" not in out.err
  losses, w = _reference(4)
  np.testing.assert_allclose([_rows(model_dir)[s]["loss"] for s in (1, 2, 3, 4)], losses, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result.state.params["w"]), w, rtol=1e-5, atol=1e-6)


def test_no_space_in_an_async_save_is_one_error_and_leaves_no_tmp_checkpoint(tmp_path, monkeypatch):
  assert_no_space_is_one_error(tmp_path / "run", 2, monkeypatch,
                               lambda model_dir: _train(model_dir, steps=4, async_save=True))


def test_a_new_data_iterator_resumes_the_model_only(four_steps, tmp_path, capsys):
  """`restore_iterator=False` (train.fresh_data_iterator): the weights and assets of step 4, the rows anew."""
  model_dir = _copy(four_steps, tmp_path)
  capsys.readouterr()
  result, _ = _train(model_dir, steps=5, restore_iterator=False)
  assert f"resumed from {model_dir / 'checkpoints'}/4 with a new data iterator" in capsys.readouterr().out
  rows = _rows(model_dir)
  assert result.last_step == 5 and sorted(rows) == [1, 2, 3, 4, 5]
  # Step 5 starts from the weights of step 4 (refreshed twice: counter 2) and reads the first batch again.
  _, w4 = _reference(4)
  first, fifth = DATA[:B], DATA[4 * B:5 * B]
  assert rows[5]["counter"] == 2
  np.testing.assert_allclose(rows[5]["loss"], float(quadratic(w4, first, np.int32(2))), rtol=1e-5)
  assert not np.isclose(rows[5]["loss"], float(quadratic(w4, fifth, np.int32(2))), rtol=1e-3)


def test_out_of_memory_while_restoring_is_not_damage_and_moves_nothing(four_steps, tmp_path, monkeypatch):
  """A GPU shared by many processes ran out of memory restoring a sound step (the first science run on an
  H200): that must not be called damage, which would move a good step to checkpoints_damaged/."""
  import orbax.checkpoint as ocp

  model_dir = _copy(four_steps, tmp_path)
  before = testlib.tree_snapshot(model_dir)

  def restore(self, step, *args, **kwargs):  # What Orbax raised there: TensorStore's wrapper of XLA's error.
    try:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 48.60MiB with allocator "
                         "GPU_0_bfc on device 0.")
    except RuntimeError as e:
      raise ValueError("Encountered error while reading array index: (slice(0, 12, 1),)") from e

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
  with pytest.raises(UserError, match=r"out of accelerator memory restoring .*checkpoints/4/\w+ .*"
                                      r"the checkpoint is not damaged") as caught:
    _train(model_dir, steps=6)
  assert not isinstance(caught.value, DamagedCheckpointError)
  assert testlib.tree_snapshot(model_dir) == before
