"""The experiment grids a GPU bundle is built from (`xalign gpu_bundle --grid=NAME`), and how their steps are sized.

A grid is data: the caches it trains and evaluates on, its evaluation suites, and its experiments, each a
`python -m flax_xalign.train` run (gin files + bindings) that starts from the bundle's start weights or from
another experiment's last checkpoint. Experiments of one *family* share one budget: the same steps, batch,
length, data order and seeds, so their rows compare.

`science` (issue 37 part 3), from multilingual-e5-small trimmed to the pieces of the Debian help text and the
Bible (one start, one vocabulary for both settings):

* `warmup`: e5-small's MLM head trained with the encoder frozen (`OptimizerConfig.trainable`): e5 was never
  trained with one. Every MLM-trained continuation starts from it; its encoder is e5's, unchanged.
* `debian`: MLM, TCS-MLM, SCS-MLM (batch and vocabulary candidates) and MLM-GC continued on the monolingual
  Debian help mixture (de, el, fr, hi, ru + en), 2 seeds (data order and masks; the same two for every row).
* `xlm_align`: TLM + DWA on the Bible (grc-en) with DWA's labels self-made (`self`), eflomal's links
  (`links`) and their union. Its `mlm` term trains nothing: the `bible` cache holds pairs only and `mlm`
  scores only pair_side 0 slots (objectives/mlm.py), so its weight is 0 on every step.
* `so`: awesome-align's SO objective on eflomal's links, one uninterrupted run from e5-small (no MLM head);
  its recipe is gin_configs/experiments/so_links.gin, the one experiments/e5_so_eflomal.gin includes.

`science2` (issue 49 part 4, the grid of the next GPU call), with the fixes the first run asked for:

* `xlm_align_mix`: XLM-Align from the warm-up on the Bible's MLM + TLM mixture (both monolingual streams and
  the verse pairs, train books only: `BibleTasks`, so MLM trains), MLM + TLM (the −DWA control) and
  MLM + TLM + DWA with self labels, 2 seeds each (the same two); every row and the start scored in both
  alignment modes with every extraction method (`word_alignment_modes`, sinkhorn_itermax among them);
* `debian`: MLM vs MLM-GC from the warm-up with the same two seeds (the per-layer RSIM carries its centred and
  shuffled controls);
* `so`: as in `science`.

Not in it yet: the from-scratch TCS/SCS family (a second, randomly initialised start of 6 layers x 256: a bundle
carries one start today).

`tiny` is the same machinery in miniature (a 4-layer model, 3 steps per experiment): the CPU proof that a
bundle runs end to end from its own `run.sh` where TensorFlow and seqio are absent.

A grid is read here, by the builder (`builder`), and nowhere else: the bundle carries every row, family,
cache and step bound of it (`bundle.Bundle`), and the host runs what the bundle says.

Sizing (`plan_steps`): the runner measures the warm-up's steps per second on the card, then gives each family
`share` of the training budget; the family's steps are what its experiments' summed relative costs allow in
that time, capped at `max_steps` and floored at `min_steps`. The costs are step times relative to the warm-up
step, measured on 2 CPU cores (docs/results/code_switch_debian.md: 60 steps of MLM 2.9 min, TCS 5.9, SCS 4.6,
SCS over the vocabulary 11.8, GC 2.7) and scaled by tokens per step; the runner checks them against the
measured step times and reports both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from flax_xalign.errors import UserError

DEBIAN_LANGUAGES = ("de", "el", "fr", "hi", "ru")
PIVOT = "en"
# The metric families of `flax_xalign.evaluation.offline.score` each setting's rows are scored on: BLI
# (layer 0 and per layer, with RSIM and the MUSE cosine), help-paragraph retrieval and MLM accuracy for the
# Debian continuations; word alignment (every method, sinkhorn_itermax among them, the layer chosen on the
# validation verses) for the Bible's, in the row's own mode and in both fixed modes (separate/cosine and
# joint/dot: `word_alignment_modes`), so the start and every row compare in one mode (issue 49: the H200 run
# scored the start separate/cosine and the TLM + DWA rows joint/dot).
DEBIAN_METRICS = ("bli", "retrieval", "mlm")
BIBLE_METRICS = ("word_alignment", "word_alignment_modes")


@dataclasses.dataclass(frozen=True)
class CacheSpec:
  """A packed cache the bundle writes (`xalign cache`): the task, its splits, rows and row length."""

  task: str
  length: int
  rows: int                       # train rows (the stream's first N: epochs repeat on the host)
  eval_rows: int = 0              # validation rows (MLM accuracy, held-out loss); 0 = no validation split
  links: bool = False             # carry eflomal's link groups (XLM-Align `links`/`union`, SO on links)


@dataclasses.dataclass(frozen=True)
class Family:
  """Experiments that share one budget: steps, batch, row length, learning-rate schedule, seeds."""

  name: str
  cache: str                      # the CacheSpec it trains on
  batch_size: int
  share: float                    # of the training budget (the shares of a grid sum to 1)
  max_steps: int
  min_steps: int
  min_steps_reason: str = ""      # why min_steps (e.g. "2x the README recipe's 1,200 steps")
  bindings: tuple[str, ...] = ()  # gin bindings every experiment of the family gets


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One `python -m flax_xalign.train` run of the grid and what is scored on it."""

  name: str                       # unique; also its MODEL_DIR's folder name
  family: str
  objective: str                  # the row's label
  gin_files: tuple[str, ...]      # files found on the gin search path (gin_configs/)
  bindings: tuple[str, ...] = ()
  start: str = "start"            # "start" (the bundle's weights) or the experiment whose last step it continues
  seed: int = 0
  cost: float = 1.0               # step time relative to the warm-up's step at the same tokens per step
  metrics: tuple[str, ...] = ()   # what its last step is scored on (`evaluation.offline` metric families)


