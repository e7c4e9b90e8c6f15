"""Word alignment on the Bible gold: our aligner vs eflomal vs the diagonal.

On the held-out test books' manual Greek-English gold (sure links), AER,
precision, recall, F1 and wall time of:

* diagonal: source word i linked to target word round(i * m / n) (the
  reference point `word_align.evaluate_alignment` reports too);
* eflomal 2.0 (the statistical aligner users of low-resource Bible alignment
  pick), unsupervised over every New Testament verse pair (train, validation
  and test books, lowercased, as users run it), scored on the test books:
  forward, reverse, and our intersection / union / grow-diag-final-and;
* ours, for each checkpoint: every method (argmax, itermax, sinkhorn) at its
  best layer, from `word_align.evaluate_alignment` (one encoder pass over the
  test pairs for every layer and method).

  python bench/word_alignment.py --demo_dir=runs/demo        # the demo's cold + xlm_align
  python bench/word_alignment.py --checkpoint=e5=runs/e5_bible --encoding=separate \\
      --normalize=nfd_strip_marks
  python bench/word_alignment.py --max_pairs=50 --eflomal_corpus=split   # quick look

The last printed line is one JSON object (also written to
bench/results/word_alignment.json): `ours_aer` (best of ours), `eflomal_aer`
(grow-diag-final-and), `diagonal_aer`, `ratio` = eflomal_aer / ours_aer (> 1:
ours is better), all AERs as fractions; null where a side did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "word_alignment.json")
# The subdirectories `python -m flax_xalign.demo --model_dir=DIR` trains, with the demo's names for them.
DEMO_RUNS = (("cold start", "cold"), ("XLM-Align", "xlm_align"))
EFLOMAL_ROWS = ("forward", "reverse", "intersection", "union", "grow-diag-final-and")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--demo_dir", default=None, help="a `flax_xalign.demo` MODEL_DIR: its cold/ and xlm_align/")
  parser.add_argument("--checkpoint", action="append", default=[], metavar="NAME=MODEL_DIR",
                      help="a checkpoint of ours to score (repeatable)")
  parser.add_argument("--split", default="test", help="the books whose gold scores every system")
  parser.add_argument("--max_pairs", type=int, default=None, help="score only the split's first N pairs")
  parser.add_argument("--layers", default=None, help="comma-separated layers to sweep (default: all)")
  parser.add_argument("--eflomal_corpus", default="all", choices=("all", "split"),
                      help="eflomal's unsupervised corpus: every NT pair (users' practice) or only the scored ones")
  parser.add_argument("--skip_eflomal", action="store_true")
  parser.add_argument("--normalize", default="", help="text normaliser of our aligner (e.g. nfd_strip_marks)")
  parser.add_argument("--encoding", default="joint", help="our aligner's encoding: joint or separate")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--output", default=_RESULTS)
  return parser.parse_args(argv)


def checkpoints_of(args: argparse.Namespace) -> list[tuple[str, str]]:
  """(name, model_dir) of every checkpoint to score: the demo's that exist, then --checkpoint."""
  from flax_xalign.errors import UserError

  runs = []
  if args.demo_dir:
    runs = [(name, os.path.join(args.demo_dir, sub)) for name, sub in DEMO_RUNS
            if os.path.isdir(os.path.join(args.demo_dir, sub))]
    if not runs:
      raise UserError(f"--demo_dir={args.demo_dir} has neither cold/ nor xlm_align/; pass the --model_dir "
                      "that `python -m flax_xalign.demo` trained into.")
  for spec in args.checkpoint:
    name, sep, model_dir = spec.partition("=")
    if not sep or not name or not model_dir:
      raise UserError(f"--checkpoint={spec!r}: expected NAME=MODEL_DIR, e.g. --checkpoint=cold=runs/demo/cold.")
    if not os.path.isdir(model_dir):
      raise UserError(f"--checkpoint={spec}: {model_dir} is not a directory.")
    runs.append((name, model_dir))
  return runs


def row(system: str, name: str, scores: Any, seconds: float | None, **extra: Any) -> dict[str, Any]:
  scores = scores if isinstance(scores, dict) else scores.as_dict()
  return {"system": system, "name": name, **{k: scores[k] for k in ("aer", "precision", "recall", "f1")},
          "num_predicted": scores["num_predicted"], "seconds": seconds, **extra}


def diagonal_row(pairs: list, sure: list) -> dict[str, Any]:
  from flax_xalign.evaluation.word_alignment import aer
  start = time.perf_counter()
  links = [{(i, min(len(b) - 1, round(i * len(b) / len(a)))) for i in range(len(a))} if a and b else set()
           for a, b in pairs]
  return row("diagonal", "diagonal", aer.score(links, sure), time.perf_counter() - start)


