"""Writes docs/results/claims.md, the claims ledger, from the committed raw result files (never by hand).

    python tools/claims_ledger.py           # rewrite docs/results/claims.md
    python tools/claims_ledger.py --check   # exit 1 if the committed ledger is not what the raw files give

One row per claim of the four papers (and the aligner's own headline): the paper's number, ours with its
number of seeds and their spread, the command that made the raw file, the raw file, and a status decided by
the rule written beside the claim: `shown`, `not shown`, `contradicted` or `lead`. Every number in the ledger is computed here from a raw file under docs/results/;
tests/test_claims_ledger.py regenerates the ledger and compares, and checks that every raw file it names is
committed and that the README's headline numbers are in one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEDGER = os.path.join("docs", "results", "claims.md")
STATUSES = ("shown", "not shown", "contradicted", "lead")


@dataclasses.dataclass(frozen=True)
class Measured:
  """What a claim's raw file gives: the number shown in the ledger, per seed, and the status it earns."""

  values: tuple[float, ...]  # one per seed (or per paired comparison)
  status: str
  detail: str = ""  # what the number is, in words

  @property
  def text(self) -> str:
    mean = statistics.fmean(self.values)
    if len(self.values) == 1:
      return f"{mean:.3f} (n=1)"
    spread = max(self.values) - min(self.values)
    return f"{mean:.3f} (n={len(self.values)}, range {spread:.3f})"


@dataclasses.dataclass(frozen=True)
class Claim:
  paper: str
  where: str  # table or figure of the paper
  claim: str
  papers_number: str  # as the paper prints it
  raw: tuple[str, ...]  # committed files under docs/results/
  command: str
  rule: str  # what would confirm or refute, decided before the numbers
  measure: Callable[..., Measured]  # measure(*loaded raw files) -> Measured


def _load(path: str) -> Any:
  full = os.path.join(REPO, path)
  if not os.path.isfile(full):
    raise SystemExit(f"error: the raw file {path} the ledger names is not in the checkout; restore it or drop "
                     "the claim from tools/claims_ledger.py")
  with open(full, encoding="utf-8") as f:
    return json.load(f)


def _rows(data: Any, **match: Any) -> list[dict[str, Any]]:
  return [r for r in data["rows"] if all(r.get(k) == v for k, v in match.items())]


def _one(data: Any, **match: Any) -> dict[str, Any]:
  found = _rows(data, **match)
  if len(found) != 1:
    raise SystemExit(f"error: expected one row {match} in a raw file, found {len(found)}")
  return found[0]


# ---------------------------------------------------------------------------- the measurements


def _xlm_align_aer(results: Any) -> Measured:
  """AER points the self-labelled TLM+DWA row gains over the untrained start (best method each, test books)."""
  def best(row: dict[str, Any]) -> float:
    return min(m["aer"] for m in row["scores"]["word_alignment"]["test"]["by_method"].values())

  start, trained = _one(results, name="start"), _one(results, name="xlm_align_self")
  gain = 100 * (best(start) - best(trained))
  return Measured((gain,), "shown" if gain > 0 else "contradicted",
                  "AER points gained by TLM+DWA (self labels; the rows trained no MLM) over the start, best "
                  "extraction each; the start scored separate/cosine, the row joint/dot; no -DWA control")


def _trans_inv_rows(*grids: Any) -> list[list[dict[str, Any]]]:
  """Per seed (one raw file each), the Trans∘Inv rows of every objective."""
  return [[r for r in grid["rows"] if r["transform"] == "trans_inv"] for grid in grids]


