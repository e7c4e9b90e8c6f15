"""Smoke test of bench/word_alignment.py on a tiny checkpoint: the table and the JSON contract."""

import json
import sys

import pytest

from flax_xalign.evaluation.word_alignment import statistical
from tests import testlib
from tests.evaluation.test_word_align import init_model, write_checkpoint

KEYS = ("ours_aer", "eflomal_aer", "diagonal_aer", "ratio", "simalign_aer", "speed", "rows", "pairs", "split",
        "eflomal", "simalign")
OURS = ["argmax", "itermax", "match", "sinkhorn"]


def load_bench():
  return testlib.load_bench("word_alignment.py")


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory, tiny_corpus):
  """A demo MODEL_DIR holding only cold/: a random tiny model on the toy vocabulary, Greek-English manifest."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  root = tmp_path_factory.mktemp("demo")
  _, params = init_model()
  write_checkpoint(root / "cold", params, vocab.load_vocabulary(tiny_corpus["vocab"]), task="gone_bible",
                   languages=["en", "grc"])
  return root


def run_bench(capsys, argv):
  code = load_bench().main(argv)
  out = capsys.readouterr().out
  assert code == 0, out
  return out, json.loads(out.strip().splitlines()[-1])


def check_common(result, out, output):
  for key in KEYS:
    assert key in result, key
  assert result["pairs"] == 6 and result["split"] == "test"
  assert json.loads(output.read_text()) == result
  names = [(r["system"], r["name"]) for r in result["rows"]]
  assert names[0] == ("diagonal", "diagonal")
  assert [n for s, n in names if s == "ours"] == [f"cold start {m}" for m in OURS]
  ours = [r for r in result["rows"] if r["system"] == "ours"]
  assert result["ours_aer"] == min(r["aer"] for r in ours)
  assert all(r["layer"] in (0, 1, 2) and 0 <= r["aer"] <= 1 for r in ours)
  assert result["diagonal_aer"] == result["rows"][0]["aer"] and 0 < result["diagonal_aer"] < 1
  assert "Greek -> English word alignment, test books, 6 verse pairs" in out
  assert all(r["pairs_per_second"] is None or r["pairs_per_second"] > 0 for r in result["rows"])
  timing = result["speed"]  # ours alone: the demo's models have language embeddings, so no HF export
  assert timing["method"] == "itermax" and timing["ours_seconds"] > 0 and 0 <= timing["ours_aer"] <= 1
  assert result["simalign_aer"] is None and "speed (cold start, itermax at layer" in out


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
def test_bench_without_eflomal(capsys, tmp_path, monkeypatch, bible_data_dir, demo_dir):
  monkeypatch.setattr(statistical, "eflomal_version", lambda: None)
  output = tmp_path / "wa.json"
  out, result = run_bench(capsys, [f"--demo_dir={demo_dir}", "--max_pairs=6", "--layers=0,1,2",
                                   f"--output={output}", "--batch_size=8"])
  check_common(result, out, output)
  assert result["eflomal_aer"] is None and result["ratio"] is None
  assert result["eflomal"]["available"] is False
  assert not [r for r in result["rows"] if r["system"] == "eflomal"]
  assert "not installed: pip install eflomal==2.0.0" in out
  if result["simalign"]["available"]:  # the demo's models cannot be exported: a line says so
    assert "cold start does not export to Hugging Face" in out
  else:
    assert "simalign  not installed: pip install simalign==0.4" in out


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
def test_bench_with_eflomal(capsys, tmp_path, bible_data_dir, demo_dir, monkeypatch):
  pytest.importorskip("eflomal")
  monkeypatch.setitem(sys.modules, "simalign", None)  # as if not installed: one line says so
  output = tmp_path / "wa.json"
  out, result = run_bench(capsys, [f"--checkpoint=cold start={demo_dir / 'cold'}", "--max_pairs=6",
                                   "--layers=0,1,2", "--eflomal_corpus=split", f"--output={output}",
                                   "--batch_size=8"])
  check_common(result, out, output)
  rows = {r["name"]: r for r in result["rows"] if r["system"] == "eflomal"}
  assert list(rows) == ["forward", "reverse", "intersection", "union", "grow-diag-final-and"]
  assert result["eflomal_aer"] == rows["grow-diag-final-and"]["aer"]
  assert result["ratio"] == pytest.approx(result["eflomal_aer"] / result["ours_aer"])
  assert result["eflomal"]["corpus_pairs"] == 6 and result["eflomal"]["version"] == "2.0.0"
  assert rows["intersection"]["num_predicted"] <= rows["grow-diag-final-and"]["num_predicted"] <= (
      rows["union"]["num_predicted"])
  assert result["simalign"]["available"] is False and result["simalign_aer"] is None
  assert "simalign  not installed: pip install simalign==0.4 (or pip install -e '.[peers]')" in out


def test_bench_rejects_bad_checkpoint_flags(capsys, tmp_path):
  bench = load_bench()
  assert bench.main(["--checkpoint=nodir", f"--output={tmp_path / 'x.json'}"]) == 2
  assert "expected NAME=MODEL_DIR" in capsys.readouterr().err
  assert bench.main([f"--demo_dir={tmp_path}", f"--output={tmp_path / 'x.json'}"]) == 2
  assert "has neither cold/ nor xlm_align/" in capsys.readouterr().err


@pytest.fixture(scope="module")
def exportable_dir(tmp_path_factory, tiny_corpus):
  """A tiny random model without language embeddings (it exports to a HF BERT), Greek-English manifest."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  from tests.evaluation.test_word_align import CONFIG
  config = CONFIG.replace(num_languages=0, head_dim=CONFIG.embed_dim // CONFIG.num_heads)  # HF: heads x dim = embed
  _, params = init_model(config, seed=3)
  return write_checkpoint(tmp_path_factory.mktemp("plain") / "plain", params,
                          vocab.load_vocabulary(tiny_corpus["vocab"]), task="gone_bible", languages=["en", "grc"],
                          config=config, objectives=())


@pytest.mark.filterwarnings("ignore:.*exceed the budget")
def test_bench_simalign_rows_and_speed(capsys, tmp_path, bible_data_dir, exportable_dir):
  pytest.importorskip("simalign")
  output = tmp_path / "wa.json"
  out, result = run_bench(capsys, [f"--checkpoint=plain={exportable_dir}", "--max_pairs=6", "--layers=1",
                                   "--skip_eflomal", f"--output={output}", "--batch_size=8"])
  for key in KEYS:
    assert key in result, key
  peer = [r for r in result["rows"] if r["system"] == "simalign"]
  assert peer, result["simalign"]["checkpoints"]["plain"].get("reason")
  assert [r["name"] for r in peer] == ["plain inter (= argmax)", "plain itermax (= itermax)", "plain mwmf (= match)"]
  assert all(r["layer"] == 1 and 0 <= r["aer"] <= 1 and r["pairs_per_second"] > 0 for r in peer)
  assert result["simalign_aer"] == min(r["aer"] for r in peer)
  info = result["simalign"]["checkpoints"]["plain"]
  assert info["threads"] in bench_threads() and set(map(int, info["probe_pairs_per_second"])) == set(bench_threads())
  # SimAlign gets the words as our aligner normalised them.
  assert info["normalize"] == next(r for r in result["rows"] if r["system"] == "ours")["normalize"]
  timing = result["speed"]
  assert timing["checkpoint"] == "plain" and timing["layer"] == 1 and timing["pairs"] == 6
  assert timing["speed_ratio"] == pytest.approx(timing["simalign_seconds"] / timing["ours_seconds"])
  assert timing["simalign_threads"] == info["threads"]
  # The same weights, words and layer: SimAlign's itermax row and its timed itermax run agree.
  assert timing["simalign_aer"] == pytest.approx(peer[1]["aer"])
  assert "speed_ratio (SimAlign s / ours s)" in out and "SimAlign 0.4 on plain exported to Hugging Face" in out


def bench_threads():
  return load_bench().THREADS
