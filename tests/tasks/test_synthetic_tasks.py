"""Synthetic-language seqio tasks and an ALIGN-MLM run on them."""

import json
import os

import pytest

from flax_xalign.data.synthetic import SyntheticLanguage

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
  batch = next(pipeline.get_dataset(names["xlm"], split="train", feature_lengths={"tokens": 48}, batch_size=8,
                                    seed=0)[0].as_numpy_iterator())
  pairs = batch["pair_side"] > 0
  assert pairs.any()
  side2 = batch["tokens"][(batch["pair_side"] == 2) & (batch["tokens"] >= 5)]
  assert (side2 >= V).all()


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
  results = mlm_eval.evaluate(model_dir=str(model_dir), split="test", batch_size=4, max_batches=2,
                              baseline_batches=2, output=None)
  assert set(results["alignment"]) >= {"all", "heldout", "count_all", "count_heldout"}
  assert results["alignment"]["count_all"] == V - 5


def test_dictionary_objectives_refuse_natural_tasks(tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.errors import UserError
  from flax_xalign.training.pretrain import pretrain

  with pytest.raises(UserError, match="need a bilingual token dictionary"):
    pretrain(model_dir=str(tmp_path / "x"), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
             batch_size=6, train_steps=1, encoder=tiny_encoder, objectives={"mlm": 1.0, "align": 10.0})
  assert not os.path.exists(tmp_path / "x")
