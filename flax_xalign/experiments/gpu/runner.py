"""Runs a GPU bundle on the host (`xalign gpu_run`): trains every row the bundle lists, scores it, writes one
results JSON. Needs no TensorFlow, seqio or network: the data are the bundle's packed caches and suite files,
the start weights and gin files its own; it runs what the Bundle says (`bundle.read_bundle`), not a grid.

1. The start weights go to WORK/start (`start.start_weights`), the bundle's gin files to WORK/gin.
2. The warm-up (MLM head only, the encoder frozen) trains alone; its measured steps/s sizes every family's
   steps (`GridRun.plan`, `grids.plan_steps` over the bundle's families) so the rows fit the budget, and the
   start model is scored beside it.
3. The rows run `python -m flax_xalign.train`, `parallel` at a time on the one card, each followed by its
   scoring (a process of its own, `score_run`) beside the next rows' training (`GridRun.train_rows`,
   `GridRun.score_row`). A row still training when its family's time is spent gets SIGTERM: it saves its
   step and is scored there (the row says `stopped_early` and the steps it reached).
4. OUT/results.json (`results`), OUT/rsim.png, OUT/failed_rows.log when a row failed.

SIGTERM, SIGINT or SIGHUP to the driver stops every child (`children.Children`) and writes results.json of
what was done, with `stopped_by`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import lzma
import math
import os
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu.bundle import SUITE_DIR, Bundle, Row, read_bundle
from flax_xalign.experiments.gpu.children import SCORE_FILE, Children, RowRun
from flax_xalign.experiments.gpu.results import (FAILED_LOG_LINES, FAILED_LOGS, RESULTS_FILE, Clock, last_step,
                                                 log_tail, mark_stopped, measured_rates, plot_rsim, write_results)
from flax_xalign.experiments.gpu.start import reusable_start, start_weights

SMOKE_BINDINGS = ("BATCH_SIZE = 2",)
SCORE_SHARE = 0.3  # of the budget kept after the last training deadline for the last rows' scoring
WARMUP_SPEEDUP = 3.0
TRAIN_MEMORY, SCORE_MEMORY = 0.7, 0.2  # of the card: all trainers together, all scorers together
# A row started after its family's deadline still trains this long: it saves at SIGTERM, but only once its
# first step is compiled and run (an MLM row's start and compile took about 30 s on the H200).
MIN_TRAIN_S = 60.0
GIN_DIR = "gin"  # In WORK: the bundle's gin files, first on the trainers' gin search path.

OUT_ENTRIES = (RESULTS_FILE, FAILED_LOGS, "rsim.png")
# What a work folder holds: this command's runs, logs, start and gin files, the JAX cache run.sh puts there, and
# what gpu_bundle leaves in the host work folder it made (the default --work on the builder's machine): its mark
# (fileio.MARK, added in `check_places`) and, from older builds, the tiny grid's start.
WORK_ENTRIES = ("start", "start.partial", "runs", "logs", "jax_cache", "tiny_start", GIN_DIR)

# ---------------------------------------------------------------------------- the host's settings


def number_type(kind: type, what: str, *, low: float = 0.0, high: float = math.inf, low_ok: bool = False) -> Any:
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


SECONDS = number_type(float, "a number of seconds above 0")
COUNT = number_type(int, "a whole number above 0")
FRACTION = number_type(float, "a fraction of the card's memory above 0 and at most 1", high=1.0)
# The variables the children's JAX reads and the runner sets unless the user did (`child_env`): a bad value would
# fail every child, and the driver at its first jax call.
MEMORY_FRACTION_VARIABLES = ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION")
CHECKED_VARIABLES = {  # name: (type, an example)
    "BUDGET_S": (SECONDS, "450"), "PARALLEL": (COUNT, "3"),
    **{name: (FRACTION, "0.7") for name in MEMORY_FRACTION_VARIABLES},
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": (number_type(float, "a number of seconds", low_ok=True), "0"),
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


def check_environment() -> None:
  """Every variable of CHECKED_VARIABLES checked (UserError naming it), and not both memory fractions set."""
  for name in CHECKED_VARIABLES:
    environment_value(name)
  if all(os.environ.get(name) for name in MEMORY_FRACTION_VARIABLES):
    raise UserError(f"both {' and '.join(MEMORY_FRACTION_VARIABLES)} are set, which jax refuses; unset "
                    f"{MEMORY_FRACTION_VARIABLES[0]} (the older name)")


def child_env(memory_fraction: float | None = None) -> dict[str, str]:
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


# ---------------------------------------------------------------------------- one row's trainer and scorer


def train_flags(bundle_dir: str, bundle: Bundle, row: Row, *, model_dir: str, init_dir: str, start_dir: str,
                steps: int, extra: Sequence[str] = (), cached: bool = True, gin_dir: str = "") -> list[str]:
  """The `python -m flax_xalign.train` flags of one row (its family's shape, cache and schedule): the
  architecture is the start weights' (START/model.gin), the parameters `init_dir`'s latest step.

  `cached`: the data are the bundle's packed cache (False: the task, registered by a tasks gin file the caller
  adds, as for an assets build); `gin_dir`: a folder searched first for the gin files (the bundle's own)."""
  family = bundle.family(row.family)
  cache = bundle.caches[family.cache]
  flags = ["--gin_file=runs/pretrain.gin", f"--gin_file={os.path.join(start_dir, 'model.gin')}"]
  flags += [f"--gin_file={f}" for f in row.gin_files]
  bindings = [
      f"MODEL_DIR = '{model_dir}'", f"MIXTURE_OR_TASK_NAME = '{cache.task}'",
      *([f"train.data = 'cache:{os.path.join(bundle_dir, cache.path)}'"] if cached else []),
      # Through the macro objectives/xlm_align.gin reads (and requires).
      f"INIT_FROM_CHECKPOINT = '{init_dir}'", "train.init_from_checkpoint = %INIT_FROM_CHECKPOINT",
      f"TASK_FEATURE_LENGTHS = {{'tokens': {cache.length}}}", f"BATCH_SIZE = {family.batch_size}",
      f"TRAIN_STEPS = {steps}", f"CHECKPOINT_EVERY = {steps}", f"LOG_EVERY = {max(1, min(50, steps // 10))}",
      f"EVAL_EVERY = {steps if cache.eval_rows else 0}", "train.eval_batches = 4",
      *bundle.common_bindings, *family.bindings, *row.bindings, *extra]
  flags += [f"--gin.{b.replace(' = ', '=', 1)}" for b in bindings]
  return flags + ([f"--gin_search_paths={gin_dir}"] if gin_dir else [])


def write_gin_files(bundle: Bundle, folder: str) -> str:
  """The bundle's gin files (`Bundle.gin`) under `folder`, replaced whole; `folder`."""
  shutil.rmtree(folder, ignore_errors=True)
  for name, text in bundle.gin.items():
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
  return folder


def copy_assets(bundle_dir: str, assets: str, model_dir: str) -> list[str]:
  """A row's prebuilt asset files (lang_vocab, cooc: built where seqio is), the bundle's assets/ASSETS, into
  its new MODEL_DIR; `assets` "": none."""
  source = os.path.join(bundle_dir, "assets", assets) if assets else None
  if not source or not os.path.isdir(source):
    return []
  os.makedirs(model_dir, exist_ok=True)
  copied = []
  for name in sorted(os.listdir(source)):
    target = os.path.join(model_dir, name[:-3] if name.endswith(".xz") else name)
    if os.path.exists(target):
      continue
    if name.endswith(".xz"):  # Carried xz-compressed (builder.write_assets); the run reads the file itself.
      with lzma.open(os.path.join(source, name), "rb") as src, open(target + ".partial", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
      os.replace(target + ".partial", target)
    else:
      shutil.copy2(os.path.join(source, name), target)
    copied.append(os.path.basename(target))
  return copied


def score_run(bundle_dir: str, model_dir: str, metrics: Sequence[str]) -> None:
  """Scores the latest step of MODEL_DIR on the bundle's suite; writes MODEL_DIR/scores.json (the scorer)."""
  from flax_xalign.evaluation.offline.scoring import score
  from flax_xalign.fileio import write_atomically
  from flax_xalign.runs import Run

  run = Run.open(model_dir)
  print(f"scoring {model_dir} step {run.step}: {', '.join(metrics)}", flush=True)
  result = score(run, os.path.join(bundle_dir, SUITE_DIR), metrics=list(metrics),
                 progress=lambda line: print(line, flush=True))
  write_atomically(os.path.join(model_dir, SCORE_FILE), json.dumps(result, indent=1, sort_keys=True))


def run_order(rows: Sequence[Any]) -> list[Any]:
  """The order rows (`bundle.Row`s, or anything with `family` and `seed`) start in: seed 0 of every family
  before any later seed, and within a seed the families with fewer rows first (a stable sort, so the bundle's
  order otherwise). When the card is slower than planned, the deadline then cuts second seeds, not the only
  SO run."""
  sizes: dict[str, int] = {}
  for row in rows:
    sizes[row.family] = sizes.get(row.family, 0) + 1
  return sorted(rows, key=lambda row: (row.seed, sizes[row.family]))


# ---------------------------------------------------------------------------- the checks before any work


def check_places(bundle_dir: str, out: str, work: str, *, settings: tuple[str, str] = ("--out", "--work")
                 ) -> tuple[str, str]:
  """(--out, --work) as absolute paths, checked before anything is made (UserError): apart from the bundle and
  from each other (none is, holds or lies inside another), each new, empty or of gpu_run's own kind."""
  from flax_xalign.experiments.gpu.folders import nesting
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


@dataclasses.dataclass(frozen=True)
class HostRun:
  """A run of a bundle, every part checked (`check_run`): what `run_grid` runs."""

  bundle_dir: str
  bundle: Bundle
  out: str
  work: str
  budget_s: float
  parallel: int = 3
  smoke: bool = False             # every row trains 1 step of 2 rows, nothing is scored
  launcher: tuple[str, ...] = ()  # the command every child runs under


def check_run(bundle_dir: str, *, out: str, work: str | None, budget_s: float | None, parallel: int = 3,
              smoke: bool = False, launcher: Sequence[str] = (), settings: tuple[str, str] = ("--out", "--work")
              ) -> HostRun:
  """The run of the bundle at `bundle_dir`, everything checked before anything is made (UserError); `work`
  None: the bundle's, `budget_s` None: the bundle's; `settings`: how the user named --out and --work."""
  bundle = read_bundle(bundle_dir)
  out, work = check_places(bundle_dir, out, os.path.abspath(work or bundle.work), settings=settings)
  earlier = os.path.join(work, "runs")
  if os.path.isdir(earlier) and os.listdir(earlier):  # Its rows would resume from them, not train.
    raise UserError(f"the work folder {work} holds the runs of an earlier gpu_run ({earlier}); its rows would "
                    f"resume from them instead of training. Remove {earlier} or choose another --work.")
  reusable_start(bundle_dir, bundle, work)  # (refuses another bundle's start)
  if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
    raise UserError(f"the budget {budget_s!r} is not a number of seconds above 0; pass --budget_s=SECONDS")
  if parallel < 1:
    raise UserError(f"--parallel={parallel}: run at least 1 experiment at a time")
  return HostRun(bundle_dir=bundle_dir, bundle=bundle, out=out, work=work, parallel=parallel, smoke=smoke,
                 budget_s=float(budget_s if budget_s is not None else bundle.budget_s), launcher=tuple(launcher))


# ---------------------------------------------------------------------------- the grid


def run_grid(run: HostRun) -> dict[str, Any]:
  """The bundle's rows on this host (module docstring); results (also OUT/results.json).

  A SIGTERM, SIGINT or SIGHUP stops every child (`Children`) and returns results with `stopped_by` set to the
  signal's name and each unfinished row marked (`mark_stopped`)."""
  # This process only reads the card's name and imports the start weights: XLA's default would reserve 75%
  # of the card here at the first jax call, before any row starts (the first science run's out-of-memory).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  grid = GridRun(run)
  with grid.children.on_signals():
    try:
      grid.flow()
    except _Stop:
      pass
    finally:  # On an error or a signal: no child outlives the driver, and no thread the interpreter.
      grid.children.close()
      grid.join()
  return grid.finish()


class _Stop(Exception):
  """The driver is stopping (a signal): the grid's flow ends, `run_grid` writes what was done."""


class GridRun:
  """The state of one run of the grid: its rows, children, threads, clock and results."""

  def __init__(self, run: HostRun):
    self.run, self.bundle = run, run.bundle
    self.clock = Clock(run.budget_s)
    # The card is split between `parallel` trainers and `score_slots` scorers (the start row's included).
    score_slots = max(1, run.parallel // 2)
    self.env = child_env(TRAIN_MEMORY / run.parallel)
    self.score_env = child_env(SCORE_MEMORY / score_slots)
    self.scoring = threading.Semaphore(score_slots)
    self.results: dict[str, Any] = {
        "grid": self.bundle.grid, "bundle": {"created": self.bundle.created, "bytes": self.bundle.bytes,
                                             "parts": dict(self.bundle.parts)},
        "card": None, "budget_s": run.budget_s, "parallel": run.parallel,
        "alignment_peers": self.bundle.alignment_peers, "rows": []}
    self.children = Children(run.launcher)
    start = Row(name="start", family="start", objective="start", gin_files=(), bindings=(), start="start", seed=0,
                cost=0.0, metrics=self.bundle.metrics(), assets="")
    self.start_row = RowRun(start, work=run.work, children=self.children)
    self.start_row.row.update(steps_planned=0, steps_done=0, tokens_seen=0, train_s=0.0, stopped_early=False)
    self.warm = RowRun(self.bundle.warmup, work=run.work, children=self.children)
    self.rows = [RowRun(e, work=run.work, children=self.children) for e in self.bundle.experiments]
    self.every_row = [self.start_row, self.warm, *self.rows]
    self.threads: list[threading.Thread] = []  # Every thread started, joined before the end, whatever ends it.
    self.lock = threading.Lock()
    self.extra = SMOKE_BINDINGS if run.smoke else ()
    self.start_dir = ""
    self.gin_dir = os.path.join(run.work, GIN_DIR)

  def log(self, name: str) -> str:
    return os.path.join(self.run.work, "logs", f"{name}.log")

  def start_thread(self, target: Any, *args: Any) -> None:
    self.threads.append(threading.Thread(target=target, args=args))
    self.threads[-1].start()

  def join(self) -> None:
    while self.threads:  # (the start row's scoring, the workers and the scorers they start)
      self.threads.pop(0).join()

  def flow(self) -> None:
    """Start weights, the warm-up beside the start row's scoring, the plan, the rows."""
    run = self.run
    os.makedirs(run.out, exist_ok=True)
    os.makedirs(os.path.join(run.work, "logs"), exist_ok=True)
    for row in self.every_row:  # A log holds this call's lines only (failed_rows.log copies its end).
      with contextlib.suppress(FileNotFoundError):
        os.remove(self.log(row.name))
    self.results["card"] = _card()
    self.clock.line(f"grid {self.bundle.grid}: {len(self.bundle.all_experiments())} experiments, budget "
                    f"{run.budget_s:.0f} s, {run.parallel} at a time")
    write_gin_files(self.bundle, self.gin_dir)
    self.start_dir = start_weights(run.bundle_dir, self.bundle, run.work)
    if self.children.stopping:
      raise _Stop
    self.clock.line(f"start weights ready in {self.start_dir}")
    # The start row is scored while the warm-up trains.
    self.start_row.model_dir = self.start_dir
    if run.smoke:
      self.start_row.row.update(score_s=0.0, scores={"smoke": "not scored"})
    else:
      self.start_thread(self.score_start)
    plan = self.plan(self.train_warmup())
    self.train_rows(plan)
    self.join()

  def score_start(self) -> None:
    with self.scoring:
      self.start_row.score(self.run.bundle_dir, self.bundle.metrics(), log=self.log("start"), env=self.score_env)

  def train_warmup(self) -> dict[str, float]:
    """Trains the warm-up alone; its measured rates (`results.measured_rates`)."""
    run, warm = self.run, self.warm
    warm_steps = 1 if run.smoke else self.bundle.warmup_steps
    copy_assets(run.bundle_dir, warm.spec.assets, warm.model_dir)
    code = warm.train(train_flags(run.bundle_dir, self.bundle, warm.spec, model_dir=warm.model_dir,
                                  init_dir=self.start_dir, start_dir=self.start_dir, steps=warm_steps,
                                  extra=self.extra, gin_dir=self.gin_dir),
                      deadline=self.clock.start + (run.budget_s if run.smoke else 0.2 * run.budget_s),
                      log=self.log("warmup"), env=self.env)
    warm.row.update(steps_planned=warm_steps, steps_done=last_step(warm.model_dir))
    if self.children.stopping:
      raise _Stop
    if code != 0 or not warm.row["steps_done"]:
      raise UserError(f"the warm-up failed (exit {code}: {log_tail(self.log('warmup'))}); its log: "
                      f"{self.log('warmup')}")
    rates = measured_rates(warm.model_dir)
    warm.row.update(tokens_seen=round(rates.get("tokens_per_step", 0) * warm.row["steps_done"]), score_s=0.0,
                    scores={"note": "not scored: the encoder is e5's (frozen), the start row scores it"})
    self.clock.line(f"warm-up: {warm.row['steps_done']} steps in {warm.row['train_s']} s, "
                    f"{rates.get('steps_per_s', 0):.2f} steps/s")
    return rates

  def plan(self, rates: dict[str, float]) -> dict[str, dict]:
    """Each family's steps, from the warm-up's rate and the budget left (`grids.plan_steps`); in results."""
    from flax_xalign.experiments.gpu.grids import plan_steps

    run = self.run
    # The start row is not waited for: its scoring compiles every evaluation shape cold (239 s on an H200 in
    # the first science run, where planning after it left the rows no time), and it goes on beside the rows.
    remaining = run.budget_s - self.clock.elapsed()
    score_reserve = SCORE_SHARE * run.budget_s
    # The warm-up trains the head alone (no backward pass through the encoder): a full step costs about
    # WARMUP_SPEEDUP of its steps (forward + backward ~ 3 forwards).
    plan = plan_steps(self.bundle, warmup_steps_per_s=max(rates.get("steps_per_s", 0.0), 1e-6) / WARMUP_SPEEDUP,
                      train_budget_s=max(remaining - score_reserve, 1.0) * run.parallel, safety=0.8)
    self.results["calibration"] = {"warmup_steps_per_s": rates.get("steps_per_s"), "score_reserve_s": score_reserve}
    if run.smoke:
      plan = {name: {**p, "steps": 1, "capped": "smoke"} for name, p in plan.items()}
    self.results["plan"] = plan
    self.clock.line("plan: " + ", ".join(f"{f} {p['steps']} steps" + (f" ({p['capped']})" if p["capped"] else "")
                                         for f, p in plan.items()))
    return plan

  def train_rows(self, plan: dict[str, dict]) -> None:
    """The rows, `parallel` trainers at a time in the order `run_order` gives; each scored as it ends."""
    run = self.run
    # (A smoke run has no deadline: it is slow on a CPU and checks that every row starts, not the budget.)
    deadline = float("inf") if run.smoke else self.clock.start + run.budget_s - SCORE_SHARE * run.budget_s
    total_work = sum(plan[r.spec.family]["steps"] * r.spec.cost for r in self.rows)
    done_work = [0.0]
    order = [spec.name for spec in run_order([r.spec for r in self.rows])]
    queue = sorted(self.rows, key=lambda r: order.index(r.name))

    def worker() -> None:
      while not self.children.stopping:
        with self.lock:
          if not queue:
            return
          row = queue.pop(0)
        steps = plan[row.spec.family]["steps"]
        init = self.start_dir if row.spec.start == "start" else os.path.join(run.work, "runs", row.spec.start)
        copy_assets(run.bundle_dir, row.spec.assets, row.model_dir)
        self.clock.line(f"{row.name}: training {steps} steps", done=done_work[0], total=total_work)
        # A row late in the queue still gets MIN_TRAIN_S: SIGTERM before the trainer's first save loses the row.
        code = row.train(train_flags(run.bundle_dir, self.bundle, row.spec, model_dir=row.model_dir, init_dir=init,
                                     start_dir=self.start_dir, steps=steps, extra=self.extra, gin_dir=self.gin_dir),
                         deadline=max(deadline, time.monotonic() + MIN_TRAIN_S), log=self.log(row.name),
                         env=self.env)
        if code is None:  # Stopping: the row never started.
          return
        reached = last_step(row.model_dir)
        rate = measured_rates(row.model_dir)
        row.row.update(steps_planned=steps, steps_done=reached,
                       tokens_seen=round(rate.get("tokens_per_step", 0) * reached), train_exit=code,
                       steps_per_s=rate.get("steps_per_s"))
        with self.lock:
          done_work[0] += steps * row.spec.cost
        if self.children.stopping:  # (stopped by the driver's signal: neither a failure nor scored; mark_stopped)
          return
        if not reached:
          row.row.update(score_s=0.0, scores={"error": f"training failed (exit {code}: "
                                                       f"{log_tail(self.log(row.name))})"})
          self.clock.line(f"{row.name}: training FAILED (exit {code}); log {self.log(row.name)}")
          continue
        self.clock.line(f"{row.name}: {reached}/{steps} steps in {row.row['train_s']} s"
                        + (" (stopped at its deadline)" if row.row["stopped_early"] else "")
                        + ("" if run.smoke else "; scoring"), done=done_work[0], total=total_work)
        if run.smoke:
          row.row.update(score_s=0.0, scores={"smoke": "not scored"})
          continue
        # Scored beside the next rows' training: the training slots stay full, so the rows of a family train
        # back to back and reach the same planned steps.
        self.start_thread(self.score_row, row)

    for _ in range(run.parallel):
      self.start_thread(worker)

  def score_row(self, row: RowRun) -> None:
    """Scores a trained row (a process of its own, at most `score_slots` at once); results.json rewritten."""
    with self.scoring:
      code = row.score(self.run.bundle_dir, row.spec.metrics, log=self.log(row.name), env=self.score_env)
    if self.children.stopping:
      return
    if code != 0 or "scores" not in row.row:
      row.row["scores"] = {"error": f"scoring failed (exit {code}: {log_tail(self.log(row.name))})"}
    self.clock.line(f"{row.name}: scored in {row.row['score_s']} s" + ("" if code == 0 else f" FAILED (exit {code})"))
    with self.lock:  # A call cut short still brings back every row scored so far.
      write_results(self.results, self.every_row, self.run.out, self.clock, partial=True)

  def finish(self) -> dict[str, Any]:
    """OUT/results.json (every row; after a stop, `stopped_by`), failed rows' logs and the RSIM plot."""
    results, out = self.results, self.run.out
    if self.children.stopped_by is not None:
      mark_stopped(self.every_row, signal.Signals(self.children.stopped_by).name)
      results["stopped_by"] = signal.Signals(self.children.stopped_by).name
      write_results(results, self.every_row, out, self.clock)
      return results
    path = write_results(results, self.every_row, out, self.clock)
    failed = [r["name"] for r in results["rows"] if (r.get("scores") or {}).get("error")]
    if failed:  # One file (a device call brings back few): the end of each failed row's log.
      with open(os.path.join(out, FAILED_LOGS), "w", encoding="utf-8") as f:
        for name in failed:
          f.write(f"==== {name} ({self.log(name)}), last {FAILED_LOG_LINES} lines\n"
                  f"{log_tail(self.log(name), FAILED_LOG_LINES)}\n")
    plot_rsim(results, os.path.join(out, "rsim.png"))
    self.clock.line(f"results: {path} ({len(results['rows'])} rows, {results['wall_s']} s)")
    return results


def _card() -> dict[str, Any]:
  import jax

  devices = jax.devices()
  return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices)}