def _align_mlm_ordering(*grids: Any) -> Measured:
  """ALIGN-MLM's zero-shot POS gap (Δ, lower is better) minus MLM's on Trans∘Inv, one value per seed."""
  diffs = []
  for rows in _trans_inv_rows(*grids):
    by = {r["objective"]: r for r in rows}
    diffs.append(by["align_mlm"]["pos"]["delta"] - by["mlm"]["pos"]["delta"])
  below = sum(d < 0 for d in diffs)
  status = ("shown" if below == len(diffs) == 3 else "contradicted" if len(diffs) - below >= 2 else "not shown")
  return Measured(tuple(diffs), status, "POS transfer gap Δ of ALIGN-MLM minus MLM on Trans∘Inv, per seed "
                  "(negative: ALIGN-MLM transfers better)")


def _ranks(values: Sequence[float]) -> list[float]:
  order = sorted(range(len(values)), key=lambda i: values[i])
  ranks = [0.0] * len(values)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    for k in range(i, j + 1):
      ranks[order[k]] = (i + j) / 2 + 1  # Ties share their mean rank.
    i = j + 1
  return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's ρ: Pearson's correlation of the ranks (ties averaged); 0 where a side is constant."""
  rx, ry = _ranks(x), _ranks(y)
  mx, my = statistics.fmean(rx), statistics.fmean(ry)
  sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
  sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
  return sxy / math.sqrt(sxx * syy) if sxx and syy else 0.0


def bootstrap_interval(x: Sequence[float], y: Sequence[float], *, draws: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
  """The 95% percentile interval of ρ over rows resampled with replacement (a fixed seed: the same page
  from the same raw files)."""
  import random

  rng = random.Random(seed)
  n, found = len(x), []
  for _ in range(draws):
    pick = [rng.randrange(n) for _ in range(n)]
    found.append(spearman([x[i] for i in pick], [y[i] for i in pick]))
  found.sort()
  return found[int(0.025 * draws)], found[int(0.975 * draws) - 1]


def _align_mlm_correlation(*grids: Any) -> Measured:
  rows = [r for seed in _trans_inv_rows(*grids) for r in seed]
  alignment, delta = [r["alignment"] for r in rows], [r["pos"]["delta"] for r in rows]
  rho = spearman(alignment, delta)
  low, high = bootstrap_interval(alignment, delta)
  status = "shown" if high < 0 else "contradicted" if low > 0 else "not shown"
  return Measured((rho,), status, f"Spearman ρ of alignment vs POS Δ over {len(rows)} Trans∘Inv rows "
                  f"({len(grids)} seeds × 4 objectives), bootstrap 95% interval [{low:.2f}, {high:.2f}]")


def _rsim_falls_with_depth(code_switch: Any) -> Measured:
  rsim = _one(code_switch, setting="synthetic", objective="start")["per_layer"]["rsim"]
  drop = rsim[0] - rsim[-1]
  return Measured((drop,), "shown" if drop > 0 and rsim[-1] < rsim[0] / 2 else "not shown",
                  "RSIM of layer 0 minus the last layer, the synthetic from-scratch MLM start")


CS_LABELS = {"tcs": "TCS (self-induced dictionary)", "scs": "SCS", "tcs_gold": "TCS with the 50%-correct gold "
             "dictionary (control)"}


def _cs_pairs(files: Sequence[Any], objective: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
  """(MLM row, `objective` row) of the synthetic setting, one pair per seed file."""
  return [(_one(d, setting="synthetic", objective="mlm"), _one(d, setting="synthetic", objective=objective))
          for d in files]


def _by_seed_rule(diffs: Sequence[float], better: Callable[[float], bool]) -> str:
  """docs/results/code_switch_seeds.md's rule: better in every seed, shown; worse in 2 or more, contradicted."""
  worse = sum(not better(d) and d != 0 for d in diffs)
  return "shown" if all(better(d) for d in diffs) and len(diffs) >= 3 else ("contradicted" if worse >= 2
                                                                            else "not shown")


def _cs_upper_rsim(objective: str) -> Callable[..., Measured]:
  def measure(*files: Any) -> Measured:
    diffs = tuple(row["rsim_top_half"] - mlm["rsim_top_half"] for mlm, row in _cs_pairs(files, objective))
    return Measured(diffs, _by_seed_rule(diffs, lambda d: d > 0),
                    f"upper-half RSIM of {CS_LABELS[objective]} minus MLM's, per seed (positive: it helps)")
  return measure


