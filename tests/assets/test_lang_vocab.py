"""The `lang_vocab` asset (§2.1) against hand counts of a corpus the test writes, and the synthetic pair."""

import collections
import random

import numpy as np
import pytest
import sentencepiece as spm

from flax_xalign.assets import lang_vocab as lv
from flax_xalign.assets import registry
from flax_xalign.data.transforms.synthetic import SyntheticLanguage
from flax_xalign.errors import UserError
from flax_xalign.run_spec import RunSpec
from tests.testlib import register_synthetic_afresh, tiny_encoder_config

EN = "cat dog house tree river sun moon red blue green the a of and".split()
DE = "katze hund haus baum fluss sonne mond rot blau gruen die ein von und".split()
SHARED = ["ok", "tv", "radio"]  # Used in both languages: frequent on both sides, so removed.


def _lines(rng, words, n):
  return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy_corpus):
  """lv_en, lv_de (text), lv_de_en (bitext) and their mixture lv_mix over files written here."""
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("lang_vocab_corpus")
  rng = random.Random(3)
  en = _lines(rng, EN + SHARED, 150)
  de = _lines(rng, DE + SHARED, 90)
  pairs = list(zip(_lines(rng, DE, 40), _lines(rng, EN, 40)))
  (root / "en.txt").write_text("\n".join(en) + "\n\n   \n", encoding="utf-8")  # Blank lines are skipped.
  (root / "de.txt").write_text("\n".join(de) + "\n", encoding="utf-8")
  (root / "de_en.tsv").write_text("\n".join(f"{d}\t{e}" for d, e in pairs) + "\n", encoding="utf-8")
  model = str(toy_corpus[1])
  tasks = [user.TextTask(name="lv_en", files={"train": str(root / "en.txt")}, lang="en", vocabulary_path=model),
           user.TextTask(name="lv_de", files={"train": str(root / "de.txt")}, lang="de", vocabulary_path=model),
           user.TsvBitextTask(name="lv_de_en", files={"train": str(root / "de_en.tsv")}, lang_a="de", lang_b="en",
                              vocabulary_path=model),
           user.AlphaMixture(name="lv_mix", tasks=("lv_en", "lv_de", "lv_de_en"))]
  for t in tasks:
    t.register()
  # The hand count: SentencePiece over every non-empty line, per language (bitext sides included).
  sp = spm.SentencePieceProcessor(model_file=model)
  counts = {"de": collections.Counter(), "en": collections.Counter()}
  for lang, texts in (("en", en), ("de", de), ("de", [d for d, _ in pairs]), ("en", [e for _, e in pairs])):
    for text in texts:
      counts[lang].update(sp.encode(text.strip()))
  return {"root": root, "model": model, "counts": counts, "sp": sp}


def _run(task, asset_options=None, **changes):
  from flax_xalign.training.data import resolve_task

  data = resolve_task(task)
  return RunSpec(task=task, languages=data.languages, task_feature_lengths={"tokens": 19},
                 task_definitions=data.definitions, vocabulary=data.vocabulary_spec,
                 model=tiny_encoder_config(vocab_size=data.vocabulary_spec.size), objectives={"mlm": 1.0},
                 asset_options=asset_options or {}, **changes)


def _hand_vocab(counts, min_count, first_regular, size):
  """§2.1 from the description: V_l = {t: count_l(t) > min_count}, minus the tokens in both."""
  frequent = [{t for t, n in counts[lang].items() if n > min_count and first_regular <= t < size}
              for lang in ("de", "en")]
  return sorted(frequent[0] - frequent[1]), sorted(frequent[1] - frequent[0])


