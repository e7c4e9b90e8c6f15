"""Evaluators by name: the registry's checks, and `python -m flax_xalign.eval` with EVALS on a tiny run.

The numbers `eval` writes under each evaluator's key must be those of the
evaluation function called directly on the same run.
"""

import json
import random

import pytest

from flax_xalign import eval as eval_main
from flax_xalign.errors import UserError
from flax_xalign.evaluation import mlm_eval, registry
from flax_xalign.evaluation.word_alignment import aer
from flax_xalign.evaluation.word_alignment import word_align
from flax_xalign.runs import Run
from tests import testlib
from tests.runs.tiny_run import tiny_mix_run


class FakeRun:
  class dir:  # noqa: N801 (stands in for a RunDir value)
    path = "/nowhere"


class Doubler:
  """A new evaluation as a user would add it: one class, one registry line."""

  def __init__(self, run, *, value: int, offset: int = 0):
    self.run, self.value, self.offset = run, value, offset

  def __call__(self):
    return {"doubled": 2 * self.value + self.offset, "where": self.run.dir.path}


@pytest.fixture
def doubler(monkeypatch):
  monkeypatch.setitem(registry.EVALUATORS, "doubler", Doubler)


def test_a_new_evaluator_is_one_class_and_one_line(doubler):
  results = registry.evaluate(FakeRun(), ["doubler", "again"],
                              {"doubler": {"value": 3}, "again": {"type": "doubler", "value": 5, "offset": 1}},
                              log=None)
  assert results == {"doubler": {"doubled": 6, "where": "/nowhere"}, "again": {"doubled": 11, "where": "/nowhere"}}


@pytest.mark.parametrize("evals, options, needles", [
    (["word_algn"], None, ["Unknown evaluator 'word_algn'", "Did you mean 'word_align'"]),
    (["doubler"], {"doubler": {"value": 1, "ofset": 2}}, ["no option 'ofset'", "Did you mean 'offset'"]),
    (["doubler"], {}, ["needs option(s) value"]),
    (["doubler"], {"doublr": {"value": 1}}, ["EVAL_OPTIONS has options for 'doublr'", "'doubler'"]),
    (["doubler", "doubler"], {"doubler": {"value": 1}}, ["twice"]),
    ("doubler", None, ["must be a list"]),
    (["word_align"], {"word_align": {"gld": "x"}}, ["Did you mean 'gold'"]),
    (["bli"], {"bli": {"src": "de"}}, ["needs option(s) tgt"]),
])
def test_bad_names_and_options_are_refused_before_anything_runs(doubler, evals, options, needles):
  with pytest.raises(UserError) as e:
    registry.plan(evals, options)
  for needle in needles:
    assert needle in str(e.value), str(e.value)


def test_every_evaluator_lists_its_options():
  # The adapters read their options off the wrapped function or command: a renamed
  # parameter there must not leave an evaluator without its options.
  expected = {"mlm": {"split", "batch_size", "max_batches", "seed"}, "alignment_score": {"step"},
              "word_align": {"gold", "input", "bible_gold", "layers", "methods", "similarity", "mu"},
              "bli": {"src", "tgt", "gold", "layer", "method", "knn", "layers"},
              "rsim": {"src", "tgt", "layers"}, "isomorphism": {"gold", "quadruples", "seed"},
              "retrieval": {"tsv", "bible", "src_lang", "layers", "csls_k"},
              "transfer": {"task", "train", "test", "target_train", "epochs"}}
  assert set(registry.names()) == set(expected)
  for name, options in expected.items():
    known = set(registry.option_names(registry.get(name)))
    assert options <= known, (name, options - known)
    assert not {"run", "model_dir", "checkpoint", "log"} & known, name  # What the adapter fills in from the run.


# ------------------------------------------------------------ through eval.main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_corpus):
  """A copy of the shared 3-step MLM run on tiny_mix (de, en)."""
  return tiny_mix_run(tmp_path_factory, tiny_corpus, "registry")


@pytest.fixture(scope="module")
def gold_files(tmp_path_factory):
  """Twelve German-English pairs (word k translates word k) and their Pharaoh gold."""
  root = tmp_path_factory.mktemp("gold")
  pairs = testlib.sentences(random.Random(7), 12)
  (root / "pairs.tsv").write_text("".join(f"{de}\t{en}\n" for en, de in pairs), encoding="utf-8")
  (root / "gold.txt").write_text("".join(" ".join(f"{k}-{k}" for k in range(len(en.split()))) + "\n"
                                         for en, _ in pairs))
  return root / "pairs.tsv", root / "gold.txt"


def _expect_one_error(capsys, code, *needles):
  assert code == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
  for needle in needles:
    assert needle in err, (needle, err[-2000:])


