"""WordAligner: layout vs the feature converter, truncation, methods, sweep, checkpoints.

Models are randomly initialised (no training): with post-LN every layer-0
vector has norm sqrt(embed), so without language embeddings a sentence aligned
with itself must give the diagonal at layer 0, whatever the weights.
"""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import aer
from flax_xalign.evaluation.word_alignment import word_align
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.ops import AlignmentSolver
from flax_xalign.runs import Run
from tests.testlib import tiny_encoder_config

CONFIG = tiny_encoder_config(vocab_size=83, dropout_rate=0.0)
DE = ["das", "haus", "sieht", "ein", "alt", "hund", "und", "die", "katze", "läuft", "über", "den", "grün", "fluss"]
EN = ["the", "house", "sees", "a", "old", "dog", "and", "the", "cat", "runs", "over", "the", "green", "river"]


def init_model(config=CONFIG, seed=0):
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  return model, nn.meta.unbox(model.init(jax.random.key(seed), batch=1, length=8))


def write_checkpoint(model_dir, params, vocabulary, *, task, languages, language_pairs=(), config=CONFIG,
                     pair_layout="restart", objectives=(("mlm", 1.0), ("tlm", 1.0)), objective_options=None,
                     task_definitions=None, init_from_checkpoint=None):
  """A MODEL_DIR with one checkpoint, written the way the trainer writes it (manifest + vocabulary asset).

  The default objectives (MLM + TLM: joint pairs) make the aligner's model defaults joint encoding and dot
  products, the settings most tests here were written for.
  """
  import tensorflow as tf

  from flax_xalign.assets.vocabulary import VocabularyAsset, spec_of
  from flax_xalign.run_spec import RunSpec
  from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer, make_meta

  asset = VocabularyAsset(vocabulary)
  run = RunSpec(task=task, languages=tuple(languages), language_pairs=tuple(language_pairs),
                task_feature_lengths={"tokens": 19}, vocabulary=spec_of(vocabulary), model=config,
                objectives=dict(objectives), objective_options=objective_options or {},
                task_definitions=task_definitions, pair_layout=pair_layout, init_from_checkpoint=init_from_checkpoint)
  value = asset.build(run)
  run = run.replace(assets={"vocabulary": asset.fingerprint(value)})
  model_dir.mkdir(parents=True, exist_ok=True)
  asset.save(str(model_dir), value)
  checkpointer = Checkpointer(str(model_dir), CheckpointConfig(async_save=False))
  checkpointer.save(1, {"params": params, "step": np.int32(1)}, iter(tf.data.Dataset.range(2)),
                    make_meta(run, run.assets), assets={"vocabulary": asset}, asset_values={"vocabulary": value},
                    force=True)
  checkpointer.close()
  return model_dir


@pytest.fixture(scope="module")
def vocabulary(tiny_corpus):
  from flax_xalign.data.vocab import sentencepiece as vocab
  return vocab.load_vocabulary(tiny_corpus["vocab"])


@pytest.fixture(scope="module")
def tiny_model():
  return init_model()


@pytest.fixture(scope="module")
def aligner(tiny_model, vocabulary):
  model, params = tiny_model
  return word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de", tgt_lang="en",
                                batch_size=4)


@pytest.fixture(scope="module")
def plain_model():
  return init_model(CONFIG.replace(num_languages=0), seed=1)


@pytest.fixture(scope="module")
def plain_aligner(plain_model, vocabulary):
  """No language embeddings: identical sentences have identical layer-0 vectors."""
  model, params = plain_model
  return word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de", tgt_lang="en",
                                batch_size=4)


