"""Word alignment on the Bible gold: our aligner vs eflomal vs the diagonal.

On the held-out test books' manual Greek-English gold (sure links), AER,
precision, recall, F1 and wall time of:

* diagonal: source word i linked to target word round(i * m / n) (the
  reference point `word_align.evaluate_alignment` reports too);
* eflomal 2.0 (the statistical aligner users of low-resource Bible alignment
  pick), unsupervised over every New Testament verse pair (train, validation
  and test books, lowercased, as users run it), scored on the test books:
  forward, reverse, and our intersection / union / grow-diag-final-and;
* ours, for each checkpoint: every method (argmax, itermax, sinkhorn, match)
  at its best layer, from `word_align.evaluate_alignment` (one encoder pass
  over the test pairs for every layer and method);
* SimAlign 0.4 (when installed: the `peers` extra), for each checkpoint that
  exports to Hugging Face: the same weights through our exporter
  (`interop.export_hf`, BERT layout), the same normalised words, at our best
  (or the pinned) layer, with its argmax ("inter"), itermax and match ("mwmf");
* speed: ours vs SimAlign aligning every scored pair with one method at one
  layer (jit compilation included, loading excluded), SimAlign at its best
  torch thread count (1 and 2 probed on a few pairs, the faster timed).

  python bench/word_alignment.py --demo_dir=runs/demo        # the demo's cold + xlm_align
  python bench/word_alignment.py --checkpoint=e5=runs/e5_bible --encoding=separate \\
      --normalize=nfd_strip_marks
  python bench/word_alignment.py --checkpoint=e5=runs/e5_bible --encoding=separate \\
      --normalize=nfd_strip_marks --layers=7        # pin the layer: SimAlign and speed use it too
  python bench/word_alignment.py --max_pairs=50 --eflomal_corpus=split   # quick look

The last printed line is one JSON object (also written to
bench/results/word_alignment.json): `ours_aer` (best of ours), `eflomal_aer`
(grow-diag-final-and), `diagonal_aer`, `ratio` = eflomal_aer / ours_aer (> 1:
ours is better), `simalign_aer` (best of SimAlign's rows), all AERs as
fractions; every row's `pairs_per_second` (pairs it aligned / its seconds);
`speed` {method, layer, ours_seconds, simalign_seconds, *_pairs_per_second,
simalign_threads, speed_ratio = simalign_seconds / ours_seconds}; null where a
side did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "word_alignment.json")
# The subdirectories `xalign demo --model_dir=DIR` trains, with the demo's names for them.
DEMO_RUNS = (("cold start", "cold"), ("XLM-Align", "xlm_align"))
EFLOMAL_ROWS = ("forward", "reverse", "intersection", "union", "grow-diag-final-and")
OURS_METHODS = "argmax,itermax,sinkhorn,match"
# SimAlign's matching methods and the names of ours they equal (on (cos + 1) / 2, as SimAlign scores).
SIMALIGN_METHODS = {"a": ("inter", "argmax"), "i": ("itermax", "itermax"), "m": ("mwmf", "match")}
SIMALIGN_INSTALL = "pip install simalign==0.4 (or pip install -e '.[peers]')"
THREADS = (1, 2)  # torch thread counts SimAlign is probed with
PROBE_PAIRS = 48
SPEED_CODES = {ours: code for code, (_, ours) in SIMALIGN_METHODS.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--demo_dir", default=None, help="a `xalign demo` MODEL_DIR: its cold/ and xlm_align/")
  parser.add_argument("--checkpoint", action="append", default=[], metavar="NAME=MODEL_DIR",
                      help="a checkpoint of ours to score (repeatable)")
  parser.add_argument("--split", default="test", help="the books whose gold scores every system")
  parser.add_argument("--max_pairs", type=int, default=None, help="score only the split's first N pairs")
  parser.add_argument("--layers", default=None, help="comma-separated layers to sweep (default: all)")
  parser.add_argument("--eflomal_corpus", default="all", choices=("all", "split"),
                      help="eflomal's unsupervised corpus: every NT pair (users' practice) or only the scored ones")
  parser.add_argument("--skip_eflomal", action="store_true")
  parser.add_argument("--normalize", default=None,
                      help="text normaliser of our aligner (e.g. nfd_strip_marks; default: the model's)")
  parser.add_argument("--encoding", default=None,
                      help="our aligner's encoding: joint or separate (default: what the model was trained for)")
  parser.add_argument("--methods", default=OURS_METHODS, help="our methods (comma-separated)")
  parser.add_argument("--similarity", default=None, choices=("cosine", "dot"),
                      help="our similarity (default: the model's; SimAlign's is cosine)")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--skip_simalign", action="store_true")
  parser.add_argument("--skip_speed", action="store_true", help="no speed block (ours vs SimAlign, one method)")
  parser.add_argument("--speed_method", default="itermax", choices=("argmax", "itermax", "match"),
                      help="the one method ours and SimAlign are timed with")
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
                      "that `xalign demo` trained into.")
  for spec in args.checkpoint:
    name, sep, model_dir = spec.partition("=")
    if not sep or not name or not model_dir:
      raise UserError(f"--checkpoint={spec!r}: expected NAME=MODEL_DIR, e.g. --checkpoint=cold=runs/demo/cold.")
    if not os.path.isdir(model_dir):
      raise UserError(f"--checkpoint={spec}: {model_dir} is not a directory.")
    runs.append((name, model_dir))
  return runs


def row(system: str, name: str, scores: Any, seconds: float | None, *, pairs: int, **extra: Any) -> dict[str, Any]:
  """One table row; `pairs`: how many pairs the system aligned in `seconds`."""
  scores = scores if isinstance(scores, dict) else scores.as_dict()
  return {"system": system, "name": name, **{k: scores[k] for k in ("aer", "precision", "recall", "f1")},
          "num_predicted": scores["num_predicted"], "seconds": seconds,
          "pairs_per_second": pairs / seconds if seconds else None, **extra}


def diagonal_row(pairs: list, sure: list) -> dict[str, Any]:
  from flax_xalign.evaluation.word_alignment import aer
  start = time.perf_counter()
  links = [{(i, min(len(b) - 1, round(i * len(b) / len(a)))) for i in range(len(a))} if a and b else set()
           for a, b in pairs]
  return row("diagonal", "diagonal", aer.score(links, sure), time.perf_counter() - start, pairs=len(pairs))


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
  rows = [row("eflomal", name, s, result.seconds, pairs=size) for name, s in scores.items()]
  return rows, info


def ours_rows(args: argparse.Namespace, name: str, model_dir: str, diagonal: dict) -> tuple[list[dict], dict]:
  """Our rows of one checkpoint (each method at its best layer) and evaluate_alignment's settings."""
  from flax_xalign.evaluation.word_alignment import word_align
  from flax_xalign.runs import Run
  layers = [int(l) for l in args.layers.split(",")] if args.layers else None
  out = os.path.join(os.path.dirname(args.output), "word_alignment", name.replace(" ", "_").replace("/", "_"))
  print(f"ours ({name}): sweeping {model_dir} ...", flush=True)
  start = time.perf_counter()
  results = word_align.evaluate_alignment(Run.open(model_dir), split=args.split, layers=layers, max_pairs=args.max_pairs,
                                          methods=args.methods.split(","), output_dir=out,
                                          batch_size=args.batch_size, normalize=args.normalize,
                                          encoding=args.encoding, similarity=args.similarity, verbose=False)
  wall = time.perf_counter() - start
  if abs(results["diagonal_baseline"]["aer"] - diagonal["aer"]) > 1e-9:
    raise RuntimeError("the bench's diagonal differs from evaluate_alignment's; the pairs or gold differ")
  settings = {k: results[k] for k in ("normalize", "encoding", "similarity")}
  rows = [row("ours", f"{name} {method}", best, results["seconds"], pairs=results["pairs"], layer=best["layer"],
              model_dir=model_dir, step=results["step"], sweep_layers=len(results["layers"]),
              load_and_sweep_seconds=wall, **settings)
          for method, best in results["best"].items()]
  return rows, settings


