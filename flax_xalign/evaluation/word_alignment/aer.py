"""Word-alignment metrics (P/R/F1/AER), gold-file readers and per-layer reports.

An alignment of one sentence pair is a set of `(i, j)` links, 0-indexed: word i
of the source side with word j of the target side. A gold alignment is a
`GoldLinks(sure, possible)` with `possible ⊇ sure` (readers add any sure link
that a file leaves out of its possible set).

Scores follow Och & Ney (2003), summed over the corpus (not averaged per
sentence), with A the predicted, S the sure and P the possible links:

  precision = |A ∩ P| / |A|        recall = |A ∩ S| / |S|
  AER = 1 - (|A ∩ S| + |A ∩ P|) / (|A| + |S|)
  F1 = 2 · precision · recall / (precision + recall)

A ratio whose denominator is 0 (no predicted link, no sure link) is reported
as 0 (precision, recall, F1) or 1 (AER): a degenerate result never looks good.

File formats (one line per sentence pair, in corpus order):

* Pharaoh (`read_pharaoh`, `write_pharaoh`): whitespace-separated links,
  `i-j` a sure link, `i?j` or `ipj` a possible one (SimAlign's gold files use
  `p`); an empty line is a pair without links. 0-indexed unless
  `one_indexed=True`.
* NAACL / WPT (`read_naacl`; the Hansards and EuroParl gold sets and the
  `alignv2.txt` files of SimAlign's and XLM-Align's test sets): one link per
  line, `sentence_id i j [S|P]`, all three numbers 1-indexed; no flag means S.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.fileio import save_figure, write_atomically  # noqa: F401  (also aer.write_atomically)

Link = tuple[int, int]
Alignment = frozenset  # of Link


class GoldLinks(NamedTuple):
  """Gold links of one sentence pair; `possible` includes `sure`."""

  sure: frozenset
  possible: frozenset


class AlignmentScores(NamedTuple):
  """Corpus-level alignment quality (fractions in [0, 1]) and link counts."""

  precision: float
  recall: float
  f1: float
  aer: float
  num_predicted: int
  num_sure: int
  num_possible: int

  def as_dict(self) -> dict[str, float | int]:
    return self._asdict()


def _ratio(numerator: float, denominator: float, *, empty: float) -> float:
  return numerator / denominator if denominator else empty


def score(predicted: Sequence[Iterable[Link]], sure: Sequence[Iterable[Link]],
          possible: Sequence[Iterable[Link]] | None = None) -> AlignmentScores:
  """P/R/F1/AER of `predicted` against gold, summed over sentence pairs.

  Args:
    predicted: per pair, the predicted links.
    sure: per pair, the sure gold links.
    possible: per pair, the possible gold links (sure links are added to them);
      None means possible = sure.

  Returns:
    AlignmentScores; see the module docstring for the empty cases.

  Raises:
    ValueError: the three sequences differ in length.
  """
  if possible is None:
    possible = sure
  if not len(predicted) == len(sure) == len(possible):
    raise ValueError(f"score() needs one entry per sentence pair: got {len(predicted)} predicted, "
                     f"{len(sure)} sure and {len(possible)} possible alignments.")
  num_a = num_s = num_p = hit_s = hit_p = 0
  for a, s, p in zip(predicted, sure, possible):
    a, s = set(a), set(s)
    p = set(p) | s
    num_a, num_s, num_p = num_a + len(a), num_s + len(s), num_p + len(p)
    hit_s += len(a & s)
    hit_p += len(a & p)
  precision = _ratio(hit_p, num_a, empty=0.0)
  recall = _ratio(hit_s, num_s, empty=0.0)
  f1 = _ratio(2 * precision * recall, precision + recall, empty=0.0)
  aer = 1.0 - _ratio(hit_s + hit_p, num_a + num_s, empty=0.0)
  return AlignmentScores(precision=precision, recall=recall, f1=f1, aer=aer,
                         num_predicted=num_a, num_sure=num_s, num_possible=num_p)


# ------------------------------------------------------------------ files

_PHARAOH_LINK = re.compile(r"^(\d+)([-?p])(\d+)$")
_PHARAOH_HELP = ("expected whitespace-separated links 'i-j' (sure) or 'i?j' / 'ipj' "
                 "(possible), non-negative integers, one line per sentence pair")
_NAACL_HELP = "expected 'sentence_id i j' or 'sentence_id i j S|P' (1-indexed integers)"


def _read_lines(path: str) -> list[str]:
  if not storage.isfile(path):
    raise UserError(f"alignment file {path} does not exist; check the path.")
  try:
    return storage.read_text(path).splitlines()
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text ({e}); alignment files are plain text.") from e


def read_pharaoh(path: str, *, one_indexed: bool = False) -> list[GoldLinks]:
  """Reads a Pharaoh file: one line of links per sentence pair.

  Args:
    path: the file; `i-j` sure links, `i?j` or `ipj` possible links.
    one_indexed: the file counts words from 1 (links are returned 0-indexed).

  Returns:
    One GoldLinks per line (possible ⊇ sure).

  Raises:
    UserError: the file is missing, or a link is malformed (names the line).
  """
  offset = 1 if one_indexed else 0
  result = []
  for number, line in enumerate(_read_lines(path), start=1):
    sure, possible = set(), set()
    for token in line.split():
      match = _PHARAOH_LINK.match(token)
      if not match:
        raise UserError(f"{path}:{number}: bad link {token!r}; {_PHARAOH_HELP}.")
      i, j = int(match.group(1)) - offset, int(match.group(3)) - offset
      if i < 0 or j < 0:
        raise UserError(f"{path}:{number}: link {token!r} has index 0 but the file was read as "
                        "1-indexed; read it as 0-indexed.")
      possible.add((i, j))
      if match.group(2) == "-":
        sure.add((i, j))
    result.append(GoldLinks(frozenset(sure), frozenset(possible)))
  return result


def read_naacl(path: str, *, num_sentences: int | None = None) -> list[GoldLinks]:
  """Reads a NAACL/WPT gold file (`sentence_id i j [S|P]`, 1-indexed).

  Args:
    path: the file; blank lines are skipped.
    num_sentences: the number of sentence pairs, when the last ones may have
      no link (and so no line); default: the largest sentence id.

  Returns:
    One GoldLinks per sentence id 1..N (0-indexed word links); ids without a
    line get empty sets.

  Raises:
    UserError: missing file, malformed line (named), or a sentence id beyond
      num_sentences.
  """
  by_sentence: dict[int, tuple[set, set]] = {}
  for number, line in enumerate(_read_lines(path), start=1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) not in (3, 4) or not all(f.isdigit() for f in fields[:3]) or (
        len(fields) == 4 and fields[3] not in ("S", "P")):
      raise UserError(f"{path}:{number}: bad line {line.strip()!r}; {_NAACL_HELP}.")
    sentence, i, j = (int(f) for f in fields[:3])
    if min(sentence, i, j) < 1:
      raise UserError(f"{path}:{number}: {line.strip()!r} has a 0; {_NAACL_HELP}.")
    sure, possible = by_sentence.setdefault(sentence, (set(), set()))
    possible.add((i - 1, j - 1))
    if len(fields) == 3 or fields[3] == "S":
      sure.add((i - 1, j - 1))
  count = max(by_sentence, default=0)
  if num_sentences is not None:
    if count > num_sentences:
      raise UserError(f"{path} has links for sentence {count} but there are only {num_sentences} "
                      "sentence pairs; check that the gold file belongs to the input.")
    count = num_sentences
  empty = (set(), set())
  return [GoldLinks(frozenset(by_sentence.get(k, empty)[0]), frozenset(by_sentence.get(k, empty)[1]))
          for k in range(1, count + 1)]


GOLD_FORMATS = ("pharaoh", "naacl")
PAIRS_FORMAT = "one pair per line: source words<TAB>target words (exactly one tab, both sides non-empty)"


def read_pairs(path: str, *, setting: str = "--input") -> list[tuple[list[str], list[str]]]:
  """(source words, target words) per line of the TSV file an aligner reads; UserError names a bad line.

  `setting` names where the path came from (a flag, an evaluator option) in the messages.
  """
  if not storage.isfile(path):
    raise UserError(f"{setting} {path} does not exist; pass a UTF-8 file with {PAIRS_FORMAT}.")
  try:
    lines = storage.read_text(path).splitlines()
  except UnicodeDecodeError as e:
    raise UserError(f"{setting} {path} is not UTF-8 ({e}).") from e
  while lines and not lines[-1].strip():
    lines.pop()  # Trailing blank lines carry no pair (the trainer skips them too).
  pairs = []
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      raise UserError(f"{path}:{number}: blank line; output line k aligns input line k, so every line before "
                      f"the last must hold a pair ({PAIRS_FORMAT}): remove the blank line.")
    fields = line.split("\t")
    if len(fields) != 2 or not fields[0].split() or not fields[1].split():
      raise UserError(f"{path}:{number}: malformed line {line[:60]!r}; expected {PAIRS_FORMAT}.")
    pairs.append((fields[0].split(), fields[1].split()))
  if not pairs:
    raise UserError(f"{setting} {path} is empty; expected {PAIRS_FORMAT}.")
  return pairs


def read_gold(path: str, gold_format: str = "pharaoh", *, num_sentences: int | None = None
              ) -> list[GoldLinks]:
  """`read_pharaoh` or `read_naacl` by name (see GOLD_FORMATS)."""
  if gold_format == "pharaoh":
    return read_pharaoh(path)
  if gold_format == "naacl":
    return read_naacl(path, num_sentences=num_sentences)
  raise UserError(f"unknown gold format {gold_format!r}; use one of {', '.join(GOLD_FORMATS)}.")


def check_gold_fits(gold: Sequence[GoldLinks], pairs: Sequence[tuple[Sequence[str], Sequence[str]]], *,
                    gold_path: str, input_path: str) -> None:
  """UserError unless gold has one entry per pair and every link lies inside its pair's words.

  A link past a sentence's last word would be scored as a miss (a wrong AER,
  silently); the usual cause is a file that counts words from 1, or a gold
  file of other sentences.
  """
  if len(gold) != len(pairs):
    raise UserError(f"gold {gold_path} has {len(gold)} entries but input {input_path} has {len(pairs)} pairs; they "
                    "must correspond line by line.")
  for number, (links, (src, tgt)) in enumerate(zip(gold, pairs), start=1):
    outside = sorted((i, j) for i, j in links.possible if i >= len(src) or j >= len(tgt))
    if outside:
      i, j = outside[0]
      uses_zero = any(0 in link for entry in gold for link in entry.possible)
      hint = ("no link of the file uses word 0: it probably counts words from 1 (Pharaoh files are 0-indexed; "
              "subtract 1 from every index)" if not uses_zero else
              "check that the gold file belongs to this input, line by line")
      raise UserError(f"gold {gold_path}, entry {number}: link {i}-{j} lies outside the pair ({len(src)} source and "
                      f"{len(tgt)} target words on line {number} of {input_path}); {hint}.")


def format_links(links: Iterable[Link] | GoldLinks) -> str:
  """One Pharaoh line: sorted `i-j` links (GoldLinks: `i?j` for possible ones)."""
  if isinstance(links, GoldLinks):
    marked = [(i, j, "-") for i, j in links.sure]
    marked += [(i, j, "?") for i, j in links.possible - links.sure]
    return " ".join(f"{i}{m}{j}" for i, j, m in sorted(marked))
  return " ".join(f"{i}-{j}" for i, j in sorted(links))


def write_pharaoh(path: str, alignments: Sequence[Iterable[Link] | GoldLinks]) -> None:
  """Writes one line of sorted `i-j` links per pair (GoldLinks: `i?j` for possible).

  The file is replaced atomically, so a reader never sees half of it.
  """
  write_atomically(path, "".join(format_links(a) + "\n" for a in alignments))


# ------------------------------------------------------------------ reports
#
# A sweep table maps (method, layer) -- or (model, method, layer) when several
# models are compared -- to AlignmentScores (or a dict with the same keys).


def _split_key(key: tuple) -> tuple[str, str, int]:
  if len(key) == 2:
    return "", str(key[0]), int(key[1])
  if len(key) == 3:
    return str(key[0]), str(key[1]), int(key[2])
  raise ValueError(f"table keys are (method, layer) or (model, method, layer), got {key!r}")


def _get(scores, name: str) -> float:
  return float(scores[name] if isinstance(scores, Mapping) else getattr(scores, name))


def best_layers(table: Mapping[tuple, object]) -> dict[tuple[str, str], tuple[int, object]]:
  """{(model, method): (layer with the lowest AER, its scores)}; ties: lowest layer."""
  best: dict[tuple[str, str], tuple[int, object]] = {}
  for key in sorted(table, key=_split_key):
    model, method, layer = _split_key(key)
    current = best.get((model, method))
    if current is None or _get(table[key], "aer") < _get(current[1], "aer"):
      best[(model, method)] = (layer, table[key])
  return best


def format_table(table: Mapping[tuple, object], *, title: str | None = None) -> str:
  """A markdown table, one row per (model,) method and layer; the best AER in bold."""
  best = best_layers(table)
  several = any(model for model, _ in best)
  head = (["model"] if several else []) + ["method", "layer", "P", "R", "F1", "AER"]
  lines = [f"**{title}**", ""] if title else []
  lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
  for key in sorted(table, key=_split_key):
    model, method, layer = _split_key(key)
    scores = table[key]
    aer = f"{100 * _get(scores, 'aer'):.1f}"
    if best[(model, method)][0] == layer:
      aer = f"**{aer}**"
    cells = ([model] if several else []) + [method, str(layer)] + [
        f"{100 * _get(scores, m):.1f}" for m in ("precision", "recall", "f1")] + [aer]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot_layer_curve(table: Mapping[tuple, object], path: str, *, title: str | None = None) -> str:
  """Plots AER (%) against layer, one line per (model,) method; writes a PNG.

  Args:
    table: the sweep table (see above).
    path: output image path (written atomically).
    title: optional figure title.

  Returns:
    `path`.
  """
  import matplotlib  # Lazy: only reports need it.

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
  for key in sorted(table, key=_split_key):
    model, method, layer = _split_key(key)
    curves.setdefault((model, method), []).append((layer, 100 * _get(table[key], "aer")))
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  try:
    for (model, method), points in curves.items():
      layers, aers = zip(*points)
      ax.plot(layers, aers, marker="o", label=f"{model} {method}".strip())
    all_layers = sorted({layer for points in curves.values() for layer, _ in points})
    ax.set_xticks(all_layers)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel("AER (%, lower is better)")
    finite = [a for points in curves.values() for _, a in points if math.isfinite(a)]
    if finite:
      ax.set_ylim(max(0.0, min(finite) - 5), min(100.0, max(finite) + 5))
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
      ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
  finally:
    plt.close(fig)
  return path
