"""Transfer fine-tuning: tasks from the corpus, featurisation, heads, SUP / ZS / Δ.

Models are tiny and randomly initialised; one encoder config (vocabulary
doubled, as a transliterating language needs) serves every test, so the
tagging train step compiles once for the module.
"""

import dataclasses
import random

import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation import transfer
from flax_xalign.evaluation import transfer_data
from flax_xalign.evaluation.transfer_data import LabelledSentence, TaggedSentence
from flax_xalign.models.encoder import Encoder
from tests import testlib

# A part-of-speech-like tag per word of the toy corpus: a function of the word.
POS = {**dict.fromkeys("the a das ein".split(), "det"),
       **dict.fromkeys("house dog cat tree river haus hund katze baum fluss".split(), "noun"),
       **dict.fromkeys("sees runs sieht läuft".split(), "verb"),
       **dict.fromkeys("big small red green old new groß klein rot grün alt neu".split(), "adj")}
STEPS, BATCH, LENGTH, LR = 60, 16, 24, 1e-2


class WordVocabulary:
  """A fake vocabulary: fixed pieces per word."""

  def __init__(self, pieces):
    self.pieces = pieces

  def encode(self, word):
    return self.pieces[word]


@dataclasses.dataclass(frozen=True)
class FakeLanguage:
  """The SyntheticLanguage interface: optional inversion and +V transliteration."""

  vocab_size: int
  invert: bool = False
  transliterates: bool = False
  seeds: list = dataclasses.field(default_factory=list, compare=False)

  @property
  def name(self):
    return "fake" + ("_inv" if self.invert else "") + ("_trans" if self.transliterates else "")

  @property
  def derived_vocab_size(self):
    return 2 * self.vocab_size if self.transliterates else self.vocab_size

  def transform_words(self, words, labels=None, *, parse=None, sentence_seed=0):
    del parse
    self.seeds.append(sentence_seed)
    order = list(range(len(words)))[::-1] if self.invert else list(range(len(words)))
    return ([words[i] for i in order],
            {k: [v[i] for i in order] for k, v in (labels or {}).items()})

  def transliterate_ids(self, ids):
    return np.where(ids >= 5, ids + self.vocab_size, ids)


def tagged(n, seed):
  rng = random.Random(seed)
  words = sorted(POS)
  out = []
  for _ in range(n):
    sentence = tuple(rng.choice(words) for _ in range(rng.randint(2, 7)))
    out.append(TaggedSentence(sentence, tuple(POS[w] for w in sentence)))
  return out


@pytest.fixture(scope="module")
def spm_vocabulary(tmp_path_factory):
  """An 83-piece BPE SentencePiece model of the toy corpus, with the project's special ids."""
  import sentencepiece as spm

  prefix = tmp_path_factory.mktemp("spm") / "toy"
  text = [s for pair in testlib.sentences(random.Random(0), 400) for s in pair]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(text), model_prefix=str(prefix), vocab_size=83, model_type="bpe",
      pad_id=0, eos_id=1, unk_id=2, bos_id=3, user_defined_symbols=["<mask>"], minloglevel=2,
      num_threads=1)
  return spm.SentencePieceProcessor(model_file=f"{prefix}.model")


def random_params(config, seed=0):
  """Encoder parameters drawn in numpy (compiling the encoder's init costs seconds on CPU)."""
  shapes = jax.eval_shape(lambda: nn.meta.unbox(
      Encoder(config).init_variables(jax.random.key(0))["params"]))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    if name == "scale":
      return np.ones(leaf.shape, leaf.dtype)
    if name in ("bias", "output_bias"):
      return np.zeros(leaf.shape, leaf.dtype)
    return rng.normal(0.0, config.initializer_std, leaf.shape).astype(leaf.dtype)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def tiny_model(spm_vocabulary):
  from flax_xalign.models.config import EncoderConfig

  # tests/conftest.py's tiny_encoder sizes; vocabulary doubled for transliteration.
  config = EncoderConfig(num_layers=2, embed_dim=24, num_heads=3, head_dim=8, mlp_dim=40,
                         max_positions=32, num_languages=3, dropout_rate=0.1,
                         attention_dropout_rate=0.0,
                         vocab_size=2 * spm_vocabulary.get_piece_size())
  return Encoder(config), random_params(config)


# ------------------------------------------------------------------ data