class RowSet:
  """What a grid and a built bundle both answer of their rows: a dataclass with the fields `families`,
  `warmup` and `experiments` (each row with `metrics`)."""

  def family(self, name: str) -> Family:
    return next(f for f in self.families if f.name == name)

  def all_experiments(self) -> tuple:
    return (self.warmup, *self.experiments)

  def metrics(self) -> tuple[str, ...]:
    """Every metric some experiment is scored on (the start row gets all of them)."""
    return tuple(dict.fromkeys(m for e in self.experiments for m in e.metrics))


@dataclasses.dataclass(frozen=True)
class Grid(RowSet):
  name: str
  description: str
  start: str                      # "e5" (e5-small trimmed to the grid's text) or "tiny" (a 4-layer model)
  caches: Mapping[str, CacheSpec]
  suite_sizes: Mapping[str, int | None]  # the evaluation suite's `SuiteSizes` (sentences, pairs, verses, ...)
  warmup: Experiment
  warmup_steps: int
  families: tuple[Family, ...]
  experiments: tuple[Experiment, ...]
  budget_s: float                 # default BUDGET_S: training + scoring, the host's start not included
  measured: "MeasuredBundle | None" = None  # what a built bundle of this grid took (`estimate_bytes`)

  def check(self) -> "Grid":
    names = [e.name for e in self.all_experiments()]
    if len(set(names)) != len(names):
      raise ValueError(f"grid {self.name}: experiment names repeat: {names}")
    known = {"start", *names}
    for e in self.all_experiments():
      if e.start not in known:
        raise ValueError(f"grid {self.name}: {e.name} starts from unknown {e.start!r}")
      if e is not self.warmup and e.family not in {f.name for f in self.families}:
        raise ValueError(f"grid {self.name}: {e.name} has no family {e.family!r}")
    if self.warmup.family != self.families[0].name:  # (it trains on the first family's cache: `tokens_per_step`)
      raise ValueError(f"grid {self.name}: the warm-up's family {self.warmup.family!r} is not the first family")
    if abs(sum(f.share for f in self.families) - 1.0) > 1e-6:
      raise ValueError(f"grid {self.name}: family shares sum to {sum(f.share for f in self.families)}")
    return self


@dataclasses.dataclass(frozen=True)
class MeasuredBundle:
  """Bytes a built bundle of a grid took, per part, and per cached row (ArrayRecord compresses, so a row's
  bytes are measured, not computed): what `estimate_bytes` scales to another number of rows."""

  when: str
  fixed: Mapping[str, int]            # start, assets, suite, wheels
  row_bytes: Mapping[str, float]      # per cache: shard bytes / rows
  split_bytes: int                    # per cached split besides its rows: vocabulary.model + manifest
  total: int                          # the measured bundle's bytes
  rows: Mapping[str, tuple[int, int]]  # per cache: the (train, validation) rows it was measured with


def estimate_bytes(grid: Grid, caches: Mapping[str, CacheSpec] | None = None) -> dict[str, int]:
  """The bundle's bytes per part for `caches` (default the grid's own), from `grid.measured`."""
  m = grid.measured
  if m is None:
    raise ValueError(f"grid {grid.name} has no measured bundle to estimate from")
  caches = grid.caches if caches is None else caches
  parts = dict(m.fixed)
  parts["caches"] = sum(int((c.rows + c.eval_rows) * m.row_bytes[name]) + (2 if c.eval_rows else 1) * m.split_bytes
                        for name, c in caches.items())
  return parts


