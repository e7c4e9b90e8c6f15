"""Lexicon evaluators: BLI (Hit@k of a CSLS / NN dictionary), RSIM per layer, isomorphism measures.

All three are views of `python -m flax_xalign.bli` (one pass builds the
language-specific vocabularies and representations); options are its flags
by `dest` name: `src`, `tgt` (required), `gold` (a MUSE file or
'token_map'), `layer`, `method`, `min_count`, `knn`, `layers`,
`max_sentences`, `task`, `normalize`, `split`, `quadruples`, `seed`, ...
"""

from __future__ import annotations

from typing import Any

from flax_xalign.evaluation.evaluators.cli_args import CommandEvaluator


class Bli(CommandEvaluator):
  """Hit@1 / Hit@5 of the induced dictionary against `gold` (both methods), and its coverage."""

  command = "bli"
  required = ("src", "tgt")


class Rsim(CommandEvaluator):
  """Per layer: Hit@1, the mean cosine and the RSIM of the translation pairs (`layers` default 'all')."""

  command = "bli"
  required = ("src", "tgt")
  defaults = {"layers": "all"}

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return {"src": result["src"], "tgt": result["tgt"], "per_layer": result["per_layer"]}


class Isomorphism(CommandEvaluator):
  """Ai & Fang's MUSE cosine and translation analogies over every pair of `gold` (required)."""

  command = "bli"
  required = ("src", "tgt", "gold")
  defaults = {"isomorphism": True}

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return {"src": result["src"], "tgt": result["tgt"], "gold": result.get("gold"),
            "muse_cosine": result["muse_cosine"], "analogy": result["analogy"]}
