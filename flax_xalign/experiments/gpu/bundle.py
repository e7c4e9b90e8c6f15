"""A GPU bundle's plan and parts as one frozen, typed record (`Bundle`), and bundle.json, the file that holds it.

The builder (`builder`) makes a Bundle from a grid (`grids`) and writes it with `write_bundle`; the host reads
it back with `read_bundle` and runs what it says (`runner`): every row's objective, gin files and bindings, its
family's batch, cache, budget share and step bounds, the warm-up's steps, the seeds, what each row is scored
on, and the parts with their sizes. Those two functions are the only ones that write or read the file: its
schema is the dataclasses below (bundle.json is `dataclasses.asdict(bundle)` beside `format` and `version`).

`read_bundle` checks everything before any work (the 2026-12-01 review's R04-R26): the file is whole JSON of
this version (another version, or none, is refused in one line naming the rebuild command), every file it
lists is there with its size, every field has its type (`shape_problem`, from the dataclasses' annotations:
`BUNDLE_SHAPE`) and names what it should (a family, a cache, a start, a path inside the bundle).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from collections.abc import Mapping
from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu.grids import Family, RowSet

BUNDLE_FILE = "bundle.json"
SUITE_DIR = "suite"  # The bundle's evaluation suite (`evaluation.offline.suite.write_suite`).
FORMAT = "flax_xalign.gpu_bundle"
# bundle.json's schema. 1: the dicts gpu_run read by key, the rows run from the checkout's grid; 2: the Bundle.
VERSION = 2
REBUILD = "xalign gpu_bundle --grid=NAME --output=DIR"
REMAKE = f"carry the whole bundle again, or rebuild it with `{REBUILD}`"
START_KINDS = ("model_dir", "e5_q4")


@dataclasses.dataclass(frozen=True)
class Start:
  """The start weights as carried: a MODEL_DIR (`model_dir`) or e5-small's trimmed Q4_0 source (`e5_q4`)."""

  kind: str
  path: str  # inside the bundle


@dataclasses.dataclass(frozen=True)
class Cache:
  """A packed cache the bundle carries (`xalign cache`'s folder, one subfolder a split)."""

  task: str
  length: int
  rows: int       # train rows
  eval_rows: int  # validation rows; 0: no validation split
  links: bool     # the rows carry eflomal's link groups
  path: str       # inside the bundle


@dataclasses.dataclass(frozen=True)
class Row:
  """One `python -m flax_xalign.train` run of the bundle and what its last step is scored on."""

  name: str                   # unique; its MODEL_DIR's folder name on the host
  family: str                 # the Family whose batch, cache, schedule and steps it trains with
  objective: str              # the row's label in results.json
  gin_files: tuple[str, ...]  # on the gin search path; their text is the bundle's `gin`
  bindings: tuple[str, ...]   # after the family's: they win
  start: str                  # "start" (the bundle's weights) or the row whose last step it continues
  seed: int
  cost: float                 # step time relative to the warm-up's step at the same tokens per step
  metrics: tuple[str, ...]    # `evaluation.offline` metric families
  assets: str                 # the folder under assets/ of its prebuilt asset files; "": none


@dataclasses.dataclass(frozen=True)
class Bundle(RowSet):
  """Everything the host runs and reports, as built (module docstring)."""

  grid: str                       # the grid's name: a label (the host runs the rows below, not the grid)
  budget_s: float                 # default BUDGET_S
  created: str
  work: str                       # the host work folder it was built for (the induced dictionaries name it)
  languages: tuple[str, ...]      # the Debian languages besides English
  start: Start
  caches: Mapping[str, Cache]
  common_bindings: tuple[str, ...]
  families: tuple[Family, ...]    # in the grid's order; the warm-up trains with the first one's
  warmup: Row                     # the MLM head alone; trains before the others and sizes their steps
  warmup_steps: int
  experiments: tuple[Row, ...]    # every other row, in the grid's order
  gin: Mapping[str, str]          # {gin file name: its text}: every file the rows read, as built
  alignment_peers: Mapping[str, Any] | None  # eflomal's and the diagonal's AER on the suite's test verses
  parts: Mapping[str, int]        # bytes per part (start, caches, assets, suite, wheels, run.sh)
  bytes: int
  files: Mapping[str, int]        # every file of the bundle but bundle.json, with its size


# ---------------------------------------------------------------------------- the shape of bundle.json

_NUMBER = (int, float)
_JSON_KINDS = ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "a text"),
               (list, "a list"), (dict, "an object"), (type(None), "null"))