def test_counts_match_a_hand_count_of_every_member_task(corpus):
  size = corpus["sp"].get_piece_size()
  counts = lv.count_tokens("lv_mix", languages=("de", "en"), vocab_size=size, log=None)
  assert counts.shape == (2, size) and counts.dtype == np.int64
  for row, lang in enumerate(("de", "en")):
    expected = np.zeros(size, np.int64)
    for t, n in corpus["counts"][lang].items():
      expected[t] = n
    np.testing.assert_array_equal(counts[row], expected, err_msg=lang)
  # Languages outside `languages` are skipped; the order of `languages` is the row order.
  only_en = lv.count_tokens("lv_mix", languages=("en",), vocab_size=size, log=None)
  np.testing.assert_array_equal(only_en[0], counts[1])
  capped = lv.count_tokens("lv_en", languages=("en",), vocab_size=size, max_examples=3, log=None)
  first3 = [line for line in (corpus["root"] / "en.txt").read_text().splitlines() if line.strip()][:3]
  assert capped.sum() == sum(len(corpus["sp"].encode(line)) for line in first3)


def test_language_specific_threshold_is_strict_and_shared_tokens_are_removed():
  counts = np.array([[9, 9, 101, 100, 500, 101, 0, 300],
                     [9, 9, 0, 101, 200, 100, 101, 7]])
  side0, side1 = lv.language_specific(counts, min_count=100, first_regular=2, end_regular=None)
  # 2: 101 > 100 only in side 0; 3: 100 is not > 100 in side 0; 4: frequent in both, removed;
  # 5: 100 in side 1 is not frequent there, so 5 stays in side 0; 0, 1: specials.
  np.testing.assert_array_equal(side0, [2, 5, 7])
  np.testing.assert_array_equal(side1, [3, 6])
  side0, side1 = lv.language_specific(counts, min_count=100, first_regular=2, end_regular=7)
  np.testing.assert_array_equal(side0, [2, 5])
  specials = lv.language_specific(np.full((2, 6), 1000), min_count=0, first_regular=5, end_regular=None)
  assert [s.tolist() for s in specials] == [[], []]  # Everything shared.


@pytest.mark.parametrize("min_count", [0, 3, 12, 40])
def test_lang_vocab_for_matches_the_hand_vocabulary(corpus, min_count):
  run = _run("lv_mix")
  value = lv.lang_vocab_for(run, min_count=min_count, log=None)
  specials = run.vocabulary.specials
  expected = _hand_vocab(corpus["counts"], min_count, specials.first_regular, run.vocabulary.size)
  assert set(value) == {"ids", "mask", "counts", "lang_ids"}
  assert value["ids"].dtype == np.int32 and value["mask"].dtype == bool and value["counts"].dtype == np.int32
  assert value["ids"].shape == value["mask"].shape == (2, max(map(len, expected)))
  np.testing.assert_array_equal(value["lang_ids"], [run.language_id("de"), run.language_id("en")])
  for s, lang in enumerate(("de", "en")):
    ids = value["ids"][s][value["mask"][s]]
    np.testing.assert_array_equal(ids, expected[s])
    np.testing.assert_array_equal(value["counts"][s][value["mask"][s]], [corpus["counts"][lang][t] for t in ids])
    assert not value["ids"][s][~value["mask"][s]].any()
  shared_ids = {t for w in SHARED for t in corpus["sp"].encode(w)}
  frequent_both = {t for t in shared_ids if min(corpus["counts"]["de"][t], corpus["counts"]["en"][t]) > min_count}
  assert frequent_both and not frequent_both & set(value["ids"][value["mask"]].tolist())


def test_threshold_equal_to_a_count_excludes_that_token(corpus):
  run = _run("lv_mix")
  counts = corpus["counts"]
  # A token used in one language only, whose count as min_count leaves both sides non-empty.
  candidates = sorted((counts[lang][t], s, t) for s, lang in enumerate(("de", "en")) for t in counts[lang]
                      if t >= 5 and counts["en" if lang == "de" else "de"][t] == 0)
  n, side, token = next(c for c in candidates if all(_hand_vocab(counts, c[0], 5, run.vocabulary.size)))
  at = lv.lang_vocab_for(run, min_count=n, log=None)
  below = lv.lang_vocab_for(run, min_count=n - 1, log=None)
  assert token not in at["ids"][side][at["mask"][side]]
  assert token in below["ids"][side][below["mask"][side]]


