r"""Runs a GPU bundle's grid on the host: trains every experiment, scores it, writes one results JSON.

  bash .gpu/run.sh                                       # what the bundle's run.sh does:
  python -m flax_xalign.cli.gpu_run .gpu --out="$OUT" [--budget_s=450] [--parallel=3]

Made by `xalign gpu_bundle` (which says what the bundle holds); needs no TensorFlow, seqio or network:
the data are the bundle's packed caches and suite files, the start weights and gin files its own, and the rows
run are the ones its bundle.json lists (`flax_xalign.experiments.gpu.runner`, which says how).

1. The start weights go to WORK/start (e5-small from its trimmed Q4_0 source, or a small MODEL_DIR copied).
2. The warm-up (MLM head only, the encoder frozen) trains alone; its measured steps/s sizes every family's
   steps (`grids.plan_steps`) so the grid fits BUDGET_S, and the start model is scored beside it.
3. The experiments run `python -m flax_xalign.train`, --parallel at a time on the one card, each followed by
   its scoring (`--score`, a process of its own). An experiment still training when its family's time is
   spent gets SIGTERM: it saves its step and is scored there, so a slower card still returns every row
   (the row says `stopped_early` and the steps it reached).
4. OUT/results.json: the card, the budget, the plan, and per row the steps, tokens seen, seconds and scores;
   OUT/rsim.png: ΔRSIM per layer against MLM (Lu et al. Fig. 7's shape), when matplotlib is there;
   OUT/failed_rows.log: the end of each failed row's log, when a row failed.

Progress lines carry the elapsed time and an ETA. Every bad flag, variable or bundle is one line before anything
is made; a bundle of another version is refused with the command that rebuilds it. WORK/start is reused only
when it was made from this bundle's start weights. SIGTERM, SIGINT or SIGHUP to this process stops every child,
writes results.json of what was done and exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Sequence

from flax_xalign.errors import ArgumentParser, UserError


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  """The flags, with the environment's OUT, WORK, BUDGET_S and PARALLEL for those not given, every value checked
  (UserError naming the variable) before any work; `args.settings`: how --out and --work were named."""
  from flax_xalign.experiments.gpu import runner

  parser = ArgumentParser(prog="xalign gpu_run", description=__doc__.splitlines()[0])
  parser.add_argument("bundle", help="the bundle folder (`xalign gpu_bundle --output`)")
  parser.add_argument("--out", help="where results go (default $OUT, else ./gpu_out)")
  parser.add_argument("--budget_s", type=runner.SECONDS,
                      help="seconds for training + scoring (default $BUDGET_S, else the grid's)")
  parser.add_argument("--parallel", type=runner.COUNT, help="experiments training at once on the card (default "
                      "$PARALLEL, else 3)")
  parser.add_argument("--work", help="runs and logs (default $WORK, else the folder the bundle was built for, "
                      "bundle.json's 'work': its induced dictionaries name their source there)")
  parser.add_argument("--launcher", default="", help="a command every child (trainer, scorer) runs under, split "
                      "like a shell line: e.g. 'nice -n 5' or 'numactl --cpunodebind=0'")
  parser.add_argument("--smoke", action="store_true", help="every row trains 1 step of 2 rows, nothing is scored: "
                      "checks here that the bundle's rows load and compile (minutes on a CPU) before a GPU call")
  parser.add_argument("--score", metavar="MODEL_DIR", help="(internal) score one run and exit")
  parser.add_argument("--metrics", default="", help="(with --score) comma-separated metric families")
  args = parser.parse_args(argv)
  settings = ["--out", "--work"]
  if args.out is None:
    args.out, settings[0] = (os.environ["OUT"], "$OUT") if os.environ.get("OUT") else ("gpu_out", "--out")
  if args.work is None and os.environ.get("WORK"):
    args.work, settings[1] = os.environ["WORK"], "$WORK"
  args.settings = tuple(settings)
  if args.budget_s is None:
    args.budget_s = runner.environment_value("BUDGET_S")
  if args.parallel is None:
    args.parallel = runner.environment_value("PARALLEL") or 3
  runner.check_environment()
  try:
    args.launcher = shlex.split(args.launcher)
  except ValueError as e:
    raise UserError(f"--launcher={args.launcher!r} is not a command line ({e}); quote it like a shell line") from None
  if args.launcher and shutil.which(args.launcher[0]) is None:
    raise UserError(f"--launcher's command {args.launcher[0]!r} is not found; name a program on PATH")
  return args


def run(args: argparse.Namespace) -> None:
  from flax_xalign.experiments.gpu import runner
  from flax_xalign.experiments.gpu.results import RESULTS_FILE, check_results

  if args.score:
    runner.score_run(args.bundle, args.score, [m for m in args.metrics.split(",") if m])
    return
  # --out: new, empty or an earlier results folder (results.json is replaced), never in the bundle it reads.
  results = runner.run_grid(runner.check_run(args.bundle, out=args.out, work=args.work, budget_s=args.budget_s,
                                             parallel=args.parallel, smoke=args.smoke, launcher=args.launcher,
                                             settings=args.settings))
  if results.get("stopped_by"):
    done = sum(1 for r in results["rows"] if "not_run" not in r["scores"])
    print(f"stopped by {results['stopped_by']} after {results['wall_s']:.0f} s: {done} of {len(results['rows'])} "
          f"rows finished, the others are marked not run in {os.path.join(args.out, RESULTS_FILE)}; no child is "
          "left running (to run again, remove the work folder's runs/ or choose another --work)",
          file=sys.stderr, flush=True)
    raise SystemExit(128 + signal.Signals[results["stopped_by"]])
  problems = check_results(results)
  if problems:
    raise UserError(f"{len(problems)} results are missing ({'; '.join(problems[:6])}); {args.out}/{RESULTS_FILE} "
                    "holds the rest and the failed rows' logs are beside it")


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.cli import common

  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