def simalign_version() -> str | None:
  try:
    import simalign  # noqa: F401
    from importlib.metadata import version
    return version("simalign")
  except Exception:  # not installed, or its imports (torch, transformers) fail
    return None


def simalign_links(hf_dir: str, pairs: list, *, layer: int, methods: str, threads: int) -> tuple[dict, float]:
  """SimAlign's word links of every pair ({its method name: [set per pair]}) and the seconds aligning took."""
  import torch
  from simalign import SentenceAligner

  torch.set_num_threads(threads)
  aligner = SentenceAligner(model=hf_dir, token_type="bpe", matching_methods=methods, layer=layer)
  names = [SIMALIGN_METHODS[m][0] for m in methods]
  links: dict[str, list] = {n: [] for n in names}
  start = time.perf_counter()
  for a, b in pairs:
    found = aligner.get_word_aligns(list(a), list(b)) if a and b else {n: [] for n in names}
    for n in names:
      links[n].append(set(found[n]))
  return links, time.perf_counter() - start


def best_threads(hf_dir: str, pairs: list, *, layer: int, method: str) -> tuple[int, dict[int, float]]:
  """The fastest of THREADS for SimAlign on the first PROBE_PAIRS pairs (after 4 warm-up pairs): (threads, pairs/s each)."""
  rates = {}
  probe = pairs[:PROBE_PAIRS]
  for threads in THREADS:
    simalign_links(hf_dir, probe[:4], layer=layer, methods=method, threads=threads)
    _, seconds = simalign_links(hf_dir, probe, layer=layer, methods=method, threads=threads)
    rates[threads] = len(probe) / seconds
  return max(rates, key=rates.get), rates