def test_file_round_trip_keeps_the_fingerprint_and_is_readable(corpus, tmp_path):
  run = _run("lv_mix", {"lang_vocab": {"min_count": 3, "languages": ["en", "de"]}})
  asset = registry.create("lang_vocab", run)
  value = asset.build(run)
  assert asset.languages == ("en", "de")
  np.testing.assert_array_equal(value["lang_ids"], [run.language_id("en"), run.language_id("de")])
  asset.save(str(tmp_path), value)
  text = (tmp_path / lv.FILENAME).read_text(encoding="utf-8").splitlines()
  header = [line for line in text if line.startswith("#")]
  assert "# languages: en de" in header and "# min_count: 3" in header and "# task: lv_mix" in header
  assert "# split: train" in header and any(line.startswith("# kept_token_totals:") for line in header)
  rows = [line.split("\t") for line in text if not line.startswith("#")]
  assert rows[0] == ["lang", "id", "piece", "count"]
  first = rows[1]
  assert first[0] == "en" and first[2] == corpus["sp"].id_to_piece(int(first[1]))
  assert int(first[3]) == corpus["counts"]["en"][int(first[1])]
  loaded = registry.create("lang_vocab", run).load(str(tmp_path))
  assert asset.fingerprint(loaded) == asset.fingerprint(value)
  for key in value:
    assert loaded[key].dtype == value[key].dtype
    np.testing.assert_array_equal(loaded[key], value[key])
  asset.check(loaded, run)
  assert "lang_vocab: language-specific tokens en" in asset.describe(value)


def test_a_file_of_other_settings_or_malformed_is_refused(corpus, tmp_path):
  run = _run("lv_mix", {"lang_vocab": {"min_count": 3}})
  asset = registry.create("lang_vocab", run)
  asset.save(str(tmp_path), asset.build(run))
  other = _run("lv_mix", {"lang_vocab": {"min_count": 4}})
  reader = registry.create("lang_vocab", other)
  with pytest.raises(UserError, match="min_count '3'"):
    reader.check(reader.load(str(tmp_path)), other)
  path = tmp_path / lv.FILENAME
  lines = path.read_text(encoding="utf-8").splitlines()
  number = next(i for i, line in enumerate(lines) if line.startswith("en\t")) + 1
  lines[number - 1] = lines[number - 1].replace("\t", "\tx", 1)
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  with pytest.raises(UserError, match=rf"lang_vocab.tsv:{number}: malformed row"):
    asset.load(str(tmp_path))
  path.write_text("de\t7\tx\t3\n", encoding="utf-8")
  with pytest.raises(UserError, match="header has no '# languages"):
    asset.load(str(tmp_path))


def test_bad_options_and_empty_sides_are_user_errors(corpus):
  with pytest.raises(UserError, match=r"unknown lang_vocab option\(s\) \['min_cnt'\]"):
    registry.create("lang_vocab", _run("lv_mix", {"lang_vocab": {"min_cnt": 3}}))
  with pytest.raises(UserError, match=r"\['fr'\] not among the run's languages"):
    registry.create("lang_vocab", _run("lv_mix", {"lang_vocab": {"languages": ["de", "fr"]}}))
  with pytest.raises(UserError, match="two or more different languages"):
    registry.create("lang_vocab", _run("lv_mix", {"lang_vocab": {"languages": ["de", "de"]}}))
  with pytest.raises(UserError, match="'min_count' must be an integer >= 0"):
    registry.create("lang_vocab", _run("lv_mix", {"lang_vocab": {"min_count": -1}}))
  run = _run("lv_mix", {"lang_vocab": {"min_count": 10**6}})
  with pytest.raises(UserError, match=r"vocabulary of 'de' is empty.*Lower min_count"):
    registry.create("lang_vocab", run).build(run)
  # A run with one language cannot have the asset; objectives that require it get one clear error.
  one = _run("lv_en")
  with pytest.raises(UserError, match=r"Objectives \['scs'\] need the asset 'lang_vocab'.*has 1"):
    registry.resolve({"lang_vocab": ["scs"]}, {}, one)
  with pytest.raises(UserError, match="no task of 'lv_mix' has a split 'validation'"):
    lv.lang_vocab_for(_run("lv_mix"), split="validation", log=None)


