"""Resume checks, evaluation and config order (issue 14, items 3, 8, 9; contracts C6, C7, C8).

The refusals run on a copy of the shared tiny run (tests/runs/tiny_run.py: tiny_mix, 3 steps, seed 0) and
stop before anything trains. The tests that train again are in the `slow` tier; their loop behaviour has
fake-model twins in tests/training/test_loop.py and test_loop_checkpoints.py, and what `pretrain` decides
before the loop is checked here without training (the loop replaced, or `_check_resumable` called).
"""

import json
import os
import shutil

import pytest

from flax_xalign.errors import UserError
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from flax_xalign.training.trainer import Trainer

from tests import testlib
from tests.runs.tiny_run import tiny_mix_run


def _run(model_dir, *, steps, batch_size=6, task="tiny_mix", **kw):
  """`pretrain` with the shared run's data loop unless changed (checkpoints every 2 steps)."""
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name=task, task_feature_lengths=kw.pop("lengths", {"tokens": 19}),
      batch_size=batch_size, train_steps=steps, encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=kw.pop("every", 2), keep=3, async_save=True),
      log_every=1, seed=kw.pop("seed", 0), **kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_corpus):
  """The shared 3-step run on tiny_mix (checkpoint 3); `tiny_mix_again` is the same data under another name."""
  from flax_xalign.tasks import user

  user.AlphaMixture(name="tiny_mix_again", tasks=("tiny_en", "tiny_de", "tiny_de_en")).register()
  return tiny_mix_run(tmp_path_factory, tiny_corpus, "resume")


def _copy(base, tmp_path):
  shutil.copytree(base, tmp_path / "run")
  return tmp_path / "run"


@pytest.mark.parametrize("change, expected", [
    ({"batch_size": 3}, ["BATCH_SIZE=6, this run 3"]),
    ({"lengths": {"tokens": 17}}, ['TASK_FEATURE_LENGTHS={"tokens": 19}, this run {"tokens": 17}']),
    ({"task": "tiny_mix_again"}, ['MIXTURE_OR_TASK_NAME="tiny_mix", this run "tiny_mix_again"']),
    ({"batch_size": 3, "seed": 4}, ["BATCH_SIZE=6, this run 3", "train.seed=0, this run 4"]),
])
def test_resume_with_another_data_loop_is_refused_naming_each_difference(base, tmp_path, change, expected):
  model_dir = _copy(base, tmp_path)
  before = testlib.tree_snapshot(model_dir)
  written = []
  with pytest.raises(UserError) as info:
    _run(model_dir, steps=4, write_config=written.append, **change)
  message = str(info.value)
  assert message.startswith(f"checkpoint step 3 of {model_dir / 'checkpoints'} was trained with another data loop")
  for line in expected:
    assert line in message
  assert len([line for line in message.splitlines() if "this run" in line]) == len(expected)
  assert "--gin.train.fresh_data_iterator=True" in message and "checkpoint's values" in message
  assert testlib.tree_snapshot(model_dir) == before and not written


@pytest.mark.slow  # Trains; tests/training/test_loop_checkpoints.py has the fake-model twin.
def test_fresh_data_iterator_resumes_the_model_with_a_new_iterator(base, tmp_path, capsys):
  model_dir = _copy(base, tmp_path)
  result = _run(model_dir, steps=5, batch_size=3, fresh_data_iterator=True)
  assert result.last_step == 5
  assert f"resumed from {model_dir / 'checkpoints' / '3'} with a new data iterator" in capsys.readouterr().out
  rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_iterator_of_another_pipeline_without_a_loop_record_is_a_user_error(base, tmp_path):
  # A checkpoint written before the loop was recorded: the mismatch shows only when the iterator is read.
  model_dir = _copy(base, tmp_path)
  meta_file = model_dir / "checkpoints" / "3" / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  del meta["loop"]
  meta_file.write_text(json.dumps(meta))
  with pytest.raises(UserError, match=r"does not fit this run's input pipeline .*fresh_data_iterator=True"):
    _run(model_dir, steps=4, batch_size=3)