def test_layout_matches_the_feature_converter(aligner, vocabulary):
  import tensorflow as tf

  from flax_xalign.data.feature_converter import XAlignFeatureConverter

  converter = XAlignFeatureConverter(["de", "en"])
  pairs = [(DE[:5], EN[:7]), (["\u200b"] + DE[2:4] + ["\u200b"], EN[:1]), (DE[6:], EN[7:])]
  for (a, b), encoded in zip(pairs, aligner.encode(pairs)):
    ex = {"tokens": tf.constant(vocabulary.encode(" ".join(a)), tf.int32),
          "tokens_b": tf.constant(vocabulary.encode(" ".join(b)), tf.int32),
          "lang": tf.constant("de"), "lang_b": tf.constant("en")}
    expected = converter._layout(ex, 64)
    for key in ("tokens", "lang_ids", "positions", "pair_side"):
      np.testing.assert_array_equal(getattr(encoded, key), expected[key].numpy(), err_msg=key)
    assert not encoded.truncated
  # Word indices of the subwords; the zero-width space yields no subword.
  encoded = aligner.encode(pairs[1:2])[0]
  pieces = [len(aligner.word_pieces([w])[0]) for w in pairs[1][0]]
  assert pieces[0] == pieces[-1] == 0
  np.testing.assert_array_equal(encoded.src_words, np.repeat(np.arange(4), pieces))


def test_continuous_layout_matches_the_feature_converter(tiny_model, vocabulary):
  import tensorflow as tf

  from flax_xalign.data.feature_converter import XAlignFeatureConverter

  model, params = tiny_model
  aligner = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                   tgt_lang="en", batch_size=4, pair_layout="continuous")
  converter = XAlignFeatureConverter(["de", "en"], pair_layout="continuous")
  pairs = [(DE[:3], EN[:4]), (DE[2:4], EN[:1]), (DE[9:12], EN[10:13])]
  for (a, b), encoded in zip(pairs, aligner.encode(pairs)):
    assert not encoded.truncated
    ex = {"tokens": tf.constant(vocabulary.encode(" ".join(a)), tf.int32),
          "tokens_b": tf.constant(vocabulary.encode(" ".join(b)), tf.int32),
          "lang": tf.constant("de"), "lang_b": tf.constant("en")}
    expected = converter._layout(ex, CONFIG.num_positions)  # The row must fit the position table.
    for key in ("tokens", "lang_ids", "positions", "pair_side"):
      np.testing.assert_array_equal(getattr(encoded, key), expected[key].numpy(), err_msg=key)
  # By hand: <s> a </s> b </s>, positions 0.. across the pair.
  specials = aligner.specials
  e = word_align.layout_pair([[11, 12], [13]], [[21]], src_lang_id=1, tgt_lang_id=2, max_length=16,
                             max_side=16, specials=specials, pair_layout="continuous")
  assert e.tokens.tolist() == [specials.bos, 11, 12, 13, specials.eos, 21, specials.eos]
  assert e.positions.tolist() == list(range(7))
  assert e.pair_side.tolist() == [1] * 5 + [2] * 2 and e.lang_ids.tolist() == [1] * 5 + [2] * 2
  # The whole row shares one position table: a budget of max_length - 3 subwords.
  e = word_align.layout_pair([[1]] * 6, [[2]] * 6, src_lang_id=1, tgt_lang_id=2, max_length=10, max_side=10,
                             specials=specials, pair_layout="continuous")
  assert (len(e.src_words), len(e.tgt_words), e.truncated) == (3, 4, True)  # 7 = 3 + 4, as pair_budget
  # The links of a continuous row come from the right positions: a sentence
  # against itself at layer 0 without language embeddings would be diagonal,
  # here we only check that every method runs and stays inside the sentences.
  with pytest.warns(UserWarning, match="must fit the 32 positions"):
    aligner.encode([(DE, EN)])
  links = aligner.run(pairs, layers=(0, 2), methods=word_align.METHODS)
  for (a, b), per_pair in zip(pairs, links[("sinkhorn", 2)]):
    assert all(i < len(a) and j < len(b) for i, j in per_pair)
  with pytest.raises(UserError, match="needs the 'restart' pair layout"):
    word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de", tgt_lang="en",
                           encoding="separate", pair_layout="continuous")
  with pytest.raises(UserError, match="not a pair layout"):
    word_align.layout_pair([[1]], [[2]], src_lang_id=1, tgt_lang_id=2, max_length=10, max_side=10,
                           specials=specials, pair_layout="packed")


def test_continuous_layout_aligns_a_sentence_with_itself_at_layer_0(plain_model, vocabulary):
  model, params = plain_model
  aligner = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                   tgt_lang="en", batch_size=4, pair_layout="continuous",
                                   options=AlignmentSolver(similarity="cosine"))
  # Layer 0 adds position embeddings, which differ across the two sides here:
  # the argmax of cosines still finds each word's own copy.
  words = DE[:6]
  links = aligner.align([(words, words)], layer=0, method="argmax")[0]
  assert links == {(i, i) for i in range(len(words))}


