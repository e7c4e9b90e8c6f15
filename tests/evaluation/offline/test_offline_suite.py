"""The offline suite: `score` from its files equals the seqio-fed scorers on the same run and data.

The reference of each metric family is the existing path (`xalign bli`'s `evaluate_lexicon` over the task
registry, `evaluate_retrieval` over the TSV with the run's vocabulary, `mlm_eval.evaluate` over seqio, the
`word_align` evaluator over the embedded Bible gold), run on the session's shared tiny run; the suite is
written from the same sources, so any difference is the file path's.
"""

import types

import pytest

from flax_xalign.errors import UserError

from tests.evaluation.offline.suite_testlib import MIN_COUNT, SIZES, TASK, close as _close

pytestmark = pytest.mark.contract


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


def test_word_alignment_modes_equal_the_evaluator_told_each_mode(run, suite):
  """Both fixed modes (separate/cosine, joint/dot) against the `word_align` evaluator given that mode."""
  from flax_xalign.evaluation.evaluators.word_alignment import WordAlignment
  from flax_xalign.evaluation.offline.scoring import ALIGNMENT_MODES, score
  from flax_xalign.ops.align_solver import METHODS

  modes = score(run, suite["dir"], metrics=["word_alignment_modes"], progress=lambda line: None)
  assert sorted(modes["word_alignment_modes"]) == sorted(f"{e}/{s}" for e, s in ALIGNMENT_MODES)
  common = {"src_lang": "de", "tgt_lang": "en", "max_pairs": SIZES["bible_pairs"], "methods": METHODS}
  for encoding, similarity in ALIGNMENT_MODES:
    ours = modes["word_alignment_modes"][f"{encoding}/{similarity}"]
    assert ours["encoding"] == encoding and ours["solver"]["similarity"] == similarity
    validation = WordAlignment(run, bible_gold="validation", encoding=encoding, similarity=similarity, **common)()
    _close(ours["validation"]["scores"], validation["scores"], f"modes.{encoding}.validation.scores")
    method = "sinkhorn_itermax"
    layer = ours["test"]["by_method"][method]["layer"]
    test = WordAlignment(run, bible_gold="test", layers=[layer], encoding=encoding, similarity=similarity,
                         **common)()
    _close({k: v for k, v in ours["test"]["by_method"][method].items() if k != "layer"},
           test["scores"][method][str(layer)], f"modes.{encoding}.test.{method}")
  one, other = (modes["word_alignment_modes"][f"{e}/{s}"]["validation"]["scores"] for e, s in ALIGNMENT_MODES)
  assert one != other  # The two modes are two computations, not one reported twice.


def test_word_alignment_modes_reuse_the_runs_own_mode(run, suite, monkeypatch):
  """Asked with the run's own mode, the mode it was scored in is that result, not a second computation (the
  sweeps themselves are the test above's; here each is a stand-in that records its call)."""
  from flax_xalign.evaluation.offline import scoring

  calls = []

  def sweep(run, suite, log, *, encoding=None, similarity=None):
    calls.append((encoding, similarity))
    return {"encoding": encoding or "joint", "solver": {"similarity": similarity or "dot"}}

  monkeypatch.setattr(scoring, "_word_alignment", sweep)
  both = scoring.score(run, suite["dir"], metrics=["word_alignment", "word_alignment_modes"],
                       progress=lambda line: None)
  own = both["word_alignment"]
  assert both["word_alignment_modes"][f"{own['encoding']}/{own['solver']['similarity']}"] is own
  assert calls == [(None, None), ("separate", "cosine")]


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
