"""`Run.open`: a run written by the training stack opens with its manifest, params, assets and vocabulary.

The run directory is made here by the current writer (`pretrain`, three
steps on `tiny_mix`, checkpoints at 2 and 3), so the test covers the layout
every existing MODEL_DIR has. The references are independent of the reader:
the parameters `pretrain` returned in memory, the manifest JSON read straight
from the step's `meta/` folder, the asset and vocabulary files read with their
own loaders, and the layout's file names spelled out literally.
"""

import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.assets import lang_vocab
from flax_xalign.errors import UserError
from flax_xalign.objectives import base as objectives_base
from flax_xalign.run_dir import RunDir
from flax_xalign.run_spec import RunSpec
from flax_xalign.runs import Run
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

MIN_COUNT = 5


@objectives_base.register("test_run_handle_lang_vocab")
class LangVocabProbe(objectives_base.ObjectiveBase):
  """A zero loss that needs the `lang_vocab` asset, so every checkpoint step saves one."""

  requires = ("lang_vocab",)

  def __call__(self, ctx):
    count = jnp.sum(ctx.assets["lang_vocab"]["mask"].astype(jnp.float32))
    return objectives_base.LossTerm(loss=jnp.zeros((), jnp.float32), metrics={"entries": count})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_corpus):
  """(MODEL_DIR, the final params pretrain returned) of a 3-step run with checkpoints at steps 2 and 3."""
  model_dir = tmp_path_factory.mktemp("run_handle") / "run"
  result = pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=3, encoder=tiny_encoder_config(),
      objectives={"mlm": 1.0, "test_run_handle_lang_vocab": 0.5},
      asset_options={"lang_vocab": {"min_count": MIN_COUNT}},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
      checkpoint=CheckpointConfig(every_steps=2, keep=5, async_save=False), log_every=1, seed=3)
  return model_dir, jax.device_get(result.state.params)


def _saved_manifest(step_dir):
  """The run manifest as JSON, read from the step's meta/ folder without Orbax."""
  meta_dir = step_dir / "meta"
  texts = [p.read_text() for p in meta_dir.rglob("*") if p.is_file()]
  metas = [json.loads(t) for t in texts if t.lstrip().startswith("{") and '"run"' in t]
  assert len(metas) == 1, f"expected one JSON file with the manifest under {meta_dir}"
  return metas[0]["run"]


def test_layout_names_are_the_files_training_writes(trained):
  model_dir, _ = trained
  run_dir = RunDir(str(model_dir))
  assert run_dir.checkpoints == f"{model_dir}/checkpoints"
  assert run_dir.metrics == f"{model_dir}/metrics.jsonl"
  assert run_dir.lock == f"{model_dir}/.lock"
  assert run_dir.config_gin == f"{model_dir}/config.gin"
  assert run_dir.eval_json == f"{model_dir}/eval.json"
  assert run_dir.damaged == f"{model_dir}/checkpoints_damaged"
  assert run_dir.tensorboard == f"{model_dir}/tensorboard"
  assert run_dir.step_dir(3) == f"{model_dir}/checkpoints/3"
  assert run_dir.step_assets(3) == f"{model_dir}/checkpoints/3/assets"
  assert run_dir.assets == str(model_dir)
  for path in (run_dir.checkpoints, run_dir.metrics, run_dir.lock, run_dir.tensorboard, run_dir.step_dir(2)):
    assert os.path.exists(path), path
  assert {"lang_vocab.tsv", "vocabulary.model"} <= set(os.listdir(run_dir.step_assets(3)))
  assert os.path.isfile(run_dir.file("vocabulary.model")) and os.path.isfile(run_dir.file("lang_vocab.tsv"))


def test_open_reads_the_manifest_and_the_params_training_saved(trained):
  model_dir, final_params = trained
  run = Run.open(str(model_dir))
  assert (run.step, run.latest_step, run.path) == (3, 3, str(model_dir))
  assert run.spec == RunSpec.from_json(_saved_manifest(model_dir / "checkpoints" / "3"))
  assert run.spec.task == "tiny_mix" and run.spec.languages == ("de", "en")
  assert sorted(run.fingerprints) == ["lang_vocab", "vocabulary"]
  params = run.params()
  assert jax.tree.structure(params) == jax.tree.structure(final_params)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(final_params)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  # The model is the plain MLM pass over those params: its init has the same tree.
  shapes = jax.eval_shape(lambda k: run.model.init(k, batch=1, length=8), jax.random.key(0))
  assert jax.tree.structure(nn.meta.unbox(shapes)) == jax.tree.structure(params)
  # An earlier step: its own params (the model trained one more step after it).
  earlier = Run.open(str(model_dir), step=2)
  assert earlier.step == 2 and earlier.latest_step == 3 and run.at(2).step == 2 and run.at(None) is run
  differ = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(earlier.params()), jax.tree.leaves(params))]
  assert any(differ)


