"""Sentence-pair classification (XNLI / PAWS-X) in the transfer harness.

Pair rows are checked against layouts written out by hand; a tiny random
encoder learns a pair task that needs both sides (are the sentences
identical?); the file-level entry runs end to end on a tiny trained MODEL_DIR
with TSV files written here.
"""

import json
import random
import types

import numpy as np
import pytest

from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer import featurize
from flax_xalign.evaluation.transfer import finetune
from flax_xalign.evaluation.transfer import transfer
from flax_xalign.evaluation.transfer import transfer_data
from flax_xalign.evaluation.transfer.transfer_data import SentencePair
from flax_xalign.runs import Run
from tests import testlib
from tests.runs.tiny_run import tiny_mix_run
from tests.evaluation.transfer_testlib import FakeLanguage, WordVocabulary

# PROJECT ids: pad 0, eos 1, unk 2, bos 3, mask 4; regular pieces from 5.
PIECES = {"a": [10], "b": [11, 12], "c": [13], "d": [14], "e": [15, 16, 17]}


def _featurizer(max_length=32, layout="restart"):
  return featurize.Featurizer(WordVocabulary(PIECES), max_length=max_length, specials=PROJECT, pair_layout=layout)


def test_pair_rows_by_hand():
  pair = SentencePair(("a", "b", "c"), ("d",), "1")
  restart = _featurizer().encode_pair(pair.first, pair.second)
  np.testing.assert_array_equal(restart.tokens, [3, 10, 11, 12, 13, 1, 3, 14, 1])
  np.testing.assert_array_equal(restart.positions, [0, 1, 2, 3, 4, 5, 0, 1, 2])
  assert restart.num_words == 4
  continuous = _featurizer(layout="continuous").encode_pair(pair.first, pair.second)
  np.testing.assert_array_equal(continuous.tokens, [3, 10, 11, 12, 13, 1, 14, 1])
  np.testing.assert_array_equal(continuous.positions, np.arange(8))
  # An empty side keeps its frame; a word without pieces becomes <unk>.
  empty = featurize.encode_pair_words([], [[]], max_length=16, specials=PROJECT)
  np.testing.assert_array_equal(empty.tokens, [3, 1, 3, 2, 1])
  np.testing.assert_array_equal(empty.positions, [0, 1, 0, 1, 2])


def test_pair_truncation_and_transliteration_by_hand():
  # restart, max_length 7: 3 pieces for both sides; side a may keep max(3 // 2, 3 - 1) = 2 pieces -> word "a"
  # only ("b" would need 3); side b then keeps "d".
  row = _featurizer(max_length=7).encode_pair(("a", "b", "c"), ("d",))
  np.testing.assert_array_equal(row.tokens, [3, 10, 1, 3, 14, 1])
  assert row.num_words == 2
  shifted = _featurizer().encode_pair(("a",), ("e",), transliterate=lambda ids: ids + 100)
  np.testing.assert_array_equal(shifted.tokens, [3, 110, 1, 3, 115, 116, 117, 1])  # Specials unchanged.
  with pytest.raises(UserError, match="no room"):
    _featurizer(max_length=5).encode_pair(("a",), ("d",))


def test_featurize_pairs_pads_rows_positions_and_labels():
  examples = [SentencePair(("a", "b", "c"), ("d",), "1"), SentencePair(("a",), ("e", "e"), "0"),
              SentencePair(("a", "b", "c"), ("d",), "0")]
  features = _featurizer(max_length=7).featurize(examples, label_index={"0": 0, "1": 1})
  assert features.tokens.shape == (3, 7)  # Longest row 7 (<= LENGTH_MULTIPLE rounded, capped).
  np.testing.assert_array_equal(features.tokens[0], [3, 10, 1, 3, 14, 1, 0])
  np.testing.assert_array_equal(features.positions[0], [0, 1, 2, 0, 1, 2, 0])
  # Row 2: side a keeps "a" (1 piece); side b has 3 - 1 = 2 pieces left, too few for "e" (3 pieces).
  np.testing.assert_array_equal(features.tokens[1], [3, 10, 1, 3, 1, 0, 0])
  np.testing.assert_array_equal(features.labels, [1, 0, 0])
  np.testing.assert_array_equal(features.weights, [1, 1, 1])
  assert features.words_dropped == 2 + 2 + 2
  assert featurize.task_of(examples) == "pair_classification"
  assert featurize.head_task("pair_classification") == "classification"
  assert featurize.label_set_of(examples) == ("0", "1")
  with pytest.raises(UserError, match="SentencePairs"):
    featurize.task_of([examples[0], transfer_data.LabelledSentence(("a",), "0")])


