"""The offline suite: `score` from its files equals the seqio-fed scorers on the same run and data.

The reference of each metric family is the existing path (`xalign bli`'s `evaluate_lexicon` over the task
registry, `evaluate_retrieval` over the TSV with the run's vocabulary, `mlm_eval.evaluate` over seqio, the
`word_align` evaluator over the embedded Bible gold), run on the session's shared tiny run; the suite is
written from the same sources, so any difference is the file path's.
"""

import json
import subprocess
import sys
import textwrap
import types

import pytest

from flax_xalign.errors import UserError

pytestmark = pytest.mark.contract

GOLD = {"dev": "haus house\nsieht sees\nläuft runs\ngrün green\ndas the\n",
        "test": "fluss river\nhund dog\nneu new\nrot red\nbaum tree\nkatze cat\nalt old\nklein small\nxyzzy house\n"}
SIZES = dict(eval_sentences=12, retrieval_pairs=9, mlm_batches=2, mlm_batch_size=4, baseline_batches=2, bible_pairs=5)
TASK = "hz_mix"
MIN_COUNT = 5


@pytest.fixture(scope="module")
def sources(shared_run, tmp_path_factory):
  root = tmp_path_factory.mktemp("offline_sources")
  for split, text in GOLD.items():
    (root / f"de-en.{split}.txt").write_text(text, encoding="utf-8")
  files = shared_run["corpus"]["files"]
  en = open(files[("en", "validation")], encoding="utf-8").read().splitlines()
  de = open(files[("de", "validation")], encoding="utf-8").read().splitlines()
  (root / "en-de.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in zip(en, de)), encoding="utf-8")
  return {"gold": str(root / "{lang}-en.{split}.txt"), "retrieval": str(root / "en-{lang}.tsv"), "root": root}


@pytest.fixture(scope="module")
def run(shared_run):
  from flax_xalign.runs import Run

  return Run.open(str(shared_run["dir"]))


@pytest.fixture(scope="module")
def suite(run, sources, tmp_path_factory):
  from flax_xalign.evaluation.offline.suite import SuiteSizes, write_suite

  folder = tmp_path_factory.mktemp("offline") / "suite"
  layout = write_suite(str(folder), run, task=TASK, languages=["de"], gold=sources["gold"],
                       retrieval=sources["retrieval"], min_count=MIN_COUNT, bible_languages=("de", "en"),
                       sizes=SuiteSizes(**SIZES), progress=lambda line: None)
  return {"dir": str(folder), "layout": layout}


@pytest.fixture(scope="module")
def scored(run, suite):
  from flax_xalign.evaluation.offline.scoring import score

  return score(run, suite["dir"], progress=lambda line: None)


def _close(a, b, path="result"):
  """Recursive equality, floats to 1e-6 (the same arrays through the same kernels)."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and sorted(a) == sorted(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
    for key in a:
      _close(a[key], b[key], f"{path}.{key}")
  elif isinstance(a, (list, tuple)):
    assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} items"
    for i, (x, y) in enumerate(zip(a, b)):
      _close(x, y, f"{path}[{i}]")
  elif isinstance(a, float) or isinstance(b, float):
    assert a == pytest.approx(b, abs=1e-6, nan_ok=True), f"{path}: {a} != {b}"  # RSIM of < 3 pairs is NaN.
  else:
    assert a == b, f"{path}: {a!r} != {b!r}"


def test_suite_layout_names_every_file_it_wrote(suite):
  import os

  layout = suite["layout"]
  on_disk = {os.path.relpath(os.path.join(d, n), suite["dir"]) for d, _, names in os.walk(suite["dir"]) for n in names}
  assert on_disk - {"suite.json"} == set(layout["files"])
  assert layout["bytes"] == sum(layout["files"].values())
  assert sorted(layout["bli"]["languages"]["de"]["gold"]) == ["dev", "test"]
  assert layout["word_alignment"]["splits"]["test"]["count"] == SIZES["bible_pairs"]
  assert layout["mlm"]["batches"] == SIZES["mlm_batches"]


def test_bli_equals_the_task_registry_path(run, sources, suite, scored):
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, evaluate_lexicon
  from flax_xalign.evaluation.offline.scoring import bli_summary

  quiet = lambda line: None  # noqa: E731
  for split in ("dev", "test"):
    common = {"src": "de", "tgt": "en", "gold": sources["gold"].format(lang="de", split=split), "task": TASK,
              "normalize": "", "min_count": MIN_COUNT}
    layer0 = evaluate_lexicon(run, LexiconOptions(isomorphism=True, **common), log=quiet)
    layers = evaluate_lexicon(run, LexiconOptions(layers="all", max_sentences=SIZES["eval_sentences"], **common),
                              log=quiet)
    _close(scored["bli"]["de"][split], bli_summary(layer0, layers, "gold"), f"bli.de.{split}")
  curves = scored["bli"]["de"]["test"]["per_layer"]
  assert curves["layers"] == [0, 1, 2] and {"rsim", "hit@1_nn", "hit@1_csls", "mean_cosine"} <= set(curves)


def test_retrieval_equals_the_vocabulary_path(run, sources, scored):
  from flax_xalign.evaluation.offline.scoring import RETRIEVAL_MAX_LENGTH, retrieval_summary
  from flax_xalign.evaluation.retrieval import RetrievalOptions, evaluate_retrieval

  config = run.model.encoder.config
  options = RetrievalOptions(tsv=sources["retrieval"].format(lang="de"), src_lang="en", tgt_lang="de",
                             max_pairs=SIZES["retrieval_pairs"],
                             max_length=min(RETRIEVAL_MAX_LENGTH, config.max_positions - config.position_offset))
  reference = retrieval_summary(evaluate_retrieval(run, options, log=lambda line: None))
  _close(scored["retrieval"]["de"], reference, "retrieval.de")
  assert scored["retrieval"]["de"]["pairs"] == SIZES["retrieval_pairs"]


def test_mlm_equals_the_seqio_evaluation(run, scored):
  from flax_xalign.evaluation import mlm_eval

  reference = mlm_eval.evaluate(run, split="validation", mixture_or_task_name=TASK,
                                batch_size=SIZES["mlm_batch_size"], max_batches=SIZES["mlm_batches"],
                                baseline_batches=SIZES["baseline_batches"], output=None)
  mlm = scored["mlm"]
  assert mlm["batches"] == reference["batches"] == SIZES["mlm_batches"]
  _close(mlm["languages"], reference["languages"], "mlm.languages")
  _close(mlm["overall"], reference["overall"], "mlm.overall")
  assert mlm["overall"]["predictions"] > 0


def test_word_alignment_picks_the_layer_on_validation_and_scores_test_once(run, scored):
  from flax_xalign.evaluation.evaluators.word_alignment import WordAlignment
  from flax_xalign.ops.align_solver import METHODS

  common = {"src_lang": "de", "tgt_lang": "en", "max_pairs": SIZES["bible_pairs"], "methods": METHODS}
  validation = WordAlignment(run, bible_gold="validation", **common)()
  ours = scored["word_alignment"]
  _close(ours["validation"]["scores"], validation["scores"], "word_alignment.validation.scores")
  chosen = {m: validation["best"][m]["layer"] for m in METHODS}
  test = WordAlignment(run, bible_gold="test", layers=sorted(set(chosen.values())), **common)()
  for method in METHODS:
    row = ours["test"]["by_method"][method]
    assert row["layer"] == chosen[method]
    _close({k: v for k, v in row.items() if k != "layer"}, test["scores"][method][str(chosen[method])],
           f"word_alignment.test.{method}")
  assert ours["methods"] == list(METHODS) and ours["test"]["pairs"] == SIZES["bible_pairs"]


def test_a_run_with_another_vocabulary_is_refused(suite, run):
  from flax_xalign.evaluation.offline.scoring import score

  other = types.SimpleNamespace(path="elsewhere", step=1, spec=types.SimpleNamespace(
      vocabulary=types.SimpleNamespace(sha256="0" * 64), languages=run.spec.languages))
  with pytest.raises(UserError, match="another vocabulary"):
    score(other, suite["dir"], progress=lambda line: None)
  with pytest.raises(UserError, match="choose from"):
    score(run, suite["dir"], metrics=["bleu"], progress=lambda line: None)


def test_a_text_the_suite_did_not_tokenise_is_refused():
  from flax_xalign.evaluation.offline.suite_files import TokenTable

  table = TokenTable({"haus": [7, 9]}, name="words")
  assert table.encode("haus") == [7, 9]
  with pytest.raises(UserError, match="no entry for 'maus'"):
    table.encode("maus")


CHILD = textwrap.dedent("""
    import json, sys
    from flax_xalign.runs import Run
    from flax_xalign.evaluation.offline.scoring import score
    result = score(Run.open(sys.argv[1]), sys.argv[2], progress=lambda line: None)
    print("RESULT " + json.dumps(result))
    """)


@pytest.mark.subprocess
def test_score_runs_where_tensorflow_and_seqio_are_absent(shared_run, suite, scored):
  from tests import no_tf_site

  code = CHILD + no_tf_site.CHECK + "\n"
  done = subprocess.run([sys.executable, "-c", code, str(shared_run["dir"]), suite["dir"]], env=no_tf_site.env(),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])
  assert lines.index(next(line for line in lines if line.startswith("RESULT "))) < lines.index("ABSENT OK")
  assert set(result["metrics"]) == {"bli", "retrieval", "mlm", "word_alignment"}
  _close(result["bli"], json.loads(json.dumps(scored["bli"])), "child.bli")
  _close(result["word_alignment"]["test"], json.loads(json.dumps(scored["word_alignment"]["test"])), "child.wa")
