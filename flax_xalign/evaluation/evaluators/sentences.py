"""Sentence-level evaluators: parallel-sentence retrieval and zero-shot sentence-pair transfer."""

from __future__ import annotations

from typing import Any

from flax_xalign.evaluation.evaluators.adapter import FunctionEvaluator, OptionsEvaluator


def _evaluate_retrieval():
  from flax_xalign.evaluation import retrieval

  return retrieval.evaluate_retrieval


def _retrieval_options():
  from flax_xalign.evaluation import retrieval

  return retrieval.RetrievalOptions


class Retrieval(OptionsEvaluator):
  """Retrieval accuracy per layer and method (cosine, CSLS): `retrieval.evaluate_retrieval`.

  Options are `RetrievalOptions`' fields (the `retrieval` command's flags):
  `tsv` (source<TAB>target sentences) or `bible` ('validation' / 'test'),
  `src_lang`, `tgt_lang`, `layers`, `method` ('cosine,csls'), `csls_k`,
  `max_pairs`, `normalize`, `max_length`, `batch_size`, `output`.
  """

  function = staticmethod(_evaluate_retrieval)
  options_class = staticmethod(_retrieval_options)
  files = ("tsv",)


def _pair_transfer():
  from flax_xalign.evaluation.transfer import transfer
  return transfer.pair_transfer_from_files


class Transfer(FunctionEvaluator):
  """XNLI / PAWS-X zero-shot transfer (`transfer.pair_transfer_from_files`): ZS, and SUP / Δ with
  `target_train`. Options are that function's: `task`, `train`, `test` (required), `target_train`,
  `source_test`, `source_lang`, `target_lang`, `steps`, `epochs`, `batch_size`, `learning_rate`, ..."""

  function = staticmethod(_pair_transfer)
  fixed = ("run", "output")
  files = ("train", "test", "target_train", "source_test")

  def run_arguments(self) -> dict[str, Any]:
    return {"run": self.run, "output": None}