def test_book_groups():
  assert [transfer_data.book_group(v) for v in
          ("40001001", "43021025", "44001001", "45001001", "57001025", "58001001",
           "65001025", "66022021")] == [
              "gospels", "gospels", "acts", "pauline", "pauline", "general", "general",
              "revelation"]
  covered = sorted(b for books in transfer_data.BOOK_GROUPS.values() for b in books)
  assert covered == list(range(40, 67))
  with pytest.raises(ValueError):
    transfer_data.book_group("01001001")


def test_greek_tasks_read_gold_labels(bible_data_dir):
  del bible_data_dir  # Sets $FLAX_XALIGN_DATA_DIR.
  pos = transfer_data.greek_pos("test")
  assert pos[0] == TaggedSentence(("Ἀρχὴ", "τοῦ", "εὐαγγελίου", "Ἰησοῦ", "χριστοῦ"),
                                  ("noun", "det", "noun", "noun", "noun"))
  assert sum(len(s.words) for s in pos) == 14651
  assert all(len(s.words) == len(s.tags) for s in pos)
  assert {t for s in pos for t in s.tags} <= set(transfer_data.GREEK_POS_TAGS)
  verses = transfer_data.greek_verse_classification("test")
  counts = {g: sum(v.label == g for v in verses) for g in transfer_data.BOOK_GROUPS}
  # Whole-book splits: Acts and Revelation never reach the test split.
  assert counts == {"gospels": 673, "acts": 0, "pauline": 104, "general": 108, "revelation": 0}
  assert verses[0].words == pos[0].words


def test_derive_moves_tags_with_words_and_seeds_by_index():
  language = FakeLanguage(vocab_size=10, invert=True)
  examples = [TaggedSentence(("a", "b", "c"), ("x", "y", "z")), TaggedSentence(("d",), ("w",))]
  assert transfer_data.derive(examples, language) == [
      TaggedSentence(("c", "b", "a"), ("z", "y", "x")), TaggedSentence(("d",), ("w",))]
  assert language.seeds == [0, 1]
  assert transfer_data.derive([LabelledSentence(("a", "b"), "k")], language,
                              sentence_seeds=[7]) == [LabelledSentence(("b", "a"), "k")]
  assert language.seeds == [0, 1, 7]


def test_derive_with_a_synthetic_language_repairs_bio():
  from flax_xalign.data.synthetic import SyntheticLanguage

  language = SyntheticLanguage(("trans", "inv"), 50)
  ner = [TaggedSentence(("a", "b", "c"), ("B-PER", "I-PER", "O"))]
  assert transfer_data.derive(ner, language) == [
      TaggedSentence(("c", "b", "a"), ("O", "B-PER", "I-PER"))]
  pos = [TaggedSentence(("a", "b"), ("noun", "verb"))]
  assert transfer_data.derive(pos, language) == [TaggedSentence(("b", "a"), ("verb", "noun"))]


# ------------------------------------------------------------------ features


