"""The three-seed from-scratch TCS/SCS table and plot of docs/results/code_switch_seeds.md, from its raw files.

    python tools/code_switch_seeds.py            # print the table, write docs/results/code_switch_seeds.png

Reads docs/results/code_switch_seed{0,1,2}.json (each `xalign code_switch --settings=synthetic` run's
results.json, copied as it was written) and prints one row per seed and model: the Hit@1 of the dictionary
the row switched with, layer-0 CSLS Hit@1, upper-half RSIM (with its mean-centred control), last-layer RSIM
and zero-shot POS (SUP, ZS, Δ). The plot is ΔRSIM per layer against MLM of the same seed: one panel per
objective, a thin line per seed and their mean in bold, with two references: MLM itself (zero) and the
mono-mPLM before any continuation.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = tuple(os.path.join("docs", "results", f"code_switch_seed{s}.json") for s in range(3))
PLOT = os.path.join("docs", "results", "code_switch_seeds.png")
ORDER = ("start", "mlm", "tcs", "scs", "tcs_gold")
NAMES = {"start": "mono-mPLM (start)", "mlm": "+ MLM (baseline)", "tcs": "+ TCS (self-induced dictionary)",
         "scs": "+ SCS", "tcs_gold": "+ TCS, gold dictionary at 50% (control)"}


def load(paths: Sequence[str] = RAW) -> list[dict[str, dict[str, Any]]]:
  """Per seed, {objective: row} of the synthetic setting."""
  out = []
  for path in paths:
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
      out.append({r["objective"]: r for r in json.load(f)["rows"] if r["setting"] == "synthetic"})
  return out


def _upper(row: dict[str, Any], key: str) -> float | None:
  from flax_xalign.experiments.code_switch import top_half_mean

  return top_half_mean(row["per_layer"], key) if key in row["per_layer"] else None


def table(seeds: Sequence[dict[str, dict[str, Any]]]) -> str:
  head = ["seed", "model", "dictionary Hit@1", "CSLS Hit@1 (layer 0)", "RSIM upper half", "centred",
          "RSIM last layer", "POS SUP", "ZS", "Δ"]
  lines = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * (len(head) - 2)]

  def pct(x):
    return "–" if x is None else f"{100 * x:.1f}"

  def num(x):
    return "–" if x is None else f"{x:.3f}"

  for seed, rows in enumerate(seeds):
    for objective in (o for o in ORDER if o in rows):
      row = rows[objective]
      pos = row.get("pos") or {}
      lines.append("| " + " | ".join([
          str(seed), NAMES[objective], pct(row.get("dictionary_hit1")), pct(row["csls"]["hit@1"]),
          num(row["rsim_top_half"]), num(_upper(row, "rsim_centred")), num(row["per_layer"]["rsim"][-1]),
          pct(pos.get("sup")), pct(pos.get("zs")), pct(pos.get("delta"))]) + " |")
  return "\n".join(lines)


def plot(seeds: Sequence[dict[str, dict[str, Any]]], path: str) -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  objectives = [o for o in ("tcs", "scs", "tcs_gold") if all(o in rows for rows in seeds)]
  fig, axes = plt.subplots(1, len(objectives), figsize=(4.3 * len(objectives), 3.6), sharey=True, squeeze=False)
  for ax, objective in zip(axes[0], objectives):
    layers = seeds[0]["mlm"]["per_layer"]["layers"]
    deltas = [[a - b for a, b in zip(rows[objective]["per_layer"]["rsim"], rows["mlm"]["per_layer"]["rsim"])]
              for rows in seeds]
    for seed, delta in enumerate(deltas):
      ax.plot(layers, delta, color="tab:blue", lw=0.9, alpha=0.45, ls=("-", "--", ":")[seed % 3],
              label=f"seed {seed}")
    mean = [statistics.fmean(column) for column in zip(*deltas)]
    ax.plot(layers, mean, color="tab:blue", lw=2.4, marker="o", label=f"mean of {len(deltas)} seeds")
    start = [statistics.fmean(a - b for a, b in zip(column_start, column_mlm)) for column_start, column_mlm in
             zip(zip(*(rows["start"]["per_layer"]["rsim"] for rows in seeds)),
                 zip(*(rows["mlm"]["per_layer"]["rsim"] for rows in seeds)))]
    ax.plot(layers, start, color="grey", lw=1.4, ls="-.", label="the mono-mPLM, not continued (mean)")
    ax.axhline(0.0, color="black", lw=0.8, label="MLM continued (the baseline)")
    ax.set_title(NAMES[objective].removeprefix("+ "), fontsize=10)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_xticks(layers)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("RSIM minus MLM's (same seed)")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
  fig.suptitle("From-scratch mono-mPLM continued 400 steps: ΔRSIM per layer against continued MLM")
  fig.tight_layout(rect=(0, 0.08, 1, 0.95))
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv: Sequence[str]) -> int:
  seeds = load()
  print(table(seeds))
  print(f"\nwrote {plot(seeds, os.path.join(REPO, PLOT))}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
