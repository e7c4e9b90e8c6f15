"""End-to-end trainer behaviour on a tiny corpus: resume, bad input, NaN.

The runs that train several times (resume, NaN) are in the `slow` tier; the unit tier has their
fake-model twins in tests/training/test_loop.py, and checks here what `pretrain` itself decides.
"""

import json
import os
import signal

import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.objectives import base as objectives_base
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from flax_xalign.training.trainer import NonFiniteLossError

from tests.runs.tiny_run import tiny_mix_run
from tests.testlib import tree_snapshot

LENGTHS = {"tokens": 19}


# Shapes and model match tests/test_entry_points.py so that the persistent
# compilation cache serves both files.
def _run(model_dir, encoder, *, steps, task="tiny_mix", objectives=None, callback=None, every=3, **kw):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name=task, task_feature_lengths=LENGTHS,
      batch_size=6, train_steps=steps, encoder=encoder,
      objectives=objectives or {"mlm": 1.0, "tlm": 1.0},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=every, keep=2, async_save=True),
      log_every=1, seed=3, step_callback=callback, **kw)


def _losses(model_dir):
  rows = [json.loads(l) for l in open(os.path.join(model_dir, "metrics.jsonl"))]
  return {r["step"]: r for r in rows if "loss" in r}


@pytest.mark.slow  # Three tiny-encoder runs; test_loop.py has the fake-model twin.
def test_sigterm_then_resume_matches_uninterrupted(tmp_path, tiny_corpus, tiny_encoder):
  full = tmp_path / "full"
  _run(full, tiny_encoder, steps=7)

  def stop_at_4(step, metrics):
    if step == 4:
      os.kill(os.getpid(), signal.SIGTERM)

  resumed = tmp_path / "resumed"
  first = _run(resumed, tiny_encoder, steps=7, callback=stop_at_4)
  assert first.interrupted and first.last_step == 4
  assert sorted(os.listdir(resumed / "checkpoints")) == ["3", "4"]
  second = _run(resumed, tiny_encoder, steps=7)
  assert not second.interrupted and second.last_step == 7

  a, b = _losses(full), _losses(resumed)
  assert sorted(b) == list(range(1, 8)), "metrics.jsonl should read as one run"
  for step in range(1, 8):
    for key in ("loss", "mlm", "tlm", "learning_rate"):
      np.testing.assert_allclose(b[step][key], a[step][key], rtol=1e-5, err_msg=f"{key} at step {step}")
  assert os.path.isdir(resumed / "tensorboard") and os.listdir(resumed / "tensorboard")


def test_checkpoint_with_other_vocabulary_is_refused(tmp_path_factory, tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.tasks import user

  model_dir = tiny_mix_run(tmp_path_factory, tiny_corpus, "other_vocabulary")
  other = vocab.train_sentencepiece(
      open(tiny_corpus["files"][("en", "train")], encoding="utf-8"), vocab_size=37,
      model_path=tmp_path / "other.model")
  user.TextTask(name="tiny_en_other_vocab", files={"train": tiny_corpus["files"][("en", "train")]},
                lang="en", vocabulary_path=str(other)).register()
  before = tree_snapshot(model_dir)
  with pytest.raises(UserError, match="different vocabulary"):
    _run(model_dir, tiny_encoder, steps=6, task="tiny_en_other_vocab", objectives={"mlm": 1.0})
  assert tree_snapshot(model_dir) == before


@objectives_base.register("test_nan")
class _NanObjective:
  needs_all_hidden = False

  def __call__(self, ctx):
    return objectives_base.LossTerm(loss=jnp.float32(jnp.nan) * ctx.logits.mean(), metrics={})


@pytest.mark.slow  # Three tiny-encoder runs; test_loop.py has the fake-model twin.
def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_corpus, tiny_encoder):
  model_dir = tmp_path / "run"
  _run(model_dir, tiny_encoder, steps=3)
  with pytest.raises(NonFiniteLossError, match="step 4"):
    _run(model_dir, tiny_encoder, steps=6, objectives={"mlm": 1.0, "test_nan": 1.0})
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["3"]
  # The good checkpoint still resumes.
  result = _run(model_dir, tiny_encoder, steps=4)
  assert result.last_step == 4


