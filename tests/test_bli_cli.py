"""`xalign bli` in-process (the contract tier), on the session's shared MODEL_DIR: a few steps on the
tiny de/en corpus (tests/shared_run.py)."""

import json

import numpy as np
import pytest

from flax_xalign.cli import bli as bli_main
from flax_xalign.data.transforms.synthetic import SyntheticLanguage
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.hardening.harness import tree_digest
from tests.testlib import register_synthetic_afresh, tiny_encoder_config

pytestmark = pytest.mark.contract

# German -> English toy gold (tests/testlib.py's aligned word lists). Under the toy 83-piece BPE model "hund"
# (▁h un d) and "xyzzy" are several pieces, and "neu" is one piece but its translation "new" (▁ne w) is not:
# three entries out of coverage, six in.
GOLD = ("haus house\nsieht sees\nläuft runs\ngrün green\nfluss river\ndas the\nhund dog\nneu new\n"
        "xyzzy house\n")


@pytest.fixture(scope="module")
def checkpoint(shared_run):
  """The session's shared MODEL_DIR (tests/shared_run.py): 4 steps of MLM + TLM on the tiny de/en corpus."""
  return shared_run["dir"]


@pytest.fixture
def gold_file(tmp_path):
  path = tmp_path / "de-en.txt"
  path.write_text(GOLD, encoding="utf-8")
  return path


def _last_json(text):
  return json.loads(text.strip().splitlines()[-1])


def _expect_error(capsys, code, *needles):
  assert code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "Traceback" not in err, err
  for needle in needles:
    assert needle in err, (needle, err)


def test_layer0_dictionary_and_gold_scores(checkpoint, gold_file, tmp_path, capsys):
  out = tmp_path / "dict.tsv"
  before = tree_digest(checkpoint)
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=de", "--tgt=en", f"--output={out}",
                        f"--gold={gold_file}", "--min_count=5", "--knn=3"])
  assert tree_digest(checkpoint) == before  # The command only reads the run.
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  assert set(result) >= {"hit@1", "hit@5", "coverage", "pairs", "nn", "csls", "out_of_coverage"}
  assert result["method"] == "csls" and result["hit@1"] == result["csls"]["hit@1"]
  assert result["entries"] == 9
  assert result["out_of_coverage"] == {"source_not_one_token": 2, "source_not_in_language_vocab": 0,
                                       "no_translation_covered": 1, "translation_not_one_token": 1,
                                       "translation_not_in_language_vocab": 0}
  assert result["covered"] == result["pairs"] == result["gold_pairs"] == 6
  assert result["coverage"] == pytest.approx(6 / 9)
  for method in ("nn", "csls"):
    assert 0.0 <= result[method]["hit@1"] <= result[method]["hit@5"] <= 1.0
  assert "Hit@1" in text and "out of coverage: source_not_one_token 2, no_translation_covered 1" in text
  lines = out.read_text(encoding="utf-8").splitlines()
  assert len(lines) == result["dictionary_entries"] == result["vocab_sizes"][0]
  fields = [line.split("\t") for line in lines]
  assert all(len(f) == 3 for f in fields)
  scores = [float(f[2]) for f in fields]
  assert scores == sorted(scores, reverse=True)


def test_layers_all_curves_and_plot(checkpoint, gold_file, tmp_path, capsys):
  plot = tmp_path / "layers.png"
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=de", "--tgt=en", f"--gold={gold_file}",
                        "--min_count=5", "--knn=3", "--layers=all", f"--rsim_plot={plot}", "--method=nn",
                        "--max_sentences=50", "--batch_size=8"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  curves = result["per_layer"]
  assert curves["layers"] == [0, 1, 2]
  for key in ("mean_cosine", "rsim", "hit@1_nn", "hit@1_csls"):
    assert len(curves[key]) == 3 and np.isfinite(curves[key]).all(), key
  assert result["hit@1"] == result["nn"]["hit@1"] == curves["hit@1_nn"][0]
  assert plot.stat().st_size > 1000
  assert "averaged over 50 sentences" in text


def test_contextual_layer_without_gold(checkpoint, tmp_path, capsys):
  out = tmp_path / "dict2.tsv"
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=en", "--tgt=de", "--layer=2", f"--output={out}",
                        "--min_count=5", "--max_sentences=40"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  assert result["layer"] == 2 and "hit@1" not in result
  assert len(out.read_text(encoding="utf-8").splitlines()) == result["dictionary_entries"] > 0