def simalign_rows(args: argparse.Namespace, name: str, model_dir: str, pairs: list, sure: list, *, layer: int,
                  settings: dict, workdir: str) -> tuple[list[dict], dict[str, Any]]:
  """SimAlign's rows on `name`'s weights (exported to HF) and its info, with the speed probe's thread count."""
  from flax_xalign.data.vocab import normalize as normalize_lib
  from flax_xalign.errors import UserError
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.interop.export_hf import export_hf

  info: dict[str, Any] = {"available": True, "version": simalign_version(), "layer": layer,
                          "install": SIMALIGN_INSTALL, "normalize": settings["normalize"]}
  hf_dir = os.path.join(workdir, name.replace(" ", "_").replace("/", "_"))
  try:
    export_hf(model_dir, hf_dir, layout="bert", log=lambda _: None)
  except UserError as e:
    info["reason"] = f"{name} does not export to Hugging Face: {e}"
    return [], info
  words = [([normalize_lib.normalize_text(w, settings["normalize"] or "") for w in a],
            [normalize_lib.normalize_text(w, settings["normalize"] or "") for w in b]) for a, b in pairs]
  threads, rates = best_threads(hf_dir, words, layer=layer, method=SPEED_CODES[args.speed_method])
  print(f"SimAlign ({name}): layer {layer}, {threads} torch thread(s) (probe pairs/s: "
        + ", ".join(f"{t}: {r:.1f}" for t, r in rates.items()) + ") ...", flush=True)
  links, seconds = simalign_links(hf_dir, words, layer=layer, methods="".join(SIMALIGN_METHODS), threads=threads)
  info.update(hf_dir=hf_dir, threads=threads, probe_pairs_per_second=rates, words=words)
  rows = [row("simalign", f"{name} {theirs} (= {ours})", aer.score(links[theirs], sure), seconds,
              pairs=len(pairs), layer=layer, threads=threads) for theirs, ours in SIMALIGN_METHODS.values()]
  return rows, info


