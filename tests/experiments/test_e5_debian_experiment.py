"""The Debian setting of the code-switching / MLM-GC drivers: its tables, spread and ΔRSIM over seeds, the
provisional BLI gold, and (slow) the driver end to end on a tiny build and a tiny 'imported' model it writes."""

import json
import random

import pytest

from flax_xalign.experiments import e5_debian, e5_debian_report as report


def _row(objective, seed, hit1, rsim, retrieval=0.5, mlm=0.3, seconds=120.0):
  curve = {"layers": [0, 1, 2, 3, 4], "rsim": [0.6, 0.5, 0.4, rsim, rsim], "mean_cosine": [0.1] * 5}
  bli = {lang: {"csls": {"hit@1": hit1, "hit@5": 2 * hit1}, "nn": {"hit@1": hit1 / 2, "hit@5": hit1},
                "pairs": 300, "gold_kind": "provisional", "per_layer": curve,
                "muse_cosine": {"mean": 0.4, "shuffled_mean": 0.1, "pairs": 500}} for lang in ("de", "fr")}
  retr = {lang: {"best": {"csls": {"layer": 12, "accuracy": retrieval}, "cosine": {"layer": 12, "accuracy": 0.4}}}
          for lang in ("de", "fr", "ja")}
  return {"setting": "debian", "objective": objective, "seed": seed, "seconds": seconds, "mlm_accuracy": mlm,
          "bli": bli, "retrieval": retr}


ROWS = [_row("start", 0, 0.10, 0.30, mlm=None, seconds=0.0), _row("mlm", 0, 0.12, 0.30), _row("mlm", 1, 0.14, 0.34),
        _row("scs", 0, 0.13, 0.36), _row("scs", 1, 0.15, 0.36)]


def test_table_has_one_line_per_objective_with_the_spread_over_seeds():
  lines = report.format_table(ROWS).splitlines()
  assert len(lines) == 5 and lines[0].startswith("| model | seeds | BLI Hit@1 CSLS | Hit@5 CSLS |")
  assert lines[2].startswith("| e5-small (start) | – | 10.0 | 20.0 | 5.0 | 10.0 | 0.400 | 0.100 | 0.300 | 0.600 |")
  # mlm: seeds 12 and 14 -> 13.0 ±1.0; RSIM top half (layers 3, 4) 0.30 and 0.34 -> 0.320 ±0.020.
  assert lines[3].startswith("| + MLM (baseline) | 2 | 13.0 ±1.0 | 26.0 ±2.0 |")
  assert "| 0.320 ±0.020 | 50.0 ±0.0 | 30.0 ±0.0 | 2.0 ±0.0 |" in lines[3]
  languages = report.format_languages(ROWS)
  assert "| + SCS-MLM | 14.0 / 28.0, 50.0 | 14.0 / 28.0, 50.0 | –, 50.0 |" in languages
  assert "de provisional (300 queries)" in languages


def test_delta_rsim_pairs_seeds_and_compares_the_start_with_every_baseline_seed():
  curves = report.delta_rsim(ROWS)
  scs = curves["scs"]["delta"]
  assert scs["mean"][3] == pytest.approx(0.04) and scs["min"][3] == pytest.approx(0.02)
  assert scs["max"][3] == pytest.approx(0.06)
  start = curves["start"]["delta"]
  assert start["min"][3] == pytest.approx(-0.04) and start["max"][3] == pytest.approx(0.0)
  assert curves["mlm"]["delta"]["mean"] == pytest.approx([0.0] * 5)
  assert report.delta_rsim([r for r in ROWS if r["objective"] != "mlm"]) == {}


def test_plot_writes_a_png(tmp_path):
  pytest.importorskip("matplotlib")
  assert report.plot(ROWS, str(tmp_path / "rsim.png")) == str(tmp_path / "rsim.png")
  assert (tmp_path / "rsim.png").stat().st_size > 0
  assert report.plot(ROWS[:1], str(tmp_path / "none.png")) is None


def test_provisional_gold_inverts_one_word_entries(tmp_path):
  data = tmp_path / "data"
  (data / "dict").mkdir(parents=True)
  (data / "dict" / "en-de.tsv").write_text("house\tHaus\nhouse\tHaus\nbig house\tVilla\nopen\töffnen\nbad\n",
                                           encoding="utf-8")
  args = type("Args", (), {"debian_gold": "", "debian_data": str(data)})()
  path, kind = e5_debian.gold_for(args, "de", str(tmp_path / "run"))
  assert kind == "provisional" and open(path, encoding="utf-8").read() == "Haus house\nöffnen open\n"
  assert e5_debian.gold_for(args, "fr", str(tmp_path / "run")) is None
  (data / "bli").mkdir()
  (data / "bli" / "de-en.test.txt").write_text("Haus house\n", encoding="utf-8")
  assert e5_debian.gold_for(args, "de", str(tmp_path / "run")) == (str(data / "bli" / "de-en.test.txt"), "gold")