def test_word_links_from_subwords():
  links = np.zeros((4, 3), bool)
  links[1, 2] = links[0, 1] = links[3, 0] = True
  src_words, tgt_words = np.array([0, 0, 1, 2]), np.array([0, 1, 1])
  assert word_align.word_links(links, src_words, tgt_words) == {(0, 1), (2, 0)}
  assert word_align.word_links(np.zeros((0, 3), bool), src_words[:0], tgt_words) == frozenset()


def test_long_pairs_keep_word_prefixes_and_warn_once(aligner, tiny_model, vocabulary):
  model, params = tiny_model
  short = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                 tgt_lang="en", max_length=24, batch_size=4)
  pairs = [(DE * 2, EN[:3]), (DE[:3], EN[:2]), (DE * 3, EN * 3)]
  with pytest.warns(UserWarning, match=r"2 of 3 sentence pairs exceed") as record:
    encoded = short.encode(pairs)
  assert len(record) == 1
  assert [e.truncated for e in encoded] == [True, False, True]
  for (a, b), e in zip(pairs, encoded):
    assert len(e.tokens) <= 24 and e.positions.max() < CONFIG.max_positions
    for words, side in ((a, e.src_words), (b, e.tgt_words)):
      kept = int(side.max()) + 1 if len(side) else 0
      assert len(side) == sum(len(p) for p in short.word_pieces(words[:kept]))  # Whole words only.
  # A short target gives its unused share to the source, as pair_budget does.
  assert len(encoded[0].src_words) > (24 - 4) // 2
  with pytest.warns(UserWarning):
    links = short.align(pairs, layer=2, method="sinkhorn")
  assert all(i <= encoded[k].src_words.max() for k, pair in enumerate(links) for i, _ in pair)
  # The position table (32) caps each side at 30 subwords even with a large budget.
  with pytest.warns(UserWarning, match="1 of 1"):
    encoded = aligner.encode([(DE * 4, EN)])
  assert len(encoded[0].src_words) <= 30 and encoded[0].positions.max() <= 31


def test_a_sentence_aligns_with_itself_at_layer_0(plain_aligner):
  words = EN[:6] + ["dog", "tree"]  # Distinct words.
  pairs = [(words, words), (words[:3], words[:3])]
  links = plain_aligner.run(pairs, layers=range(CONFIG.num_layers + 1), methods=word_align.METHODS)
  for method in word_align.METHODS:
    assert links[(method, 0)] == [{(i, i) for i in range(len(a))} for a, _ in pairs], method


def test_batching_and_padding_do_not_change_links(aligner):
  # One shape (4 rows, length 32) throughout, so one compile: each pair once
  # among others, once with copies of itself.
  pairs = [(DE[5:9], EN[6:8]), (DE[:6], EN[:6]), (DE[9:12], EN[10:13])]
  together = aligner.align(pairs, layer=2)
  assert together == [aligner.align([pair] * 3, layer=2)[0] for pair in pairs]
  assert all(together)


def test_sweep_scores_every_method_and_layer(plain_aligner):
  words = EN[:6] + ["dog", "tree"]
  pairs = [(words, words), (words[:3], words[:3])]
  gold = [{(i, i) for i in range(len(a))} for a, _ in pairs]
  table = plain_aligner.sweep(pairs, gold)
  assert set(table) == {(m, layer) for m in word_align.SWEEP_METHODS for layer in range(CONFIG.num_layers + 1)}
  assert all(isinstance(s, aer.AlignmentScores) and 0.0 <= s.aer <= 1.0 for s in table.values())
  assert table[("argmax", 0)].aer == 0.0 and table[("argmax", 0)].num_sure == 11
  assert plain_aligner.last_run["pairs"] == 2 and plain_aligner.last_run["seconds"] > 0
  with pytest.raises(UserError, match="gold alignments for 1 pairs but 2"):
    plain_aligner.sweep(pairs, gold[:1])


