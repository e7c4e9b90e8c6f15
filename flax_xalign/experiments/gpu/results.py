"""What the host's runner reports (`xalign gpu_run`): progress lines, what each row's run left, OUT/results.json
(R04-R26).

`Clock` prints each progress line with the elapsed time and an ETA. A row's steps/s and tokens per step come
from its metrics.jsonl (`measured_rates`), its step from its last checkpoint (`last_step`), a failure's cause
from the end of its log (`log_tail`). OUT/results.json is replaced whole (`write_results`); after a stop every
unfinished row says why (`mark_stopped`); `check_results` names what a filled file lacks. OUT/rsim.png: ΔRSIM
per layer against MLM (`plot_rsim`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from flax_xalign.experiments.gpu.children import RowRun

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
  rows = [r for r in _metrics(model_dir) if isinstance(r, dict) and _positive_number(r.get("steps_per_sec"))
          and _positive_number(r.get("tokens_per_sec"))]  # (a line of another shape says nothing of the rate)
  timed = rows[1:] if len(rows) > 1 else rows
  if not timed:
    return {}
  steps_per_s = sorted(r["steps_per_sec"] for r in timed)[len(timed) // 2]
  tokens_per_step = sum(r["tokens_per_sec"] / r["steps_per_sec"] for r in timed) / len(timed)
  return {"steps_per_s": steps_per_s, "tokens_per_step": tokens_per_step}


def _positive_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def log_tail(path: str, lines: int = 1) -> str:
  """The last non-empty line(s) of a log (what a failed child said last)."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      kept = [line.rstrip() for line in f if line.strip()]
  except OSError:
    return "no log"
  if not kept:
    return "empty log"
  return kept[-1].strip()[:300] if lines == 1 else "\n".join(kept[-lines:])


def last_step(model_dir: str) -> int:
  """The latest step saved in MODEL_DIR's checkpoints/; 0 when none is."""
  if not os.path.isdir(os.path.join(model_dir, "checkpoints")):  # (not trained: no need to load orbax)
    return 0
  from flax_xalign.runs.checkpoints import find_latest_step

  return find_latest_step(model_dir) or 0


def mark_stopped(rows: Sequence[RowRun], signame: str) -> None:
  """Every row a stop left unfinished says so in its `scores` (`not_run`), so results.json holds every row."""
  for row in rows:
    r = row.row
    if "scores" in r:
      continue
    if "score_s" in r:
      why = f"not scored: stopped by {signame} while it was scored"
    elif r.get("steps_done"):
      why = f"not scored: stopped by {signame} after training to step {r['steps_done']} (saved in {row.model_dir})"
    elif r.get("train_s"):
      why = f"not run: stopped by {signame} while it trained, before its first save"
    else:
      why = f"not run: stopped by {signame} before it started"
    r["scores"] = {"not_run": why}


def write_results(results: dict[str, Any], rows: Sequence[RowRun], out: str, clock: Clock, *,
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


def plot_rsim(results: Mapping[str, Any], path: str) -> str | None:
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