def _spec(annotation: Any) -> Any:
  """The `shape_problem` spec of a field's type: a type (or tuple of types), [spec], {str: spec} or a record."""
  origin, args = typing.get_origin(annotation), typing.get_args(annotation)
  if dataclasses.is_dataclass(annotation):
    hints = typing.get_type_hints(annotation)
    return {f.name: _spec(hints[f.name]) for f in dataclasses.fields(annotation)}
  if origin is tuple:
    return [_spec(args[0])]
  if origin in (Mapping, dict):
    return {str: _spec(args[1])}
  if origin in (typing.Union, types.UnionType):  # `X | None`: only an object's contents go unchecked
    return (dict, type(None))
  if annotation is float:
    return _NUMBER
  return object if annotation is Any else annotation


BUNDLE_SHAPE = {"format": str, "version": int, **_spec(Bundle)}


def _kind(types_: tuple[type, ...]) -> str:
  return " or ".join(name for kind, name in _JSON_KINDS if kind in types_ and not (kind is int and float in types_))


def shape_problem(value: Any, spec: Any, where: str = "") -> str | None:
  """Where a JSON value departs from `spec` (see BUNDLE_SHAPE), e.g. 'experiments[2].bindings is a text, not a
  list'; None when it fits. A spec is a type (or a tuple of types), [spec] (a list of them), {str: spec} (any
  names to them) or a dict of a record's fields (a field ending in "?" may be absent)."""
  if isinstance(spec, list) or isinstance(spec, dict):
    if not isinstance(value, type(spec)):
      return f"{where or 'the file'} is {_kind((type(value),))}, not {_kind((type(spec),))}"
    if isinstance(spec, list):
      items = ((f"{where}[{i}]", v, spec[0]) for i, v in enumerate(value))
    elif set(spec) == {str}:
      items = ((f"{where}.{k}" if where else k, v, spec[str]) for k, v in value.items())
    else:
      missing = [f for f in spec if not f.endswith("?") and f not in value]
      if missing:
        return f"{where + '.' if where else ''}{missing[0]} is missing"
      items = ((f"{where}.{f.rstrip('?')}" if where else f.rstrip("?"), value[f.rstrip("?")], inner)
               for f, inner in spec.items() if f.rstrip("?") in value)
    return next((p for w, v, inner in items if (p := shape_problem(v, inner, w))), None)
  types_ = spec if isinstance(spec, tuple) else (spec,)
  if not isinstance(value, types_) or (isinstance(value, bool) and bool not in types_):
    return f"{where} is {_kind((type(value),))}, not {_kind(types_)}"
  return None


def _typed(annotation: Any, value: Any) -> Any:
  """The JSON `value` (of `_spec(annotation)`'s shape) as `annotation`: records, tuples, floats."""
  origin, args = typing.get_origin(annotation), typing.get_args(annotation)
  if dataclasses.is_dataclass(annotation):
    hints = typing.get_type_hints(annotation)
    return annotation(**{f.name: _typed(hints[f.name], value[f.name]) for f in dataclasses.fields(annotation)})
  if origin is tuple:
    return tuple(_typed(args[0], v) for v in value)
  if origin in (Mapping, dict):
    return {k: _typed(args[1], v) for k, v in value.items()}
  return float(value) if annotation is float else value


# ---------------------------------------------------------------------------- the one pair


def write_bundle(folder: str, bundle: Bundle) -> str:
  """FOLDER/bundle.json holding `bundle` (replaced whole); its path."""
  from flax_xalign.fileio import write_atomically

  path = os.path.join(folder, BUNDLE_FILE)
  write_atomically(path, json.dumps({"format": FORMAT, "version": VERSION, **dataclasses.asdict(bundle)},
                                    indent=1, sort_keys=True))
  return path