def test_single_sentences_keep_plain_positions():
  features = _featurizer().featurize([transfer_data.LabelledSentence(("a", "b"), "x")], label_index={"x": 0})
  np.testing.assert_array_equal(features.positions[0, :6], [0, 1, 2, 3, 4, 0])  # <s> a b1 b2 </s>


def test_derive_moves_both_sides():
  language = FakeLanguage(vocab_size=50, invert=True)
  pair = SentencePair(("a", "b", "c"), ("d", "e"), "entailment")
  (derived,) = transfer_data.derive([pair], language, sentence_seeds=[7])
  assert derived == SentencePair(("c", "b", "a"), ("e", "d"), "entailment")
  assert language.seeds == [7, 7]


def test_read_pair_tsv(tmp_path):
  xnli = tmp_path / "xnli.tsv"
  xnli.write_text("language\tgold_label\tsentence1\tsentence2\n"
                  "en\tentailment\tA man sleeps .\tA person rests .\n"
                  "en\tcontradictory\tIt rains\tIt is dry\n", encoding="utf-8")
  pairs = transfer_data.read_pair_tsv(xnli, task="xnli")
  assert pairs == [SentencePair(("A", "man", "sleeps", "."), ("A", "person", "rests", "."), "entailment"),
                   SentencePair(("It", "rains"), ("It", "is", "dry"), "contradiction")]
  paws = tmp_path / "paws.tsv"
  paws.write_text("id\tsentence1\tsentence2\tlabel\n1\ta b\tb a\t1\n", encoding="utf-8")
  assert transfer_data.read_pair_tsv(paws, task="pawsx") == [SentencePair(("a", "b"), ("b", "a"), "1")]
  headerless = tmp_path / "plain.tsv"
  headerless.write_text("a b\tb a\t0\n", encoding="utf-8")
  assert transfer_data.read_pair_tsv(headerless, task="pawsx", has_header=False)[0].label == "0"
  with pytest.raises(UserError, match="not one of xnli"):
    transfer_data.read_pair_tsv(paws, task="xnli", label_column="label")
  with pytest.raises(UserError, match="unknown sentence-pair task"):
    transfer_data.read_pair_tsv(paws, task="mnli")


# ------------------------------------------------------------ learning


def identity_pairs(n, seed):
  """Balanced pairs: label "same" when the second sentence repeats the first, "diff" for another sentence."""
  rng = random.Random(seed)
  sentences = [en.split() for en, _ in testlib.sentences(rng, 2 * n)]
  out = []
  for i in range(n):
    first = tuple(sentences[i])
    same = i % 2 == 0
    second = first if same else tuple(sentences[n + i])
    out.append(SentencePair(first, second, "same" if same else "diff"))
  return out


@pytest.mark.slow  # 300 fine-tuning steps (~20 s of CPU); the rows hold both sides: the featurizer tests above.
def test_a_pair_task_that_needs_both_sides_is_learnt(transfer_model, spm_vocabulary):
  encoder, params = transfer_model
  train, test = identity_pairs(256, seed=1), identity_pairs(64, seed=2)
  model = finetune.finetune(encoder, params, spm_vocabulary, train, steps=300, batch_size=16, max_length=32,
                            learning_rate=1e-3, seed=0, log=None)
  assert model.task == "pair_classification" and model.label_set == ("diff", "same")
  scores = finetune.evaluate(model, test)
  assert scores["count"] == 64
  # Chance is 0.5 (balanced); measured 0.75 (P(>= 0.65) by chance on 64 pairs is about 1 %).
  assert scores["accuracy"] > 0.65, scores


def test_cross_lingual_transfer_scores_the_right_sets(monkeypatch):
  source_train, source_test = identity_pairs(4, 1), identity_pairs(4, 2)
  target_train, target_test = identity_pairs(4, 3), identity_pairs(4, 4)
  accuracy = {("source", "source"): 0.9, ("source", "target"): 0.6, ("target", "target"): 0.8}

  def fake_finetune(network, params, featurizer, train, *, language_id, **kwargs):
    assert featurizer.pair_layout == "continuous"  # From the run manifest.
    return types.SimpleNamespace(on="source" if train is source_train else "target", history={"loss": [0.0] * 5})

  def fake_evaluate(model, test, *, language_id, batch_size):
    tested = "source" if test is source_test else "target"
    assert language_id == (1 if tested == "source" else 2)
    return {"accuracy": accuracy[model.on, tested], "count": 4}

  monkeypatch.setattr(transfer, "finetune", fake_finetune)
  monkeypatch.setattr(transfer, "evaluate", fake_evaluate)
  config = types.SimpleNamespace(num_languages=2, vocab_size=50)
  meta = types.SimpleNamespace(languages=("en", "de"), pair_layout="continuous")
  result = transfer.cross_lingual_transfer(
      (types.SimpleNamespace(config=config), None, meta), WordVocabulary(PIECES), task_name="toy",
      source_train=source_train, source_test=source_test, target_train=target_train, target_test=target_test,
      source_lang="en", target_lang="de", specials=PROJECT, steps=5, log=None)
  assert (result["zs"], result["sup"], result["natural"]) == (0.6, 0.8, 0.9)
  assert result["delta"] == pytest.approx(0.2) and result["metric"] == "accuracy"
  only_zs = transfer.cross_lingual_transfer(
      (types.SimpleNamespace(config=config), None, meta), WordVocabulary(PIECES), task_name="toy",
      source_train=source_train, target_test=target_test, source_lang="en", target_lang="de", specials=PROJECT,
      steps=5, log=None)
  assert only_zs["sup"] is None and only_zs["delta"] is None and only_zs["natural"] is None


