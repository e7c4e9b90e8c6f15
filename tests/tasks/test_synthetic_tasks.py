"""Synthetic-language seqio tasks and an ALIGN-MLM run on them."""

import json
import os
import signal
import subprocess
import sys

import pytest

from flax_xalign.data.transforms.synthetic import SyntheticLanguage

V = 211


@pytest.fixture(scope="module")
def suite(bible_data_dir):
  from flax_xalign.tasks import synthetic

  language = SyntheticLanguage(transforms="trans_inv", vocab_size=V, seed=0)
  return language, synthetic.register_synthetic(language)


def test_streams_transliterate_and_invert(suite):
  from flax_xalign.data import pipeline
  from flax_xalign.tasks import get_provider, get_vocabulary, languages_of

  language, names = suite
  assert get_vocabulary(names["mlm"]).vocab_size == 2 * V
  assert languages_of(names["xlm"]) == ("grc", "grc~trans_inv")
  nat = next(get_provider(names["natural"]).get_dataset({"tokens": 64}, split="test", shuffle=False)
             .as_numpy_iterator())
  der = next(get_provider(names["derived"]).get_dataset({"tokens": 64}, split="test", shuffle=False)
             .as_numpy_iterator())
  assert nat["tokens"].max() < V and der["tokens"].min() >= V
  # Word order inverted; every subword transliterated.
  vocab = get_vocabulary(names["natural"]).base
  nat_words = vocab.decode(nat["tokens"].tolist()).split()
  der_words = vocab.decode((der["tokens"] - V).tolist()).split()
  assert der_words == nat_words[::-1]
  from flax_xalign import tasks

  provider, languages, _ = tasks.resolve(names["xlm"])
  batch = next(pipeline.get_dataset(provider, languages=languages, split="train", feature_lengths={"tokens": 48},
                                    batch_size=8, seed=0).as_numpy_iterator())
  pairs = batch["pair_side"] > 0
  assert pairs.any()
  side2 = batch["tokens"][(batch["pair_side"] == 2) & (batch["tokens"] >= 5)]
  assert (side2 >= V).all()


def test_align_mlm_assets_are_drawn_once_and_then_kept(tmp_path, suite, tiny_encoder):
  """The unit-tier part of the run below, without training: `assets_only` (the assets command's path)."""
  from flax_xalign.training.pretrain import pretrain

  _, names = suite
  model_dir = tmp_path / "assets"

  def assets(rate):
    return pretrain(model_dir=str(model_dir), mixture_or_task_name=names["mlm"], task_feature_lengths={"tokens": 19},
                    batch_size=6, train_steps=2, encoder=tiny_encoder.replace(num_languages=0),
                    objectives={"mlm": 1.0, "align": 10.0}, seed=5, dictionary_rate=rate, assets_only=True)

  run = assets(0.25)
  text = (model_dir / "dictionary.tsv").read_text().splitlines()
  assert text[0] == "natural_id\tderived_id\tpiece" and len(text) - 1 == round(0.25 * (V - 5))
  assert set(run.assets) >= {"dictionary", "token_map", "vocabulary"}
  before = (model_dir / "dictionary.tsv").read_bytes()
  assets(0.5)  # The files in MODEL_DIR win over a new rate.
  assert (model_dir / "dictionary.tsv").read_bytes() == before
  assert not (model_dir / "checkpoints").exists()


@pytest.mark.slow  # Two training runs and an evaluation (~50 s); the test above covers the assets without training.
def test_align_mlm_run_saves_dictionary_and_logs_alignment(tmp_path, suite, tiny_encoder):
  from flax_xalign.training.checkpoints import CheckpointConfig
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.pretrain import pretrain

  language, names = suite
  model_dir = tmp_path / "align"

  def run(steps, rate):
    return pretrain(model_dir=str(model_dir), mixture_or_task_name=names["mlm"],
                    task_feature_lengths={"tokens": 19}, batch_size=6, train_steps=steps,
                    encoder=tiny_encoder.replace(num_languages=0), objectives={"mlm": 1.0, "align": 10.0},
                    optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
                    checkpoint=CheckpointConfig(every_steps=2, keep=2, async_save=False),
                    log_every=1, eval_every=2, eval_batches=1, seed=5, dictionary_rate=rate)

  run(2, 0.25)
  text = (model_dir / "dictionary.tsv").read_text().splitlines()
  assert text[0] == "natural_id\tderived_id\tpiece" and len(text) - 1 == round(0.25 * (V - 5))
  rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  evals = [r for r in rows if "eval_alignment_all" in r]
  assert evals and 0.0 <= evals[-1]["eval_alignment_heldout"] <= 1.0
  assert any("align_cosine" in r for r in rows)
  before = (model_dir / "dictionary.tsv").read_bytes()
  run(3, 0.5)  # resume: the saved dictionary wins over a new rate
  assert (model_dir / "dictionary.tsv").read_bytes() == before

  from flax_xalign.evaluation import mlm_eval
  from flax_xalign.runs import Run
  results = mlm_eval.evaluate(Run.open(model_dir), split="test", batch_size=4, max_batches=2,
                              baseline_batches=2, output=None)
  assert set(results["alignment"]) >= {"all", "heldout", "count_all", "count_heldout"}
  assert results["alignment"]["count_all"] == V - 5