def _cs_transfer(objective: str) -> Callable[..., Measured]:
  def measure(*files: Any) -> Measured:
    diffs = tuple(row["pos"]["delta"] - mlm["pos"]["delta"] for mlm, row in _cs_pairs(files, objective))
    return Measured(diffs, _by_seed_rule(diffs, lambda d: d < 0),
                    f"POS transfer gap Δ of {CS_LABELS[objective]} minus MLM's, per seed (negative: it helps)")
  return measure


def _cs_self_induced(*files: Any) -> Measured:
  hits = tuple(row["dictionary_hit1"] for _, row in _cs_pairs(files, "tcs"))
  return Measured(hits, "shown" if all(h >= 0.4 for h in hits) else "not shown",
                  "Hit@1 of the dictionary CSLS self-induced from the from-scratch mono-mPLM (the one TCS switched "
                  "with), against the true map, per seed")


def _mlm_gc_pos(*files: Any) -> Measured:
  """POS Δ of MLM-GC (Eq. 3) minus MLM's, per paired run (same setting and seed file)."""
  diffs = []
  for data in files:
    for setting in sorted({r["setting"] for r in data["rows"] if "pos" in r}):
      mlm, gc = _one(data, setting=setting, objective="mlm"), _one(data, setting=setting, objective="gc")
      diffs.append(gc["pos"]["delta"] - mlm["pos"]["delta"])
  status = "lead" if all(d < 0 for d in diffs) else "not shown"  # Paired runs, but fewer than 4 seeds.
  return Measured(tuple(diffs), status, "POS transfer gap Δ of MLM-GC minus MLM, per paired run (negative: GC helps)")


def _mlm_gc_muse(data: Any) -> Measured:
  diffs = []
  for setting in sorted({r["setting"] for r in data["rows"]}):
    mlm, gc = _one(data, setting=setting, objective="mlm"), _one(data, setting=setting, objective="gc")
    diffs.append(gc["muse_cosine"]["mean"] - mlm["muse_cosine"]["mean"])
  status = "shown" if all(d > 0 for d in diffs) else ("contradicted" if all(d < 0 for d in diffs) else "not shown")
  return Measured(tuple(diffs), status, "MUSE-pair mean cosine of MLM-GC minus MLM, per setting")


def _so_vs_eflomal(results: Any) -> Measured:
  so = _one(results, name="so_links")["scores"]["word_alignment"]["test"]["by_method"]
  best = 100 * min(m["aer"] for m in so.values())
  return Measured((best,), "lead", "best AER of e5-small + SO (eflomal's links), test books; eflomal's own AER on "
                  "this run is not in the raw file (alignment_peers: null), so no comparison is made here")


def _so_vs_eflomal_demo(demo: Any) -> Measured:
  """The demo's SO row (150 steps) minus eflomal gdfa, both scored in the demo's own run (test books)."""
  so = 100 * min(m["aer"] for m in demo["e5-small + SO (eflomal links)"]["best"].values())
  eflomal = 100 * next(iter(demo["peers"].values()))["grow-diag-final-and"]["aer"]
  diff = so - eflomal
  return Measured((diff,), "shown" if diff < 0 else "not shown",
                  "AER points of e5-small + SO (150 steps, best extraction) minus eflomal gdfa, one run of `make demo`")


# Seed 0 is the committed grid (its Trans∘Inv rows); seeds 1 and 2 are docs/results/align_mlm_seeds.md's runs.
ALIGN_MLM_SEEDS = ("docs/results/align_mlm_grid.json", "docs/results/align_mlm_seed1.json",
                   "docs/results/align_mlm_seed2.json")