def plan_steps(grid: Grid, *, warmup_steps_per_s: float, train_budget_s: float,
               safety: float = 0.8) -> dict[str, dict]:
  """Each family's steps from the measured warm-up step rate (module docstring).

  Args:
    grid: a Grid, or the plan a bundle carries (`bundle.Bundle`: the same `families`, `experiments` (the rows
      the warm-up starts, not it) and `caches` fields), which is what the host plans from.
    warmup_steps_per_s: steps per second of the warm-up alone on this card (compile excluded).
    train_budget_s: seconds left for the families' training.
    safety: the fraction of a family's time its steps are planned to fill (the rest absorbs process starts,
      compiles and a cost estimate that was too low).

  Returns:
    {family: {"steps", "seconds", "cost", "capped"}}: "capped" names the bound that decided the steps
    ("max_steps", "min_steps", or "" when the budget did).
  """
  if warmup_steps_per_s <= 0:
    raise ValueError(f"warmup_steps_per_s must be positive, got {warmup_steps_per_s}")
  plan = {}
  for family in grid.families:
    members = [e for e in grid.experiments if e.family == family.name]
    tokens_ratio = tokens_per_step(grid, family.name) / tokens_per_step(grid, None)
    cost = sum(e.cost for e in members) * tokens_ratio  # warm-up steps per family step
    seconds = family.share * train_budget_s * safety
    fit = int(seconds * warmup_steps_per_s / cost) if cost else family.max_steps
    steps, capped = fit, ""
    if fit > family.max_steps:
      steps, capped = family.max_steps, "max_steps"
    if fit < family.min_steps:
      steps, capped = family.min_steps, "min_steps"
    plan[family.name] = {"steps": steps, "seconds": seconds, "cost": cost, "capped": capped}
  return plan


def tokens_per_step(grid: Grid, family: str | None) -> int:
  """Row slots per step of `family` (None: the warm-up's, which runs on the first family's cache); `grid` as
  `plan_steps` takes it."""
  if family is None:
    first = grid.families[0]
    return first.batch_size * grid.caches[first.cache].length
  f = grid.family(family)
  return f.batch_size * grid.caches[f.cache].length


# ---------------------------------------------------------------------------- the grids

# Every experiment: no dropout (the CPU recipes' setting, docs/results/code_switch_debian.md).
COMMON_BINDINGS = ("EncoderConfig.dropout_rate = 0.0", "EncoderConfig.attention_dropout_rate = 0.0")
# The SO recipe (on the gin search path): the one experiments/e5_so_eflomal.gin includes; the grid sets its layer.
SO_LINKS_GIN = "experiments/so_links.gin"
# The builder's tasks file registers the Bible's MLM + TLM tasks under this prefix (`parts.tasks_gin`).
BIBLE_PREFIX = "gpu_bible"
BIBLE_MIX_TASK = f"{BIBLE_PREFIX}_grc_en_mlm_tlm"


def _debian_rows(seeds: Sequence[int], objectives: Sequence[str], *, costs: Mapping[str, float],
                 min_count: int) -> tuple[Experiment, ...]:
  files = {"mlm": ("experiments/code_switch/mlm.gin",), "tcs": ("experiments/code_switch/tcs.gin",),
           "scs": ("experiments/code_switch/scs.gin",), "scs_vocab": ("experiments/code_switch/scs.gin",),
           "gc": ("experiments/mlm_gc/gc.gin",)}
  extra = {"scs_vocab": ("train.objective_options = {'scs': {'candidates': 'vocabulary'}}",)}
  rows = []
  for seed in seeds:
    for objective in objectives:
      bindings = (*extra.get(objective, ()), f"SEED = {seed}")
      if objective != "gc":  # The code-switching files read it (mlm.gin for the language-specific metrics).
        bindings = (f"LANG_VOCAB_MIN_COUNT = {min_count}", *bindings)
      rows.append(Experiment(name=f"debian_{objective}_s{seed}", family="debian", objective=objective,
                             gin_files=files[objective], bindings=bindings, start="warmup", seed=seed,
                             cost=costs[objective], metrics=DEBIAN_METRICS))
  return tuple(rows)