@pytest.mark.slow  # Trains; the warning is checked below without training, the config order in test_loop.py.
def test_changed_train_steps_resumes_with_a_schedule_warning(base, tmp_path, capsys):
  model_dir = _copy(base, tmp_path)
  written, errs = [], []

  def write_config(directory):  # C8: after the restore, i.e. once "resumed from" is printed.
    captured = capsys.readouterr()
    written.append("resumed from" in captured.out)
    errs.append(captured.err)

  assert _run(model_dir, steps=4, write_config=write_config).last_step == 4
  err = "".join(errs) + capsys.readouterr().err
  warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1 and "TRAIN_STEPS=4 but checkpoint step 3 was trained with TRAIN_STEPS=3" in warnings[0]
  assert "learning-rate schedule" in warnings[0]
  assert written == [True]


def test_changed_train_steps_is_a_schedule_warning_not_a_refusal(base, capsys):
  """`pretrain`'s resume check on the checkpoint's own manifest and data loop, TRAIN_STEPS changed."""
  from flax_xalign.runs.checkpoints import read_run_spec
  from flax_xalign.training import checkpoints
  from flax_xalign.training import pretrain as pretrain_lib

  _, run, _ = read_run_spec(str(base))
  loop = checkpoints.loop_record(batch_size=6, task_feature_lengths={"tokens": 19}, task="tiny_mix", data_shards=None,
                                 seed=0, train_steps=3)
  saved, _ = pretrain_lib._check_resumable(str(base), 3, run, loop, fresh_data_iterator=False)
  assert saved == run and capsys.readouterr().err == ""
  pretrain_lib._check_resumable(str(base), 3, run, {**loop, "train_steps": 4}, fresh_data_iterator=False)
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 1 and warnings[0].startswith(
      "warning: TRAIN_STEPS=4 but checkpoint step 3 was trained with TRAIN_STEPS=3")
  assert "learning-rate schedule" in warnings[0]
  with pytest.raises(UserError, match="BATCH_SIZE=6, this run 3"):  # The data loop is still checked ...
    pretrain_lib._check_resumable(str(base), 3, run, {**loop, "batch_size": 3}, fresh_data_iterator=False)
  pretrain_lib._check_resumable(str(base), 3, run, {**loop, "batch_size": 3}, fresh_data_iterator=True)  # ... unless.


def _train_only_en(tiny_corpus):
  from flax_xalign.tasks import user

  user.TextTask(name="tiny_en_train_only", files={"train": tiny_corpus["files"][("en", "train")]}, lang="en",
                vocabulary_path=tiny_corpus["vocab"]).register()


@pytest.mark.slow  # Trains; the decision is checked below with the loop replaced.
def test_missing_eval_split_warns_and_trains_without_evaluation(tmp_path, tiny_corpus, capsys):
  _train_only_en(tiny_corpus)
  result = _run(tmp_path / "run", steps=3, task="tiny_en_train_only", eval_every=1, seed=3)
  assert result.last_step == 3
  err = capsys.readouterr().err
  assert [line for line in err.splitlines() if line.startswith("warning: ")] == [
      "warning: task tiny_en_train_only has no 'validation' split; training without evaluation (add that split "
      "to the task, name another with train.eval_split, or set EVAL_EVERY=0)"]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]


def test_missing_eval_split_warns_and_hands_the_loop_no_evaluation(tmp_path, tiny_corpus, capsys, monkeypatch):
  from flax_xalign.training import pretrain as pretrain_lib

  seen = {}
  monkeypatch.setattr(pretrain_lib, "train_loop", lambda **kwargs: seen.update(kwargs) or "not trained")
  _train_only_en(tiny_corpus)
  assert _run(tmp_path / "run", steps=3, task="tiny_en_train_only", eval_every=1, seed=3) == "not trained"
  err = capsys.readouterr().err
  assert [line for line in err.splitlines() if line.startswith("warning: ")] == [
      "warning: task tiny_en_train_only has no 'validation' split; training without evaluation (add that split "
      "to the task, name another with train.eval_split, or set EVAL_EVERY=0)"]
  assert seen["eval_batches"] is None and seen["trainer"].loop.eval_every == 0


