"""An evaluator given `Run.open(d, step=k)` scores step k, not the newest checkpoint.

The evaluations used to take a MODEL_DIR and open it again, at its latest step,
so `registry.evaluate(Run.open(d, step=1), ["mlm"])` reported step 2's numbers.
One tiny run keeps two checkpoints whose parameters differ; each step is scored
through the registry and compared with the same metric computed here from that
step's parameters, read straight from its checkpoint (`training.run_reader`,
not `runs.Run`) and fed to the model, the aligner or the lexicon pass directly.
"""

import itertools
import random

import jax
import numpy as np
import pytest

from flax_xalign.evaluation import registry
from flax_xalign.runs import Run
from tests import testlib

STEPS = (3, 6)  # Checkpoints kept; the numbers of a tiny model tie too often one step apart.
MLM = {"split": "validation", "batch_size": 6, "max_batches": 20, "baseline_batches": 2, "seed": 0}
LAYERS, METHODS = (0, 2), ("argmax", "sinkhorn")
RSIM = {"src": "de", "tgt": "en", "min_count": 5, "knn": 3, "max_sentences": 40}

pytestmark = pytest.mark.contract  # ~1 min on 2 cores: a 6-step run, three evaluators at two steps, and the direct sums.


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_corpus):
  """A 6-step MLM run on tiny_mix (de, en) with checkpoints at steps 3 and 6, and gold alignments."""
  from flax_xalign.training.checkpoints import CheckpointConfig
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.pretrain import pretrain

  del tiny_corpus  # Registers tiny_mix.
  root = tmp_path_factory.mktemp("two_steps")
  model_dir = root / "model"
  pretrain(model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
           batch_size=6, train_steps=STEPS[-1], encoder=testlib.tiny_encoder_config(), objectives={"mlm": 1.0},
           optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0),
           checkpoint=CheckpointConfig(every_steps=STEPS[0], keep=len(STEPS), async_save=False), log_every=1,
           seed=0)
  pairs = testlib.sentences(random.Random(7), 10)  # (en, de); word k translates word k.
  (root / "pairs.tsv").write_text("".join(f"{de}\t{en}\n" for en, de in pairs), encoding="utf-8")
  (root / "gold.txt").write_text("".join(" ".join(f"{k}-{k}" for k in range(len(en.split()))) + "\n"
                                         for en, _ in pairs))
  return model_dir, root / "pairs.tsv", root / "gold.txt"


def _params_of(model_dir, step):
  """Step `step`'s parameters as saved, read without `runs.Run` (the warm start's reader)."""
  from flax_xalign.training.run_reader import SourceRun

  latest = SourceRun.open(str(model_dir))
  return SourceRun(path=latest.path, step=step, spec=latest.spec).params()


class _WithParams:
  """The run opened at its latest step, answering `params()` with the given ones (for the lexicon pass)."""

  def __init__(self, run, params):
    self._run, self._params = run, params

  def params(self, *args, **kwargs):
    del args, kwargs
    return self._params

  def __getattr__(self, name):
    return getattr(self._run, name)


def _masked_accuracy(run, params):
  """Overall masked-token accuracy of `params` on MLM's batches and masks, counted here."""
  spec = run.spec
  batches = run.task_data(MLM["split"]).batches(
      feature_lengths=dict(spec.task_feature_lengths), batch_size=MLM["batch_size"], seed=MLM["seed"],
      split=MLM["split"], shuffle=False, num_epochs=1, pair_layout=spec.pair_layout,
      both_directions=spec.bitext_both_directions)
  predict = jax.jit(run.model.masked_predictions)
  correct = total = 0
  for i, batch in enumerate(itertools.islice(batches, MLM["max_batches"])):
    out = jax.device_get(predict(params, batch, jax.random.fold_in(jax.random.key(MLM["seed"]), i)))
    kept = out["weights"] > 0
    correct += int((out["predicted"] == out["targets"])[kept].sum())
    total += int(kept.sum())
  return correct / total, total


def _alignment_scores(run, params, result, pairs_file, gold_file):
  """{method: {layer: scores}} of an aligner built here on `params`, with the settings `result` reports."""
  from flax_xalign.evaluation.word_alignment import aer, word_align
  from flax_xalign.ops import AlignmentSolver

  spec = run.spec
  aligner = word_align.WordAligner(
      run.model, params, run.vocabulary(), languages=list(spec.languages), src_lang="de", tgt_lang="en",
      specials=spec.vocabulary.specials, pair_layout=result["pair_layout"],
      options=AlignmentSolver(**result["solver"]), normalize=result["normalize"], encoding=result["encoding"],
      batch_size=4)
  gold = aer.read_pharaoh(str(gold_file))
  links = aligner.run(aer.read_pairs(str(pairs_file)), layers=LAYERS, methods=METHODS)
  scores = {}
  for (method, layer), predicted in links.items():
    score = aer.score(predicted, [g.sure for g in gold], [g.possible for g in gold])
    scores.setdefault(method, {})[str(layer)] = score.as_dict()
  return scores


def _assert_close(got, expected, where):
  """Equal structure, numbers equal to float rounding (nested dicts and lists of scores)."""
  if isinstance(expected, dict):
    assert set(got) == set(expected), where
    for key in expected:
      _assert_close(got[key], expected[key], f"{where}.{key}")
  elif isinstance(expected, (list, tuple)):
    assert len(got) == len(expected), where
    for i, (x, y) in enumerate(zip(got, expected)):
      _assert_close(x, y, f"{where}[{i}]")
  elif isinstance(expected, (float, np.floating)):
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-9, nan_ok=True), where
  else:
    assert got == expected, where


def test_evaluators_score_the_step_they_are_given(two_steps):
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, evaluate_lexicon

  model_dir, pairs_file, gold_file = two_steps
  latest = Run.open(model_dir)
  assert latest.step == STEPS[-1]
  options = {"mlm": MLM, "rsim": RSIM,
             "word_align": {"input": str(pairs_file), "gold": str(gold_file), "layers": list(LAYERS),
                            "methods": list(METHODS), "batch_size": 4}}
  results = {step: registry.evaluate(Run.open(model_dir, step=step), list(options), options, log=None)
             for step in STEPS}

  params = {step: _params_of(model_dir, step) for step in STEPS}
  a, b = (jax.tree.leaves(params[step]) for step in STEPS)
  assert any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b)), "the steps must differ"
  for step in STEPS:
    got = results[step]
    assert got["mlm"]["step"] == got["word_align"]["step"] == step
    accuracy, predictions = _masked_accuracy(latest, params[step])
    assert got["mlm"]["overall"]["predictions"] == predictions
    assert got["mlm"]["overall"]["accuracy"] == pytest.approx(accuracy, abs=1e-12), step
    _assert_close(got["word_align"]["scores"],
                  _alignment_scores(latest, params[step], got["word_align"], pairs_file, gold_file),
                  f"word_align at step {step}")
    direct = evaluate_lexicon(_WithParams(latest, params[step]), LexiconOptions(**RSIM, layers="all"),
                              log=lambda line: None)
    _assert_close(got["rsim"]["per_layer"], direct["per_layer"], f"rsim at step {step}")
  # And the numbers tell the steps apart (else the comparisons above could not catch a wrong step).
  first, second = (results[step] for step in STEPS)
  assert first["mlm"]["overall"]["accuracy"] != second["mlm"]["overall"]["accuracy"]
  assert first["word_align"]["scores"] != second["word_align"]["scores"]
  assert first["rsim"]["per_layer"] != second["rsim"]["per_layer"]