def _bible_rows(*, xlm_align_cost: float, so_cost: float, label_sources: Sequence[str],
                so_layer: int) -> tuple[Experiment, ...]:
  rows = [Experiment(name=f"xlm_align_{source}", family="xlm_align", objective=f"xlm_align_{source}",
                     gin_files=("objectives/xlm_align.gin",),
                     bindings=(f"DwaConfig.label_source = '{source}'",), start="warmup", cost=xlm_align_cost,
                     metrics=BIBLE_METRICS)
          for source in label_sources]
  rows.append(Experiment(name="so_links", family="so", objective="so_links", gin_files=(SO_LINKS_GIN,),
                         bindings=(f"SoConfig.layer = {so_layer}",), start="start", cost=so_cost,
                         metrics=BIBLE_METRICS))
  return tuple(rows)


def _bible_mix_rows(seeds: Sequence[int], *, family: str, mlm_tlm_cost: float,
                    dwa_cost: float) -> tuple[Experiment, ...]:
  """MLM + TLM (the −DWA control) and MLM + TLM + DWA (self labels) from the warm-up, per seed."""
  rows = []
  for seed in seeds:
    rows.append(Experiment(name=f"mlm_tlm_s{seed}", family=family, objective="mlm_tlm",
                           gin_files=("objectives/mlm_tlm.gin",), bindings=(f"SEED = {seed}",), start="warmup",
                           seed=seed, cost=mlm_tlm_cost, metrics=BIBLE_METRICS))
    rows.append(Experiment(name=f"xlm_align_self_s{seed}", family=family, objective="xlm_align_self",
                           gin_files=("objectives/xlm_align.gin",),
                           bindings=("DwaConfig.label_source = 'self'", f"SEED = {seed}"), start="warmup",
                           seed=seed, cost=dwa_cost, metrics=BIBLE_METRICS))
  return tuple(rows)


def _warmup(family: str, *, lr: float) -> Experiment:
  # LANG_VOCAB_MIN_COUNT: mlm.gin names it (MLM itself needs no language vocabulary).
  return Experiment(name="warmup", family=family, objective="head_warmup",
                    gin_files=("experiments/code_switch/mlm.gin",),
                    bindings=("LANG_VOCAB_MIN_COUNT = 5", "OptimizerConfig.trainable = ['mlm_head']",
                              f"OptimizerConfig.learning_rate = {lr}"),
                    start="start", metrics=())


# CPU step times relative to MLM (docs/results/code_switch_debian.md, 60 steps each).
_DEBIAN_COSTS = {"mlm": 1.0, "tcs": 5.9 / 2.9, "scs": 4.6 / 2.9, "scs_vocab": 11.8 / 2.9, "gc": 2.7 / 2.9}

SCIENCE = Grid(
    name="science",
    description="e5-small continued with MLM / TCS / SCS (batch, vocabulary) / MLM-GC on the Debian help "
                "mixture (2 seeds), XLM-Align (self, links, union) and SO on eflomal's links on the Bible",
    start="e5",
    caches={"debian": CacheSpec(task="gpu_debian_mlm", length=128, rows=24_000, eval_rows=512),
            "bible": CacheSpec(task="gpu_bible_linked", length=128, rows=16_000, eval_rows=256, links=True)},
    suite_sizes={"eval_sentences": 100, "retrieval_pairs": 100, "mlm_batches": 8, "mlm_batch_size": 32,
                 "baseline_batches": 100, "bible_pairs": None},
    warmup=_warmup("debian", lr=1e-3),
    warmup_steps=400,
    families=(
        Family(name="debian", cache="debian", batch_size=64, share=0.55, max_steps=4000, min_steps=200,
               bindings=("OptimizerConfig.learning_rate = 5e-5", "OptimizerConfig.warmup_steps = 100")),
        Family(name="xlm_align", cache="bible", batch_size=32, share=0.3, max_steps=6000, min_steps=300,
               bindings=("OptimizerConfig.learning_rate = 2e-4", "OptimizerConfig.warmup_steps = 100")),
        Family(name="so", cache="bible", batch_size=8, share=0.15, max_steps=6000, min_steps=2400,
               min_steps_reason="2x the README recipe's 1,200 steps (issue 37 part 3c)",
               bindings=("OptimizerConfig.learning_rate = 2e-5", "OptimizerConfig.warmup_steps = 20")),
    ),
    experiments=(*_debian_rows((0, 1), ("mlm", "tcs", "scs", "scs_vocab", "gc"), costs=_DEBIAN_COSTS, min_count=5),
                 *_bible_rows(xlm_align_cost=2.5, so_cost=1.5, label_sources=("self", "links", "union"),
                              so_layer=7)),
    budget_s=450.0,
    # `xalign gpu_bundle --grid=science` on 2026-11-27: 50,820,882 bytes (48.5 MiB), the suite then at 200
    # sentences a language (2.87 MB; at today's 100 it is smaller).
    measured=MeasuredBundle(
        when="2026-11-27", total=50_820_882,
        fixed={"start": 19_290_484, "assets": 4_739_820, "suite": 2_868_950, "wheels": 4_555_700, "run.sh": 996},
        row_bytes={"debian": (9_043_968 + 262_144) / (24_000 + 512), "bible": (7_077_888 + 196_608) / (16_000 + 256)},
        split_bytes=694_430 + 1_800, rows={"debian": (24_000, 512), "bible": (16_000, 256)}),
)