def speed(args: argparse.Namespace, model_dir: str, pairs: list, sure: list, *, layer: int, settings: dict,
          simalign: dict | None) -> dict[str, Any]:
  """Ours vs SimAlign aligning every pair with `--speed_method` at `layer`; ours from a cold jit cache."""
  import jax

  from flax_xalign.evaluation.word_alignment import aer, word_align
  from flax_xalign.runs import Run

  method = args.speed_method
  out: dict[str, Any] = {"method": method, "layer": layer, "pairs": len(pairs), "model_dir": model_dir}
  aligner, _, _ = word_align.load_aligner(Run.open(model_dir), src_lang="grc", tgt_lang="en",
                                          batch_size=args.batch_size, **settings)
  for fn in (word_align._jitted_states, word_align._jitted_state_links, word_align._jitted_links):
    fn.cache_clear()
  jax.clear_caches()  # compilation counts, as in a fresh process
  seconds, cpu = [], []
  for _ in range(2):  # cold (jit compiles included), then warm
    start, start_cpu = time.perf_counter(), time.process_time()
    links = aligner.align(pairs, layer=layer, method=method)
    seconds.append(time.perf_counter() - start)
    cpu.append(time.process_time() - start_cpu)
  out.update(ours_seconds=seconds[0], ours_warm_seconds=seconds[1], ours_pairs_per_second=len(pairs) / seconds[0],
             ours_cpu_seconds=cpu[0], load_average=os.getloadavg()[0],
             ours_aer=aer.score(links, sure).aer, ours_packing={k: aligner.last_run.get(k) for k in
                                                               ("rows", "row_length", "encoder_batches", "fill")})
  if simalign:
    start_cpu = time.process_time()
    theirs, t = simalign_links(simalign["hf_dir"], simalign["words"], layer=layer, methods=SPEED_CODES[method],
                               threads=simalign["threads"])
    out.update(simalign_seconds=t, simalign_pairs_per_second=len(pairs) / t, simalign_threads=simalign["threads"],
               simalign_cpu_seconds=time.process_time() - start_cpu, load_average_after=os.getloadavg()[0],
               simalign_aer=aer.score(theirs[SIMALIGN_METHODS[SPEED_CODES[method]][0]], sure).aer,
               speed_ratio=t / seconds[0], warm_speed_ratio=t / seconds[1])
  return out


def run(args: argparse.Namespace) -> dict[str, Any]:
  import tempfile

  from flax_xalign.evaluation.word_alignment import word_align
  runs = checkpoints_of(args)
  pairs, sure = word_align.bible_gold(args.split, max_pairs=args.max_pairs)
  rows = [diagonal_row(pairs, sure)]
  eflomal, info = eflomal_rows(args, pairs, sure)
  rows += eflomal
  version = simalign_version()
  simalign: dict[str, Any] = {"available": version is not None, "version": version, "install": SIMALIGN_INSTALL,
                              "checkpoints": {}}
  if args.skip_simalign or version is None:
    simalign["reason"] = "--skip_simalign" if args.skip_simalign else f"not installed: {SIMALIGN_INSTALL}"
  peers, candidates = simalign["checkpoints"], []
  with tempfile.TemporaryDirectory(prefix="bench_wa_") as workdir:
    for name, model_dir in runs:
      ours, settings = ours_rows(args, name, model_dir, rows[0])
      rows += ours
      layer = min(ours, key=lambda r: r["aer"])["layer"]
      candidates.append((name, model_dir, layer, settings))
      if "reason" not in simalign:
        theirs, peers[name] = simalign_rows(args, name, model_dir, pairs, sure, layer=layer, settings=settings,
                                            workdir=workdir)
        rows += theirs
    # Timed on the first checkpoint SimAlign ran on (else the first checkpoint, ours alone).
    timed = next((c for c in candidates if "threads" in peers.get(c[0], {})), candidates[0] if candidates else None)
    timing = None
    if timed and not args.skip_speed:
      name, model_dir, layer, settings = timed
      timing = {"checkpoint": name, **speed(args, model_dir, pairs, sure, layer=layer, settings=settings,
                                            simalign=peers.get(name) if "threads" in peers.get(name, {}) else None)}
  for entry in peers.values():
    entry.pop("words", None)
    entry.pop("hf_dir", None)
  ours = min((r for r in rows if r["system"] == "ours"), key=lambda r: r["aer"], default=None)
  best_peer = min((r for r in rows if r["system"] == "simalign"), key=lambda r: r["aer"], default=None)
  gdfa = next((r for r in rows if r["system"] == "eflomal" and r["name"] == "grow-diag-final-and"), None)
  ours_aer = ours["aer"] if ours else None
  eflomal_aer = gdfa["aer"] if gdfa else None
  return {
      "benchmark": "word_alignment", "split": args.split, "pairs": len(pairs),
      "ours_aer": ours_aer, "ours_best": ours["name"] if ours else None,
      "eflomal_aer": eflomal_aer, "diagonal_aer": rows[0]["aer"],
      "ratio": eflomal_aer / ours_aer if ours_aer and eflomal_aer is not None else None,
      "simalign_aer": best_peer["aer"] if best_peer else None, "simalign_best": best_peer["name"] if best_peer else None,
      "speed": timing, "eflomal": info, "simalign": simalign, "checkpoints": dict(runs), "rows": rows,
  }