WORDS = {"en": ["open", "the", "file", "save", "close", "window", "cell", "chart", "insert", "choose", "menu", "sheet"],
         "de": ["öffnen", "die", "Datei", "speichern", "schließen", "Fenster", "Zelle", "Diagramm", "einfügen",
                "wählen", "Menü", "Tabelle"]}


def _tiny_build(root):
  """A Debian build with en + de help text, en-de pairs and an en-de dictionary (the builder's layout)."""
  rng = random.Random(5)
  counts = {}
  for split, n in (("train", 120), ("validation", 12), ("test", 24)):
    picks = [[rng.randrange(12) for _ in range(rng.randint(3, 8))] for _ in range(n)]
    text = {lang: [" ".join(WORDS[lang][i] for i in p) for p in picks] for lang in WORDS}
    for lang in WORDS:
      (root / "help").mkdir(parents=True, exist_ok=True)
      (root / "help" / f"{lang}.{split}.txt").write_text("\n".join(text[lang]) + "\n", encoding="utf-8")
    (root / "help_bitext").mkdir(exist_ok=True)
    (root / "help_bitext" / f"en-de.{split}.tsv").write_text(
        "".join(f"{a}\t{b}\n" for a, b in zip(text["en"], text["de"])), encoding="utf-8")
    counts[split] = n
  (root / "dict").mkdir()
  (root / "dict" / "en-de.tsv").write_text("".join(f"{e}\t{d}\n" for e, d in zip(WORDS["en"], WORDS["de"])),
                                           encoding="utf-8")
  manifest = {"counts": {"help": {"en": {"paragraphs": counts}, "de": {"paragraphs": counts, "pairs": counts}}}}
  (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
  return root


def _tiny_import(root, build):
  """A tiny 'imported' MODEL_DIR (untrained weights, no language embeddings) with a vocabulary of the build."""
  import flax.linen as nn
  import jax
  import seqio

  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from tests import testlib

  lines = [line for f in sorted((build / "help").iterdir()) for line in f.read_text(encoding="utf-8").splitlines()]
  path = vocab.train_sentencepiece(lines, vocab_size=56, model_path=root / "spm.model", model_type="unigram")
  vocabulary = seqio.SentencePieceVocabulary(str(path), extra_ids=0)
  config = testlib.tiny_encoder_config(vocab_size=56, num_languages=0, dropout_rate=0.0, attention_dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  params = nn.meta.unbox(model.init(jax.random.key(4), batch=1, length=8))
  write_model_dir(str(root / "e5"), config=config, params=params, vocabulary=vocabulary, languages=["en", "de"])
  return root / "e5"


@pytest.mark.slow
def test_tiny_debian_setting_end_to_end(tmp_path):
  from flax_xalign.cli.experiments import code_switch

  build = _tiny_build(tmp_path / "debian")
  e5_dir = _tiny_import(tmp_path, build)
  out = tmp_path / "runs"
  flags = [f"--model_dir={out}", "--settings=natural", "--objectives=mlm,tcs,gc", "--seeds=2", "--debian_steps=2",
           f"--debian_data={build}", f"--debian_e5_dir={e5_dir}", "--min_count=1", "--debian_eval_sentences=8",
           "--debian_retrieval_pairs=10", "--gin=TASK_FEATURE_LENGTHS={'tokens': 24}", "--gin=BATCH_SIZE=4",
           "--gin=OptimizerConfig.warmup_steps=1"]
  assert code_switch.main(flags) == 0
  rows = json.loads((out / "results.json").read_text())["rows"]
  assert [(r["objective"], r["seed"]) for r in rows] == [("start", 0), ("mlm", 0), ("mlm", 1), ("tcs", 0), ("tcs", 1),
                                                          ("gc", 0), ("gc", 1)]
  for row in rows:
    assert row["languages"] == ["de"] and set(row["bli"]) == {"de"} and set(row["retrieval"]) == {"de"}
    bli = row["bli"]["de"]
    assert bli["gold_kind"] == "provisional" and 0.0 <= bli["csls"]["hit@1"] <= 1.0
    assert len(bli["per_layer"]["rsim"]) == 3 and bli["muse_cosine"]["shuffled_mean"] is not None
    assert 0.0 <= row["retrieval"]["de"]["best"]["csls"]["accuracy"] <= 1.0
    assert row["eval_seconds"]["total"] > 0
  # The second GC seed read the first one's table instead of counting it again.
  second = json.loads((out / "debian" / "gc_seed1" / "cooc.json").read_text())
  assert second == json.loads((out / "debian" / "gc_seed0" / "cooc.json").read_text())
  assert (out / "rsim_debian.png").stat().st_size > 0
  assert "| + TCS-MLM | 2 |" in (out / "results.md").read_text()
  # A rerun trains and scores nothing again.
  assert code_switch.main(flags) == 0
  assert json.loads((out / "results.json").read_text())["rows"] == rows