@pytest.mark.parametrize("flags, needles", [
    (["--src=fr", "--tgt=en"], ["['fr']", "languages"]),
    (["--src=de", "--tgt=en", "--gold=/nonexistent/gold.txt"], ["does not exist"]),
    (["--src=de", "--tgt=en", "--layer=7"], ["outside 0..2"]),
    (["--src=de", "--tgt=en", "--rsim_plot=x.png"], ["--layers=all"]),
])
def test_bad_arguments_are_one_error(checkpoint, capsys, flags, needles):
  code = bli_main.main([f"--checkpoint={checkpoint}", "--min_count=5", *flags])
  _expect_error(capsys, code, *needles)


def test_zero_coverage_and_no_checkpoint(checkpoint, tmp_path, capsys):
  gold = tmp_path / "none.txt"
  gold.write_text("xyzzy plugh\n", encoding="utf-8")
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=de", "--tgt=en", f"--gold={gold}", "--min_count=5"])
  _expect_error(capsys, code, "no entry of --gold", "source_not_one_token 1")
  bad = tmp_path / "bad.txt"
  bad.write_text("haus house\nhund\n", encoding="utf-8")
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=de", "--tgt=en", f"--gold={bad}", "--min_count=5"])
  _expect_error(capsys, code, "bad.txt:2: malformed line")
  empty = tmp_path / "empty_model"
  empty.mkdir()
  code = bli_main.main([f"--checkpoint={empty}", "--src=de", "--tgt=en"])
  _expect_error(capsys, code, "no checkpoint")
  code = bli_main.main([f"--checkpoint={tmp_path / 'missing'}", "--src=de", "--tgt=en"])
  _expect_error(capsys, code, "does not exist")


def test_reads_the_model_dirs_lang_vocab_file_with_sides_swapped(shared_run_copy, gold_file, capsys):
  from flax_xalign.assets import lang_vocab
  from flax_xalign.runs.checkpoints import read_run_spec

  model_dir = shared_run_copy
  _, run, _ = read_run_spec(str(model_dir))
  # Written for (en, de) with min_count 20: the command asks for de -> en and must flip the sides.
  value = lang_vocab.lang_vocab_for(run, languages=("en", "de"), min_count=20, log=None)
  lang_vocab.LangVocab(languages=("en", "de"), min_count=20, split="train", task=run.task,
                       vocab_size=run.vocabulary.size).save(str(model_dir), value)
  code = bli_main.main([f"--checkpoint={model_dir}", "--src=de", "--tgt=en", f"--gold={gold_file}"])
  text = capsys.readouterr().out
  assert code == 0, text
  sizes = value["mask"].sum(axis=1)
  assert "lang_vocab.tsv (min_count 20)" in text
  assert _last_json(text)["vocab_sizes"] == [int(sizes[1]), int(sizes[0])]


# ------------------------------------------------------------ --isomorphism


