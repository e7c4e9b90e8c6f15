"""Tables and the ΔRSIM plot of the Debian setting's rows (`e5_debian.rows`): mean over seeds, spread shown.

Spread is written `mean ±h` with h half the range over seeds (for two seeds: the
two values are mean - h and mean + h). Language averages are over the languages
a row has (BLI: those with a gold dictionary; retrieval: all).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

LABELS = {"start": "e5-small (start)", "mlm": "+ MLM (baseline)", "tcs": "+ TCS-MLM", "scs": "+ SCS-MLM",
          "gc": "+ MLM-GC (Eq. 3)", "gc_output": "+ MLM-GC (Eq. 6)"}
ORDER = tuple(LABELS)


def _mean(values: Sequence[float]) -> float | None:
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def bli_mean(row: dict, method: str, k: str) -> float | None:
  return _mean([b[method][k] for b in row.get("bli", {}).values() if b.get(method)])


def muse(row: dict, key: str) -> float | None:
  return _mean([(b.get("muse_cosine") or {}).get(key) for b in row.get("bli", {}).values()])


def retrieval_mean(row: dict, method: str = "csls") -> float | None:
  return _mean([r["best"][method]["accuracy"] for r in row.get("retrieval", {}).values() if method in r["best"]])


def rsim_curve(row: dict) -> tuple[list[int], list[float]] | None:
  """(layers, RSIM per layer averaged over the row's BLI languages), or None without any."""
  curves = [b["per_layer"] for b in row.get("bli", {}).values() if b.get("per_layer")]
  if not curves:
    return None
  layers = curves[0]["layers"]
  return layers, [_mean([c["rsim"][i] for c in curves]) for i in range(len(layers))]


def rsim_top_half(row: dict) -> float | None:
  curve = rsim_curve(row)
  if curve is None:
    return None
  layers, values = curve
  return _mean([v for layer, v in zip(layers, values) if layer > max(layers) / 2])


def _gap(row: dict) -> float | None:
  gold, shuffled = muse(row, "mean"), muse(row, "shuffled_mean")
  return None if gold is None or shuffled is None else gold - shuffled


def grouped(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
  """[(objective, its rows by seed)] in ORDER."""
  groups: dict[str, list[dict]] = {}
  for row in rows:
    groups.setdefault(row["objective"], []).append(row)
  return [(o, sorted(groups[o], key=lambda r: r.get("seed", 0))) for o in ORDER if o in groups]


def spread(values: Sequence[float | None], fmt: Callable[[float], str]) -> str:
  values = [v for v in values if v is not None]
  if not values:
    return "–"
  mean = sum(values) / len(values)
  if len(values) == 1:
    return fmt(mean)
  return f"{fmt(mean)} ±{fmt((max(values) - min(values)) / 2)}"


def pct(x: float) -> str:
  return f"{100 * x:.1f}"


def num(x: float) -> str:
  return f"{x:.3f}"


COLUMNS: tuple[tuple[str, Callable[[dict], Any], Callable[[float], str]], ...] = (
    ("BLI Hit@1 CSLS", lambda r: bli_mean(r, "csls", "hit@1"), pct),
    ("Hit@5 CSLS", lambda r: bli_mean(r, "csls", "hit@5"), pct),
    ("Hit@1 NN", lambda r: bli_mean(r, "nn", "hit@1"), pct),
    ("Hit@5 NN", lambda r: bli_mean(r, "nn", "hit@5"), pct),
    ("MUSE cos", lambda r: muse(r, "mean"), num),
    ("shuffled", lambda r: muse(r, "shuffled_mean"), num),
    ("gap", _gap, num),
    ("RSIM L0", lambda r: (rsim_curve(r) or ([0], [None]))[1][0], num),
    ("RSIM top half", rsim_top_half, num),
    ("retrieval CSLS", retrieval_mean, pct),
    ("MLM acc", lambda r: r.get("mlm_accuracy"), pct),
    ("train min", lambda r: r.get("seconds", 0.0) / 60 if r["objective"] != "start" else None, lambda x: f"{x:.1f}"),
)


def format_table(rows: Sequence[dict]) -> str:
  """One line per objective: every measure's mean over seeds ±half the range."""
  head = ["model", "seeds", *[c[0] for c in COLUMNS]]
  lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * len(COLUMNS)]
  for objective, group in grouped(rows):
    cells = [LABELS[objective], "–" if objective == "start" else str(len(group))]
    cells += [spread([get(r) for r in group], fmt) for _, get, fmt in COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def format_languages(rows: Sequence[dict]) -> str:
  """Per language: BLI Hit@1 / Hit@5 CSLS (and the gold's kind and pairs), retrieval CSLS; means over seeds."""
  languages = sorted({lang for r in rows for lang in r.get("retrieval", {})} |
                     {lang for r in rows for lang in r.get("bli", {})})
  head = ["model", *[f"{lang}: Hit@1 / @5 CSLS, retr." for lang in languages]]
  lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(languages)]
  for objective, group in grouped(rows):
    cells = [LABELS[objective]]
    for lang in languages:
      bli = [r["bli"][lang]["csls"] for r in group if lang in r.get("bli", {})]
      retr = [r["retrieval"][lang]["best"]["csls"]["accuracy"] for r in group if lang in r.get("retrieval", {})]
      hit = (f"{pct(_mean([b['hit@1'] for b in bli]))} / {pct(_mean([b['hit@5'] for b in bli]))}" if bli else "–")
      cells.append(f"{hit}, {pct(_mean(retr)) if retr else '–'}")
    lines.append("| " + " | ".join(cells) + " |")
  golds = {lang: (b.get("gold_kind"), b.get("pairs")) for r in rows[:1] for lang, b in r.get("bli", {}).items()}
  if golds:
    lines.append("")
    lines.append("BLI gold: " + ", ".join(f"{lang} {kind} ({pairs:,} queries)" for lang, (kind, pairs)
                                          in sorted(golds.items()) if pairs is not None) + ".")
  return "\n".join(lines)


def delta_rsim(rows: Sequence[dict], baseline: str = "mlm") -> dict[str, dict[str, Any]]:
  """{objective: layers, mean RSIM, its min/max over seeds, ΔRSIM against `baseline` paired by seed}."""
  by = {o: {r.get("seed", 0): rsim_curve(r) for r in g} for o, g in grouped(rows)}
  if baseline not in by:
    return {}
  out = {}
  for objective, curves in by.items():
    curves = {s: c for s, c in curves.items() if c is not None}
    if not curves:
      continue
    layers = next(iter(curves.values()))[0]
    values = [c[1] for c in curves.values()]
    base = {s: c[1] for s, c in by[baseline].items() if c is not None}
    paired = [[v - b for v, b in zip(c[1], base[s])] for s, c in curves.items() if s in base]
    if objective == "start":  # One starting model: against every baseline seed.
      paired = [[v - b for v, b in zip(values[0], bc)] for bc in base.values()]
    out[objective] = {"layers": layers, "rsim": _columns(values), "delta": _columns(paired) if paired else None}
  return out


def _columns(curves: Sequence[Sequence[float]]) -> dict[str, list[float]]:
  columns = list(zip(*curves))
  return {"mean": [sum(c) / len(c) for c in columns], "min": [min(c) for c in columns],
          "max": [max(c) for c in columns]}


def plot(rows: Sequence[dict], path: str, *, title: str = "") -> str | None:
  """Fig. 7's shape: (a) RSIM per layer, (b) ΔRSIM against continued MLM; mean over seeds, band = min..max."""
  curves = delta_rsim(rows)
  if len(curves) < 2:
    return None
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return None
  from flax_xalign.fileio import save_figure

  fig, (left, right) = plt.subplots(1, 2, figsize=(10.5, 3.9))
  for objective, c in curves.items():
    style = "--" if objective in ("mlm", "start") else "-"
    line, = left.plot(c["layers"], c["rsim"]["mean"], marker="o", ms=3, linestyle=style, label=LABELS[objective])
    left.fill_between(c["layers"], c["rsim"]["min"], c["rsim"]["max"], color=line.get_color(), alpha=0.2)
    if objective != "mlm" and c["delta"]:
      right.plot(c["layers"], c["delta"]["mean"], marker="o", ms=3, color=line.get_color(), linestyle=style,
                 label=LABELS[objective])
      right.fill_between(c["layers"], c["delta"]["min"], c["delta"]["max"], color=line.get_color(), alpha=0.2)
  right.axhline(0.0, color="black", linewidth=0.8)
  left.set_title("(a) RSIM per layer (mean over languages; seeds: band)")
  right.set_title("(b) ΔRSIM against continued MLM (paired by seed)")
  left.set_ylabel("RSIM")
  right.set_ylabel("ΔRSIM")
  for ax in (left, right):
    ax.set_xlabel("layer (0 = embeddings)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  save_figure(fig, path, dpi=110)
  plt.close(fig)
  return path