def test_bad_layer_method_and_language(aligner, tiny_model, vocabulary):
  with pytest.raises(UserError, match=r"layer 3 is outside 0\.\.2"):
    aligner.align([(DE, EN)], layer=3)
  with pytest.raises(UserError, match="unknown alignment method 'maxmatch'"):
    aligner.align([(DE, EN)], layer=1, method="maxmatch")
  model, params = tiny_model
  # With language embeddings, a language outside the run's list has no embedding to use.
  assert model.config.num_languages > 0
  with pytest.raises(UserError, match=r"'fr' is not one of the checkpoint's languages \['de', 'en'\]"):
    word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="fr", tgt_lang="en")
  with pytest.raises(UserError, match="unknown similarity"):
    AlignmentSolver(similarity="l2")


def test_checkpoint_round_trip(tmp_path, tiny_corpus, tiny_model, vocabulary, aligner):
  _, params = tiny_model
  model_dir = write_checkpoint(tmp_path / "registered", params, vocabulary, task="tiny_mix",
                               languages=["de", "en"], language_pairs=[("de", "en")])
  loaded, run, step = word_align.load_aligner(Run.open(model_dir), batch_size=4)
  assert (loaded.src_lang, loaded.tgt_lang, step) == ("de", "en", 1)  # From the manifest's bitext sides.
  assert loaded.pair_layout == run.pair_layout == "restart"
  assert loaded.specials == run.vocabulary.specials
  pairs = [(DE[5:9], EN[6:8]), (DE[:6], EN[:6]), (DE[9:12], EN[10:13])]
  assert loaded.align(pairs, layer=2) == aligner.align(pairs, layer=2)

  # A task this process does not know: vocabulary and sides come from the run directory alone.
  model_dir = write_checkpoint(tmp_path / "gone", params, vocabulary, task="gone_mix", languages=["de", "en"],
                               language_pairs=[("en", "de")])
  loaded, _, _ = word_align.load_aligner(Run.open(model_dir))
  assert (loaded.src_lang, loaded.tgt_lang) == ("en", "de")
  links = loaded.align(pairs, layer=2)
  # Without the MODEL_DIR copy the checkpoint step's copy serves; without both, one clear error.
  (model_dir / "vocabulary.model").unlink()
  assert word_align.load_aligner(Run.open(model_dir))[0].align(pairs, layer=2) == links
  (model_dir / "checkpoints" / "1" / "assets" / "vocabulary.model").unlink()
  with pytest.raises(UserError, match="vocabulary.model is missing"):
    word_align.load_aligner(Run.open(model_dir))
  loaded, _, _ = word_align.load_aligner(Run.open(model_dir), vocabulary_path=tiny_corpus["vocab"])
  assert (loaded.src_lang, loaded.tgt_lang) == ("en", "de")
  other = _other_vocabulary(tmp_path, tiny_corpus)
  with pytest.raises(UserError, match="is not the vocabulary"):
    word_align.load_aligner(Run.open(model_dir), vocabulary_path=str(other))

  # The pair layout comes from the manifest unless overridden.
  model_dir = write_checkpoint(tmp_path / "continuous", params, vocabulary, task="tiny_mix",
                               languages=["de", "en"], language_pairs=[("de", "en")], pair_layout="continuous")
  assert word_align.load_aligner(Run.open(model_dir))[0].pair_layout == "continuous"
  assert word_align.load_aligner(Run.open(model_dir), pair_layout="restart")[0].pair_layout == "restart"

  # No recorded bitext sides: the languages must be named (one is enough with two languages).
  model_dir = write_checkpoint(tmp_path / "mono", params, vocabulary, task="gone_mono", languages=["de", "en"])
  with pytest.raises(UserError, match="pass --src_lang and --tgt_lang"):
    word_align.load_aligner(Run.open(model_dir))
  loaded, _, _ = word_align.load_aligner(Run.open(model_dir), tgt_lang="de")
  assert (loaded.src_lang, loaded.tgt_lang) == ("en", "de")


def _other_vocabulary(tmp_path, tiny_corpus):
  from flax_xalign.data.vocab import sentencepiece as vocab
  return vocab.train_sentencepiece(open(tiny_corpus["files"][("en", "train")], encoding="utf-8"),
                                   vocab_size=37, model_path=tmp_path / "other.model")


