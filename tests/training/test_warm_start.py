"""XLM-Align continues from a cold-start run: warm start and the DWA terms."""

import json
import os

import jax
import numpy as np
import pytest
from flax import traverse_util

from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.dwa import DwaConfig
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.runs.checkpoints import read_run_spec
from flax_xalign.training.checkpoints import CheckpointConfig, restore_params, warm_start_params
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.runs.tiny_run import tiny_mix_run
from tests.testlib import tiny_encoder_config

LENGTHS = {"tokens": 19}


def _run(model_dir, encoder, *, steps, task="tiny_mix", objectives=None, **kw):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name=task, task_feature_lengths=LENGTHS,
      batch_size=6, train_steps=steps, encoder=encoder,
      objectives=objectives or {"mlm": 1.0, "tlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=3, keep=2, async_save=True),
      log_every=1, seed=3, **kw)


@pytest.fixture(scope="module")
def cold_run(tmp_path_factory, tiny_corpus):
  """A cold-start run: a copy of the shared 3-step MLM run on tiny_mix, and its encoder config."""
  return tiny_mix_run(tmp_path_factory, tiny_corpus, "cold"), tiny_encoder_config()


def _flat(tree):
  return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


def test_warm_start_loads_shared_params_and_keeps_new_heads(cold_run):
  model_dir, encoder = cold_run
  _, run, _ = read_run_spec(str(model_dir))
  config = encoder.replace(vocab_size=run.model.vocab_size, pointer_head=True)
  model = PretrainingModel(encoder=Encoder(config), objectives={"dwa": 1.0})
  fresh = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                       model.init(jax.random.key(5), batch=1, length=8), is_leaf=lambda x: hasattr(x, "unbox"))
  warm, missing = warm_start_params(str(model_dir), fresh)
  assert missing == ["pointer_key/bias", "pointer_key/kernel", "pointer_query/bias", "pointer_query/kernel"]
  cold_params = {k: v for k, v in _flat(fresh).items() if not k.startswith("pointer")}
  saved = _flat(restore_params(str(model_dir), traverse_util.unflatten_dict(
      {tuple(k.split("/")): jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in cold_params.items()})))
  got = _flat(warm)
  for name in cold_params:
    np.testing.assert_array_equal(got[name], saved[name], err_msg=name)
  for name in missing:
    np.testing.assert_array_equal(got[name], _flat(fresh)[name])
  assert not np.array_equal(got["token_embed/embedding"], _flat(fresh)["token_embed/embedding"])


@pytest.mark.slow  # Compiles and trains the DWA model (~25 s of CPU); the warm start itself is checked above.
def test_xlm_align_run_from_cold_start_logs_dwa(tmp_path, cold_run):
  model_dir, encoder = cold_run
  out = tmp_path / "xlm_align"
  _run(out, encoder, steps=2, objectives={"mlm": 1.0, "tlm": 1.0, "dwa": 1.0},
       objective_options={"dwa": DwaConfig(self_label_layer=1)}, init_from_checkpoint=str(model_dir))
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  train_rows = [r for r in rows if "dwa" in r]
  assert len(train_rows) == 2
  for row in train_rows:
    assert np.isfinite(row["dwa"]) and row["dwa_labels"] > 0 and row["dwa_entropy"] >= 0
  _, run, _ = read_run_spec(str(out))
  assert run.model.pointer_head is True
  assert run.init_from_checkpoint == str(model_dir)
  assert run.objective_options["dwa"]["self_label_layer"] == 1
  assert run.objective_options["dwa"]["solver"]["sinkhorn_iters"] == 2


def test_warm_start_from_other_vocabulary_is_refused(tmp_path, tiny_corpus, cold_run):
  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.tasks import user

  model_dir, encoder = cold_run
  other = vocab.train_sentencepiece(
      open(tiny_corpus["files"][("en", "train")], encoding="utf-8"), vocab_size=37,
      model_path=tmp_path / "other.model")
  user.TextTask(name="tiny_en_warm_other_vocab", files={"train": tiny_corpus["files"][("en", "train")]},
                lang="en", vocabulary_path=str(other)).register()
  target = tmp_path / "never_written"
  with pytest.raises(UserError, match="different vocabulary"):
    _run(target, encoder, steps=2, task="tiny_en_warm_other_vocab", init_from_checkpoint=str(model_dir),
         objectives={"mlm": 1.0})
  assert not target.exists()


def test_warm_start_from_missing_dir_is_one_clear_error(tmp_path, cold_run):
  _, encoder = cold_run
  with pytest.raises(UserError, match="No checkpoints at"):
    _run(tmp_path / "x", encoder, steps=2, init_from_checkpoint=str(tmp_path / "nowhere"))
  assert not (tmp_path / "nowhere").exists()


def _linked_task(tmp_path, tiny_corpus, name):
  """tiny_corpus's de-en bitext with its true word links (word i translates word i) as a Pharaoh file."""
  from flax_xalign.tasks import user

  tsv = tiny_corpus["files"][("de_en", "train")]
  lines = [line.split("\t") for line in open(tsv, encoding="utf-8") if line.strip()]
  links = tmp_path / "de_en.links"
  links.write_text("".join(" ".join(f"{i}-{i}" for i in range(len(a.split()))) + "\n" for a, _ in lines))
  user.TsvBitextTask(name=name, files={"train": tsv, "validation": tiny_corpus["files"][("de_en", "validation")]},
                     lang_a="de", lang_b="en", vocabulary_path=tiny_corpus["vocab"],
                     links={"train": str(links)}).register()
  return name


@pytest.mark.slow  # Compiles and trains the DWA model for 2 steps (~25 s of CPU).
def test_dwa_learns_from_given_links(tmp_path, tiny_corpus, cold_run):
  model_dir, encoder = cold_run
  task = _linked_task(tmp_path, tiny_corpus, "tiny_de_en_linked")
  out = tmp_path / "distilled"
  _run(out, encoder, steps=2, task=task, objectives={"tlm": 1.0, "dwa": 1.0},
       objective_options={"dwa": DwaConfig(label_source="links")}, init_from_checkpoint=str(model_dir))
  rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  train_rows = [r for r in rows if "dwa" in r]
  assert len(train_rows) == 2
  for row in train_rows:
    # Every label is a given link (the self-labelling pass is skipped), and there are many of them.
    assert np.isfinite(row["dwa"]) and row["dwa_given"] > 20 and row["dwa_labels"] == row["dwa_given"]
  assert read_run_spec(str(out))[1].objective_options["dwa"]["label_source"] == "links"