# The from-scratch TCS/SCS runs, one file per seed (docs/results/code_switch_seeds.md).
CODE_SWITCH_SEEDS = tuple(f"docs/results/code_switch_seed{s}.json" for s in range(3))
CODE_SWITCH_COMMAND = ("xalign code_switch --settings=synthetic --objectives=mlm,tcs,scs,tcs_gold --gin SEED=s "
                       "(docs/results/code_switch_seeds.md)")
CODE_SWITCH_RULE = ("shown if above MLM in all 3 seeds, contradicted if below in 2 or more "
                    "(docs/results/code_switch_seeds.md, written before the runs)")
CODE_SWITCH_TRANSFER_RULE = ("shown if Δ is below MLM's in all 3 seeds, contradicted if above in 2 or more "
                             "(docs/results/code_switch_seeds.md, written before the runs)")

CLAIMS = (
    Claim("XLM-Align (Chi et al. 2021)", "Table 2", "DWA with self-labelled alignments lowers word-alignment AER",
          "average AER 22.64 (XLM-R base) -> 21.05", ("docs/results/gpu_science_h200/results.json",),
          "bash .gpu/run.sh (xalign gpu_bundle --grid=science; docs/results/gpu_science_h200.md)",
          "shown if the trained row's best AER is below the start's; TLM and DWA are not separated (no control)",
          _xlm_align_aer),
    Claim("ALIGN-MLM (Tang et al.)", "Fig. 2", "ALIGN-MLM transfers better than MLM on Trans∘Inv",
          "POS: ALIGN-MLM 30 F1 points above MLM (script and word order changed)", ALIGN_MLM_SEEDS,
          "xalign align_mlm_grid --transforms=trans_inv --gin SEED=s (docs/results/align_mlm_seeds.md)",
          "shown if ALIGN-MLM's Δ is below MLM's in all 3 seeds, contradicted if above in 2 or more",
          _align_mlm_ordering),
    Claim("ALIGN-MLM (Tang et al.)", "Fig. 3, Table 8", "alignment correlates with transfer",
          "Spearman 0.734 for POS, better alignment with lower Δ (0.727 XNLI), p < .01", ALIGN_MLM_SEEDS,
          "xalign align_mlm_grid --transforms=trans_inv --gin SEED=s (docs/results/align_mlm_seeds.md)",
          "shown if the bootstrap 95% interval of ρ(alignment, Δ) lies below 0, contradicted if above",
          _align_mlm_correlation),
    Claim("TCS/SCS (Lu et al. 2023)", "§2.3, Fig. 3 (b)", "a mono-mPLM's RSIM falls with depth",
          "geometric similarity weaker at top layers (XLM-R large)", ("docs/results/code_switch.json",),
          "xalign code_switch --settings=synthetic (docs/code_switch.md)",
          "shown if the last layer's RSIM is below half of layer 0's", _rsim_falls_with_depth),
    *(Claim("TCS/SCS (Lu et al. 2023)", "Fig. 7", f"{CS_LABELS[o]} raises upper-layer RSIM over MLM "
            "(from scratch, monolingual data only)", "SCS-MLM's RSIM above XLM-R's, the gain in the higher layers",
            CODE_SWITCH_SEEDS, CODE_SWITCH_COMMAND, CODE_SWITCH_RULE, _cs_upper_rsim(o))
      for o in ("tcs", "scs", "tcs_gold")),
    *(Claim("TCS/SCS (Lu et al. 2023)", "Tables 2-4", f"{CS_LABELS[o]} improves zero-shot transfer over MLM",
            "XNLI / POS / NER gains over XLM-R continued with MLM", CODE_SWITCH_SEEDS, CODE_SWITCH_COMMAND,
            CODE_SWITCH_TRANSFER_RULE, _cs_transfer(o))
      for o in ("tcs", "scs", "tcs_gold")),
    Claim("TCS/SCS (Lu et al. 2023)", "Table 1", "the self-induced dictionary is good enough to code-switch with",
          "CSLS Hit@1 about 50% (XLM-R base, X->en)", CODE_SWITCH_SEEDS, CODE_SWITCH_COMMAND,
          "shown if its Hit@1 is at least 40% in every seed, else not shown (the premise unmet here)",
          _cs_self_induced),
    Claim("MLM-GC (Ai & Fang 2023)", "Table 5", "MLM-GC improves zero-shot transfer",
          "XNLI average 71.5 (XLM) -> 74.6 (XLM + MLM-GC)", ("docs/results/mlm_gc.json", "docs/results/mlm_gc_seed1.json"),
          "xalign mlm_gc (docs/mlm_gc.md)", "lead while fewer than 4 paired seeds all favour GC; not shown otherwise",
          _mlm_gc_pos),
    Claim("MLM-GC (Ai & Fang 2023)", "Table 2", "MLM-GC raises the cosine of dictionary pairs",
          "MUSE cosine above the baseline for every n (En-De)", ("docs/results/mlm_gc.json",), "xalign mlm_gc (docs/mlm_gc.md)",
          "shown if every setting's MUSE cosine rises, contradicted if every one falls", _mlm_gc_muse),
    Claim("ours (awesome-align's SO on e5-small)", "README", "SO on eflomal's links aligns better than eflomal",
          "eflomal gdfa 34.2-34.9 AER on our test books", ("docs/results/gpu_science_h200/results.json",),
          "bash .gpu/run.sh (xalign gpu_bundle --grid=science)",
          "lead until eflomal is scored in the same raw file", _so_vs_eflomal),
    Claim("ours (awesome-align's SO on e5-small)", "README (make demo)", "at the demo's 150 steps, SO aligns better "
          "than eflomal", "eflomal gdfa 34.2-34.9 AER on our test books", ("docs/results/demo_e5_aer.json",),
          "make demo (xalign demo)", "shown if SO's AER is below eflomal's in the same run, else not shown",
          _so_vs_eflomal_demo),
)


