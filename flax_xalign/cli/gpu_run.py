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

Progress lines carry the elapsed time and an ETA.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.errors import ArgumentParser, UserError

BUNDLE_FILE = "bundle.json"
SCORE_FILE = "scores.json"
SUITE_DIR = "suite"  # The bundle's evaluation suite (`evaluation.offline.suite.write_suite`).
RESULTS_FILE = "results.json"
FAILED_LOGS = "failed_rows.log"
FAILED_LOG_LINES = 60
# What a scored row must hold; `check_results` refuses a results file with one of these missing or empty.
ROW_FIELDS = ("name", "family", "objective", "seed", "steps_planned", "steps_done", "tokens_seen", "train_s",
              "score_s", "stopped_early", "scores")


class Clock:
  """Elapsed seconds and an ETA from the work planned and done so far."""

  def __init__(self, budget_s: float):
    self.start = time.monotonic()
    self.budget_s = budget_s
    self._lock = threading.Lock()

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def line(self, text: str, *, done: float | None = None, total: float | None = None) -> None:
    eta = ""
    if done is not None and total:
      rate = done / max(self.elapsed(), 1e-9)
      eta = f", ETA {max(0.0, (total - done) / rate):.0f} s" if rate > 0 else ""
    with self._lock:  # Workers print from threads: one whole line at a time.
      sys.stdout.write(f"[{self.elapsed():6.0f} s / {self.budget_s:.0f} s budget{eta}] {text}\n")
      sys.stdout.flush()


# ---------------------------------------------------------------------------- the bundle


def read_bundle(path: str) -> dict[str, Any]:
  """bundle.json of the bundle at `path`, every file it lists checked for presence and size (UserError)."""
  manifest_path = os.path.join(path, BUNDLE_FILE)
  if not os.path.isfile(manifest_path):
    raise UserError(f"{path} is not a GPU bundle (no {BUNDLE_FILE}); make one with "
                    "`xalign gpu_bundle --grid=NAME --output=DIR`")
  with open(manifest_path, encoding="utf-8") as f:
    bundle = json.load(f)
  for rel, size in bundle["files"].items():
    full = os.path.join(path, rel)
    if not os.path.isfile(full) or os.path.getsize(full) != size:
      have = os.path.getsize(full) if os.path.isfile(full) else "missing"
      raise UserError(f"bundle file {rel} is damaged ({have} bytes, the bundle wrote {size}); "
                      "carry the whole bundle again")
  return bundle


def _python() -> list[str]:
  return [sys.executable]


def _env(bundle_dir: str, memory_fraction: float | None = None) -> dict[str, str]:
  """The children's environment; `memory_fraction`: the card's share each child may grow to (unless the
  user set XLA_PYTHON_CLIENT_MEM_FRACTION). Without a cap, ten processes that each keep their peak ran an
  H200 out of memory (8 of 14 rows lost in the first science run)."""
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if memory_fraction is not None:
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{memory_fraction:.3f}")
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


# ---------------------------------------------------------------------------- one experiment


def _metrics(model_dir: str) -> list[dict[str, Any]]:
  path = os.path.join(model_dir, "metrics.jsonl")
  if not os.path.isfile(path):
    return []
  rows = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        pass
  return rows