def test_assets_are_the_step_files_checked_against_the_manifest(trained, tmp_path):
  model_dir, _ = trained
  run = Run.open(str(model_dir))
  value = run.assets(("lang_vocab",))["lang_vocab"]
  reader = lang_vocab.LangVocab(languages=("de", "en"), min_count=MIN_COUNT, split="train")
  on_disk = reader.load(str(model_dir / "checkpoints" / "3" / "assets"))
  assert sorted(value) == sorted(on_disk)
  for key in on_disk:
    np.testing.assert_array_equal(value[key], on_disk[key], err_msg=key)
  assert value["mask"].any()
  # A step file edited by hand is refused, never used.
  copy = tmp_path / "edited"
  shutil.copytree(model_dir, copy)
  tsv = copy / "checkpoints" / "3" / "assets" / "lang_vocab.tsv"
  lines = tsv.read_text().splitlines()
  tsv.write_text("\n".join(lines[:-1]) + "\n")
  with pytest.raises(UserError):
    Run.open(str(copy)).assets(("lang_vocab",))


def test_vocabulary_falls_back_to_the_step_copy_and_checks_an_explicit_file(trained, tiny_corpus, tmp_path):
  from flax_xalign.data.vocab import sentencepiece as vocab
  model_dir, _ = trained
  reference = vocab.load_vocabulary(tiny_corpus["vocab"])
  text = "the house and das haus"
  assert list(Run.open(str(model_dir)).vocabulary().encode(text)) == list(reference.encode(text))
  copy = tmp_path / "run"
  shutil.copytree(model_dir, copy)
  (copy / "vocabulary.model").unlink()
  assert list(Run.open(str(copy)).vocabulary().encode(text)) == list(reference.encode(text))
  for step in (2, 3):
    (copy / "checkpoints" / str(step) / "assets" / "vocabulary.model").unlink()
  with pytest.raises(UserError, match="vocabulary.model is missing"):
    Run.open(str(copy)).vocabulary()
  assert list(Run.open(str(copy)).vocabulary(path=tiny_corpus["vocab"]).encode(text)) == list(reference.encode(text))
  other = vocab.train_sentencepiece(open(tiny_corpus["files"][("en", "train")], encoding="utf-8"),
                                    vocab_size=37, model_path=tmp_path / "other.model")
  with pytest.raises(UserError, match="is not the vocabulary"):
    Run.open(str(copy)).vocabulary(path=str(other))


def test_task_data_is_the_runs_task_and_refuses_another_language_set(trained):
  model_dir, _ = trained
  run = Run.open(str(model_dir))
  run.register_tasks()  # Registered already: nothing to do.
  data = run.task_data("validation")
  assert list(data.languages) == list(run.spec.languages)
  assert data.vocabulary_spec.sha256 == run.spec.vocabulary.sha256
  with pytest.raises(UserError, match=r"'tiny_en' has languages \['en'\] but .* was trained on \['de', 'en'\]"):
    run.task_data("validation", name="tiny_en")


def test_a_folder_without_checkpoints_is_refused_and_left_as_it_was(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(UserError, match="has no checkpoint"):
    Run.open(str(empty))
  with pytest.raises(UserError, match="has no checkpoint"):
    Run.open(str(tmp_path / "missing"))
  assert os.listdir(empty) == [] and not (tmp_path / "missing").exists()


def test_run_dir_from_user_expands_and_refuses_as_check_model_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert RunDir.from_user("~/runs/x").path == str(tmp_path / "runs" / "x")
  with pytest.raises(UserError, match="is not a folder name"):
    RunDir.from_user("")
  (tmp_path / "f").write_text("x")
  with pytest.raises(UserError, match="is a file"):
    RunDir.from_user(str(tmp_path / "f"))
  assert RunDir.from_user(str(tmp_path / "f"), writable=False).path == str(tmp_path / "f")


def test_a_damaged_newest_step_is_skipped_with_one_warning_and_left_in_place(trained, tmp_path, capfd):
  import shutil

  model_dir, _ = trained
  copy = tmp_path / "model"
  shutil.copytree(model_dir, copy)
  newest = max(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
  shutil.rmtree(copy / "checkpoints" / str(newest) / "state")  # an interrupted or hand-damaged save
  before = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
  run = Run.open(str(copy))
  assert run.step < newest and run.latest_step == newest
  err = capfd.readouterr().err.strip().splitlines()
  assert err == [f"warning: checkpoint step {newest} of {copy} is damaged (state/ is missing); reading step "
                 f"{run.step}, the newest complete one"], err
  assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == before  # a reader moves nothing


def test_a_renamed_step_folder_is_seen_for_what_it_is(trained, tmp_path, capfd):
  import shutil

  model_dir, _ = trained
  copy = tmp_path / "model"
  shutil.copytree(model_dir, copy)
  steps = sorted(int(p.name) for p in (copy / "checkpoints").iterdir() if p.name.isdigit())
  renamed = steps[-1] + 10
  (copy / "checkpoints" / str(steps[-1])).rename(copy / "checkpoints" / str(renamed))
  run = Run.open(str(copy))  # the newest complete step is the one before
  assert run.step == steps[-2]
  err = capfd.readouterr().err
  assert f"step {renamed} of {copy} is damaged (it holds the files of step {steps[-1]}: the folder was renamed" in err
  with pytest.raises(UserError, match=f"it holds the files of step {steps[-1]}"):
    Run.open(str(copy), step=renamed)