# ------------------------------------------------------------ end to end from files


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_corpus):
  """A copy of the shared 3-step MLM run on tiny_mix (de, en)."""
  return tiny_mix_run(tmp_path_factory, tiny_corpus, "pairs")


def _write_paws(path, n, seed, side):
  rng = random.Random(seed)
  pairs = testlib.sentences(rng, 2 * n)
  lines = ["id\tsentence1\tsentence2\tlabel"]
  for i in range(n):
    first = pairs[i][side]
    second = first if i % 2 == 0 else pairs[n + i][side]
    lines.append(f"{i}\t{first}\t{second}\t{int(i % 2 == 0)}")
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def test_pair_transfer_from_files_end_to_end(checkpoint, tmp_path):
  files = {"train": _write_paws(tmp_path / "en.train.tsv", 48, 1, 0),
           "source_test": _write_paws(tmp_path / "en.test.tsv", 16, 2, 0),
           "test": _write_paws(tmp_path / "de.test.tsv", 16, 3, 1),
           "target_train": _write_paws(tmp_path / "de.train.tsv", 48, 4, 1)}
  lines = []
  result = transfer.pair_transfer_from_files(
      Run.open(checkpoint), task="pawsx", source_lang="en", target_lang="de", steps=4, batch_size=8,
      learning_rate=1e-3, max_length=32, output="pawsx.json", log=lines.append, **files)
  assert result["label_set"] == ["0", "1"] and result["metric"] == "accuracy"
  for key in ("zs", "sup", "natural"):
    assert 0.0 <= result[key] <= 1.0
    assert result["scores"][key]["count"] == 16
  assert result["delta"] == pytest.approx(result["sup"] - result["zs"])
  assert result["pair_layout"] == "restart" and result["steps"] == 4
  assert json.loads((checkpoint / "pawsx.json").read_text()) == json.loads(json.dumps(result))
  assert any(line.startswith("pawsx accuracy: ZS") for line in lines)
  with pytest.raises(UserError, match="language embeddings"):
    transfer.pair_transfer_from_files(Run.open(checkpoint), task="pawsx", train=files["train"],
                                      test=files["test"], source_lang="en", target_lang="fr", steps=1, log=None)
  with pytest.raises(UserError, match="unknown sentence-pair task"):
    transfer.pair_transfer_from_files(Run.open(checkpoint), task="nli", train=files["train"],
                                      test=files["test"], steps=1, log=None)


@pytest.mark.contract  # The eval command's smoke run on a trained MODEL_DIR.
def test_eval_entry_point_runs_pair_transfer(checkpoint, tmp_path, capsys):
  from flax_xalign import eval as eval_main

  train = _write_paws(tmp_path / "en.train.tsv", 24, 5, 0)
  test = _write_paws(tmp_path / "de.test.tsv", 8, 6, 1)
  code = eval_main.main(["--gin_file=runs/eval_pairs.gin", f"--gin.MODEL_DIR='{checkpoint}'",
                         "--gin.PAIR_TASK='pawsx'", f"--gin.TRAIN_TSV='{train}'", f"--gin.TEST_TSV='{test}'",
                         "--gin.pair_transfer.steps=2", "--gin.pair_transfer.max_length=32",
                         "--gin.pair_transfer.source_lang='en'", "--gin.pair_transfer.target_lang='de'"])
  out = capsys.readouterr().out
  assert code == 0, out
  assert "pawsx accuracy: ZS" in out
  saved = json.loads((checkpoint / "pair_transfer.json").read_text())
  assert saved["files"] == {"train": train, "test": test, "target_train": None, "source_test": None}
  # A misspelt macro of this config is refused like any other.
  code = eval_main.main(["--gin_file=runs/eval_pairs.gin", f"--gin.MODEL_DIR='{checkpoint}'",
                         f"--gin.TRAIN_TSV='{train}'", f"--gin.TEST_TSVS='{test}'"])
  assert code == 2 and "TEST_TSV" in capsys.readouterr().err