def test_labels_on_first_subwords_and_truncation_keeps_whole_words():
  vocabulary = WordVocabulary({"ab": [10, 11], "c": [12], "def": [13, 14, 15], "": []})
  featurizer = transfer.Featurizer(vocabulary, max_length=7)
  encoded = featurizer.encode(["ab", "c", "def"])
  # 2 + 1 subwords fit in 7 - 2; "def" (3 more) does not and is dropped whole.
  np.testing.assert_array_equal(encoded.tokens, [3, 10, 11, 12, 1])
  np.testing.assert_array_equal(encoded.word_index, [-1, 0, -1, 1, -1])
  assert encoded.num_words == 2
  features = featurizer.featurize([TaggedSentence(("ab", "c", "def"), ("n", "v", "n")),
                                   TaggedSentence(("", "c"), ("v", "n"))],
                                  label_index={"n": 0, "v": 1})
  assert features.tokens.shape == (2, 7) and features.words_dropped == 1
  np.testing.assert_array_equal(features.weights[0], [0, 1, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(features.labels[0], [0, 0, 0, 1, 0, 0, 0])
  # A word without pieces becomes <unk> and keeps its label.
  np.testing.assert_array_equal(features.tokens[1], [3, 2, 12, 1, 0, 0, 0])
  np.testing.assert_array_equal(features.labels[1][:3], [0, 1, 0])
  sentences = featurizer.featurize([LabelledSentence(("c",), "k")], label_index={"k": 0})
  assert sentences.labels.shape == (1,) and sentences.weights.tolist() == [1.0]


def test_transliterate_maps_only_regular_ids():
  vocabulary = WordVocabulary({"x": [7, 4], "y": [2], "z": [5, 9]})
  encoded = transfer.encode_words(vocabulary_pieces(vocabulary, "xyz"), max_length=10,
                                  transliterate=lambda ids: ids + 100)
  np.testing.assert_array_equal(encoded.tokens, [3, 107, 4, 2, 105, 109, 1])


def vocabulary_pieces(vocabulary, words):
  return [vocabulary.encode(w) for w in words]


def test_batch_order_covers_epochs_and_groups_by_length():
  lengths = np.random.default_rng(0).integers(3, 100, size=1000)
  plain = transfer.batch_order(lengths, 10, 300, seed=1)
  grouped = transfer.batch_order(lengths, 10, 300, seed=1, group_by_length=True)
  assert plain.shape == grouped.shape == (300, 10)
  # Three epochs, each example once per epoch, in both orders.
  for order in (plain, grouped):
    for epoch in order.reshape(3, 1000):
      assert sorted(epoch) == list(range(1000))
  np.testing.assert_array_equal(plain, transfer.batch_order(lengths, 10, 300, seed=1))
  spread = lambda order: np.mean(np.ptp(lengths[order], axis=1))  # noqa: E731
  assert spread(grouped) < 0.2 * spread(plain)
  assert [transfer.bucket_length(n, 112) for n in (1, 32, 33, 97, 101)] == [32, 32, 64, 112, 112]


# ------------------------------------------------------------------ metrics


def test_bio_span_f1_by_hand():
  assert transfer.bio_spans(["B-PER", "I-PER", "O", "B-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
  # I- without a matching entity before it starts one (conlleval).
  assert transfer.bio_spans(["I-ORG", "I-ORG", "B-ORG", "I-PER"]) == {
      ("ORG", 0, 2), ("ORG", 2, 3), ("PER", 3, 4)}
  assert transfer.bio_spans(["O", "O"]) == set()
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
  predicted = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-PER"]]
  # gold spans 3, predicted 4, correct 2 (LOC 3:4, ORG 0:1).
  scores = transfer.span_f1(gold, predicted)
  assert scores["precision"] == pytest.approx(2 / 4)
  assert scores["recall"] == pytest.approx(2 / 3)
  assert scores["f1"] == pytest.approx(2 * (1 / 2) * (2 / 3) / (1 / 2 + 2 / 3))
  assert transfer.span_f1([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
  assert transfer_data.is_bio(["O", "B-PER", "I-PER"]) and not transfer_data.is_bio(["noun", "verb"])


def test_macro_f1():
  gold, predicted = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])
  # class 0: p 1, r 1/2 -> 2/3; class 1: p 2/3, r 1 -> 4/5.
  assert transfer.macro_f1(gold, predicted) == pytest.approx((2 / 3 + 4 / 5) / 2)


# ------------------------------------------------------------------ fine-tuning


def test_finetune_learns_a_tagging_task(tiny_model, spm_vocabulary, capsys):
  encoder, params = tiny_model
  train = tagged(200, seed=1)
  embedding = np.array(params["token_embed"]["embedding"])
  finetuned = transfer.finetune(encoder, params, spm_vocabulary, train, language_id=1,
                                steps=STEPS, batch_size=BATCH, max_length=LENGTH,
                                learning_rate=LR, seed=0, name="toy pos")
  assert finetuned.label_set == ("adj", "det", "noun", "verb")
  assert "finetune toy pos: 60 steps" in capsys.readouterr().out
  assert finetuned.history["loss"][-5:].mean() < 0.5 * finetuned.history["loss"][:5].mean()
  # Tags depend on later subwords ("▁a" starts "a" and "alt", "▁k" "katze" and
  # "klein"), so the encoder, not just the embeddings, has to learn.
  assert transfer.evaluate(finetuned, train, language_id=1)["accuracy"] > 0.9
  scores = transfer.evaluate(finetuned, tagged(60, seed=2), language_id=1)
  assert scores["accuracy"] > 0.85 and scores["f1"] > 0.8
  assert scores["count"] == sum(len(s.words) for s in tagged(60, seed=2))
  # Batches of rows sorted by length, the last one partial: the same predictions.
  assert transfer.evaluate(finetuned, tagged(60, seed=2), language_id=1, batch_size=16) == scores
  # The pretrained parameters are untouched (a later fine-tuning starts from them).
  np.testing.assert_array_equal(params["token_embed"]["embedding"], embedding)
  # Length-grouped batches (all cut to LENGTH here, so no new compilation).
  grouped = transfer.finetune(encoder, params, spm_vocabulary, train, steps=5, batch_size=BATCH,
                              max_length=LENGTH, learning_rate=LR, group_by_length=True,
                              log=None)
  assert grouped.history["loss"].shape == (5,) and np.isfinite(grouped.history["loss"]).all()


def test_classification_head_and_evaluate(tiny_model, spm_vocabulary):
  encoder, params = tiny_model
  head = transfer.make_head(encoder.config, "classification", 2)
  hidden = np.random.default_rng(0).normal(size=(3, 5, 24)).astype(np.float32)
  variables = head.init(jax.random.key(0), hidden, deterministic=True)
  assert set(variables["params"]) == {"dense", "out"}
  logits = head.apply(variables, hidden, deterministic=True)
  assert logits.shape == (3, 2)
  # Only the <s> state is read.
  changed = hidden.copy()
  changed[:, 1:] = 0.0
  np.testing.assert_allclose(head.apply(variables, changed, deterministic=True), logits)
  untrained = transfer.FinetunedModel(
      config=encoder.config, head=head, task="classification", label_set=("de", "en"),
      params={"encoder": transfer.encoder_params(params), "head": variables["params"]},
      featurizer=transfer.Featurizer(spm_vocabulary, max_length=LENGTH), history={}, seconds=0.0)
  examples = [LabelledSentence(s.words, "en") for s in tagged(10, seed=3)]
  scores = transfer.evaluate(untrained, examples, batch_size=4)
  assert scores["count"] == 10 and scores["accuracy"] in (0.0, 1.0)  # One class predicted.
  with pytest.raises(UserError, match="fine-tuned for classification"):
    transfer.evaluate(untrained, tagged(2, seed=0))


@pytest.mark.slow  # Compiles a second train step (~15 s of CPU).
def test_finetune_learns_a_classification_task(tiny_model, spm_vocabulary):
  encoder, params = tiny_model
  # Label: does the sentence contain "the"? Read from the <s> state's context.
  train = [LabelledSentence(s.words, "yes" if "the" in s.words else "no")
           for s in tagged(200, seed=3)]
  finetuned = transfer.finetune(encoder, params, spm_vocabulary, train, steps=STEPS,
                                batch_size=BATCH, max_length=LENGTH, learning_rate=LR, log=None)
  assert finetuned.task == "classification" and finetuned.label_set == ("no", "yes")
  assert transfer.evaluate(finetuned, train)["accuracy"] > 0.9


def test_zero_shot_transfer_reports_sup_zs_delta(tiny_model, spm_vocabulary):
  from flax_xalign.data.synthetic import SyntheticLanguage

  encoder, params = tiny_model
  vocab_size = spm_vocabulary.get_piece_size()
  train, test = tagged(200, seed=1), tagged(40, seed=4)
  options = dict(task_name="toy_pos", train=train, test=test, steps=STEPS, batch_size=BATCH,
                 max_length=LENGTH, learning_rate=LR, seed=0, log=None)
  model = (encoder, params, {"languages": ["en", "en_trans"]})
  result = transfer.zero_shot_transfer(
      model, spm_vocabulary, language=SyntheticLanguage(("trans", "inv"), vocab_size),
      natural_lang="en", derived_lang="en_trans", **options)
  assert result["metric"] == "accuracy" and result["language"] == "trans_inv"
  assert result["delta"] == result["sup"] - result["zs"]
  assert result["sup"] > 0.9 and result["natural"] > 0.9
  assert result["scores"]["zs"]["count"] == sum(len(s.words) for s in test)
  # An identity language with the same language id: both fine-tunings see the
  # same batches, so SUP and ZS (and natural) coincide.
  same = transfer.zero_shot_transfer(model, spm_vocabulary, language=FakeLanguage(vocab_size),
                                     natural_lang="en", derived_lang="en", **options)
  assert same["sup"] == same["zs"] == same["natural"] == result["natural"]
  assert same["delta"] == 0.0
  with pytest.raises(UserError, match="language embeddings"):
    transfer.zero_shot_transfer(model, spm_vocabulary, language=FakeLanguage(vocab_size),
                                natural_lang="grc", derived_lang="en", **options)