def measured_rates(model_dir: str) -> dict[str, float]:
  """Steps/s and tokens per step of a finished run, from metrics.jsonl (the first interval, with the
  compile, left out when there are others)."""
  rows = [r for r in _metrics(model_dir) if "steps_per_sec" in r]
  timed = rows[1:] if len(rows) > 1 else rows
  if not timed:
    return {}
  steps_per_s = sorted(r["steps_per_sec"] for r in timed)[len(timed) // 2]
  tokens_per_step = sum(r["tokens_per_sec"] / r["steps_per_sec"] for r in timed) / len(timed)
  return {"steps_per_s": steps_per_s, "tokens_per_step": tokens_per_step}


def _tail(path: str, lines: int = 1) -> str:
  """The last non-empty line(s) of a log (what a failed child said last)."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      kept = [line.rstrip() for line in f if line.strip()]
  except OSError:
    return "no log"
  if not kept:
    return "empty log"
  return kept[-1].strip()[:300] if lines == 1 else "\n".join(kept[-lines:])


def _last_step(model_dir: str) -> int:
  from flax_xalign.runs.checkpoints import find_latest_step

  return find_latest_step(model_dir) or 0


class Experiment:
  """One row: train (SIGTERM at its deadline), then score in a process of its own."""

  def __init__(self, spec: Mapping[str, Any], *, work: str):
    self.spec = spec
    self.name = spec["name"]
    self.model_dir = os.path.join(work, "runs", self.name)
    self.row: dict[str, Any] = {"name": self.name, "family": spec["family"], "objective": spec["objective"],
                                "seed": spec.get("seed", 0), "start": spec["start"]}

  def train(self, argv: Sequence[str], *, deadline: float, log: str, env: Mapping[str, str]) -> int:
    """Runs the trainer; at `deadline` (time.monotonic) it gets SIGTERM and saves. Returns its exit status."""
    start = time.monotonic()
    with open(log, "a", encoding="utf-8") as out:
      child = subprocess.Popen([*_python(), "-m", "flax_xalign.train", *argv], stdout=out,
                               stderr=subprocess.STDOUT, env=dict(env))
      stopped = False
      while child.poll() is None:
        if not stopped and time.monotonic() > deadline:
          child.send_signal(signal.SIGTERM)
          stopped = True
        time.sleep(0.5)
    self.row["train_s"] = round(time.monotonic() - start, 1)
    self.row["stopped_early"] = stopped
    return child.returncode

  def score(self, bundle_dir: str, metrics: Sequence[str], *, log: str, env: Mapping[str, str]) -> int:
    start = time.monotonic()
    with open(log, "a", encoding="utf-8") as out:
      code = subprocess.call([*_python(), "-m", "flax_xalign.cli.gpu_run", bundle_dir, "--score", self.model_dir,
                              f"--metrics={','.join(metrics)}"], stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    self.row["score_s"] = round(time.monotonic() - start, 1)
    path = os.path.join(self.model_dir, SCORE_FILE)
    if code == 0 and os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        self.row["scores"] = json.load(f)
    return code


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


def make_start(source: str, kind: str, target: str) -> None:
  """The MODEL_DIR `target` from the bundle's start weights at `source` (a folder or e5's trimmed source)."""
  scratch = target.rstrip("/") + ".partial"
  shutil.rmtree(scratch, ignore_errors=True)
  if kind == "model_dir":
    shutil.copytree(source, scratch)
  elif kind == "e5_q4":
    from flax_xalign.interop import e5_trimmed

    e5_trimmed.import_trimmed_source(source, scratch)
  else:
    raise UserError(f"bundle start kind {kind!r} is unknown to this checkout; rebuild the bundle")
  os.replace(scratch, target)


def start_weights(bundle_dir: str, bundle: Mapping[str, Any], work: str) -> str:
  """WORK/start: the bundle's start weights as a MODEL_DIR (made once; reused when already there)."""
  target = os.path.join(work, "start")
  if not os.path.isdir(os.path.join(target, "checkpoints")):
    os.makedirs(work, exist_ok=True)
    make_start(os.path.join(bundle_dir, bundle["start"]["path"]), bundle["start"]["kind"], target)
  return target


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