def test_checkpoint_without_run_manifest_is_refused(tmp_path, tiny_model):
  import tensorflow as tf

  from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer

  _, params = tiny_model
  checkpointer = Checkpointer(str(tmp_path / "old"), CheckpointConfig(async_save=False))
  legacy_meta = {"model": {}, "vocabulary": {"size": 83, "sha256": "0" * 64}, "languages": ["de", "en"],
                 "task": "tiny_mix"}
  checkpointer.save(1, {"params": params, "step": np.int32(1)}, iter(tf.data.Dataset.range(2)), legacy_meta,
                    force=True)
  checkpointer.close()
  with pytest.raises(UserError, match="before run manifests"):
    word_align.load_aligner(Run.open(tmp_path / "old"))


def test_evaluate_alignment_on_bible_gold(tmp_path, bible_data_dir, tiny_corpus, tiny_model, vocabulary):
  _, params = tiny_model
  model_dir = write_checkpoint(tmp_path / "m", params, vocabulary, task="gone_bible", languages=["en", "grc"])
  out = tmp_path / "report"
  results = word_align.evaluate_alignment(Run.open(model_dir), max_pairs=6, output_dir=str(out), batch_size=4,
                                          verbose=False)
  import dataclasses

  assert {k: results[k] for k in dataclasses.asdict(AlignmentSolver())} == dataclasses.asdict(AlignmentSolver())
  assert results["pair_layout"] == "restart" and results["sinkhorn_kernel"] == "clamped"
  assert results["pairs"] == 6 and results["layers"] == [0, 1, 2] and results["step"] == 1
  assert set(results["scores"]) == set(word_align.SWEEP_METHODS) == set(results["best"])
  assert set(results["scores"]["sinkhorn"]) == {"0", "1", "2"}
  assert results["best"]["argmax"]["layer"] in (0, 1, 2)
  assert 0.0 < results["diagonal_baseline"]["aer"] < 1.0
  assert json.loads((out / "aer.json").read_text())["scores"] == results["scores"]
  assert "| sinkhorn | 2 |" in (out / "aer.md").read_text()
  assert (out / "aer_layers.png").stat().st_size > 1000
  assert "diagonal baseline" in word_align.format_best(results)
  other = write_checkpoint(tmp_path / "de_en", params, vocabulary, task="tiny_mix", languages=["de", "en"])
  with pytest.raises(UserError, match=r"trained on \['de', 'en'\]; the Bible gold alignments are Greek-English"):
    word_align.evaluate_alignment(Run.open(other))
  pairs, sure = word_align.bible_gold("test", max_pairs=3)
  assert len(pairs) == len(sure) == 3 and all(len(a) and len(b) for a, b in pairs)


def test_a_model_without_language_embeddings_accepts_any_language(plain_model, plain_aligner, vocabulary):
  model, params = plain_model
  other = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="fr",
                                 tgt_lang="grc", batch_size=4)
  assert (other.src_lang_id, other.tgt_lang_id) == (0, 0)
  listed = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="en",
                                  tgt_lang="xx", batch_size=4)
  assert (listed.src_lang_id, listed.tgt_lang_id) == (2, 0)
  pairs = [(DE[5:9], EN[6:8]), (DE[:6], EN[:6]), (DE[9:12], EN[10:13])]
  # The encoder never reads lang_ids without language embeddings: the same links.
  assert other.align(pairs, layer=2) == plain_aligner.align(pairs, layer=2)
  assert all(other.align(pairs, layer=2))


