"""Re-registering a run's tasks in another process (`runs.tasks`): relocation, missing files, the run's
vocabulary copy, and how tasks registered in Python are recorded (`describe`)."""

import os
import shutil

import pytest
from flax_xalign.tasks import registry

from flax_xalign.errors import UserError
from flax_xalign.runs import tasks as run_tasks
from flax_xalign.run_spec import RunSpec, VocabularySpec
from tests.testlib import tiny_encoder_config


def _run(definitions, *, task="t_en", sha="ab" * 32):
  return RunSpec(task=task, languages=("en",), task_feature_lengths={"tokens": 19},
                 task_definitions=definitions,
                 vocabulary=VocabularySpec(file="vocabulary.model", sha256=sha, size=83, pieces=83),
                 model=tiny_encoder_config(vocab_size=83), objectives={"mlm": 1.0})


def _text_task(name, folder, *, vocabulary):
  files = {s: [os.path.join(folder, f"en.{s}.txt")] for s in ("train", "validation")}
  return {"kind": "TextTask", "args": {"name": name, "files": files, "lang": "en",
                                       "vocabulary_path": vocabulary, "normalize": ""}}


def test_relocated_replaces_the_longest_folder_prefix_only():
  moves = {"/data": "/new", "/data/en": "/elsewhere"}
  assert run_tasks.relocated("/data/de/a.txt", moves) == "/new/de/a.txt"
  assert run_tasks.relocated("/data/en/a.txt", moves) == "/elsewhere/a.txt"
  assert run_tasks.relocated("/database/a.txt", moves) == "/database/a.txt"  # not a folder of it
  assert run_tasks.relocated("/data", moves) == "/new"


def test_missing_recorded_file_names_it_and_the_relocate_setting(tmp_path):
  old = tmp_path / "old"
  run = _run([_text_task("rt_missing_en", str(old), vocabulary=str(tmp_path / "spm.model"))])
  with pytest.raises(UserError) as e:
    run_tasks.prepared_definitions(run, model_dir="runs/m", splits=("train", "validation"))
  message = str(e.value)
  assert str(old / "en.train.txt") in message and "1 more" in message
  assert f"--gin.evaluate.relocate=\"{{'{old}': '/NEW/FOLDER'}}\"" in message

  # Relocated to a folder that exists: the rewritten paths are what gets registered.
  new = tmp_path / "new"
  new.mkdir()
  for split in ("train", "validation"):
    (new / f"en.{split}.txt").write_text("a b\n")
  (tmp_path / "spm.model").write_bytes(b"x")
  [definition] = run_tasks.prepared_definitions(run, model_dir="runs/m", splits=("train", "validation"),
                                                relocate={str(old): str(new)})
  assert definition["args"]["files"] == {s: [str(new / f"en.{s}.txt")] for s in ("train", "validation")}
  # Still missing after relocation: the message gives both forms.
  (new / "en.validation.txt").unlink()
  with pytest.raises(UserError, match=f"{new / 'en.validation.txt'} \\(recorded as {old / 'en.validation.txt'}"):
    run_tasks.prepared_definitions(run, model_dir="runs/m", splits=("validation",),
                                   relocate={str(old): str(new)})


def test_an_unread_split_is_not_checked_and_a_missing_split_names_the_others(tmp_path):
  for split in ("train", "validation"):
    (tmp_path / f"en.{split}.txt").write_text("a b\n")
  (tmp_path / "spm.model").write_bytes(b"x")
  run = _run([_text_task("rt_split_en", str(tmp_path), vocabulary=str(tmp_path / "spm.model"))])
  (tmp_path / "en.validation.txt").unlink()
  run_tasks.prepared_definitions(run, model_dir="runs/m", splits=("train",))
  with pytest.raises(UserError, match="no 'test' files \\(it has train, validation\\).*--gin.SPLIT"):
    run_tasks.prepared_definitions(run, model_dir="runs/m", splits=("train", "test"))


def test_bad_relocate_setting_is_one_clear_error():
  with pytest.raises(UserError, match="evaluate.relocate must map"):
    run_tasks.prepared_definitions(_run([]), relocate=["/a", "/b"])


def test_a_deleted_vocabulary_file_is_replaced_by_the_runs_own_copy(tmp_path):
  for split in ("train", "validation"):
    (tmp_path / f"en.{split}.txt").write_text("a b\n")
  model_dir = tmp_path / "model"
  (model_dir / "checkpoints" / "5" / "assets").mkdir(parents=True)
  (model_dir / "vocabulary.model").write_bytes(b"v")
  run = _run([_text_task("rt_vocab_en", str(tmp_path), vocabulary=str(tmp_path / "gone.model"))])
  [definition] = run_tasks.prepared_definitions(run, model_dir=str(model_dir), step=5, splits=("train",))
  assert definition["args"]["vocabulary_path"] == str(model_dir / "vocabulary.model")
  # The checkpoint's own copy comes first.
  (model_dir / "checkpoints" / "5" / "assets" / "vocabulary.model").write_bytes(b"v")
  [definition] = run_tasks.prepared_definitions(run, model_dir=str(model_dir), step=5, splits=("train",))
  assert definition["args"]["vocabulary_path"] == str(model_dir / "checkpoints" / "5" / "assets" /
                                                       "vocabulary.model")
  # Neither copy: the missing file is named.
  shutil.rmtree(model_dir)
  with pytest.raises(UserError, match="gone.model does not exist"):
    run_tasks.prepared_definitions(run, model_dir=str(model_dir), step=5, splits=("train",))


def test_unregistrable_task_names_the_eval_settings_that_register_it():
  for definitions, why in ((None, "could not record"), ((), "not recorded in its run manifest")):
    with pytest.raises(UserError) as e:
      run_tasks.register_run_tasks(_run(definitions, task="rt_nowhere"), model_dir="runs/m")
    assert why in str(e.value) and "--gin.evaluate.import_modules" in str(e.value)
    assert "evaluate.user_tasks" in str(e.value)


def test_import_module_that_cannot_be_imported_is_one_clear_error():
  with pytest.raises(UserError, match="'no_such_module_xyz', which cannot be imported.*PYTHONPATH"):
    run_tasks.register_run_tasks(_run(None), import_modules=["no_such_module_xyz"])
  with pytest.raises(UserError, match="not a Python module name"):
    registry.PythonModule("os; rm").register()


def test_describe_records_the_module_of_a_task_registered_in_python(tiny_corpus):
  from tests.evaluation import python_registered_tasks as mod

  mod.register(tiny_corpus["files"][("en", "train")], tiny_corpus["vocab"])
  assert registry.describe(mod.TASK) == [{"kind": "PythonModule", "args": {"module": mod.__name__}}]
  # Both tasks and the mixture come from one module: one import re-registers all three.
  assert registry.describe(mod.MIXTURE) == [{"kind": "PythonModule", "args": {"module": mod.__name__}}]
  # Embedded tasks are registered by importing flax_xalign.tasks: nothing to record.
  assert registry.describe("bible_en_mlm") == []


def test_describe_gives_up_on_a_task_registered_by_a_script(tiny_corpus):
  from flax_xalign.tasks.user import FileLoader

  def loader(split):  # Defined here, as a script would: its module is what describe records.
    return FileLoader("rt_script_en", (("train", (tiny_corpus["files"][("en", "train")],)),), tsv=False)(split)

  loader.__module__ = "__main__"
  from flax_xalign.tasks import user
  registry.register_task("rt_script_en", loader=loader, vocabulary=user._vocabulary(tiny_corpus["vocab"]),
                         lang="en", splits=["train"])
  assert registry.describe("rt_script_en") is None