def test_counting_reports_progress(corpus, monkeypatch):
  monkeypatch.setattr(lv, "_PROGRESS_SECONDS", 0.0)
  lines = []
  lv.count_tokens("lv_mix", languages=("de", "en"), vocab_size=corpus["sp"].get_piece_size(), log=lines.append)
  assert len(lines) >= 4 and "examples" in lines[0] and lines[-1].startswith("lang_vocab: counted lv_mix:train")


def test_synthetic_pair_with_overlap(bible_data_dir):
  """Anchors (ids the derived language shares) are frequent in both streams and removed; derived ids are >= V."""
  from flax_xalign.tasks import synthetic

  V = 211
  language = SyntheticLanguage(transforms="trans", vocab_size=V, overlap=0.2, seed=0)
  names = register_synthetic_afresh(language)
  run = _run(names["mlm"])
  value = lv.lang_vocab_for(run, min_count=20, log=None)
  assert value["lang_ids"].tolist() == [run.language_id("grc"), run.language_id("grc~trans")]
  natural, derived = (value["ids"][s][value["mask"][s]] for s in (0, 1))
  id_map = language.id_map()
  anchors = np.flatnonzero(id_map[:V] == np.arange(V))
  anchors = anchors[anchors >= run.vocabulary.specials.first_regular]
  assert len(anchors) == round(0.2 * (V - 5))
  # The hand count of the natural stream, with SentencePiece over its train verses.
  sp = spm.SentencePieceProcessor(model_file=synthetic.GreekVocabularyPath(V)())
  counts = collections.Counter()
  for text in synthetic._Loader(language, "natural")("train")["text"]:
    counts.update(sp.encode(text.strip()))
  frequent = np.array(sorted(t for t, n in counts.items() if n > 20 and t >= 5))
  np.testing.assert_array_equal(natural, np.setdiff1d(frequent, anchors))
  np.testing.assert_array_equal(derived, np.sort(id_map[natural]))
  assert (derived >= V).all() and (natural < V).all()
  assert np.intersect1d(frequent, anchors).size > 0  # Some anchors were frequent, and are gone.


# ------------------------------------------------------------- many languages and a pivot

FR = "chat chien maison arbre riviere soleil lune rouge bleu vert le un de et".split()