def format_table(result: dict[str, Any]) -> str:
  title = (f"Greek -> English word alignment, {result['split']} books, {result['pairs']} verse pairs, "
           "sure gold (%, AER lower is better)")
  lines = [title, "", f"{'system':<9}{'row':<36}{'layer':>6}{'AER':>7}{'P':>7}{'R':>7}{'F1':>7}{'seconds':>9}"
           f"{'pairs/s':>9}"]
  for r in result["rows"]:
    layer = "" if r.get("layer") is None else str(r["layer"])
    rate = "" if r.get("pairs_per_second") is None else f"{r['pairs_per_second']:.0f}"
    lines.append(f"{r['system']:<9}{r['name']:<36}{layer:>6}" + "".join(
        f"{100 * r[k]:>7.1f}" for k in ("aer", "precision", "recall", "f1")) + f"{r['seconds']:>9.2f}{rate:>9}")
  info = result["eflomal"]
  if not info["available"] or "reason" in info:
    lines.append(f"eflomal   {info.get('reason', 'not run')}")
  else:
    lines.append(f"  eflomal {info['version']}: {info['corpus_pairs']} pairs aligned unsupervised "
                 f"({info['corpus']}) in {info['seconds']:.1f} s; its rows share that time (pairs/s of all it aligned)")
  if any(r["system"] == "ours" for r in result["rows"]):
    lines.append("  ours: seconds = one encoder pass over the scored pairs for every layer and method "
                 "(jit compilation included, loading excluded)")
  else:
    lines.append("  ours: no checkpoint given (--demo_dir or --checkpoint)")
  peer = result["simalign"]
  if "reason" in peer:
    lines.append(f"simalign  {peer['reason']}")
  for name, entry in peer["checkpoints"].items():
    if "reason" in entry:
      lines.append(f"simalign  {entry['reason']}")
    else:
      lines.append(f"  SimAlign {entry['version']} on {name} exported to Hugging Face, layer {entry['layer']}, "
                   f"{entry['threads']} torch thread(s); seconds = one pass computing its three methods")
  timing = result["speed"]
  if timing:
    lines.append(f"speed ({timing['checkpoint']}, {timing['method']} at layer {timing['layer']}, "
                 f"{timing['pairs']} pairs, loading excluded):")
    lines.append(f"  ours      {timing['ours_seconds']:8.2f} s {timing['ours_pairs_per_second']:8.1f} pairs/s "
                 f"(jit compiles included; warm {timing['ours_warm_seconds']:.2f} s)  AER {100 * timing['ours_aer']:.1f}")
    if "simalign_seconds" in timing:
      lines.append(f"  SimAlign  {timing['simalign_seconds']:8.2f} s {timing['simalign_pairs_per_second']:8.1f} "
                   f"pairs/s ({timing['simalign_threads']} torch thread(s), the faster of "
                   f"{', '.join(map(str, THREADS))})  AER {100 * timing['simalign_aer']:.1f}")
      lines.append(f"  speed_ratio (SimAlign s / ours s) = {timing['speed_ratio']:.2f} "
                   f"(warm: {timing['warm_speed_ratio']:.2f}); CPU seconds (all threads): ours "
                   f"{timing['ours_cpu_seconds']:.1f}, SimAlign {timing['simalign_cpu_seconds']:.1f}; load average "
                   f"{timing['load_average']:.2f} -> {timing['load_average_after']:.2f}")
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