def test_unknown_task_is_a_clear_error(tmp_path, tiny_corpus, tiny_encoder):
  with pytest.raises(UserError, match="tiny_mix"):
    _run(tmp_path / "x", tiny_encoder, steps=2, task="tiny_mixx")
  assert not (tmp_path / "x").exists()


@pytest.mark.slow  # A run of its own; the plumbing is checked without training below.
def test_pair_layout_reaches_the_data_and_the_manifest(tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.runs.checkpoints import read_run_spec

  result = _run(tmp_path / "cont", tiny_encoder, steps=2, pair_layout="continuous",
                bitext_both_directions=True, loss_normalization="pooled")
  assert result.last_step == 2
  _, run, _ = read_run_spec(str(tmp_path / "cont"))
  assert run.pair_layout == "continuous"
  assert all(np.isfinite(r["loss"]) for r in _losses(tmp_path / "cont").values())


def _pair_positions(batch):
  """The positions of every packed example of `batch` that is a pair (both sides present)."""
  out = []
  for seg, pos, side in zip(batch["segment_ids"], batch["positions"], batch["pair_side"]):
    for s in set(seg[seg > 0].tolist()):
      if {1, 2} <= set(side[seg == s].tolist()):
        out.append(pos[seg == s])
  return out


def _runs_on(positions):
  return np.array_equal(positions, np.arange(positions[0], positions[0] + len(positions)))


def test_pair_layout_reaches_the_pipeline_the_model_and_the_manifest(tmp_path, tiny_corpus, tiny_encoder,
                                                                     monkeypatch):
  """What `pretrain` hands the loop (replaced here: nothing compiles) under pair_layout="continuous"."""
  from flax_xalign.training import pretrain as pretrain_lib

  seen = {}

  def no_training(**kwargs):
    seen.clear()
    seen.update(kwargs)
    return "not trained"

  monkeypatch.setattr(pretrain_lib, "train_loop", no_training)
  runs = {}
  for layout in ("continuous", "restart"):
    assert _run(tmp_path / layout, tiny_encoder, steps=2, pair_layout=layout, bitext_both_directions=True,
                loss_normalization="pooled") == "not trained"
    batch = {k: np.asarray(v) for k, v in next(seen["train_iterator"]).items()}
    runs[layout] = (seen["run"], seen["trainer"], _pair_positions(batch))
  run, trainer, pairs = runs["continuous"]
  assert run.pair_layout == "continuous" and run.bitext_both_directions is True
  assert trainer.model.loss_normalization == "pooled"
  # Positions run on across the two sides of every pair ...
  assert pairs and all(_runs_on(pos) for pos in pairs)
  # ... where the default layout restarts them for the second side.
  assert runs["restart"][0].pair_layout == "restart"
  assert runs["restart"][2] and not any(_runs_on(pos) for pos in runs["restart"][2])


@pytest.mark.parametrize("kw, message", [
    ({"pair_layout": "xlmr"}, "pair_layout='xlmr'"),
    ({"loss_normalization": "mean"}, "loss_normalization='mean'"),
    ({"task_feature_lengths": {"tokens": 40}}, "exceeds the model's 32 positions"),
])
def test_bad_layout_normalisation_or_row_length_is_refused_before_writing(tmp_path, tiny_corpus, tiny_encoder,
                                                                         kw, message):
  run = {"model_dir": str(tmp_path / "x"), "mixture_or_task_name": "tiny_mix", "task_feature_lengths": LENGTHS,
         "batch_size": 6, "train_steps": 2, "encoder": tiny_encoder, "objectives": {"mlm": 1.0, "tlm": 1.0}}
  with pytest.raises(UserError, match=message):
    pretrain(**{**run, **kw})
  assert not (tmp_path / "x").exists()
