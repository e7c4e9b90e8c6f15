"""Lexicon evaluators: BLI (Hit@k of a CSLS / NN dictionary), RSIM per layer, isomorphism measures.

All three are views of one `evaluation.lexicon_eval.evaluate_lexicon` pass
(the language-specific vocabularies and representations are built once);
options are `LexiconOptions`' fields, the `bli` command's flags by name:
`src`, `tgt` (required), `gold` (a MUSE file or 'token_map'), `layer`,
`method`, `min_count`, `knn`, `layers`, `max_sentences`, `task`,
`normalize`, `split`, `quadruples`, `seed`, ...
"""

from __future__ import annotations

from typing import Any

from flax_xalign.evaluation.evaluators.adapter import OptionsEvaluator


def _evaluate_lexicon():
  from flax_xalign.evaluation.lexicon import lexicon_eval
  return lexicon_eval.evaluate_lexicon


def _lexicon_options():
  from flax_xalign.evaluation.lexicon import lexicon_eval
  return lexicon_eval.LexiconOptions


class Bli(OptionsEvaluator):
  """Hit@1 / Hit@5 of the induced dictionary against `gold` (both methods), and its coverage."""

  function = staticmethod(_evaluate_lexicon)
  options_class = staticmethod(_lexicon_options)
  files = ("gold",)
  special_files = {"gold": ("token_map",)}

  @classmethod
  def data_split(cls, options: dict[str, Any]) -> str | None:
    """The split of the run's own task it reads sentences of (None: another task)."""
    import dataclasses

    if options.get("task"):
      return None
    default = next(f.default for f in dataclasses.fields(cls.options_class()) if f.name == "split")
    return options.get("split", cls.defaults.get("split", default))


class Rsim(Bli):
  """Per layer: Hit@1, the mean cosine and the RSIM of the translation pairs (`layers` default 'all')."""

  defaults = {"layers": "all"}

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return {"src": result["src"], "tgt": result["tgt"], "per_layer": result["per_layer"]}


class Isomorphism(Bli):
  """Ai & Fang's MUSE cosine and translation analogies over every pair of `gold` (required)."""

  required = ("gold",)
  defaults = {"isomorphism": True}

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return {"src": result["src"], "tgt": result["tgt"], "gold": result.get("gold"),
            "muse_cosine": result["muse_cosine"], "analogy": result["analogy"]}