def measure_all() -> list[tuple[Claim, Measured]]:
  out = []
  for claim in CLAIMS:
    measured = claim.measure(*(_load(path) for path in claim.raw))
    if measured.status not in STATUSES or not all(math.isfinite(v) for v in measured.values):
      raise SystemExit(f"error: the claim {claim.claim!r} measured {measured}")
    out.append((claim, measured))
  return out


def render(rows: Sequence[tuple[Claim, Measured]]) -> str:
  lines = [
      "# Claims ledger",
      "",
      "Generated by `python tools/claims_ledger.py` from the committed raw files it names; do not edit by hand",
      "(`tests/test_claims_ledger.py` fails when this page is not what the raw files give). Each status follows",
      "the rule in its row. The rules were written on 2026-12-02, after these raw files existed: they bind the",
      "runs that come next, and a status here is only as strong as its n. \"The paper\" quotes the paper's text",
      "(../shared/papers/); every number under \"ours\" is computed from the raw file named in its row.",
      "",
      "| paper | where | claim | the paper | ours | what ours is | status | rule | command | raw file |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for claim, measured in rows:
    raw = ", ".join(f"`{path}`" for path in claim.raw)
    lines.append(f"| {claim.paper} | {claim.where} | {claim.claim} | {claim.papers_number} | {measured.text} | "
                 f"{measured.detail} | **{measured.status}** | {claim.rule} | `{claim.command}` | {raw} |")
  counts = {s: sum(m.status == s for _, m in rows) for s in STATUSES}
  lines += ["", "Totals: " + ", ".join(f"{n} {s}" for s, n in counts.items()) + "."]
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
  text = render(measure_all())
  path = os.path.join(REPO, LEDGER)
  if "--check" in argv:
    with open(path, encoding="utf-8") as f:
      if f.read() != text:
        print(f"error: {LEDGER} is not what the raw files give; run python tools/claims_ledger.py", file=sys.stderr)
        return 1
    return 0
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  print(f"wrote {LEDGER}: {len(CLAIMS)} claims")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
