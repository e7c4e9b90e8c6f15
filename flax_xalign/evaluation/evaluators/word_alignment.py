"""Word-alignment evaluator: AER / P / R / F1 per layer and method against a gold file the user names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.evaluation.evaluators import checks


def _solver_fields() -> tuple[str, ...]:
  from flax_xalign.ops.align_solver import AlignmentSolver

  return tuple(f.name for f in dataclasses.fields(AlignmentSolver))


class WordAlignment:
  """Scores every (method, layer) of `word_align.WordAligner.sweep` against gold links.

  The pairs and gold are what `xalign align --sweep` reads:
  `input` (`source<TAB>target` words per line) with `gold` (one entry per
  pair, `gold_format` "pharaoh" or "naacl"), or `bible_gold="test"` (the
  embedded Greek-English verses of that split and their manual gold).

  Options: `layers` (default all, 0..num_layers), `methods` (default every
  method of `ops.align_solver.METHODS`, "sinkhorn_itermax" included),
  `src_lang`/`tgt_lang` (default the run's bitext sides; grc/en for the
  Bible), `max_pairs`, the aligner's `max_length`, `batch_size`,
  `normalize`, `encoding`, `pair_layout`, and any `AlignmentSolver` field
  (`similarity`, `sinkhorn_kernel`, `mu`, ...). `normalize`, `encoding` and
  `similarity` left out follow the model (`word_alignment.model_defaults`),
  and the result records what was chosen (`settings_from`).

  Returns {"step", "pairs", "src_lang", "tgt_lang", "gold", "layers",
  "methods", "solver": {AlignmentSolver fields}, "scores": {method: {layer:
  {precision, recall, f1, aer, ...}}}, "best": {method: {"layer", ...}}}.
  """

  _OWN = ("gold", "input", "bible_gold", "gold_format", "layers", "methods", "src_lang", "tgt_lang", "max_pairs",
          "max_length", "batch_size", "normalize", "encoding", "pair_layout", "verbose")

  def __init__(self, run: Any, *, gold: str | None = None, input: str | None = None,  # noqa: A002 (the align flag)
               bible_gold: str | None = None, gold_format: str = "pharaoh", layers: Sequence[int] | None = None,
               methods: Sequence[str] | None = None, src_lang: str | None = None, tgt_lang: str | None = None,
               max_pairs: int | None = None, max_length: int = 256, batch_size: int = 32,
               normalize: str | None = None, encoding: str | None = None, pair_layout: str | None = None,
               verbose: bool = False, **solver: Any):
    from flax_xalign.ops.align_solver import METHODS, AlignmentSolver

    given = {k: v for k, v in dict(locals()).items() if k in self._OWN and v is not None}
    self.check_values("word_align", {**given, **solver}, setting="EVAL_OPTIONS", num_layers=None)
    self.run = run
    self.gold, self.input, self.bible_gold, self.gold_format = gold, input, bible_gold, gold_format
    self.layers = None if layers is None else tuple(int(l) for l in layers)
    self.methods = tuple(METHODS if methods is None else methods)
    self.languages = (src_lang, tgt_lang)
    self.max_pairs, self.verbose = max_pairs, verbose
    self.aligner_options = {"max_length": max_length, "batch_size": batch_size, "normalize": normalize,
                            "encoding": encoding, "pair_layout": pair_layout}
    self.similarity = solver.pop("similarity", None)
    self.solver = AlignmentSolver(**solver)

  @classmethod
  def option_names(cls) -> tuple[str, ...]:
    return cls._OWN + _solver_fields()

  @classmethod
  def check_values(cls, entry: str, options: dict[str, Any], *, setting: str, num_layers: int | None) -> None:
    """UserError for a value that cannot run (types, layers, methods, gold files), before any run is read."""
    import inspect

    from flax_xalign.ops.align_solver import METHODS, SIMILARITIES, AlignmentSolver

    options = dict(options)
    bible_gold, gold, input_ = options.get("bible_gold"), options.get("gold"), options.get("input")
    if bool(bible_gold) == bool(gold or input_):
      raise UserError(f"{entry} needs gold links: pass 'input' (source<TAB>target per line) and 'gold' "
                      "(one entry per pair), or 'bible_gold': 'test' for the embedded Greek-English verses.")
    if not bible_gold and not (gold and input_):
      raise UserError(f"{entry}: 'gold' and 'input' go together (the gold file has one entry per input pair).")
    solver = {k: options.pop(k) for k in list(options) if k not in cls._OWN}
    unknown = [k for k in solver if k not in _solver_fields()]
    if unknown:
      raise UserError(f"{entry} has no option {unknown[0]!r}; see `word_align` in "
                      "flax_xalign/evaluation/evaluators/word_alignment.py.")
    annotations = {p.name: p.annotation for p in inspect.signature(cls).parameters.values()}
    checks.check_names(entry, "methods", options.get("methods"), METHODS, setting=setting)
    checks.check_types(entry, options, annotations, setting=setting)
    checks.check_layers(entry, options, setting=setting, num_layers=num_layers)
    checks.check_choice(entry, "gold_format", options.get("gold_format"), ("pharaoh", "naacl"), setting=setting)
    checks.check_choice(entry, "similarity", solver.get("similarity"), SIMILARITIES, setting=setting)
    checks.check_choice(entry, "bible_gold", bible_gold, ("train", "validation", "test"), setting=setting)
    checks.check_files(entry, options, ("gold", "input"), setting=setting)
    for key in ("max_length", "batch_size", "max_pairs"):
      if options.get(key) is not None and options[key] < 1:
        raise UserError(f"{setting}[{entry!r}][{key!r}] must be at least 1, got {options[key]!r}.")
    try:
      AlignmentSolver(**{k: v for k, v in solver.items() if k != "similarity"})
    except TypeError as e:
      raise UserError(f"{setting}[{entry!r}]: {e}") from None

  def _pairs_and_gold(self) -> tuple[list, list, list | None]:
    from flax_xalign.evaluation.word_alignment import aer
    from flax_xalign.evaluation.word_alignment import word_align
    if self.bible_gold:
      pairs, sure = word_align.bible_gold(self.bible_gold, max_pairs=self.max_pairs)
      return pairs, sure, None
    pairs = aer.read_pairs(self.input, setting="word_align option 'input'")
    gold = aer.read_gold(self.gold, self.gold_format, num_sentences=len(pairs))
    aer.check_gold_fits(gold, pairs, gold_path=f"word_align option 'gold' {self.gold}",
                        input_path=f"word_align option 'input' {self.input}")
    gold, pairs = gold[:self.max_pairs], pairs[:self.max_pairs]
    return pairs, [g.sure for g in gold], [g.possible for g in gold]

  def __call__(self) -> dict[str, Any]:
    from flax_xalign.evaluation.word_alignment import word_align
    pairs, sure, possible = self._pairs_and_gold()
    src_lang, tgt_lang = self.languages
    if self.bible_gold:
      src_lang, tgt_lang = src_lang or "grc", tgt_lang or "en"
    aligner, _, step = word_align.load_aligner(self.run, src_lang=src_lang, tgt_lang=tgt_lang,
                                               options=self.solver, similarity=self.similarity,
                                               **self.aligner_options)
    table = aligner.sweep(pairs, sure, possible, layers=self.layers, methods=self.methods, verbose=self.verbose)
    scores, best = word_align.score_tables(table)
    return {"step": int(step), "pairs": len(pairs), "src_lang": aligner.src_lang, "tgt_lang": aligner.tgt_lang,
            "gold": self.gold or f"bible:{self.bible_gold}", "layers": sorted({l for _, l in table}),
            "methods": list(self.methods), "solver": dataclasses.asdict(aligner.options),
            "normalize": aligner.settings.normalize, "settings_from": dict(aligner.settings.sources),
            "encoding": aligner.encoding, "pair_layout": aligner.pair_layout, "scores": scores, "best": best}