@pytest.mark.contract  # The eval command's smoke run; registry.evaluate vs the commands stays in the unit tier.
def test_eval_runs_two_evaluators_into_one_eval_json(model_dir, gold_files, capsys):
  pairs_file, gold_file = gold_files
  mlm_options = {"split": "validation", "batch_size": 6, "baseline_batches": 5}
  wa_options = {"input": str(pairs_file), "gold": str(gold_file), "layers": [0, 2],
                "methods": ["argmax", "sinkhorn_itermax"], "batch_size": 4}
  code = eval_main.main([f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVALS=['mlm', 'word_align']",
                         f"--gin.EVAL_OPTIONS={{'mlm': {mlm_options!r}, 'word_align': {wa_options!r}}}"])
  out = capsys.readouterr().out
  assert code == 0, out
  assert "mlm:" in out and "word_align:" in out
  written = json.loads((model_dir / "eval.json").read_text())
  assert list(written) == ["mlm", "word_align"]

  # mlm: evaluate() itself, on the same run.
  direct = mlm_eval.evaluate(Run.open(model_dir), output=None, **mlm_options)
  assert written["mlm"] == json.loads(json.dumps(direct))

  # word_align: the aligner on the same pairs, scored link by link against the gold file.
  pairs = aer.read_pairs(str(pairs_file))
  gold = aer.read_pharaoh(str(gold_file))
  aligner, _, step = word_align.load_aligner(Run.open(model_dir), batch_size=4)
  assert (aligner.src_lang, aligner.tgt_lang) == ("de", "en")
  links = aligner.run(pairs, layers=(0, 2), methods=("argmax", "sinkhorn_itermax"))
  result = written["word_align"]
  assert result["step"] == step == 3 and result["pairs"] == 12 and result["layers"] == [0, 2]
  for (method, layer), predicted in links.items():
    expected = aer.score(predicted, [g.sure for g in gold], [g.possible for g in gold]).as_dict()
    assert result["scores"][method][str(layer)] == pytest.approx(expected), (method, layer)
  assert set(result["best"]) == {"argmax", "sinkhorn_itermax"}


@pytest.mark.contract  # The eval command's smoke run without EVALS.
def test_eval_without_evals_writes_the_masked_token_accuracy_as_before(model_dir, capsys):
  # The module's run may hold the EVALS layout from the test above, which this command refuses to replace
  # (tests/hardening/test_config_checks.py): start from a run without eval.json.
  (model_dir / "eval.json").unlink(missing_ok=True)
  code = eval_main.main([f"--gin.MODEL_DIR='{model_dir}'", "--gin.SPLIT='validation'", "--gin.BATCH_SIZE=6",
                         "--gin.evaluate.baseline_batches=5"])
  assert code == 0
  assert "held-out masked-token accuracy" in capsys.readouterr().out
  written = json.loads((model_dir / "eval.json").read_text())
  direct = mlm_eval.evaluate(Run.open(model_dir), output=None, split="validation", batch_size=6,
                             baseline_batches=5)
  assert written == json.loads(json.dumps(direct))


def test_a_misspelt_evaluator_is_one_error_line_with_the_close_match(model_dir, capsys):
  before = (model_dir / "eval.json").read_bytes() if (model_dir / "eval.json").exists() else None
  code = eval_main.main([f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVALS=['mlm', 'word_algn']"])
  _expect_one_error(capsys, code, "word_algn", "Did you mean 'word_align'")
  after = (model_dir / "eval.json").read_bytes() if (model_dir / "eval.json").exists() else None
  assert after == before


def test_word_align_needs_gold(model_dir, capsys):
  code = eval_main.main([f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVALS=['word_align']"])
  _expect_one_error(capsys, code, "word_align needs gold links", "bible_gold")


def test_command_backed_evaluators_equal_their_commands(model_dir, gold_files, capsys):
  from flax_xalign.cli import bli as bli_main
  from flax_xalign.cli import retrieval as retrieval_main

  pairs_file, _ = gold_files
  options = {"retrieval": {"tsv": str(pairs_file), "layers": [0, 2], "csls_k": 3},
             "rsim": {"src": "de", "tgt": "en", "min_count": 5, "knn": 3, "max_sentences": 50}}
  results = registry.evaluate(Run.open(model_dir), ["retrieval", "rsim"], options, log=None)
  direct = retrieval_main.run(retrieval_main.parse_args(
      [f"--checkpoint={model_dir}", f"--tsv={pairs_file}", "--layers=0,2", "--csls_k=3"]))
  drop = lambda r: {k: v for k, v in r.items() if k != "seconds"}
  assert drop(results["retrieval"]) == drop(direct) and direct["layers"] == [0, 2]
  lexicon = bli_main.run(bli_main.parse_args([f"--checkpoint={model_dir}", "--src=de", "--tgt=en", "--min_count=5",
                                              "--knn=3", "--max_sentences=50", "--layers=all"]))
  assert results["rsim"] == {"src": "de", "tgt": "en", "per_layer": lexicon["per_layer"]}
  assert len(lexicon["per_layer"]["layers"]) == 3
  capsys.readouterr()


def test_lexicon_and_retrieval_evaluators_take_their_commands_options():
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions
  from flax_xalign.evaluation.retrieval import RetrievalOptions

  rsim = registry.create("rsim", FakeRun(), src="de", tgt="en", knn=3)
  assert rsim.options == LexiconOptions(src="de", tgt="en", knn=3, layers="all")  # The evaluator's default.
  iso = registry.get("isomorphism")
  assert registry.required_options(iso) == ("src", "tgt", "gold")
  assert registry.create("isomorphism", FakeRun(), src="de", tgt="en", gold="g.txt").options.isomorphism
  retrieval = registry.create("retrieval", FakeRun(), bible="test", layers=[0, 2], method=["csls"])
  assert retrieval.options == RetrievalOptions(bible="test", layers="0,2", method="csls")  # Lists: comma lists.
  # Bad values stop when the evaluator is built, before any evaluator runs.
  with pytest.raises(UserError, match="--knn=0 must be at least 1"):
    registry.create("bli", FakeRun(), src="de", tgt="en", knn=0)
  with pytest.raises(UserError, match="--method='dot'"):
    registry.create("retrieval", FakeRun(), tsv="p.tsv", method="dot")