def test_normalize_applies_to_each_word(aligner, tiny_model, vocabulary):
  model, params = tiny_model
  stripping = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                     tgt_lang="en", batch_size=4, normalize="nfd_strip_marks")
  accented = ["häus", "läuft", "über", "grün", "dög"]
  plain = ["haus", "lauft", "uber", "grun", "dog"]
  assert stripping.word_pieces(accented) == aligner.word_pieces(plain) == stripping.word_pieces(plain)
  assert aligner.word_pieces(accented) != aligner.word_pieces(plain)
  pairs = [(accented, EN[:5]), (DE[6:10], ["thé", "cät", "rüns"])]
  stripped = [([w.replace("ä", "a").replace("ü", "u").replace("ö", "o") for w in a],
               [w.replace("é", "e").replace("ä", "a").replace("ü", "u") for w in b]) for a, b in pairs]
  assert stripping.align(pairs, layer=2) == aligner.align(stripped, layer=2)
  lowering = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                    tgt_lang="en", normalize="lower")
  assert lowering.word_pieces(["HAUS", "Hund"]) == aligner.word_pieces(["haus", "hund"])
  with pytest.raises(UserError, match="normalize='nfd' is not a known text normaliser"):
    word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de", tgt_lang="en",
                           normalize="nfd")


def test_separate_encoding_equals_encoding_each_side_alone(tiny_model, vocabulary):
  """With encoding='separate' a side's states do not depend on the other side."""
  model, params = tiny_model
  aligner = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                   tgt_lang="en", batch_size=2, encoding="separate")
  encoder = model.encoder
  pair = (DE[:4], EN[:5])
  batch = aligner._batch(aligner.encode([pair]), 2, 32)
  na = len(aligner.encode([pair])[0].src_words)
  assert set(batch["segment_ids"][0, :na + 2]) == {1} and set(batch["segment_ids"][0, na + 2:na + 2 + 7]) >= {2}

  def hidden(b):
    return np.asarray(encoder.apply({"params": params}, b["tokens"], lang_ids=b["lang_ids"],
                                    positions=b["positions"], segment_ids=b["segment_ids"],
                                    deterministic=True).hidden[0])

  other = aligner._batch(aligner.encode([(DE[:4], EN[6:9])]), 2, 32)  # Same source, another target.
  np.testing.assert_allclose(hidden(batch)[:na + 2], hidden(other)[:na + 2], rtol=1e-5, atol=1e-6)
  joint = word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de",
                                 tgt_lang="en", batch_size=2)
  jb, jo = joint._batch(joint.encode([pair]), 2, 32), joint._batch(joint.encode([(DE[:4], EN[6:9])]), 2, 32)
  assert not np.allclose(hidden(jb)[:na + 2], hidden(jo)[:na + 2], atol=1e-4)  # Joint: sides see each other.
  with pytest.raises(UserError, match="unknown encoding"):
    word_align.WordAligner(model, params, vocabulary, languages=["de", "en"], src_lang="de", tgt_lang="en",
                           encoding="both")


# ------------------------------------------------------------- model defaults


def _bible_definition(normalize):
  return ({"kind": "BibleTasks", "args": {"prefix": "e5_bible", "normalize": normalize}},)


@pytest.mark.parametrize("objectives, options, want", [
    ((), None, ("separate", "cosine")),                     # an import: never saw a pair
    ((("mlm", 1.0),), None, ("separate", "cosine")),         # MLM alone reads monolingual slots only
    ((("mlm", 1.0), ("tlm", 1.0)), None, ("joint", "dot")),  # TLM: pairs in one segment
    ((("tlm", 1.0), ("so", 1.0)), None, ("separate", "cosine")),  # SO trains each side alone
    ((("tlm", 1.0), ("dwa", 1.0)), {"dwa": {"self_label_encoding": "separate", "solver": {"similarity": "cosine"}}},
     ("separate", "cosine")),                                 # as DWA self-labelled
    ((("tlm", 1.0), ("dwa", 1.0)), {"dwa": {"self_label_encoding": "joint", "solver": {"similarity": "dot"}}},
     ("joint", "dot")),
])
def test_aligner_defaults_follow_what_the_model_was_trained_on(tmp_path, tiny_model, vocabulary, objectives,
                                                                options, want):
  _, params = tiny_model
  model_dir = write_checkpoint(tmp_path / "m", params, vocabulary, task="gone_mix", languages=["de", "en"],
                               language_pairs=[("de", "en")], objectives=objectives, objective_options=options)
  loaded, _, _ = word_align.load_aligner(Run.open(model_dir))
  assert (loaded.encoding, loaded.options.similarity) == want
  assert loaded.settings.sources["encoding"] != "flag"
  line = loaded.settings.describe()
  assert f"encoding={want[0]}" in line and f"similarity={want[1]}" in line and "normalize=none" in line
  # Every flag wins over the model; a passed encoding brings its own family's similarity.
  other = {"joint": "separate", "separate": "joint"}[want[0]]
  flagged, _, _ = word_align.load_aligner(Run.open(model_dir), encoding=other, normalize="nfd_strip_marks")
  assert flagged.encoding == other and flagged.normalize == "nfd_strip_marks"
  assert flagged.options.similarity == {"joint": "dot", "separate": "cosine"}[other]
  assert flagged.settings.sources["encoding"] == flagged.settings.sources["normalize"] == "flag"
  pinned, _, _ = word_align.load_aligner(Run.open(model_dir), similarity="cosine", options=AlignmentSolver(mu=2.0))
  assert pinned.options == AlignmentSolver(mu=2.0, similarity="cosine")
  assert "similarity=cosine (as passed)" in pinned.settings.describe()