def run_grid(bundle_dir: str, *, out: str, budget_s: float | None, parallel: int, work: str | None,
             smoke: bool = False) -> dict[str, Any]:
  """The grid (module docstring). `smoke`: every row trains 1 step of 2 rows and nothing is scored: a check,
  on any machine, that every row's data, assets and settings load and compile where TensorFlow is absent."""
  from flax_xalign.cli.experiments import gpu_grids
  from flax_xalign.fileio import check_output_folder

  # This process only reads the card's name and imports the start weights: XLA's default would reserve 75%
  # of the card here at the first jax call, before any row starts (the first science run's out-of-memory).
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

  # --out: new, empty or an earlier results folder (results.json is replaced), never in the bundle it reads.
  out = check_output_folder(out, setting="--out", inputs={"bundle": bundle_dir},
                            owned=lambda f: set(os.listdir(f)) <= {RESULTS_FILE, FAILED_LOGS, "rsim.png"},
                            what="a gpu_run results folder (results.json, rsim.png, failed_rows.log)")
  bundle = read_bundle(bundle_dir)
  grid = gpu_grids.grid_named(bundle["grid"])
  work = os.path.abspath(work or bundle["work"])
  earlier = os.path.join(work, "runs")
  if os.path.isdir(earlier) and os.listdir(earlier):  # Its rows would resume from them, not train.
    raise UserError(f"the work folder {work} holds the runs of an earlier gpu_run ({earlier}); its rows would "
                    f"resume from them instead of training. Remove {earlier} (nothing else is read from it) "
                    "or choose another --work.")
  budget = float(budget_s if budget_s is not None else bundle["budget_s"])
  clock = Clock(budget)
  os.makedirs(out, exist_ok=True)
  os.makedirs(os.path.join(work, "logs"), exist_ok=True)
  # The card is split between `parallel` trainers and `score_slots` scorers (the start row's included).
  score_slots = max(1, parallel // 2)
  env = _env(bundle_dir, TRAIN_MEMORY / parallel)
  score_env = _env(bundle_dir, SCORE_MEMORY / score_slots)
  scoring = threading.Semaphore(score_slots)
  results: dict[str, Any] = {"grid": grid.name, "bundle": {k: bundle[k] for k in ("created", "bytes", "parts")},
                             "card": _card(), "budget_s": budget, "parallel": parallel,
                             "alignment_peers": bundle.get("alignment_peers"), "rows": []}
  experiments = {e["name"]: e for e in bundle["experiments"]}
  log = lambda name: os.path.join(work, "logs", f"{name}.log")  # noqa: E731

  clock.line(f"grid {grid.name}: {len(experiments)} experiments, budget {budget:.0f} s, {parallel} at a time")
  start_dir = start_weights(bundle_dir, bundle, work)
  clock.line(f"start weights ready in {start_dir}")

  # The start row is scored while the warm-up trains.
  start_row = Experiment({"name": "start", "family": "start", "objective": "start", "start": "start"}, work=work)
  start_row.model_dir = start_dir
  start_row.row.update(steps_planned=0, steps_done=0, tokens_seen=0, train_s=0.0, stopped_early=False)

  def score_start() -> None:
    with scoring:
      start_row.score(bundle_dir, grid.metrics(), log=log("start"), env=score_env)

  start_thread = threading.Thread(target=score_start)
  if smoke:
    start_row.row.update(score_s=0.0, scores={"smoke": "not scored"})
  else:
    start_thread.start()
  extra = SMOKE_BINDINGS if smoke else ()

  warm = Experiment(experiments["warmup"], work=work)
  warm_spec = experiments["warmup"]
  warm_steps = 1 if smoke else grid.warmup_steps
  copy_assets(bundle_dir, warm_spec, warm.model_dir)
  code = warm.train(train_argv(bundle_dir, bundle, {**warm_spec, "family": grid.families[0].name},
                               model_dir=warm.model_dir, init_dir=start_dir, start_dir=start_dir,
                               steps=warm_steps, extra=extra),
                    deadline=clock.start + (budget if smoke else 0.2 * budget), log=log("warmup"), env=env)
  if code != 0 or not _last_step(warm.model_dir):
    raise UserError(f"the warm-up failed (exit {code}: {_tail(log('warmup'))}); its log: {log('warmup')}")
  rates = measured_rates(warm.model_dir)
  warm.row.update(steps_planned=warm_steps, steps_done=_last_step(warm.model_dir),
                  tokens_seen=round(rates.get("tokens_per_step", 0) * _last_step(warm.model_dir)),
                  score_s=0.0, scores={"note": "not scored: the encoder is e5's (frozen), the start row scores it"})
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

  rows = [Experiment(experiments[e.name], work=work) for e in grid.experiments]
  # (A smoke run has no deadline: it is slow on a CPU and checks that every row starts, not the budget.)
  family_deadline = {f.name: float("inf") if smoke else clock.start + budget - score_reserve for f in grid.families}
  total_work = sum(plan[r.spec["family"]]["steps"] * r.spec.get("cost", 1.0) for r in rows)
  done_work = [0.0]
  order = [spec["name"] for spec in run_order([r.spec for r in rows])]
  queue = sorted(rows, key=lambda r: order.index(r.name))
  lock = threading.Lock()

  def worker() -> None:
    while True:
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
      reached = _last_step(row.model_dir)
      rate = measured_rates(row.model_dir)
      row.row.update(steps_planned=steps, steps_done=reached,
                     tokens_seen=round(rate.get("tokens_per_step", 0) * reached), train_exit=code,
                     steps_per_s=rate.get("steps_per_s"))
      with lock:
        done_work[0] += steps * spec.get("cost", 1.0)
      if not reached:
        row.row.update(score_s=0.0, scores={"error": f"training failed (exit {code}: {_tail(log(row.name))})"})
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
      scorers.append(threading.Thread(target=score_row, args=(row,)))
      scorers[-1].start()

  def score_row(row: Experiment) -> None:
    with scoring:
      code = row.score(bundle_dir, row.spec.get("metrics", ()), log=log(row.name), env=score_env)
    if code != 0 or "scores" not in row.row:
      row.row["scores"] = {"error": f"scoring failed (exit {code}: {_tail(log(row.name))})"}
    clock.line(f"{row.name}: scored in {row.row['score_s']} s" + ("" if code == 0 else f" FAILED (exit {code})"))
    with lock:  # A call cut short still brings back every row scored so far.
      write_results(results, [start_row, warm, *rows], out, clock, partial=True)

  scorers: list[threading.Thread] = []
  threads = [threading.Thread(target=worker) for _ in range(max(1, parallel))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  for t in list(scorers):
    t.join()

  if not smoke:
    start_thread.join()
  path = write_results(results, [start_row, warm, *rows], out, clock)
  failed = [r["name"] for r in results["rows"] if (r.get("scores") or {}).get("error")]
  if failed:  # One file (a device call brings back few): the end of each failed row's log.
    with open(os.path.join(out, FAILED_LOGS), "w", encoding="utf-8") as f:
      for name in failed:
        f.write(f"==== {name} ({log(name)}), last {FAILED_LOG_LINES} lines\n{_tail(log(name), FAILED_LOG_LINES)}\n")
  _plot(results, os.path.join(out, "rsim.png"))
  clock.line(f"results: {path} ({len(results['rows'])} rows, {results['wall_s']} s)")
  return results


def write_results(results: dict[str, Any], rows: Sequence["Experiment"], out: str, clock: "Clock", *,
                  partial: bool = False) -> str:
  """OUT/results.json, replaced whole (write_atomically); `partial`: rows still training or scoring are left
  out and the file says so."""
  from flax_xalign.fileio import write_atomically

  kept = [r.row for r in rows if not partial or "scores" in r.row]
  results["rows"] = kept
  results["partial"] = partial
  results["wall_s"] = round(clock.elapsed(), 1)
  path = os.path.join(out, RESULTS_FILE)
  write_atomically(path, json.dumps(results, indent=1, sort_keys=True))
  return path


def _card() -> dict[str, Any]:
  import jax

  devices = jax.devices()
  return {"platform": devices[0].platform, "kind": devices[0].device_kind, "count": len(devices)}


def _plot(results: Mapping[str, Any], path: str) -> str | None:
  """ΔRSIM per layer of each Debian row against the MLM rows of the same seed (mean over languages)."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  curves = {}
  for row in results["rows"]:
    bli = (row.get("scores") or {}).get("bli") or {}
    per_language = [splits["test"]["per_layer"]["rsim"] for splits in bli.values() if "test" in splits]
    if per_language:  # RSIM per layer, averaged over the languages (X -> en test gold).
      curves.setdefault(row["objective"], []).append([sum(v) / len(v) for v in zip(*per_language)])
  if "mlm" not in curves:
    return None
  import numpy as np

  base = np.mean(np.asarray(curves["mlm"], float), axis=0)
  fig, ax = plt.subplots(figsize=(6, 4))
  for objective, rows in sorted(curves.items()):
    if objective != "mlm":
      ax.plot(np.mean(np.asarray(rows, float), axis=0) - base, marker="o", label=objective)
  ax.axhline(0.0, color="grey", lw=0.8)
  ax.set_xlabel("layer")
  ax.set_ylabel("ΔRSIM vs MLM (mean over languages and seeds)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


def check_results(results: Mapping[str, Any]) -> list[str]:
  """What is missing or empty in a results dict (the CPU proof's check); [] when every row is filled."""
  problems = []
  for row in results.get("rows", []):
    for field in ROW_FIELDS:
      if row.get(field) is None or (field == "scores" and not row.get(field)):
        problems.append(f"{row.get('name')}: {field}")
    scores = row.get("scores") or {}
    if scores.get("error"):
      problems.append(f"{row.get('name')}: {scores['error']}")
  return problems


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign gpu_run", description=__doc__.splitlines()[0])
  parser.add_argument("bundle", help="the bundle folder (`xalign gpu_bundle --output`)")
  parser.add_argument("--out", default=os.environ.get("OUT", "gpu_out"), help="where results go (default $OUT)")
  parser.add_argument("--budget_s", type=float, default=float(os.environ["BUDGET_S"]) if os.environ.get("BUDGET_S")
                      else None, help="seconds for training + scoring (default $BUDGET_S, else the grid's)")
  parser.add_argument("--parallel", type=int, default=int(os.environ.get("PARALLEL", "3")),
                      help="experiments training at once on the card (default $PARALLEL, else 3)")
  parser.add_argument("--work", default=os.environ.get("WORK"),
                      help="runs and logs (default $WORK, else the folder the bundle was built for, bundle.json's "
                      "'work': its induced dictionaries name their source there)")
  parser.add_argument("--smoke", action="store_true", help="every row trains 1 step of 2 rows, nothing is scored: "
                      "checks here that the bundle's rows load and compile (minutes on a CPU) before a GPU call")
  parser.add_argument("--score", metavar="MODEL_DIR", help="(internal) score one run and exit")
  parser.add_argument("--metrics", default="", help="(with --score) comma-separated metric families")
  return parser.parse_args(argv)


def _work(args: argparse.Namespace) -> None:
  if args.score:
    score_main(args.bundle, args.score, [m for m in args.metrics.split(",") if m])
    return
  results = run_grid(args.bundle, out=args.out, budget_s=args.budget_s, parallel=args.parallel, work=args.work,
                     smoke=args.smoke)
  problems = check_results(results)
  if problems:
    raise UserError(f"{len(problems)} results are missing ({'; '.join(problems[:6])}); {args.out}/{RESULTS_FILE} "
                    "holds the rest and the failed rows' logs are beside it")


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.cli import common

  return common.main_of(parse_args, _work, argv)


if __name__ == "__main__":
  sys.exit(main())
