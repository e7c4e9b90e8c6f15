"""Builds a GPU bundle (`xalign gpu_bundle`): one folder that trains AND scores a grid's rows on a host without
TensorFlow, seqio or network (docs/gpu_bundle.md). Run where seqio and TensorFlow are installed; it writes what
the host needs and nothing it can make itself:

  start/     the start weights (`parts.start_weights`)
  caches/    a packed cache per training setting (`training.cache_job`), with the validation rows MLM accuracy reads
  assets/    the assets the host cannot count without seqio (lang_vocab with the pivot, the induced
             dictionaries, the co-occurrence table), an assets build (`xalign assets`) per objective
  suite/     the evaluation inputs as plain files (`flax_xalign.evaluation.offline.suite`)
  wheels/    what the host lacks (gin-config, ...), as CPython 3.12 wheels
  run.sh, bundle.json (`bundle.Bundle`: the plan, every file with its size, each part's size)

The grid is read here and nowhere else: the Bundle carries every row of it, the gin files they read included.
A bundle over `max_mib` is refused with one line naming its biggest part, and no bundle.json is written; it is
assembled in a staging folder beside the output (`folders.staged`), so a refused, failed or interrupted build
leaves an earlier bundle as it was. What needs gin (registering tasks, an assets build) the command hands in
(`GinEdge`): only cli/ parses gin.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import lzma
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu import grids as grids_lib
from flax_xalign.experiments.gpu import parts
from flax_xalign.experiments.gpu.bundle import SUITE_DIR, Bundle, Cache, Row, Start, write_bundle
from flax_xalign.experiments.gpu.folders import (HOST_WORK_COMMAND, MARKER, WORK_COMMAND, BuildOptions, BuildPaths,
                                                 check_paths, staged)
from flax_xalign.experiments.gpu.grids import Grid

MIB = 1 << 20
INTERRUPTED_EXIT = 128 + signal.SIGINT  # errors.interrupted()'s status, after its one line
HOST_PYTHON_TAG = "3.12"
# What the host lacks, pinned: gin for the trainer's flags; grain, array-record for packed caches (ArrayRecord).
HOST_WHEELS = ("gin-config==0.5.0", "grain==0.2.18", "array-record==0.8.6", "portpicker==1.6.0",
               "cloudpickle==3.1.1")
# Asset files the host cannot make without seqio; the vocabulary travels with the caches and the start.
CARRIED_ASSET_FILES = ("lang_vocab.tsv", "induced_dictionary.tsv", "cooc.npz", "cooc.json")
PRETRAIN_GIN = "runs/pretrain.gin"  # every row's first gin file (`runner.train_flags`)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # flax_xalign/
GIN_DIRS = (os.path.join(os.path.dirname(_PACKAGE), "gin_configs"), os.path.join(_PACKAGE, "gin_configs"))


@dataclasses.dataclass(frozen=True)
class GinEdge:
  """What a build runs through gin, which only cli/ parses: the command passes its own functions."""

  register_tasks: parts.TaskRegistrar                  # registers the tasks of a gin file's train.user_tasks
  build_assets: Callable[[Sequence[str]], int]         # `xalign assets` with these flags; its exit status


class NestedInterrupt(Exception):
  """A command run in-process stopped at a Ctrl-C and printed its one line: this one ends with 130, silently."""


def check_nested(code: int, failed: str) -> None:
  """After a command run in-process: 130 (Ctrl-C, its line printed) ends this one the same way; any other
  failure is one UserError, `failed` (what failed) with the exit status."""
  if code == INTERRUPTED_EXIT:
    raise NestedInterrupt(failed)
  if code:
    raise UserError(f"{failed} (exit {code}); see above")


# ---------------------------------------------------------------------------- the bundle's size


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class Budget:
  """Bytes per part; refuses (one line, the biggest part named) once the bundle would pass the limit."""

  def __init__(self, root: str, limit_mib: float):
    self.root = root
    self.limit_mib = limit_mib  # (printed as given: --max_mib=0.01 is not 0)
    self.limit = int(limit_mib * MIB)
    self.parts: dict[str, int] = {}

  def add(self, part: str) -> int:
    size = folder_bytes(os.path.join(self.root, part)) if os.path.isdir(os.path.join(self.root, part)) else (
        os.path.getsize(os.path.join(self.root, part)) if os.path.exists(os.path.join(self.root, part)) else 0)
    self.parts[part] = size
    total = sum(self.parts.values())
    print(f"  {part}: {size / MIB:.2f} MiB (bundle so far {total / MIB:.2f} MiB of {self.limit_mib:g})",
          flush=True)
    if total > self.limit:
      biggest = max(self.parts, key=self.parts.get)
      raise UserError(f"the bundle would be {_mib(total)} MiB, over --max_mib={self.limit_mib:g}; its "
                      f"biggest part is {biggest} ({_mib(self.parts[biggest])} MiB): make it smaller "
                      "(fewer cache rows or suite sentences in the grid)")
    return size


def _mib(size: int) -> str:
  """MiB to one decimal, or to two significant digits below 0.1 MiB (20 KiB is not "0.0 MiB")."""
  return f"{size / MIB:.1f}" if size >= 0.1 * MIB else f"{size / MIB:.2g}"


# ---------------------------------------------------------------------------- the plan


def row_of(e: grids_lib.Experiment, host_start: str) -> Row:
  """A grid's experiment as the bundle's row (its assets key filled once they are built)."""
  bindings = list(e.bindings)
  if e.objective == "tcs":  # The encoder's embeddings after the warm-up are e5's: induce from the start.
    bindings.append(f"train.asset_options = {{'lang_vocab': {{'min_count': %LANG_VOCAB_MIN_COUNT}}, "
                    f"'induced_dictionary': {{'method': 'csls', 'knn': 10, 'refresh_every': 0, "
                    f"'source': '{host_start}'}}}}")
  return Row(name=e.name, family=e.family, objective=e.objective, gin_files=tuple(e.gin_files),
             bindings=tuple(bindings), start=e.start, seed=e.seed, cost=float(e.cost), metrics=tuple(e.metrics),
             assets="")


def gin_texts(names: Sequence[str]) -> dict[str, str]:
  """{name: text} of the gin files `names` (on the gin search path: the checkout's gin_configs/) and of every
  file they include, as the bundle carries them."""
  texts: dict[str, str] = {}
  todo = list(names)
  while todo:
    name = todo.pop(0)
    if name in texts:
      continue
    path = next((os.path.join(d, name) for d in GIN_DIRS if os.path.isfile(os.path.join(d, name))), None)
    if path is None:
      raise UserError(f"gin file {name!r} is not in this checkout's gin_configs/ ({', '.join(GIN_DIRS)})")
    with open(path, encoding="utf-8") as f:
      texts[name] = f.read()
    todo += re.findall(r"^\s*include\s+['\"]([^'\"]+)['\"]", texts[name], re.M)
  return texts


def plan_bundle(grid: Grid, *, start: Start, caches: Mapping[str, Cache], work: str, languages: Sequence[str],
                host_start: str, alignment_peers: Mapping | None = None, created: str = "") -> Bundle:
  """The Bundle of `grid` before its assets are built and its parts measured (no assets keys, no sizes)."""
  rows = tuple(row_of(e, host_start) for e in grid.experiments)
  return Bundle(
      grid=grid.name, budget_s=float(grid.budget_s),
      created=created or datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      work=work, languages=tuple(languages), start=start, caches=dict(caches),
      common_bindings=tuple(grids_lib.COMMON_BINDINGS), families=tuple(grid.families),
      warmup=row_of(grid.warmup, host_start), warmup_steps=grid.warmup_steps, experiments=rows,
      gin=gin_texts([PRETRAIN_GIN, *(g for e in grid.all_experiments() for g in e.gin_files)]),
      alignment_peers=None if alignment_peers is None else dict(alignment_peers), parts={}, bytes=0, files={})


# ---------------------------------------------------------------------------- the parts


def write_caches(grid: Grid, out: str, tasks_file: str, register_tasks: parts.TaskRegistrar) -> dict[str, Cache]:
  """A packed cache (`training.cache_job`) of each of the grid's caches, its train and validation rows; the
  tasks registered from `tasks_file` once the output is checked."""
  from flax_xalign.training import cache_job

  def registered(job: cache_job.CacheJob) -> cache_job.CacheJob:
    register_tasks(tasks_file)
    return job

  caches = {}
  for name, spec in grid.caches.items():
    folder = os.path.join(out, "caches", name)
    job = functools.partial(cache_job.CacheJob, task=spec.task, output=folder, length=spec.length)
    print(f"cache {name}: {spec.task}, {spec.rows} train rows of {spec.length}", flush=True)
    cache_job.write_cache(job(split="train", examples=spec.rows), fill=registered)
    if spec.eval_rows:
      cache_job.write_cache(job(split="validation", examples=spec.eval_rows), fill=registered)
    caches[name] = Cache(task=spec.task, length=spec.length, rows=spec.rows, eval_rows=spec.eval_rows,
                         links=spec.links, path=os.path.relpath(folder, out))
  return caches


def write_assets(plan: Bundle, out: str, work: str, tasks_file: str, host_start: str,
                 build_assets: Callable[[Sequence[str]], int]) -> dict[str, str]:
  """An assets build (`xalign assets`) for each distinct objective of the Debian rows; the carried files go to
  OUT/assets/KEY, xz-compressed. Returns {row name: KEY} of the rows that carry some."""
  from flax_xalign.experiments.gpu.runner import train_flags

  keys: dict[str, str] = {}
  built: dict[str, bool] = {}
  for row in plan.all_experiments():
    key = row.objective
    if row.family != "debian" or row.name == "warmup":
      continue
    if key not in built:
      model_dir = os.path.join(work, "assets", key)
      shutil.rmtree(model_dir, ignore_errors=True)
      flags = train_flags(out, plan, row, model_dir=model_dir, init_dir=host_start, start_dir=host_start, steps=1,
                          cached=False)
      print(f"assets of {key}", flush=True)
      check_nested(build_assets([*flags, f"--gin_file={tasks_file}"]), f"xalign assets for {key} failed")
      kept = [f for f in sorted(os.listdir(model_dir)) if f in CARRIED_ASSET_FILES]
      for f in kept:  # xz: the co-occurrence table's 17 MB carry as 4 (the host unpacks them, byte for byte).
        os.makedirs(os.path.join(out, "assets", key), exist_ok=True)
        with open(os.path.join(model_dir, f), "rb") as src, lzma.open(os.path.join(out, "assets", key, f + ".xz"),
                                                                      "wb", preset=6) as dst:
          shutil.copyfileobj(src, dst, 1 << 20)
      built[key] = bool(kept)
    if built[key]:
      keys[row.name] = key
  return keys


def write_suite(grid: Grid, out: str, *, debian_data: str, languages: Sequence[str], host_start: str) -> None:
  """The evaluation suite every row is scored from (`evaluation.offline.suite.write_suite`)."""
  from flax_xalign.evaluation.offline.suite import SuiteSizes, write_suite as write
  from flax_xalign.runs import Run

  print("evaluation suite", flush=True)
  write(os.path.join(out, SUITE_DIR), Run.open(host_start), debian_data=debian_data,
        languages=list(languages), sizes=SuiteSizes(**grid.suite_sizes),
        progress=lambda line: print(line, flush=True))


def download_wheels(out: str) -> None:
  import subprocess

  target = os.path.join(out, "wheels")
  os.makedirs(target, exist_ok=True)
  argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
          f"--python-version={HOST_PYTHON_TAG}", "-d", target, "--platform", "manylinux2014_x86_64",
          "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", *HOST_WHEELS]
  done = subprocess.run(argv, capture_output=True, text=True, check=False)
  if done.returncode:
    raise UserError(f"pip download of the host's wheels failed ({done.stderr.strip().splitlines()[-1:]}); "
                    "build where the package index can be reached, or pass --wheels=none for a host that has "
                    "them")


RUN_SH = """#!/usr/bin/env bash
# Written by xalign gpu_bundle (grid {grid}): trains and scores the grid on this host, TF-free.
#   bash {rel}/run.sh           (from the repository root; results in $OUT, default ./gpu_out)
# BUDGET_S (default {budget:.0f}): seconds for training + scoring; PARALLEL (default 3): runs at once;
# PYTHON (default python3): the interpreter with jax, flax, optax, orbax, numpy, scipy, sentencepiece.
set -euo pipefail
py="${{PYTHON:-python3}}"
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
root="$(cd "$here/.." && pwd)"
site="${{TMPDIR:-/tmp}}/xalign_gpu_site"
if compgen -G "$here/wheels/*.whl" >/dev/null; then
  "$py" -m pip install --quiet --no-deps --no-index --target="$site" "$here"/wheels/*.whl
fi
export PYTHONPATH="$root:$site${{PYTHONPATH:+:$PYTHONPATH}}"
export OUT="${{OUT:-$root/gpu_out}}" JAX_COMPILATION_CACHE_DIR="${{JAX_COMPILATION_CACHE_DIR:-${{WORK:-{work}}}/jax_cache}}"
cd "$root"
exec "$py" -m flax_xalign.cli.gpu_run "$here" --out="$OUT" "$@"
"""


# ---------------------------------------------------------------------------- the build


def build(options: BuildOptions, edge: GinEdge) -> Bundle:
  """The bundle `options` asks for, in `options.output` (module docstring); UserError before any work for what
  cannot be built."""
  grid = grids_lib.grid_named(options.grid)
  paths = check_paths(options, grid)
  languages = languages_of(options, paths.debian_data)
  print(f"GPU bundle, grid {grid.name}: {grid.description}", flush=True)
  if grid.measured is not None:  # Refused before any work when even the estimate does not fit.
    estimate = grids_lib.estimate_bytes(grid)
    print(f"  estimated {sum(estimate.values()) / MIB:.1f} MiB (from the bundle measured {grid.measured.when})",
          flush=True)
    if sum(estimate.values()) > options.max_mib * MIB:
      biggest = max(estimate, key=estimate.get)
      raise UserError(f"the bundle would be about {sum(estimate.values()) / MIB:.1f} MiB, over --max_mib="
                      f"{options.max_mib:g}; its biggest part is {biggest} ({estimate[biggest] / MIB:.1f} MiB)")
  started = time.monotonic()
  with staged(paths.output) as staging:  # The old bundle is replaced only by a whole one within --max_mib.
    bundle = assemble(options, grid, paths, staging, languages=languages, edge=edge)
  out = paths.output
  rel = os.path.relpath(out, os.getcwd()) if out.startswith(os.getcwd()) else out
  print(f"bundle {out}: {bundle.bytes / MIB:.1f} MiB in {len(bundle.files)} files, built in "
        f"{time.monotonic() - started:.0f} s "
        f"({', '.join(f'{k} {v / MIB:.1f}' for k, v in bundle.parts.items())} MiB). On the host: bash {rel}/run.sh",
        flush=True)
  return bundle


def assemble(options: BuildOptions, grid: Grid, paths: BuildPaths, out: str, *, languages: Sequence[str],
             edge: GinEdge) -> Bundle:
  """The bundle's every part in `out` (the staging folder, renamed to `paths.output` afterwards), bundle.json
  last; refused (UserError) as soon as it passes the size limit."""
  from flax_xalign import fileio

  work, host_work, debian_data = paths.work, paths.host_work, paths.debian_data
  host_start = os.path.join(host_work, "start")
  fileio.mark_new_folder(work, WORK_COMMAND, setting="--work")  # (checked: new, empty or already ours)
  fileio.mark_new_folder(host_work, HOST_WORK_COMMAND, setting="--host_work")
  budget = Budget(out, options.max_mib)

  links = parts.bible_links(paths.bible_links, work)
  start = parts.start_weights(paths.start_dir, grid, out, host_start, work=work, debian_data=debian_data,
                              languages=languages, links=links, register_tasks=edge.register_tasks)
  budget.add("start")
  tasks_file = parts.tasks_gin(os.path.join(work, "tasks.gin"), debian_data=debian_data, languages=languages,
                               links=links, vocabulary=os.path.join(host_start, "vocabulary.model"),
                               bible_prefix=grids_lib.BIBLE_PREFIX)
  caches = write_caches(grid, out, tasks_file, edge.register_tasks)
  budget.add("caches")
  plan = plan_bundle(grid, start=start, caches=caches, work=host_work, languages=languages, host_start=host_start,
                     alignment_peers=parts.alignment_peers(links, verses=grid.suite_sizes.get("bible_pairs")))
  keys = write_assets(plan, out, work, tasks_file, host_start, edge.build_assets)
  plan = dataclasses.replace(plan, experiments=tuple(dataclasses.replace(e, assets=keys.get(e.name, ""))
                                                     for e in plan.experiments))
  budget.add("assets")
  write_suite(grid, out, debian_data=debian_data, languages=languages, host_start=host_start)
  budget.add(SUITE_DIR)
  if options.wheels:
    download_wheels(out)
  budget.add("wheels")
  final = paths.output
  rel = os.path.relpath(final, os.getcwd()) if final.startswith(os.getcwd()) else final
  with open(os.path.join(out, "run.sh"), "w", encoding="utf-8") as f:
    f.write(RUN_SH.format(grid=grid.name, rel=rel, budget=grid.budget_s, work=host_work))
  os.chmod(os.path.join(out, "run.sh"), 0o755)
  budget.add("run.sh")
  files = {os.path.relpath(os.path.join(d, f), out): os.path.getsize(os.path.join(d, f))
           for d, _, names in os.walk(out) for f in names if f != MARKER}
  bundle = dataclasses.replace(plan, parts=dict(budget.parts), bytes=sum(budget.parts.values()), files=files)
  write_bundle(out, bundle)
  return bundle


def languages_of(options: BuildOptions, debian_data: str) -> list[str]:
  """The Debian languages the build trains on: those asked for, else the grid's the Debian build has."""
  from flax_xalign.tasks import debian as debian_tasks

  built = debian_tasks._built_languages(debian_data)
  wanted = list(options.languages) or [x for x in grids_lib.DEBIAN_LANGUAGES if x in built]
  missing = [x for x in wanted if x not in built]
  if missing or not wanted:
    raise UserError(f"--debian_data {options.debian_data} has no help text for {missing or wanted} "
                    f"(it has {sorted(built)}); rebuild it with `xalign debian_data --languages=...`")
  return wanted