def test_aligner_normaliser_comes_from_the_tasks_the_trimmed_vocabulary_or_the_warm_start(
    tmp_path, tiny_model, vocabulary):
  _, params = tiny_model
  common = dict(task="gone_mix", languages=["de", "en"], language_pairs=[("de", "en")])
  trained = write_checkpoint(tmp_path / "trained", params, vocabulary, **common,
                             task_definitions=_bible_definition("nfd_strip_marks"))
  loaded, _, _ = word_align.load_aligner(Run.open(trained))
  assert loaded.normalize == "nfd_strip_marks" and "training tasks" in loaded.settings.sources["normalize"]

  imported = write_checkpoint(tmp_path / "imported", params, vocabulary, **common, objectives=())
  (imported / "origin.json").write_text(json.dumps({"normalizers": ["nfd_strip_marks"], "step": 0}))
  loaded, _, _ = word_align.load_aligner(Run.open(imported))
  assert (loaded.normalize, loaded.encoding, loaded.options.similarity) == ("nfd_strip_marks", "separate", "cosine")
  assert "origin.json" in loaded.settings.sources["normalize"]

  # A run warm-started from the import inherits its normaliser; one warm-started from a TLM run, its encoding.
  continued = write_checkpoint(tmp_path / "continued", params, vocabulary, **common, objectives=(("mlm", 1.0),),
                               init_from_checkpoint=str(imported))
  assert word_align.load_aligner(Run.open(continued))[0].normalize == "nfd_strip_marks"
  from_tlm = write_checkpoint(tmp_path / "from_tlm", params, vocabulary, **common, objectives=(("mlm", 1.0),),
                              init_from_checkpoint=str(trained))
  loaded, _, _ = word_align.load_aligner(Run.open(from_tlm))
  assert (loaded.encoding, loaded.normalize) == ("joint", "nfd_strip_marks")
  assert str(trained) in loaded.settings.sources["encoding"]
  # A warm-start source that is gone only ends the chain.
  orphan = write_checkpoint(tmp_path / "orphan", params, vocabulary, **common, objectives=(("mlm", 1.0),),
                            init_from_checkpoint=str(tmp_path / "deleted"))
  loaded, _, _ = word_align.load_aligner(Run.open(orphan))
  assert (loaded.encoding, loaded.normalize) == ("separate", "")

  # Tasks with two different normalisers: none is guessed, and the line says why.
  mixed = write_checkpoint(tmp_path / "mixed", params, vocabulary, **common, task_definitions=(
      _bible_definition("nfd_strip_marks")[0], {"kind": "TextTask", "args": {"normalize": "nfkc"}}))
  loaded, _, _ = word_align.load_aligner(Run.open(mixed))
  assert loaded.normalize == "" and "several normalisers" in loaded.settings.describe()


def test_the_continuous_layout_defaults_to_joint_encoding(tmp_path, tiny_model, vocabulary):
  _, params = tiny_model
  model_dir = write_checkpoint(tmp_path / "c", params, vocabulary, task="gone_mix", languages=["de", "en"],
                               language_pairs=[("de", "en")], objectives=(), pair_layout="continuous")
  loaded, _, _ = word_align.load_aligner(Run.open(model_dir))
  assert (loaded.pair_layout, loaded.encoding, loaded.options.similarity) == ("continuous", "joint", "dot")
