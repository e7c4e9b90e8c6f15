"""Evaluators of the MLM head and the input embeddings: masked-token accuracy, ALIGN-MLM's alignment score."""

from __future__ import annotations

from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.evaluation.evaluators.adapter import FunctionEvaluator


def _evaluate():
  from flax_xalign.evaluation import mlm_eval

  return mlm_eval.evaluate


class MaskedTokenAccuracy(FunctionEvaluator):
  """`mlm_eval.evaluate`: held-out masked-token accuracy per language next to a unigram baseline.

  Options are `evaluate`'s (split, batch_size, max_batches, baseline_batches,
  seed, ...). Nothing is written: the registry writes one eval.json for all.
  """

  function = staticmethod(_evaluate)
  fixed = ("run", "output")

  @classmethod
  def data_split(cls, options: dict[str, Any]) -> str | None:
    """The split of the run's own task it reads (None: another task, checked when it runs)."""
    if options.get("mixture_or_task_name"):
      return None
    return options.get("split", next(p.default for p in cls.parameters() if p.name == "split"))

  def run_arguments(self) -> dict[str, Any]:
    return {"run": self.run, "output": None}


class AlignmentScore:
  """ALIGN-MLM's alignment score of a synthetic-language run (`alignment_score.run_alignment`).

  The share of natural tokens whose nearest derived token (input embeddings)
  is their own image, over all of them and over those held out of the
  training dictionary. The run needs a `token_map` asset.
  """

  def __init__(self, run: Any, *, step: int | None = None):
    self.run = run.at(step)

  def __call__(self) -> dict[str, Any]:
    from flax_xalign.evaluation.alignment_score import run_alignment

    scores = run_alignment(self.run, self.run.params())
    if scores is None:
      raise UserError(f"{self.run.dir.path} has no token_map asset: the alignment score measures a run on a "
                      "synthetic language (ALIGN-MLM); drop 'alignment_score' from EVALS for this run.")
    return {"step": int(self.run.step), **scores}