def test_dictionary_objectives_refuse_natural_tasks(tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.errors import UserError
  from flax_xalign.training.pretrain import pretrain

  with pytest.raises(UserError, match="need the asset 'dictionary'.*transliterated synthetic languages"):
    pretrain(model_dir=str(tmp_path / "x"), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
             batch_size=6, train_steps=1, encoder=tiny_encoder, objectives={"mlm": 1.0, "align": 10.0})
  assert not os.path.exists(tmp_path / "x")


def _script(*args):
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "tests.tasks.synthetic_run_script", *map(str, args)], env=env,
                        capture_output=True, text=True, timeout=900, cwd=repo)


def _losses(model_dir):
  rows = [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]
  return {r["step"]: {k: v for k, v in r.items() if k not in ("tokens_per_sec", "steps_per_sec",
                                                                "model_tflops_per_sec")}
          for r in rows if "loss" in r}


def _refused_in_process(model_dir, steps, objective):
  """The script's run in this process, which must refuse: the refusal's message (`_script` in a child paid
  ~20 s of CPU for TensorFlow and the task registration before the same check)."""
  from flax_xalign.errors import UserError
  from tests.tasks import synthetic_run_script

  with pytest.raises(UserError) as refused:
    synthetic_run_script.main(str(model_dir), steps, objective, None)
  return str(refused.value)


# Three training processes and two refused resumes in this one (~2 min). In the unit tier:
# tests/training/test_loop.py resumes exactly, and tests/objectives/test_dictionary_objectives.py refuses a
# hand-edited dictionary.tsv by its fingerprint.
@pytest.mark.slow
def test_dict_mlm_killed_hard_resumes_exactly_and_refuses_edited_assets(tmp_path, suite):
  full, killed = tmp_path / "full", tmp_path / "killed"
  proc = _script(full, 6, "dict_mlm")
  assert proc.returncode == 0, proc.stderr[-3000:]
  proc = _script(killed, 6, "dict_mlm", 5)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert sorted(os.listdir(killed / "checkpoints")) == ["2", "4"]
  proc = _script(killed, 6, "dict_mlm")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "restored from checkpoint step 4" in proc.stdout
  a, b = _losses(full), _losses(killed)
  assert sorted(b) == list(range(1, 7))
  assert a == b  # Every logged value, bit for bit (as JSON).
  # The step directories hold the assets; MODEL_DIR holds the run's copies.
  for name in ("dictionary.tsv", "token_map.npz", "vocabulary.model"):
    assert (killed / "checkpoints" / "6" / "assets" / name).read_bytes() == (killed / name).read_bytes(), name

  # A dictionary edited by hand is refused on resume, in MODEL_DIR or in a step directory.
  top = killed / "dictionary.tsv"
  original = top.read_text()
  lines = original.splitlines()
  natural, derived, piece = lines[1].split("\t")
  top.write_text("\n".join([lines[0], f"{natural}\t{int(derived) + 1}\t{piece}", *lines[2:]]) + "\n")
  message = _refused_in_process(killed, 8, "dict_mlm")
  assert "was changed after the run wrote it" in message
  assert "dictionary.tsv" in message
  top.write_text(original)
  step_copy = killed / "checkpoints" / "6" / "assets" / "dictionary.tsv"
  step_copy.write_text(original.replace("\n", "\n", 1).rstrip("\n").rsplit("\n", 1)[0] + "\n")
  message = _refused_in_process(killed, 8, "dict_mlm")
  assert "was changed after the run wrote it" in message
  assert os.path.join("checkpoints", "6", "assets") in message
  assert sorted(os.listdir(killed / "checkpoints")) == ["2", "4", "6"]  # Nothing was trained or written.
