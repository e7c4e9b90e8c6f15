"""Damaged checkpoints and a full disk: the documented behaviour, never a traceback (issue 14, items 5, 7).

A damaged newest step (state, iterator or meta missing or truncated) is moved
to MODEL_DIR/checkpoints_damaged/<step> with one warning line and the run
resumes from the previous complete step, reproducing the losses of an
uninterrupted run; `CheckpointConfig.on_damaged="error"` refuses instead and
leaves MODEL_DIR as it was. A write that fails for lack of space (EFBIG under
RLIMIT_FSIZE here) ends in one UserError and leaves no temporary checkpoint.

Each case trains the tiny encoder (twice for the shared runs, once more per case), so they run in the
`slow` tier; tests/training/test_loop_checkpoints.py checks the same behaviours in the unit tier through
the loop with a 3-parameter model (and `newest_readable_step`, the choice `pretrain` makes first, directly).
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain

from tests import testlib
from tests.training.damage import DAMAGE, assert_error_refuses_and_changes_nothing, assert_no_space_is_one_error
from tests.training.damage import files as _files

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(model_dir, *, steps, on_damaged="fallback", **kw):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_en", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=steps, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=1, keep=3, async_save=True, on_damaged=on_damaged),
      log_every=1, seed=3, **kw)


def _losses(model_dir):
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_corpus):
  """A 4-step run stopped after step 3 (checkpoints 1, 2, 3) and the losses of an uninterrupted one."""
  root = tmp_path_factory.mktemp("faults")

  def stop_at_3(step, metrics):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  assert _run(root / "base", steps=4, step_callback=stop_at_3).interrupted
  _run(root / "full", steps=4)
  return root / "base", _losses(root / "full")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_newest_step_falls_back_to_the_previous_one(runs, tmp_path, capsys, case):
  base, full = runs
  model_dir = tmp_path / "run"
  shutil.copytree(base, model_dir)
  damage, what = DAMAGE[case]
  damage(model_dir / "checkpoints" / "3")
  damaged_files = _files(model_dir / "checkpoints" / "3")

  result = _run(model_dir, steps=4)

  assert result.last_step == 4 and not result.interrupted
  err = capsys.readouterr().err
  warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1, err
  assert warnings[0].startswith(f"warning: checkpoint step 3 of {model_dir} is damaged ({what}")
  assert warnings[0].endswith(f"moved it to {model_dir / 'checkpoints_damaged' / '3'} and resuming from step 2")
  assert "Traceback" not in err
  # Nothing deleted: the damaged step is kept, file for file, outside checkpoints/.
  assert _files(model_dir / "checkpoints_damaged" / "3") == damaged_files
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "3", "4"]
  # Steps 3 and 4 redone from step 2 reproduce the uninterrupted run.
  losses = _losses(model_dir)
  assert sorted(losses) == [1, 2, 3, 4]
  np.testing.assert_allclose([losses[s] for s in (1, 2, 3, 4)], [full[s] for s in (1, 2, 3, 4)], rtol=1e-5)


@pytest.mark.slow
def test_missing_orbax_step_metadata_still_resumes_from_that_step(runs, tmp_path, capsys):
  model_dir = tmp_path / "run"
  shutil.copytree(runs[0], model_dir)
  os.remove(model_dir / "checkpoints" / "3" / "_CHECKPOINT_METADATA")
  assert _run(model_dir, steps=4).last_step == 4
  out = capsys.readouterr()
  assert f"resumed from {model_dir / 'checkpoints' / '3'}" in out.out and "warning" not in out.err
  np.testing.assert_allclose(_losses(model_dir)[4], runs[1][4], rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["state deleted", "iterator truncated", "meta garbled"])
def test_on_damaged_error_refuses_and_changes_nothing(runs, tmp_path, case):
  model_dir = tmp_path / "run"
  shutil.copytree(runs[0], model_dir)
  assert_error_refuses_and_changes_nothing(model_dir, 3, case,
                                           lambda model_dir: _run(model_dir, steps=4, on_damaged="error"))


@pytest.mark.slow
def test_no_complete_step_left_is_a_clear_error(runs, tmp_path):
  model_dir = tmp_path / "run"
  shutil.copytree(runs[0], model_dir)
  for step in ("1", "2", "3"):
    shutil.rmtree(model_dir / "checkpoints" / step / "meta")
  before = testlib.tree_snapshot(model_dir)
  with pytest.raises(UserError, match="no complete checkpoint is left"):
    _run(model_dir, steps=4)
  assert testlib.tree_snapshot(model_dir) == before


def test_bad_on_damaged_value_is_refused_before_writing(tmp_path, tiny_corpus):
  with pytest.raises(UserError, match="on_damaged='skip' is not one of fallback, error"):
    _run(tmp_path / "x", steps=2, on_damaged="skip")
  assert not (tmp_path / "x").exists()


_FULL_DISK_CHILD = r"""
import json, resource, signal, sys
sys.path.insert(0, {repo!r})
import tests.conftest  # Maps flax_xalign.tasks in a plain checkout.
from flax_xalign.errors import run_command
from flax_xalign.tasks import user
from tests.training.test_checkpoint_faults import _run
files = json.loads({files!r})
user.TextTask(name="tiny_en", files=files, lang="en", vocabulary_path={vocab!r}).register()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Writes past the limit fail with EFBIG instead of killing us.
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
sys.exit(run_command(lambda: _run({model_dir!r}, steps=2)))
"""


@pytest.mark.slow
def test_no_space_in_an_async_save_is_one_error_and_leaves_no_tmp_checkpoint(tmp_path, tiny_corpus, monkeypatch):
  assert_no_space_is_one_error(tmp_path / "run", 1, monkeypatch, lambda model_dir: _run(model_dir, steps=2))


@pytest.mark.slow
def test_file_too_big_while_saving_is_one_error_and_leaves_no_tmp_checkpoint(tmp_path, tiny_corpus):
  # The vocabulary (~240 kB) fits under the limit, the iterator's checkpoint (~570 kB) does not.
  model_dir = tmp_path / "run"
  files = {s: tiny_corpus["files"][("en", s)] for s in ("train", "validation")}
  code = _FULL_DISK_CHILD.format(repo=REPO, files=json.dumps(files), vocab=tiny_corpus["vocab"],
                                 limit=400_000, model_dir=str(model_dir))
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="")  # The cache's files may be bigger than the limit.
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                        env=env)
  assert proc.returncode == 2, proc.stderr[-3000:]
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and errors[0].startswith(f"error: no space left writing {model_dir / 'checkpoints'}")
  assert "free space or choose another MODEL_DIR" in errors[0]
  assert "Traceback" not in proc.stderr, proc.stderr
  left = [n for n in os.listdir(model_dir / "checkpoints") if "tmp" in n]
  assert not left, left