@pytest.fixture(scope="module")
def corpus3(tmp_path_factory, corpus):
  """lv3_en, lv3_de, lv3_fr (text) and their mixture lv3_mix: three languages written here."""
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("lang_vocab_corpus3")
  rng = random.Random(5)
  texts = {"en": _lines(rng, EN + SHARED, 160), "de": _lines(rng, DE + SHARED, 120),
           "fr": _lines(rng, FR + SHARED + ["ein"], 100)}  # 'ein' is German, frequent in French here
  for lang, lines in texts.items():
    (root / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    user.TextTask(name=f"lv3_{lang}", files={"train": str(root / f"{lang}.txt")}, lang=lang,
                  vocabulary_path=corpus["model"]).register()
  user.AlphaMixture(name="lv3_mix", tasks=("lv3_en", "lv3_de", "lv3_fr")).register()
  counts = {lang: collections.Counter(t for text in lines for t in corpus["sp"].encode(text.strip()))
            for lang, lines in texts.items()}
  return {"counts": counts}


def test_many_languages_pair_each_with_the_pivot(corpus3, tmp_path):
  run = _run("lv3_mix", {"lang_vocab": {"min_count": 2}})
  asset = registry.create("lang_vocab", run)
  assert asset.languages == ("de", "en", "fr") and asset.pivot == "en"  # English by default
  assert asset.sides == ("de", "en@de", "fr", "en@fr")
  value = asset.build(run)
  counts = corpus3["counts"]
  specials = run.vocabulary.specials
  np.testing.assert_array_equal(value["lang_ids"], [run.language_id(x) for x in ("de", "en", "fr", "en")])
  for pair, lang in ((0, "de"), (1, "fr")):  # §2.1 for each (X, en), by hand
    hand = _hand_vocab({"de": counts[lang], "en": counts["en"]}, 2, specials.first_regular, run.vocabulary.size)
    for s in (0, 1):
      side = 2 * pair + s
      np.testing.assert_array_equal(value["ids"][side][value["mask"][side]], hand[s])
  english = [set(value["ids"][s][value["mask"][s]].tolist()) for s in (1, 3)]
  assert english[0] != english[1]  # English's vocabulary depends on its partner ('ein' is French here too)
  asset.save(str(tmp_path), value)
  text = (tmp_path / lv.FILENAME).read_text(encoding="utf-8")
  assert "# pivot: en\n" in text and "# sides: de en@de fr en@fr\n" in text and "\nen@fr\t" in text
  loaded = registry.create("lang_vocab", run).load(str(tmp_path))
  for key in value:
    np.testing.assert_array_equal(loaded[key], value[key])
  asset.check(loaded, run)
  # Another pivot makes other sides: the saved file is refused, not misread.
  other = _run("lv3_mix", {"lang_vocab": {"min_count": 2, "pivot": "de"}})
  reader = registry.create("lang_vocab", other)
  assert reader.sides == ("en", "de@en", "fr", "de@fr")
  with pytest.raises(UserError, match="was built with sides 'de en@de fr en@fr'"):
    reader.check(reader.load(str(tmp_path)), other)
  # Two of the three languages, no pivot: the one pair, as before.
  two = registry.create("lang_vocab", _run("lv3_mix", {"lang_vocab": {"languages": ["fr", "de"]}}))
  assert two.sides == ("fr", "de") and two.pivot is None


def test_a_pivot_outside_the_languages_is_one_error(corpus3):
  with pytest.raises(UserError, match="option 'pivot' must be one of its languages"):
    registry.create("lang_vocab", _run("lv3_mix", {"lang_vocab": {"pivot": "es"}}))


def test_gold_dictionary_is_the_true_map_kept_at_the_asked_precision(bible_data_dir, tmp_path):
  """method 'gold' (the TCS control): precision 1 is the id map both ways; 0.5 keeps about half, the rest wrong
  partner-vocabulary tokens, the same for the same seed; its file round-trips; bad options are one error."""
  from flax_xalign.assets import induced_dictionary as idict

  V = 211
  language = SyntheticLanguage(transforms="trans", vocab_size=V, overlap=0.2, seed=0)
  names = register_synthetic_afresh(language)
  id_map = language.id_map()

  def build(**options):
    run = _run(names["mlm"], {"lang_vocab": {"min_count": 20}, "induced_dictionary": {"method": "gold", **options}})
    asset = registry.create("induced_dictionary", run)
    return asset, asset.build(run), run

  _, exact, _ = build()
  mask, ids, translation = exact["vocab_mask"], exact["vocab_ids"], exact["translation"]
  natural, derived = ids[0][mask[0]], ids[1][mask[1]]
  np.testing.assert_array_equal(translation[0][mask[0]], id_map[natural])
  inverse = {int(id_map[t]): t for t in range(5, V) if id_map[t] != t}
  np.testing.assert_array_equal(translation[1][mask[1]], [inverse[int(d)] for d in derived])

  asset, half, run = build(precision=0.5, seed=3)
  kept = translation[0][mask[0]] == half["translation"][0][mask[0]]
  assert 0.35 < kept.mean() < 0.65, kept.mean()
  wrong = half["translation"][0][mask[0]][~kept]
  assert np.isin(wrong, derived).all()
  np.testing.assert_array_equal(build(precision=0.5, seed=3)[1]["translation"], half["translation"])
  assert not np.array_equal(build(precision=0.5, seed=4)[1]["translation"], half["translation"])
  asset.save(str(tmp_path), half)
  loaded = asset.load(str(tmp_path))
  asset.check(loaded, run)
  np.testing.assert_array_equal(loaded["translation"], half["translation"])
  with pytest.raises(UserError, match="precision"):
    build(precision=1.5)
  with pytest.raises(UserError, match="belong to method 'gold'"):
    registry.create("induced_dictionary", _run(names["mlm"], {"induced_dictionary": {"seed": 1, "source": "x"}}))
  with pytest.raises(UserError, match="'gold' reads the true token map"):
    build(refresh_every=5)