SCIENCE_V2 = Grid(
    name="science2",
    description="XLM-Align on the Bible MLM + TLM mixture with its -DWA control (2 seeds), every row and the "
                "start scored in both alignment modes; MLM vs MLM-GC on the Debian help mixture (the same 2 "
                "seeds); SO on eflomal's links",
    start="e5",
    # science's caches and families, but for the mixture: the linked Bible now feeds SO alone (8 rows a step).
    caches={"debian": SCIENCE.caches["debian"],
            "bible_mix": dataclasses.replace(SCIENCE.caches["bible"], task=BIBLE_MIX_TASK, links=False),
            "bible": dataclasses.replace(SCIENCE.caches["bible"], rows=8_000)},
    suite_sizes=SCIENCE.suite_sizes,
    warmup=SCIENCE.warmup,
    warmup_steps=SCIENCE.warmup_steps,
    families=(dataclasses.replace(SCIENCE.family("debian"), share=0.3),
              dataclasses.replace(SCIENCE.family("xlm_align"), name="xlm_align_mix", cache="bible_mix", share=0.5),
              dataclasses.replace(SCIENCE.family("so"), share=0.2)),
    experiments=(*_debian_rows((0, 1), ("mlm", "gc"), costs=_DEBIAN_COSTS, min_count=5),
                 *_bible_mix_rows((0, 1), family="xlm_align_mix", mlm_tlm_cost=1.2, dwa_cost=2.5),
                 *_bible_rows(xlm_align_cost=2.5, so_cost=1.5, label_sources=(), so_layer=7)),
    budget_s=450.0,
    # Not built yet: science's measured bundle, with the mixture's rows assumed to take the linked Bible
    # cache's bytes per row (the same verses in rows of the same length) until a science2 bundle is measured.
    measured=dataclasses.replace(SCIENCE.measured, row_bytes={**SCIENCE.measured.row_bytes,
                                                              "bible_mix": SCIENCE.measured.row_bytes["bible"]}),
)

TINY = Grid(
    name="tiny",
    description="the science grid's machinery in miniature: a 4-layer model, 3 steps per experiment",
    start="tiny",
    caches={"debian": CacheSpec(task="gpu_debian_mlm", length=24, rows=48, eval_rows=8),
            "bible": CacheSpec(task="gpu_bible_linked", length=32, rows=24, eval_rows=0, links=True),
            "bible_mix": CacheSpec(task=BIBLE_MIX_TASK, length=32, rows=24, eval_rows=0)},
    suite_sizes={"eval_sentences": 8, "retrieval_pairs": 10, "mlm_batches": 2, "mlm_batch_size": 2,
                 "baseline_batches": 2, "bible_pairs": 12},
    warmup=_warmup("debian", lr=1e-3),
    warmup_steps=3,
    families=(
        Family(name="debian", cache="debian", batch_size=4, share=0.4, max_steps=3, min_steps=3),
        Family(name="xlm_align", cache="bible", batch_size=4, share=0.3, max_steps=3, min_steps=3),
        Family(name="xlm_align_mix", cache="bible_mix", batch_size=4, share=0.3, max_steps=3, min_steps=3),
    ),
    experiments=(*_debian_rows((0,), ("tcs",), costs=_DEBIAN_COSTS, min_count=1),
                 *_bible_rows(xlm_align_cost=2.5, so_cost=1.5, label_sources=("union",), so_layer=1)[:1],
                 *_bible_mix_rows((0,), family="xlm_align_mix", mlm_tlm_cost=1.2, dwa_cost=2.5)[1:]),
    budget_s=600.0,
)

GRIDS = {g.name: g.check() for g in (SCIENCE, SCIENCE_V2, TINY)}


def grid_named(name: str) -> Grid:
  if name not in GRIDS:
    raise UserError(f"--grid={name!r} is not a grid; choose from {', '.join(sorted(GRIDS))}")
  return GRIDS[name]