@pytest.mark.slow  # Trains; tests/training/test_loop.py has the fake-model twin.
def test_eval_split_without_a_full_batch_warns_once_and_finishes(tmp_path, tiny_corpus, capsys):
  from flax_xalign.tasks import user

  small = tmp_path / "small.txt"
  small.write_text("the dog sees a cat\n", encoding="utf-8")
  user.TextTask(name="tiny_en_small_eval", files={"train": tiny_corpus["files"][("en", "train")],
                                                  "validation": str(small)},
                lang="en", vocabulary_path=tiny_corpus["vocab"]).register()
  result = _run(tmp_path / "run", steps=3, task="tiny_en_small_eval", eval_every=1, seed=3)
  assert result.last_step == 3
  warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 1 and "no full batch of BATCH_SIZE=6 at step 1" in warnings[0]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]


@pytest.mark.slow  # Trains; tests/training/test_loop.py has the fake-model twin.
def test_a_step_is_checkpointed_before_its_evaluation(tmp_path, tiny_corpus, monkeypatch):
  def failing(self, params, batches, *, max_batches, assets=None):
    raise RuntimeError("evaluation failed")

  monkeypatch.setattr(Trainer, "evaluate", failing)
  with pytest.raises(RuntimeError, match="evaluation failed"):
    _run(tmp_path / "run", steps=3, eval_every=3, task="tiny_en", seed=3)
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "3"]


@pytest.mark.slow  # Trains; tests/training/test_loop.py has the fake-model twin.
def test_compile_of_the_first_step_is_announced_and_timed(tmp_path, tiny_corpus, capsys):
  _run(tmp_path / "run", steps=1, task="tiny_en", seed=3)
  out = capsys.readouterr().out.splitlines()
  start = out.index("compiling the train step...")
  assert out[start + 1].startswith("  compiled and ran the first step in ") and out[start + 1].endswith(" s")
  assert out[start + 2].startswith("step 1/1")


def test_resume_may_change_the_attention_kernel_but_not_the_layer_layout():
  import dataclasses

  from flax_xalign import run_spec as run_spec_lib
  from flax_xalign.training import checkpoints

  vocabulary = run_spec_lib.VocabularySpec(file="vocabulary.model", sha256="cd" * 32, size=61, pieces=61)
  saved = run_spec_lib.RunSpec(
      task="t", languages=("de", "en"), task_feature_lengths={"tokens": 19}, vocabulary=vocabulary,
      model=testlib.tiny_encoder_config(vocab_size=61, attention_dropout_rate=0.0, dtype="bfloat16",
                                        attention_implementation="cudnn"),
      objectives={"mlm": 1.0})
  # Trained with cuDNN on a GPU, continued with XLA's attention elsewhere: same function, same parameters.
  on_cpu = dataclasses.replace(saved, model=saved.model.replace(attention_implementation="xla"))
  checkpoints.check_compatible(saved, on_cpu, where="x")
  unrolled = dataclasses.replace(saved, model=saved.model.replace(scan_layers=False))
  with pytest.raises(UserError, match="different model"):
    checkpoints.check_compatible(saved, unrolled, where="x")


def test_cudnn_attention_off_a_gpu_is_refused_before_anything_is_written(tmp_path, tiny_corpus):
  import jax

  if jax.default_backend() == "gpu":
    pytest.skip("this host has the GPU cuDNN attention needs")
  model_dir = tmp_path / "run"
  encoder = testlib.tiny_encoder_config(attention_dropout_rate=0.0, dtype="bfloat16",
                                        attention_implementation="cudnn")
  with pytest.raises(UserError, match="'cudnn' needs an NVIDIA GPU, and this process runs on cpu"):
    pretrain(model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
             batch_size=6, train_steps=2, encoder=encoder, objectives={"mlm": 1.0})
  assert not model_dir.exists()
