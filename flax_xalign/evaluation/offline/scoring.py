"""Scores a run from an offline suite's files alone: no TensorFlow, tensorflow_text, seqio, gin or conllu.

    from flax_xalign.evaluation.offline.scoring import score
    result = score(Run.open("runs/e5_mlm_seed0"), "bundle/suite")

Each metric family is the existing scorer fed from the suite (`suite.py` says what it holds):

* bli: `lexicon_eval.evaluate_lexicon` per language and gold split (dev, test), X -> pivot, as the e5 Debian
  driver: layer 0 with the MUSE cosine (`isomorphism`), then every layer over the suite's sentences
  (Hit@1 NN/CSLS, mean cosine and RSIM per layer);
* retrieval: `retrieval.evaluate_retrieval` on each language's held-out help pairs (cosine and CSLS, every
  layer, both directions; the best layer by their mean);
* mlm: `mlm_eval.masked_accuracy` on the suite's held-out rows, beside the unigram baseline;
* word_alignment: `word_align.WordAligner.sweep` with every method of `ops.align_solver.METHODS` and every
  layer on the Bible's validation verses; each method's best layer (lowest AER) then scores the test verses
  once (AER, precision, recall, F1), in the run's own encoding and similarity (`model_defaults`);
* word_alignment_modes (asked for by name, not in the default set): the same in each of ALIGNMENT_MODES
  (separate/cosine, joint/dot), so runs trained for different modes are compared in one.

The result is JSON-able and every field is filled: a metric that cannot be computed raises a UserError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.evaluation.offline import suite_files as sf

RETRIEVAL_MAX_LENGTH = 128  # Tokens of a help paragraph kept for retrieval (the model's limit if lower).
ALIGN_MAX_LENGTH = 256
# Word alignment scored in fixed modes besides the run's own (`word_alignment_modes`): each side encoded alone
# with cosine (how zero-shot encoders and SO are scored) and both sides in one row with the dot product (how
# TLM/DWA-trained encoders are), so a start and its continuations compare in one mode whatever each defaults to.
ALIGNMENT_MODES = (("separate", "cosine"), ("joint", "dot"))
# What `score` computes: the suite's metric families, and word alignment in ALIGNMENT_MODES (the suite's verses).
SCORED = (*sf.METRICS, "word_alignment_modes")
Log = Callable[[str], None]


def score(run: Any, suite_dir: str, *, metrics: Sequence[str] | None = None,
          progress: Log = print) -> dict[str, Any]:
  """Every metric of `suite_dir` (or those in `metrics`, of SCORED) on `run` (a `runs.Run`).

  Returns:
    {"run", "step", "suite", "metrics", "bli": {lang: {split: ...}}, "retrieval": {lang: ...},
     "mlm": {...}, "word_alignment": {...}, "word_alignment_modes": {"separate/cosine": {...}, ...},
     "seconds": {metric: s}} (the metrics asked for; by default the suite's, not the extra modes).
  """
  chosen = list(sf.METRICS if metrics is None else metrics)
  unknown = [m for m in chosen if m not in SCORED]
  if unknown or not chosen:
    raise UserError(f"metrics={list(metrics or [])!r}: choose from {', '.join(SCORED)}.")
  suite = sf.Suite(suite_dir)
  suite.check_run(run)
  result: dict[str, Any] = {"run": run.path, "step": int(run.step), "suite": suite.folder, "metrics": chosen,
                            "seconds": {}}
  scorers = {"bli": _bli, "retrieval": _retrieval, "mlm": _mlm, "word_alignment": _word_alignment,
             "word_alignment_modes": lambda *args: _word_alignment_modes(*args, own=result.get("word_alignment"))}
  for metric in chosen:
    start = time.perf_counter()
    progress(f"--- {metric} ({run.path} step {run.step})")
    result[metric] = scorers[metric](run, suite, progress)
    result["seconds"][metric] = round(time.perf_counter() - start, 2)
  _check_filled(result, "score")
  return result


def _check_filled(value: Any, where: str) -> None:
  """UserError naming the first None (a field some scorer left empty) in `value`."""
  if value is None:
    raise UserError(f"{where} could not be computed (None); see the lines above for why.")
  if isinstance(value, dict):
    for key, item in value.items():
      _check_filled(item, f"{where}.{key}")
  elif isinstance(value, (list, tuple)):
    for i, item in enumerate(value):
      _check_filled(item, f"{where}[{i}]")


# ------------------------------------------------------------ BLI, RSIM, MUSE cosine


def bli_summary(layer0: dict[str, Any], layers: dict[str, Any], kind: str) -> dict[str, Any]:
  """The e5 Debian driver's BLI row of one language and gold: layer-0 Hit@k and MUSE cosine, per-layer curves."""
  iso = layer0["muse_cosine"]
  return {"nn": layer0["nn"], "csls": layer0["csls"], "coverage": layer0["coverage"], "pairs": layer0["pairs"],
          "vocab_sizes": layer0["vocab_sizes"], "gold_kind": kind,
          "muse_cosine": {k: iso[k] for k in ("mean", "shuffled_mean", "gap", "pairs")},
          "per_layer": layers["per_layer"], "per_layer_pairs": layers["pairs"]}


def _bli(run: Any, suite: sf.Suite, log: Log) -> dict[str, Any]:
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, evaluate_lexicon

  layout = suite.bli
  out: dict[str, Any] = {}
  for lang, entry in layout["languages"].items():
    text = sf.SuiteText(suite, lang)
    out[lang] = {}
    for split, gold in entry["gold"].items():
      log(f"  BLI {lang} -> {layout['pivot']} ({gold['kind']} {split} gold)")
      common = {"src": lang, "tgt": layout["pivot"], "gold": suite.path(gold["file"]), "normalize": "",
                "min_count": layout["min_count"]}
      layer0 = evaluate_lexicon(run, LexiconOptions(isomorphism=True, **common), log=log, text=text)
      layers = evaluate_lexicon(run, LexiconOptions(layers="all", max_sentences=layout["max_sentences"], **common),
                                log=log, text=text)
      out[lang][split] = bli_summary(layer0, layers, gold["kind"])
  return out


# ------------------------------------------------------------ sentence retrieval


def retrieval_summary(result: dict[str, Any]) -> dict[str, Any]:
  """The e5 Debian driver's retrieval row: both directions averaged, best layer per method, baselines."""
  def both(scores: dict[str, Any]) -> float:
    return (scores["src_to_tgt"] + scores["tgt_to_src"]) / 2

  return {"pairs": result["pairs"], "layers": result["layers"],
          "best": {m: {"layer": b["layer"], "accuracy": both(b), "src_to_tgt": b["src_to_tgt"],
                       "tgt_to_src": b["tgt_to_src"]} for m, b in result["best"].items()},
          "per_layer": {m: [both(result["scores"][m][str(layer)]) for layer in result["layers"]]
                        for m in result["methods"]},
          "bag_of_pieces": {m: both(b) for m, b in result["baselines"]["bag_of_pieces"].items()},
          "chance": result["baselines"]["chance"]}


def _retrieval(run: Any, suite: sf.Suite, log: Log) -> dict[str, Any]:
  from flax_xalign.evaluation.retrieval import RetrievalOptions, evaluate_retrieval

  config = run.model.encoder.config
  max_length = min(RETRIEVAL_MAX_LENGTH, config.max_positions - config.position_offset)
  tokens = suite.tokens(sf.SENTENCES)
  out = {}
  for lang, entry in suite.retrieval["languages"].items():
    log(f"  retrieval {suite.retrieval['src_lang']}-{lang}")
    options = RetrievalOptions(tsv=suite.path(entry["tsv"]), src_lang=suite.retrieval["src_lang"], tgt_lang=lang,
                               max_length=max_length)
    out[lang] = retrieval_summary(evaluate_retrieval(run, options, log=log, vocabulary=tokens))
  return out


# ------------------------------------------------------------ masked-token accuracy


def _mlm(run: Any, suite: sf.Suite, log: Log) -> dict[str, Any]:
  from flax_xalign.evaluation import mlm_eval

  layout = suite.mlm
  with np.load(suite.path(layout["file"])) as f:
    arrays = {name: f[name] for name in f.files}
  languages = list(run.spec.languages)
  top_token = remap_language_ids(arrays, layout["languages"], languages, where=run.path)
  batches = ({name: value[i] for name, value in arrays.items()} for i in range(layout["batches"]))
  scores = mlm_eval.masked_accuracy(run.model, run.params(), batches, top_token, languages=languages,
                                    seed=layout["seed"])
  for code, row in scores["languages"].items():
    row["most_frequent_token"] = layout["most_frequent_token"][code]
  log(f"  MLM accuracy {100 * scores['overall']['accuracy']:.2f}% over {scores['overall']['predictions']:,} "
      f"masked tokens (unigram baseline {100 * scores['overall']['unigram_baseline']:.2f}%)")
  return {"task": layout["task"], "split": layout["split"], **scores}


def remap_language_ids(arrays: dict[str, np.ndarray], written: Sequence[str], languages: Sequence[str], *,
                       where: str = "the run") -> np.ndarray:
  """Moves MLM rows written for `written` languages onto the ids of `languages` (id = 1 + index; 0 = padding).

  Replaces arrays["lang_ids"] in place and pops arrays["top_token"] ([len(written) + 1]); returns the top
  token per id of `languages` (0 for a language the rows do not hold). UserError for a written language
  that `languages` lacks.
  """
  missing = [code for code in written if code not in languages]
  if missing:
    raise UserError(f"the suite's MLM rows hold {missing}, which {where} was not trained on (languages "
                    f"{list(languages)}); write the suite from a run with this run's languages.")
  to_run = np.asarray([0] + [list(languages).index(code) + 1 for code in written], np.int64)
  arrays["lang_ids"] = to_run[arrays["lang_ids"]].astype(arrays["lang_ids"].dtype)
  top_token = np.zeros(len(languages) + 1, np.int64)
  top_token[to_run] = arrays.pop("top_token")
  return top_token


# ------------------------------------------------------------ word alignment


def _read_split(suite: sf.Suite, split: str):
  from flax_xalign.evaluation.word_alignment import aer

  entry = suite.word_alignment["splits"][split]
  pairs = aer.read_pairs(suite.path(entry["pairs"]), setting=f"the suite's {split} verses")
  gold = aer.read_gold(suite.path(entry["gold"]), "pharaoh", num_sentences=len(pairs))
  return pairs, [g.sure for g in gold]


def _word_alignment_modes(run: Any, suite: sf.Suite, log: Log, *, own: dict[str, Any] | None = None
                          ) -> dict[str, Any]:
  """`_word_alignment` in each of ALIGNMENT_MODES, keyed "encoding/similarity"; `own` (the run's own mode's
  result, already computed) stands for the mode it was scored in."""
  out = {}
  for encoding, similarity in ALIGNMENT_MODES:
    if own is not None and (own["encoding"], own["solver"]["similarity"]) == (encoding, similarity):
      out[f"{encoding}/{similarity}"] = own
      continue
    log(f"  word alignment, {encoding} encoding, {similarity} similarity")
    out[f"{encoding}/{similarity}"] = _word_alignment(run, suite, log, encoding=encoding, similarity=similarity)
  return out


def _word_alignment(run: Any, suite: sf.Suite, log: Log, *, encoding: str | None = None,
                    similarity: str | None = None) -> dict[str, Any]:
  """Every method at every layer on validation; each method's best layer scored once on test. `encoding` and
  `similarity` None: the run's own (`word_align.load_aligner`)."""
  import dataclasses

  from flax_xalign.evaluation.word_alignment import aer, word_align
  from flax_xalign.ops.align_solver import METHODS

  layout = suite.word_alignment
  aligner, _, step = word_align.load_aligner(run, src_lang=layout["src_lang"], tgt_lang=layout["tgt_lang"],
                                             vocabulary=suite.tokens(sf.WORDS), max_length=ALIGN_MAX_LENGTH,
                                             encoding=encoding, similarity=similarity)
  if aligner.normalize not in layout["normalizers"]:
    raise UserError(f"the aligner normalises with {aligner.normalize!r}, the suite tokenised the Bible's words "
                    f"for {layout['normalizers']}; write the suite again.")
  log(f"  {aligner.settings.describe()}")
  pairs, sure = _read_split(suite, "validation")
  log(f"  word alignment: {len(pairs)} validation verses, layers 0..{aligner.num_layers}, {', '.join(METHODS)}")
  table = aligner.sweep(pairs, sure, layers=None, methods=METHODS)
  scores, best = word_align.score_tables(table)
  chosen = {method: best[method]["layer"] for method in METHODS}
  test_pairs, test_sure = _read_split(suite, "test")
  links = aligner.run(test_pairs, layers=sorted(set(chosen.values())), methods=METHODS)
  test = {method: {"layer": layer, **aer.score(links[(method, layer)], test_sure).as_dict()}
          for method, layer in chosen.items()}
  for method, row in test.items():
    log(f"  test {method:<17} layer {row['layer']}: AER {100 * row['aer']:.1f}  P {100 * row['precision']:.1f}  "
        f"R {100 * row['recall']:.1f}")
  return {"src_lang": aligner.src_lang, "tgt_lang": aligner.tgt_lang, "methods": list(METHODS),
          "solver": dataclasses.asdict(aligner.options), "normalize": aligner.normalize,
          "encoding": aligner.encoding, "pair_layout": aligner.pair_layout,
          "settings_from": dict(aligner.settings.sources),
          "validation": {"pairs": len(pairs), "scores": scores, "best": best},
          "test": {"pairs": len(test_pairs), "by_method": test}}
