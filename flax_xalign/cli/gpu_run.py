r"""Runs a GPU bundle's grid on the host: trains every experiment, scores it, writes one results JSON.

  bash .gpu/run.sh                                       # what the bundle's run.sh does:
  python -m flax_xalign.cli.gpu_run .gpu --out="$OUT" [--budget_s=450] [--parallel=3]

Made by `xalign gpu_bundle` (which says what the bundle holds); needs no TensorFlow, seqio or network:
the data are the bundle's packed caches and suite files, the start weights its own.

1. The start weights go to WORK/start (e5-small from its trimmed Q4_0 source, or a small MODEL_DIR copied).
2. The warm-up (MLM head only, the encoder frozen) trains alone; its measured steps/s sizes every family's
   steps (`gpu_grids.plan_steps`) so the grid fits BUDGET_S, and the start model is scored beside it.
3. The experiments run `python -m flax_xalign.train`, --parallel at a time on the one card, each followed by
   its scoring (`--score`, a process of its own). An experiment still training when its family's time is
   spent gets SIGTERM: it saves its step and is scored there, so a slower card still returns every row
   (the row says `stopped_early` and the steps it reached).
4. OUT/results.json: the card, the budget, the plan, and per row the steps, tokens seen, seconds and scores;
   OUT/rsim.png: ΔRSIM per layer against MLM (Lu et al. Fig. 7's shape), when matplotlib is there;
   OUT/failed_rows.log: the end of each failed row's log, when a row failed.

Progress lines carry the elapsed time and an ETA. Every bad flag, variable or bundle is one line before anything
is made. WORK/start is reused only when it was made from this bundle's start weights (`reusable_start`).
SIGTERM, SIGINT or SIGHUP to this process stops every child (`Children`), writes results.json of what was done
and exits with 128 + the signal.

Its parts, in cli/experiments/: `gpu_bundle_file` (bundle.json's checks, the start weights), `gpu_children`
(the child processes, one row's trainer and scorer) and `gpu_results` (progress lines, results.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import lzma
import math
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

# (make_start, shape_problem, START_MARK and ROW_FIELDS are imported from here by gpu_bundle and the tests.)
from flax_xalign.cli.experiments.gpu_bundle_file import (  # noqa: F401
    START_MARK, SUITE_DIR, check_bundle, make_start, read_bundle, reusable_start, shape_problem, start_weights)
from flax_xalign.cli.experiments.gpu_children import SCORE_FILE, Children, Experiment
from flax_xalign.cli.experiments.gpu_results import (  # noqa: F401
    FAILED_LOG_LINES, FAILED_LOGS, RESULTS_FILE, ROW_FIELDS, Clock, check_results, last_step, log_tail,
    mark_stopped, measured_rates, plot_rsim, write_results)
from flax_xalign.errors import ArgumentParser, UserError

# ---------------------------------------------------------------------------- one experiment's trainer


def _env(bundle_dir: str, memory_fraction: float | None = None) -> dict[str, str]:
  """The children's environment; `memory_fraction`: the card's share each child may grow to (unless the
  user set XLA_PYTHON_CLIENT_MEM_FRACTION). Without a cap, ten processes that each keep their peak ran an
  H200 out of memory (8 of 14 rows lost in the first science run)."""
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # (jax refuses both of its spellings set at once: a user's XLA_CLIENT_MEM_FRACTION wins as well.)
  if memory_fraction is not None and not any(env.get(v) for v in MEMORY_FRACTION_VARIABLES):
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{memory_fraction:.3f}"
  # Every row's scoring is a fresh process compiling the same shapes: cache them all, not only the slow ones.
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env


def train_argv(bundle_dir: str, bundle: Mapping[str, Any], experiment: Mapping[str, Any], *, model_dir: str,
               init_dir: str, start_dir: str, steps: int, extra: Sequence[str] = ()) -> list[str]:
  """The `python -m flax_xalign.train` flags of one experiment (its family's shape, cache and schedule):
  the architecture is the start weights' (START/model.gin), the parameters `init_dir`'s latest step."""
  family = bundle["families"][experiment["family"]]
  cache = bundle["caches"][family["cache"]]
  flags = ["--gin_file=runs/pretrain.gin", f"--gin_file={os.path.join(start_dir, 'model.gin')}"]
  flags += [f"--gin_file={f}" for f in experiment["gin_files"]]
  bindings = [
      f"MODEL_DIR = '{model_dir}'", f"MIXTURE_OR_TASK_NAME = '{cache['task']}'",
      f"train.data = 'cache:{os.path.join(bundle_dir, cache['path'])}'",
      # Through the macro objectives/xlm_align.gin reads (and requires).
      f"INIT_FROM_CHECKPOINT = '{init_dir}'", "train.init_from_checkpoint = %INIT_FROM_CHECKPOINT",
      f"TASK_FEATURE_LENGTHS = {{'tokens': {cache['length']}}}", f"BATCH_SIZE = {family['batch_size']}",
      f"TRAIN_STEPS = {steps}", f"CHECKPOINT_EVERY = {steps}", f"LOG_EVERY = {max(1, min(50, steps // 10))}",
      f"EVAL_EVERY = {steps if cache.get('eval_rows') else 0}", "train.eval_batches = 4",
      *bundle["common_bindings"], *family["bindings"], *experiment["bindings"], *extra]
  return flags + [f"--gin.{b.replace(' = ', '=', 1)}" for b in bindings]


def copy_assets(bundle_dir: str, experiment: Mapping[str, Any], model_dir: str) -> list[str]:
  """The experiment's prebuilt asset files (lang_vocab, cooc: built where seqio is) into its new MODEL_DIR."""
  source = os.path.join(bundle_dir, "assets", experiment["assets"]) if experiment.get("assets") else None
  if not source or not os.path.isdir(source):
    return []
  os.makedirs(model_dir, exist_ok=True)
  copied = []
  for name in sorted(os.listdir(source)):
    target = os.path.join(model_dir, name[:-3] if name.endswith(".xz") else name)
    if os.path.exists(target):
      continue
    if name.endswith(".xz"):  # Carried xz-compressed (gpu_bundle.write_assets); the run reads the file itself.
      with lzma.open(os.path.join(source, name), "rb") as src, open(target + ".partial", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
      os.replace(target + ".partial", target)
    else:
      shutil.copy2(os.path.join(source, name), target)
    copied.append(os.path.basename(target))
  return copied


# ---------------------------------------------------------------------------- scoring (its own process)


def score_main(bundle_dir: str, model_dir: str, metrics: Sequence[str]) -> None:
  """Scores the latest step of MODEL_DIR on the bundle's suite; writes MODEL_DIR/scores.json."""
  from flax_xalign.evaluation.offline.scoring import score
  from flax_xalign.fileio import write_atomically
  from flax_xalign.runs import Run

  run = Run.open(model_dir)
  print(f"scoring {model_dir} step {run.step}: {', '.join(metrics)}", flush=True)
  result = score(run, os.path.join(bundle_dir, SUITE_DIR), metrics=list(metrics),
                 progress=lambda line: print(line, flush=True))
  write_atomically(os.path.join(model_dir, SCORE_FILE), json.dumps(result, indent=1, sort_keys=True))


# ---------------------------------------------------------------------------- the grid


SMOKE_BINDINGS = ("BATCH_SIZE = 2",)
SCORE_SHARE = 0.3  # of the budget kept after the last training deadline for the last rows' scoring
WARMUP_SPEEDUP = 3.0
TRAIN_MEMORY, SCORE_MEMORY = 0.7, 0.2  # of the card: all trainers together, all scorers together
# A row started after its family's deadline still trains this long: it saves at SIGTERM, but only once its
# first step is compiled and run (an MLM row's start and compile took about 30 s on the H200).
MIN_TRAIN_S = 60.0


def run_order(specs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The order rows start in: seed 0 of every family before any later seed, and within a seed the families
  with fewer rows first (a stable sort, so the grid's order otherwise). When the card is slower than
  planned, the deadline then cuts second seeds, not the only SO run."""
  sizes: dict[str, int] = {}
  for spec in specs:
    sizes[spec["family"]] = sizes.get(spec["family"], 0) + 1
  return sorted(specs, key=lambda spec: (spec.get("seed", 0), sizes[spec["family"]]))


OUT_ENTRIES = (RESULTS_FILE, FAILED_LOGS, "rsim.png")
# What a work folder holds: this command's runs, logs and start, the JAX cache run.sh puts there, and what
# gpu_bundle leaves in the host work folder it made (the default --work on the builder's machine): its mark
# (fileio.MARK, added in `check_places`) and, from older builds, the tiny grid's start.
WORK_ENTRIES = ("start", "start.partial", "runs", "logs", "jax_cache", "tiny_start")


def check_places(bundle_dir: str, out: str, work: str, *, settings: tuple[str, str] = ("--out", "--work")
                 ) -> tuple[str, str]:
  """(--out, --work) as absolute paths, checked before anything is made (UserError): apart from the bundle and
  from each other (none is, holds or lies inside another), each new, empty or of gpu_run's own kind."""
  from flax_xalign.cli.experiments.gpu_folders import nesting
  from flax_xalign.fileio import MARK, check_output_folder

  out_setting, work_setting = settings
  for (name, path), (other, other_path) in (((out_setting, out), ("the bundle", bundle_dir)),
                                            ((work_setting, work), ("the bundle", bundle_dir)),
                                            ((out_setting, out), (work_setting, work))):
    where = nesting(path, other_path)
    if where:
      raise UserError(f"{name} {path} {where} {other} {other_path}: what gpu_run writes there would mix with it; "
                      f"choose a {name} that neither is, holds nor lies inside {other} (nothing was made)")
  out = check_output_folder(out, setting=out_setting, inputs={"bundle": bundle_dir},
                            owned=lambda f: set(os.listdir(f)) <= set(OUT_ENTRIES),
                            what=f"a gpu_run results folder ({', '.join(OUT_ENTRIES)})")
  work = check_output_folder(work, setting=work_setting, inputs={"bundle": bundle_dir},
                             owned=lambda f: set(os.listdir(f)) <= {*WORK_ENTRIES, MARK},
                             what=f"a gpu_run work folder ({', '.join(WORK_ENTRIES[:5])})")
  return out, work


def check_run(bundle_dir: str, *, out: str, work: str | None, budget_s: float | None,
              settings: tuple[str, str] = ("--out", "--work")) -> tuple[dict[str, Any], Any, str, str, float]:
  """(bundle, grid, out, work, budget) of a run, everything checked before anything is made (UserError)."""
  bundle = read_bundle(bundle_dir)
  grid = check_bundle(bundle_dir, bundle)
  out, work = check_places(bundle_dir, out, os.path.abspath(work or bundle["work"]), settings=settings)
  earlier = os.path.join(work, "runs")
  if os.path.isdir(earlier) and os.listdir(earlier):  # Its rows would resume from them, not train.
    raise UserError(f"the work folder {work} holds the runs of an earlier gpu_run ({earlier}); its rows would "
                    f"resume from them instead of training. Remove {earlier} or choose another --work.")
  reusable_start(bundle_dir, bundle, work)  # (refuses another bundle's start)
  if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
    raise UserError(f"the budget {budget_s!r} is not a number of seconds above 0; pass --budget_s=SECONDS")
  return bundle, grid, out, work, float(budget_s if budget_s is not None else bundle["budget_s"])


class _Stop(Exception):
  """The driver is stopping (a signal): the grid's flow ends, `run_grid` writes what was done."""


def run_grid(bundle_dir: str, *, out: str, budget_s: float | None, parallel: int, work: str | None,
             smoke: bool = False, launcher: Sequence[str] = (), settings: tuple[str, str] = ("--out", "--work")
             ) -> dict[str, Any]:
  """The grid (module docstring). `smoke`: every row trains 1 step of 2 rows and nothing is scored: a check,
  on any machine, that every row's data, assets and settings load and compile where TensorFlow is absent.
  `launcher`: the command every child runs under; `settings`: how the user named --out and --work.

  A SIGTERM, SIGINT or SIGHUP stops every child (`Children`) and returns results (also in OUT/results.json)
  with `stopped_by` set to the signal's name and each unfinished row marked (`mark_stopped`)."""
  from flax_xalign.cli.experiments import gpu_grids

  # This process only reads the card's name and imports the start weights: XLA's default would reserve 75%
  # of the card here at the first jax call, before any row starts (the first science run's out-of-memory).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  # --out: new, empty or an earlier results folder (results.json is replaced), never in the bundle it reads.
  bundle, grid, out, work, budget = check_run(bundle_dir, out=out, work=work, budget_s=budget_s, settings=settings)
  if parallel < 1:
    raise UserError(f"--parallel={parallel}: run at least 1 experiment at a time")
  clock = Clock(budget)
  # The card is split between `parallel` trainers and `score_slots` scorers (the start row's included).
  score_slots = max(1, parallel // 2)
  env = _env(bundle_dir, TRAIN_MEMORY / parallel)
  score_env = _env(bundle_dir, SCORE_MEMORY / score_slots)
  scoring = threading.Semaphore(score_slots)
  results: dict[str, Any] = {"grid": grid.name, "bundle": {k: bundle[k] for k in ("created", "bytes", "parts")},
                             "card": None, "budget_s": budget, "parallel": parallel,
                             "alignment_peers": bundle.get("alignment_peers"), "rows": []}
  experiments = {e["name"]: e for e in bundle["experiments"]}
  log = lambda name: os.path.join(work, "logs", f"{name}.log")  # noqa: E731
  children = Children(launcher)
  start_row = Experiment({"name": "start", "family": "start", "objective": "start", "start": "start"}, work=work,
                         children=children)
  start_row.row.update(steps_planned=0, steps_done=0, tokens_seen=0, train_s=0.0, stopped_early=False)
  warm = Experiment(experiments["warmup"], work=work, children=children)
  rows = [Experiment(experiments[e.name], work=work, children=children) for e in grid.experiments]
  every_row = [start_row, warm, *rows]
  threads: list[threading.Thread] = []  # Every thread started, joined before the end, whatever ends the grid.

  def start_thread(target: Any, *args: Any) -> None:
    threads.append(threading.Thread(target=target, args=args))
    threads[-1].start()

  def grid_flow() -> None:
    os.makedirs(out, exist_ok=True)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    for row in every_row:  # A log holds this call's lines only (failed_rows.log copies its end).
      with contextlib.suppress(FileNotFoundError):
        os.remove(log(row.name))
    results["card"] = _card()
    clock.line(f"grid {grid.name}: {len(experiments)} experiments, budget {budget:.0f} s, {parallel} at a time")
    start_dir = start_weights(bundle_dir, bundle, work)
    if children.stopping:
      raise _Stop
    clock.line(f"start weights ready in {start_dir}")

    # The start row is scored while the warm-up trains.
    start_row.model_dir = start_dir

    def score_start() -> None:
      with scoring:
        start_row.score(bundle_dir, grid.metrics(), log=log("start"), env=score_env)

    if smoke:
      start_row.row.update(score_s=0.0, scores={"smoke": "not scored"})
    else:
      start_thread(score_start)
    extra = SMOKE_BINDINGS if smoke else ()

    warm_spec = experiments["warmup"]
    warm_steps = 1 if smoke else grid.warmup_steps
    copy_assets(bundle_dir, warm_spec, warm.model_dir)
    code = warm.train(train_argv(bundle_dir, bundle, {**warm_spec, "family": grid.families[0].name},
                                 model_dir=warm.model_dir, init_dir=start_dir, start_dir=start_dir,
                                 steps=warm_steps, extra=extra),
                      deadline=clock.start + (budget if smoke else 0.2 * budget), log=log("warmup"), env=env)
    warm.row.update(steps_planned=warm_steps, steps_done=last_step(warm.model_dir))
    if children.stopping:
      raise _Stop
    if code != 0 or not warm.row["steps_done"]:
      raise UserError(f"the warm-up failed (exit {code}: {log_tail(log('warmup'))}); its log: {log('warmup')}")
    rates = measured_rates(warm.model_dir)
    warm.row.update(tokens_seen=round(rates.get("tokens_per_step", 0) * warm.row["steps_done"]), score_s=0.0,
                    scores={"note": "not scored: the encoder is e5's (frozen), the start row scores it"})
    clock.line(f"warm-up: {warm.row['steps_done']} steps in {warm.row['train_s']} s, "
               f"{rates.get('steps_per_s', 0):.2f} steps/s")
    # The start row is not waited for: its scoring compiles every evaluation shape cold (239 s on an H200 in
    # the first science run, where planning after it left the rows no time), and it goes on beside the rows.
    remaining = budget - clock.elapsed()
    score_reserve = SCORE_SHARE * budget
    # The warm-up trains the head alone (no backward pass through the encoder): a full step costs about
    # WARMUP_SPEEDUP of its steps (forward + backward ~ 3 forwards).
    plan = gpu_grids.plan_steps(grid, warmup_steps_per_s=max(rates.get("steps_per_s", 0.0), 1e-6) / WARMUP_SPEEDUP,
                                train_budget_s=max(remaining - score_reserve, 1.0) * parallel, safety=0.8)
    results["calibration"] = {"warmup_steps_per_s": rates.get("steps_per_s"), "score_reserve_s": score_reserve}
    if smoke:
      plan = {name: {**p, "steps": 1, "capped": "smoke"} for name, p in plan.items()}
    results["plan"] = plan
    clock.line("plan: " + ", ".join(f"{f} {p['steps']} steps" + (f" ({p['capped']})" if p["capped"] else "")
                                    for f, p in plan.items()))

    # (A smoke run has no deadline: it is slow on a CPU and checks that every row starts, not the budget.)
    family_deadline = {f.name: float("inf") if smoke else clock.start + budget - score_reserve
                       for f in grid.families}
    total_work = sum(plan[r.spec["family"]]["steps"] * r.spec.get("cost", 1.0) for r in rows)
    done_work = [0.0]
    order = [spec["name"] for spec in run_order([r.spec for r in rows])]
    queue = sorted(rows, key=lambda r: order.index(r.name))
    lock = threading.Lock()

    def worker() -> None:
      while not children.stopping:
        with lock:
          if not queue:
            return
          row = queue.pop(0)
        spec = row.spec
        steps = plan[spec["family"]]["steps"]
        init = start_dir if spec["start"] == "start" else os.path.join(work, "runs", spec["start"])
        copy_assets(bundle_dir, spec, row.model_dir)
        clock.line(f"{row.name}: training {steps} steps", done=done_work[0], total=total_work)
        # A row late in the queue still gets MIN_TRAIN_S: SIGTERM before the trainer's first save loses the row.
        deadline = max(family_deadline[spec["family"]], time.monotonic() + MIN_TRAIN_S)
        code = row.train(train_argv(bundle_dir, bundle, spec, model_dir=row.model_dir, init_dir=init,
                                    start_dir=start_dir, steps=steps, extra=extra),
                         deadline=deadline, log=log(row.name), env=env)
        if code is None:  # Stopping: the row never started.
          return
        reached = last_step(row.model_dir)
        rate = measured_rates(row.model_dir)
        row.row.update(steps_planned=steps, steps_done=reached,
                       tokens_seen=round(rate.get("tokens_per_step", 0) * reached), train_exit=code,
                       steps_per_s=rate.get("steps_per_s"))
        with lock:
          done_work[0] += steps * spec.get("cost", 1.0)
        if children.stopping:  # (stopped by the driver's signal: neither a failure nor scored; mark_stopped)
          return
        if not reached:
          row.row.update(score_s=0.0, scores={"error": f"training failed (exit {code}: {log_tail(log(row.name))})"})
          clock.line(f"{row.name}: training FAILED (exit {code}); log {log(row.name)}")
          continue
        clock.line(f"{row.name}: {reached}/{steps} steps in {row.row['train_s']} s"
                   + (" (stopped at its deadline)" if row.row["stopped_early"] else "")
                   + ("" if smoke else "; scoring"),
                   done=done_work[0], total=total_work)
        if smoke:
          row.row.update(score_s=0.0, scores={"smoke": "not scored"})
          continue
        # Scored beside the next rows' training: the training slots stay full, so the rows of a family train
        # back to back and reach the same planned steps.
        start_thread(score_row, row)

    def score_row(row: Experiment) -> None:
      with scoring:
        code = row.score(bundle_dir, row.spec.get("metrics", ()), log=log(row.name), env=score_env)
      if children.stopping:
        return
      if code != 0 or "scores" not in row.row:
        row.row["scores"] = {"error": f"scoring failed (exit {code}: {log_tail(log(row.name))})"}
      clock.line(f"{row.name}: scored in {row.row['score_s']} s" + ("" if code == 0 else f" FAILED (exit {code})"))
      with lock:  # A call cut short still brings back every row scored so far.
        write_results(results, every_row, out, clock, partial=True)

    for _ in range(parallel):
      start_thread(worker)
    while threads:  # (the start row's scoring, the workers and the scorers they start)
      threads.pop(0).join()

  with children.on_signals():
    try:
      grid_flow()
    except _Stop:
      pass
    finally:  # On an error or a signal: no child outlives the driver, and no thread the interpreter.
      children.close()
      while threads:
        threads.pop(0).join()
  if children.stopped_by is not None:
    mark_stopped(every_row, signal.Signals(children.stopped_by).name)
    results["stopped_by"] = signal.Signals(children.stopped_by).name
    write_results(results, every_row, out, clock)
    return results
  path = write_results(results, every_row, out, clock)
  failed = [r["name"] for r in results["rows"] if (r.get("scores") or {}).get("error")]
  if failed:  # One file (a device call brings back few): the end of each failed row's log.
    with open(os.path.join(out, FAILED_LOGS), "w", encoding="utf-8") as f:
      for name in failed:
        f.write(f"==== {name} ({log(name)}), last {FAILED_LOG_LINES} lines\n{log_tail(log(name), FAILED_LOG_LINES)}\n")
  plot_rsim(results, os.path.join(out, "rsim.png"))
  clock.line(f"results: {path} ({len(results['rows'])} rows, {results['wall_s']} s)")
  return results


def _card() -> dict[str, Any]:
  import jax

  devices = jax.devices()
  return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices)}


def _number_type(kind: type, what: str, *, low: float = 0.0, high: float = math.inf, low_ok: bool = False) -> Any:
  """An argparse type: a finite `kind` above `low` (or at it, `low_ok`) and at most `high`."""

  def parse(text: str) -> Any:
    try:
      value = kind(text)
    except ValueError:
      value = None
    if value is None or not math.isfinite(value) or not (low <= value if low_ok else low < value) or value > high:
      raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value

  return parse


SECONDS = _number_type(float, "a number of seconds above 0")
COUNT = _number_type(int, "a whole number above 0")
FRACTION = _number_type(float, "a fraction of the card's memory above 0 and at most 1", high=1.0)
# The variables the children's JAX reads and this command sets unless the user did (`_env`): a bad value would
# fail every child, and this process at its first jax call.
MEMORY_FRACTION_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
CHECKED_VARIABLES = {  # name: (type, an example)
    "BUDGET_S": (SECONDS, "450"), "PARALLEL": (COUNT, "3"),
    **{name: (FRACTION, "0.7") for name in MEMORY_FRACTION_VARIABLES},
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": (_number_type(float, "a number of seconds", low_ok=True), "0"),
}


def environment_value(name: str) -> Any:
  """The checked value of the environment variable `name` (CHECKED_VARIABLES), None when unset or empty;
  UserError naming it when it is not what it should be."""
  text = os.environ.get(name, "")
  if not text.strip():
    return None
  kind, example = CHECKED_VARIABLES[name]
  try:
    return kind(text.strip())
  except argparse.ArgumentTypeError as e:
    raise UserError(f"the environment variable {name}: {e}; set it like {name}={example}, or unset it") from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  """The flags, with the environment's OUT, WORK, BUDGET_S and PARALLEL for those not given, every value checked
  (UserError naming the variable) before any work; `args.settings`: how --out and --work were named."""
  parser = ArgumentParser(prog="xalign gpu_run", description=__doc__.splitlines()[0])
  parser.add_argument("bundle", help="the bundle folder (`xalign gpu_bundle --output`)")
  parser.add_argument("--out", help="where results go (default $OUT, else ./gpu_out)")
  parser.add_argument("--budget_s", type=SECONDS,
                      help="seconds for training + scoring (default $BUDGET_S, else the grid's)")
  parser.add_argument("--parallel", type=COUNT, help="experiments training at once on the card (default $PARALLEL, "
                      "else 3)")
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
    args.budget_s = environment_value("BUDGET_S")
  if args.parallel is None:
    args.parallel = environment_value("PARALLEL") or 3
  for name in CHECKED_VARIABLES:
    environment_value(name)
  if all(os.environ.get(name) for name in MEMORY_FRACTION_VARIABLES):
    raise UserError(f"both {' and '.join(MEMORY_FRACTION_VARIABLES)} are set, which jax refuses; unset "
                    f"{MEMORY_FRACTION_VARIABLES[0]} (the older name)")
  try:
    args.launcher = shlex.split(args.launcher)
  except ValueError as e:
    raise UserError(f"--launcher={args.launcher!r} is not a command line ({e}); quote it like a shell line") from None
  if args.launcher and shutil.which(args.launcher[0]) is None:
    raise UserError(f"--launcher's command {args.launcher[0]!r} is not found; name a program on PATH")
  return args


def _work(args: argparse.Namespace) -> None:
  if args.score:
    score_main(args.bundle, args.score, [m for m in args.metrics.split(",") if m])
    return
  results = run_grid(args.bundle, out=args.out, budget_s=args.budget_s, parallel=args.parallel, work=args.work,
                     smoke=args.smoke, launcher=args.launcher, settings=args.settings)
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

  return common.main_of(parse_args, _work, argv)


if __name__ == "__main__":
  sys.exit(main())
