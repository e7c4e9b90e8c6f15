"""A run written BEFORE the redesign (flax_xalign d0e6acf) opens, reads and resumes unchanged.

`data/run_d0e6acf/` was made by `data/make_old_run.py` run against the tree
of commit d0e6acf (the last commit before issue 22 moved the readers to
`runs/`, the loop to hooks and the assets into the train state): a 2-step
MLM + TLM run on three user tasks, its data files and SentencePiece model,
and the parameters `pretrain` returned in memory (`params_step2.npz`), the
independent reference here. The recorded file paths point at the folder it
was written in; the tests move the data as a user would and say so with
`relocate`.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest
import sentencepiece as spm
from flax import traverse_util

from flax_xalign.runs import Run
from flax_xalign.tasks import user
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

FIXTURE = pathlib.Path(__file__).parent / "data" / "run_d0e6acf"


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
  """(MODEL_DIR, data folder, the data folder recorded in the manifest) of a copy of the old run.

  One copy for the module (the tasks it registers keep their names and paths); the resume test,
  which writes, comes last.
  """
  root = tmp_path_factory.mktemp("old_run") / "old"
  shutil.copytree(FIXTURE, root)
  recorded = json.loads((FIXTURE / "ORIGIN.json").read_text())["data_root"]
  return root / "run", root / "data", recorded


def test_old_run_opens_with_its_manifest_params_and_vocabulary(old_run):
  model_dir, data, _ = old_run
  run = Run.open(str(model_dir))
  assert run.latest_step == 2 and run.step == 2
  assert run.spec.task == "old_mix"
  assert set(run.spec.objectives) == {"mlm", "tlm"}

  saved = np.load(FIXTURE / "params_step2.npz")
  params = traverse_util.flatten_dict(run.params())
  assert {"/".join(k) for k in params} == set(saved.files)
  for key, value in params.items():
    np.testing.assert_array_equal(np.asarray(value), saved["/".join(key)], err_msg="/".join(key))

  reference = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
  text = "the big dog sees the old tree"
  assert list(run.vocabulary().encode(text)) == reference.encode(text)


def test_old_run_tasks_reregister_from_moved_data(old_run):
  model_dir, data, recorded = old_run
  run = Run.open(str(model_dir))
  task = run.task_data("validation", relocate={recorded: str(data)})
  assert list(task.languages) == list(run.spec.languages)
  batch = next(task.dataset(feature_lengths=dict(run.spec.task_feature_lengths), batch_size=2, seed=0,
                            split="validation", shuffle=False, num_epochs=1).as_numpy_iterator())
  assert batch["tokens"].shape == (2, 19)
  # The first validation line, tokenised by the data folder's own SentencePiece model, opens a row.
  first = (data / "en.validation.txt").read_text(encoding="utf-8").splitlines()[0]
  ids = spm.SentencePieceProcessor(model_file=str(data / "spm.model")).encode(first)
  rows = [list(r) for r in batch["tokens"]]
  assert any(r[:len(ids)] == ids or r[1:1 + len(ids)] == ids for r in rows), (first, ids, rows)


def _old_tasks(data):
  """The old run's tasks, registered from the moved data folder."""
  files = {(lang, split): str(data / f"{lang}.{split}.{'tsv' if lang == 'de_en' else 'txt'}")
           for lang in ("en", "de", "de_en") for split in ("train", "validation")}
  vocab = str(data / "spm.model")
  tasks = [
      user.TextTask(name="old_en", files={s: files[("en", s)] for s in ("train", "validation")}, lang="en",
                    vocabulary_path=vocab),
      user.TextTask(name="old_de", files={s: files[("de", s)] for s in ("train", "validation")}, lang="de",
                    vocabulary_path=vocab),
      user.TsvBitextTask(name="old_de_en", files={s: files[("de_en", s)] for s in ("train", "validation")},
                         lang_a="de", lang_b="en", vocabulary_path=vocab),
      user.AlphaMixture(name="old_mix", tasks=("old_en", "old_de", "old_de_en")),
  ]
  return tasks


def _resume(model_dir, data):
  """`pretrain` with the old run's settings, one step more."""
  return pretrain(model_dir=str(model_dir), mixture_or_task_name="old_mix", task_feature_lengths={"tokens": 19},
                  batch_size=4, train_steps=3, encoder=tiny_encoder_config(),
                  objectives={"mlm": 1.0, "tlm": 1.0},
                  optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
                  checkpoint=CheckpointConfig(every_steps=2, keep=2, async_save=False), log_every=1, seed=5,
                  user_tasks=_old_tasks(data))


def test_old_run_restores_into_the_new_trainer(old_run, tmp_path, monkeypatch):
  """All of a resume but the step: `pretrain` accepts the run, the new loop restores state and iterator."""
  from flax_xalign.training import loop as loop_lib
  from flax_xalign.training import pretrain as pretrain_lib

  model_dir = tmp_path / "run"
  shutil.copytree(old_run[0], model_dir)  # The module's copy stays untouched for the resume test.
  restored = {}

  def restore_only(**kw):
    restored["step"], restored["state"], iterator = loop_lib._restore_or_init(
        kw["trainer"], kw["checkpointer"], kw["train_iterator"], kw["new_train_iterator"], restore_iterator=True,
        check_step=kw["check_step"], init_params=None, on_resume=None)
    restored["batch"] = next(iterator)
    return "not trained"

  monkeypatch.setattr(pretrain_lib, "train_loop", restore_only)
  assert _resume(model_dir, old_run[1]) == "not trained"
  assert restored["step"] == 2 and int(restored["state"].step) == 2
  saved = np.load(FIXTURE / "params_step2.npz")
  params = traverse_util.flatten_dict(restored["state"].params)
  assert {"/".join(k) for k in params} == set(saved.files)
  for key, value in params.items():
    np.testing.assert_array_equal(np.asarray(value), saved["/".join(key)], err_msg="/".join(key))
  assert np.asarray(restored["batch"]["tokens"]).shape == (4, 19)  # The restored iterator reads on.


@pytest.mark.slow  # Trains a step; the restore itself is checked without training above.
def test_old_run_resumes_with_the_new_trainer(old_run):
  model_dir, data, _ = old_run
  result = _resume(model_dir, data)
  rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3]  # the old rows kept, one new step appended
  assert np.isfinite(rows[-1]["loss"])
  assert int(result.state.step) == 3
  assert Run.open(str(model_dir)).latest_step == 3