def eflomal_rows(args: argparse.Namespace, pairs: list, sure: list) -> tuple[list[dict], dict[str, Any]]:
  """Rows of one eflomal run (both directions and three symmetrisations) and its summary."""
  from flax_xalign.evaluation.word_alignment import statistical
  version = statistical.eflomal_version()
  info: dict[str, Any] = {"available": version is not None, "version": version, "corpus": args.eflomal_corpus,
                          "install": statistical.INSTALL_HINT}
  if args.skip_eflomal or version is None:
    info["reason"] = "--skip_eflomal" if args.skip_eflomal else f"not installed: {statistical.INSTALL_HINT}"
    return [], info
  if args.eflomal_corpus == "all":
    corpus, scored, corpus_sure = statistical.bible_corpus(args.split, max_pairs=args.max_pairs)
    if [tuple(map(tuple, corpus[k])) for k in scored] != [(tuple(a), tuple(b)) for a, b in pairs] or (
        corpus_sure != list(sure)):
      raise RuntimeError("bible_corpus and word_align.bible_gold disagree on the scored pairs")
    print(f"eflomal {version}: aligning {len(corpus)} verse pairs (all) ...", flush=True)
    scores, result, size = statistical.score_eflomal(args.split, max_pairs=args.max_pairs)
  else:
    print(f"eflomal {version}: aligning {len(pairs)} verse pairs (split) ...", flush=True)
    result, size = statistical.run_eflomal(pairs), len(pairs)
    scores = statistical.score_directions(result, range(len(pairs)), sure)
  info.update(corpus_pairs=size, seconds=result.seconds)
  rows = [row("eflomal", name, s, result.seconds) for name, s in scores.items()]
  return rows, info


def ours_rows(args: argparse.Namespace, name: str, model_dir: str, diagonal: dict) -> list[dict]:
  from flax_xalign.evaluation.word_alignment import word_align
  layers = [int(l) for l in args.layers.split(",")] if args.layers else None
  out = os.path.join(os.path.dirname(args.output), "word_alignment", name.replace(" ", "_").replace("/", "_"))
  print(f"ours ({name}): sweeping {model_dir} ...", flush=True)
  start = time.perf_counter()
  results = word_align.evaluate_alignment(model_dir, split=args.split, layers=layers, max_pairs=args.max_pairs,
                                          output_dir=out, batch_size=args.batch_size, normalize=args.normalize,
                                          encoding=args.encoding, verbose=False)
  wall = time.perf_counter() - start
  if abs(results["diagonal_baseline"]["aer"] - diagonal["aer"]) > 1e-9:
    raise RuntimeError("the bench's diagonal differs from evaluate_alignment's; the pairs or gold differ")
  return [row("ours", f"{name} {method}", best, results["seconds"], layer=best["layer"], model_dir=model_dir,
              step=results["step"], sweep_layers=len(results["layers"]), load_and_sweep_seconds=wall)
          for method, best in results["best"].items()]


def run(args: argparse.Namespace) -> dict[str, Any]:
  from flax_xalign.evaluation.word_alignment import word_align
  runs = checkpoints_of(args)
  pairs, sure = word_align.bible_gold(args.split, max_pairs=args.max_pairs)
  rows = [diagonal_row(pairs, sure)]
  eflomal, info = eflomal_rows(args, pairs, sure)
  rows += eflomal
  for name, model_dir in runs:
    rows += ours_rows(args, name, model_dir, rows[0])
  ours = min((r for r in rows if r["system"] == "ours"), key=lambda r: r["aer"], default=None)
  gdfa = next((r for r in rows if r["system"] == "eflomal" and r["name"] == "grow-diag-final-and"), None)
  ours_aer = ours["aer"] if ours else None
  eflomal_aer = gdfa["aer"] if gdfa else None
  return {
      "benchmark": "word_alignment", "split": args.split, "pairs": len(pairs),
      "ours_aer": ours_aer, "ours_best": ours["name"] if ours else None,
      "eflomal_aer": eflomal_aer, "diagonal_aer": rows[0]["aer"],
      "ratio": eflomal_aer / ours_aer if ours_aer and eflomal_aer is not None else None,
      "eflomal": info, "checkpoints": dict(runs), "rows": rows,
  }


def format_table(result: dict[str, Any]) -> str:
  title = (f"Greek -> English word alignment, {result['split']} books, {result['pairs']} verse pairs, "
           "sure gold (%, AER lower is better)")
  lines = [title, "",
           f"{'system':<9}{'row':<30}{'layer':>6}{'AER':>7}{'P':>7}{'R':>7}{'F1':>7}{'seconds':>9}"]
  for r in result["rows"]:
    layer = "" if r.get("layer") is None else str(r["layer"])
    lines.append(f"{r['system']:<9}{r['name']:<30}{layer:>6}" + "".join(
        f"{100 * r[k]:>7.1f}" for k in ("aer", "precision", "recall", "f1")) + f"{r['seconds']:>9.2f}")
  info = result["eflomal"]
  if not info["available"] or "reason" in info:
    lines.append(f"eflomal   {info.get('reason', 'not run')}")
  else:
    lines.append(f"  eflomal {info['version']}: {info['corpus_pairs']} pairs aligned unsupervised "
                 f"({info['corpus']}) in {info['seconds']:.1f} s; its rows share that time")
  if any(r["system"] == "ours" for r in result["rows"]):
    lines.append("  ours: seconds = one encoder pass over the scored pairs for every layer and method "
                 "(jit compilation included, loading excluded)")
  else:
    lines.append("  ours: no checkpoint given (--demo_dir or --checkpoint)")
  if result["ratio"] is not None:
    lines.append(f"eflomal (grow-diag-final-and) AER / ours ({result['ours_best']}) AER = {result['ratio']:.2f}")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  from flax_xalign import fileio
  from flax_xalign.errors import UserError

  args = parse_args(argv)
  try:
    result = run(args)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print()
  print(format_table(result))
  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