def _reference_muse_cosine(model_dir, gold_text):
  """Mean cosine of every gold pair, each word the mean of its pieces' embedding rows, written from the paper."""
  from flax_xalign.runs import Run

  handle = Run.open(str(model_dir))
  params, run, vocabulary = handle.params(), handle.spec, handle.vocabulary()
  table = np.asarray(params["token_embed"]["embedding"], np.float64)
  cosines, skipped = [], 0
  for line in gold_text.splitlines():
    source, target = line.split()
    vectors = []
    for word in (source, target):
      ids = list(vocabulary.encode(word))
      if not ids or run.vocabulary.specials.unk in ids:
        break
      vectors.append(table[ids].mean(axis=0))
    if len(vectors) < 2:
      skipped += 1
      continue
    a, b = vectors
    cosines.append(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
  return float(np.mean(cosines)), len(cosines), skipped


def test_isomorphism_on_a_word_lexicon(checkpoint, gold_file, capsys):
  code = bli_main.main([f"--model_dir={checkpoint}", "--src=de", "--tgt=en", f"--gold={gold_file}",
                        "--min_count=5", "--knn=3", "--isomorphism", "--quadruples=20", "--seed=3",
                        "--layers=all", "--max_sentences=50", "--batch_size=8"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  muse, analogy = result["muse_cosine"], result["analogy"]
  mean, pairs, skipped = _reference_muse_cosine(checkpoint, GOLD)
  # Multi-piece words (hund, xyzzy, new) count here, unlike in BLI's single-token gold.
  assert muse["given"] == 9 and muse["pairs"] == pairs == 9 - skipped and pairs > result["pairs"]
  assert sum(muse["skipped"].values()) == skipped
  assert muse["mean"] == pytest.approx(mean, abs=1e-5)
  assert -1 <= muse["shuffled_mean"] <= 1 and muse["gap"] == pytest.approx(muse["mean"] - muse["shuffled_mean"])
  curves = muse["per_layer"]
  assert curves["layers"] == [0, 1, 2] and 0 < curves["pairs"] <= pairs
  assert all(np.isfinite(curves[key]).all() and len(curves[key]) == 3 for key in ("mean", "shuffled_mean"))
  if curves["pairs"] == pairs:  # Every piece occurs in the 50 sentences: layer 0 is the headline number.
    assert curves["mean"][0] == pytest.approx(muse["mean"], abs=1e-6)
  assert analogy["seed"] == 3 and 0 < analogy["quadruples"] <= 20
  for key in ("accuracy", "mono_accuracy", "nn_accuracy"):
    assert 0.0 <= analogy[key] <= 1.0
  assert "MUSE cosine (layer 0" in text and "translation analogy" in text


def test_isomorphism_needs_gold(checkpoint, capsys):
  code = bli_main.main([f"--checkpoint={checkpoint}", "--src=de", "--tgt=en", "--min_count=5", "--isomorphism"])
  _expect_error(capsys, code, "--isomorphism", "--gold")


@pytest.fixture(scope="module")
def synthetic_checkpoint(tmp_path_factory, bible_data_dir):
  del bible_data_dir  # The Greek NT the synthetic language derives from.
  names = register_synthetic_afresh(SyntheticLanguage(transforms="trans", vocab_size=211, seed=0))
  model_dir = tmp_path_factory.mktemp("bli_cli_synthetic") / "model"
  pretrain(model_dir=str(model_dir), mixture_or_task_name=names["mlm"], task_feature_lengths={"tokens": 19},
           batch_size=6, train_steps=2, encoder=tiny_encoder_config(num_languages=0), objectives={"mlm": 1.0},
           optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
           checkpoint=CheckpointConfig(every_steps=2, keep=1, async_save=False), log_every=1, seed=0)
  return model_dir


@pytest.mark.slow  # Its own run: a synthetic language derived from the Greek NT, trained 2 steps.
def test_isomorphism_on_the_token_map(synthetic_checkpoint, capsys):
  from flax_xalign.runs import Run

  handle = Run.open(str(synthetic_checkpoint))
  params, run = handle.params(), handle.spec
  derived = next(code for code in run.languages if code != "grc")
  code = bli_main.main([f"--checkpoint={synthetic_checkpoint}", "--src=grc", f"--tgt={derived}", "--gold=token_map",
                        "--min_count=2", "--isomorphism", "--quadruples=30"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  muse = result["muse_cosine"]
  # The token map's pairs inside both language-specific vocabularies are exactly BLI's one-translation queries.
  assert muse["pairs"] == result["pairs"] == result["gold_pairs"] and muse["given"] == result["entries"]
  assert muse["pairs"] + sum(muse["skipped"].values()) == muse["given"]
  # Reference: natural id i <-> derived id i + V (211 natural pieces), straight from the embedding table.
  from flax_xalign.assets import lang_vocab

  value = lang_vocab.lang_vocab_for(run, languages=("grc", derived), min_count=2, log=None)
  natural = set(np.asarray(value["ids"])[0][np.asarray(value["mask"], bool)[0]].tolist())
  copies = set(np.asarray(value["ids"])[1][np.asarray(value["mask"], bool)[1]].tolist())
  table = np.asarray(params["token_embed"]["embedding"], np.float64)
  pairs = [(i, i + 211) for i in sorted(natural) if i + 211 in copies]
  cosines = [table[i] @ table[j] / np.linalg.norm(table[i]) / np.linalg.norm(table[j]) for i, j in pairs]
  assert muse["pairs"] == len(pairs)
  assert muse["mean"] == pytest.approx(np.mean(cosines), abs=1e-5)
  assert result["analogy"]["quadruples"] == min(30, len(pairs) * (len(pairs) - 1))