def read_bundle(path: str) -> Bundle:
  """The Bundle of the bundle folder `path`, every part of it checked (module docstring; UserError, one line)."""
  manifest = os.path.join(path, BUNDLE_FILE)
  if not os.path.isfile(manifest):
    raise UserError(f"{path} is not a GPU bundle (no {BUNDLE_FILE}); make one with `{REBUILD}`")
  try:
    with open(manifest, encoding="utf-8") as f:
      raw = json.load(f)
  except ValueError as e:  # Not JSON (a copy cut short), or not UTF-8.
    raise UserError(f"{manifest} is not a whole JSON file ({e}): the copy is cut short or damaged; {REMAKE}") from None
  if isinstance(raw, dict) and (raw.get("format"), raw.get("version")) != (FORMAT, VERSION):
    _refuse_version(path, manifest, raw)
  problem = shape_problem(raw, {"files": {str: int}})
  if problem is None:
    problem = next((f"files names {rel!r}, outside the bundle" for rel in raw["files"] if _outside(rel)), None)
  if problem:
    raise UserError(f"{manifest} is damaged or from another version: {problem}; {REMAKE}")
  for rel, size in raw["files"].items():
    full = os.path.join(path, rel)
    if not os.path.isfile(full) or os.path.getsize(full) != size:
      have = os.path.getsize(full) if os.path.isfile(full) else "missing"
      raise UserError(f"bundle file {rel} is damaged ({have} bytes, the bundle wrote {size}); "
                      "carry the whole bundle again")
  problem = shape_problem(raw, BUNDLE_SHAPE)
  if problem:
    raise UserError(f"{manifest} is damaged or from another version: {problem}; {REMAKE}")
  if not (math.isfinite(raw["budget_s"]) and raw["budget_s"] > 0):
    raise UserError(f"{manifest}'s budget_s is {raw['budget_s']!r}, not a number of seconds above 0; {REMAKE}")
  bundle = _typed(Bundle, {k: v for k, v in raw.items() if k not in ("format", "version")})
  _check_names(path, manifest, bundle)
  return bundle


def _refuse_version(path: str, manifest: str, raw: Mapping[str, Any]) -> None:
  version = raw.get("version") if raw.get("format") in (FORMAT, None) else None
  grid = raw.get("grid") if isinstance(raw.get("grid"), str) and raw.get("grid", "").isidentifier() else "NAME"
  made = f"version {version!r}" if version is not None else "no version (an older xalign gpu_bundle's)"
  raise UserError(f"{manifest} is a GPU bundle of {made}, and this checkout reads version {VERSION}: rebuild it "
                  f"with `xalign gpu_bundle --grid={grid} --output={path}`")


def _outside(rel: str) -> bool:
  return os.path.isabs(rel) or ".." in rel.split("/")


def _check_names(path: str, manifest: str, bundle: Bundle) -> None:
  """Refuses (UserError naming bundle.json's field) a name or value no part of the bundle answers to."""
  from flax_xalign.experiments.gpu.grids import GRIDS

  if bundle.grid not in GRIDS:  # (a name only: the rows run are the bundle's own)
    raise UserError(f"{manifest}'s grid {bundle.grid!r} is not a grid of this checkout (it has "
                    f"{', '.join(sorted(GRIDS))}): the file was edited or the bundle comes from another "
                    f"version; {REMAKE}")
  if bundle.start.kind not in START_KINDS:
    raise UserError(f"{manifest}'s start kind {bundle.start.kind!r} is unknown to this checkout (it knows "
                    f"{', '.join(START_KINDS)}); rebuild the bundle with this checkout's `xalign gpu_bundle`")
  rows = bundle.all_experiments()
  names = [e.name for e in rows]
  families = [f.name for f in bundle.families]
  inside = [("start.path", bundle.start.path), *((f"caches.{n}.path", c.path) for n, c in bundle.caches.items())]
  problems = [f"{manifest}'s {field} {rel!r} is not in the bundle" for field, rel in inside
               if _outside(rel) or not os.path.exists(os.path.join(path, rel))]
  problems += [f"{manifest} lists experiment {n!r} twice" for n in sorted({n for n in names if names.count(n) > 1})]
  problems += [f"{manifest} lists family {n!r} twice" for n in sorted({n for n in families if families.count(n) > 1})]
  problems += [f"{manifest}'s experiment {e.name!r} names the unknown family {e.family!r}"
               for e in rows if e.family not in families]
  problems += [f"{manifest}'s experiment {e.name!r} starts from the unknown {e.start!r}"
               for e in rows if e.start not in ("start", *names)]
  problems += [f"{manifest}'s family {f.name!r} names the unknown cache {f.cache!r}"
               for f in bundle.families if f.cache not in bundle.caches]
  problems += [f"{manifest}'s experiment {e.name!r} reads the gin file {g!r}, which the bundle does not carry"
               for e in rows for g in e.gin_files if g not in bundle.gin]
  if not families:
    problems.append(f"{manifest} names no family")
  elif bundle.warmup.family != families[0]:
    problems.append(f"{manifest}'s warm-up trains with family {bundle.warmup.family!r}, not the first, "
                    f"{families[0]!r}")
  if problems:
    raise UserError(f"{problems[0]}; {REMAKE}")


def listed_files(folder: str) -> set[str]:
  """The files FOLDER/bundle.json lists, of a bundle of any version (what `--overwrite` may remove).

  Raises OSError, ValueError, KeyError or TypeError for a file that cannot say."""
  with open(os.path.join(folder, BUNDLE_FILE), encoding="utf-8") as f:
    return set(json.load(f)["files"])
