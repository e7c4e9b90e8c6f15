"""What `xalign gpu_run` reads of a GPU bundle, each part checked before any work (the 2026-12-01 review's R04-R26).

bundle.json is read whole and every file it lists checked for presence and size (`read_bundle`); every field
the grid is run from is checked against the shape `gpu_bundle.build` writes (`BUNDLE_SHAPE`, `check_bundle`).
The bundle's start weights become WORK/start, marked with their fingerprint (`make_start`), and a WORK/start
is reused only when that mark says it was made from this bundle's (`reusable_start`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Mapping
from typing import Any

from flax_xalign.errors import UserError

BUNDLE_FILE = "bundle.json"
SUITE_DIR = "suite"  # The bundle's evaluation suite (`evaluation.offline.suite.write_suite`).
REMAKE = "carry the whole bundle again, or rebuild it with `xalign gpu_bundle --grid=NAME --output=DIR`"
START_KINDS = ("model_dir", "e5_q4")
_NUMBER = (int, float)
# bundle.json's shape, as `gpu_bundle.build` writes it. A spec is a type (or a tuple of types), [spec] (a list
# of them), {str: spec} (any names to them) or a dict of a record's fields (a field ending in "?" may be absent).
_EXPERIMENT = {"name": str, "family": str, "objective": str, "start": str, "gin_files": [str], "bindings": [str],
               "seed?": int, "cost?": _NUMBER, "metrics?": [str], "assets?": str}
BUNDLE_SHAPE = {
    "grid": str, "budget_s": _NUMBER, "work": str, "created": str, "bytes": int, "parts": {str: int},
    "files": {str: int}, "start": {"kind": str, "path": str}, "common_bindings": [str],
    "caches": {str: {"task": str, "length": int, "path": str, "eval_rows?": int}},
    "families": {str: {"cache": str, "batch_size": int, "bindings": [str]}},
    "experiments": [_EXPERIMENT], "alignment_peers?": (dict, type(None)),
}
_JSON_KINDS = ((bool, "true or false"), (int, "a whole number"), (float, "a number"), (str, "a text"),
               (list, "a list"), (dict, "an object"), (type(None), "null"))


def _kind(types: tuple[type, ...]) -> str:
  return " or ".join(name for kind, name in _JSON_KINDS if kind in types and not (kind is int and float in types))


def shape_problem(value: Any, spec: Any, where: str = "") -> str | None:
  """Where a JSON value departs from `spec` (see BUNDLE_SHAPE), e.g. 'experiments[2].bindings is a text, not a
  list'; None when it fits."""
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
  types = spec if isinstance(spec, tuple) else (spec,)
  if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
    return f"{where} is {_kind((type(value),))}, not {_kind(types)}"
  return None


def read_bundle(path: str) -> dict[str, Any]:
  """bundle.json of the bundle at `path`, every file it lists checked for presence and size (UserError);
  `check_bundle` checks the rest of it."""
  manifest_path = os.path.join(path, BUNDLE_FILE)
  if not os.path.isfile(manifest_path):
    raise UserError(f"{path} is not a GPU bundle (no {BUNDLE_FILE}); make one with "
                    "`xalign gpu_bundle --grid=NAME --output=DIR`")
  try:
    with open(manifest_path, encoding="utf-8") as f:
      bundle = json.load(f)
  except ValueError as e:  # Not JSON (a copy cut short), or not UTF-8.
    raise UserError(f"{manifest_path} is not a whole JSON file ({e}): the copy is cut short or damaged; "
                    f"{REMAKE}") from None
  problem = shape_problem(bundle, {"files": {str: int}})
  if problem is None:
    problem = next((f"files names {rel!r}, outside the bundle" for rel in bundle["files"]
                    if os.path.isabs(rel) or ".." in rel.split("/")), None)
  if problem:
    raise UserError(f"{manifest_path} is damaged or from another version: {problem}; {REMAKE}")
  for rel, size in bundle["files"].items():
    full = os.path.join(path, rel)
    if not os.path.isfile(full) or os.path.getsize(full) != size:
      have = os.path.getsize(full) if os.path.isfile(full) else "missing"
      raise UserError(f"bundle file {rel} is damaged ({have} bytes, the bundle wrote {size}); "
                      "carry the whole bundle again")
  return bundle


def check_bundle(path: str, bundle: Mapping[str, Any]) -> Any:
  """The grid (`gpu_grids.Grid`) of a bundle read by `read_bundle`, once every field it is run from has its
  shape and names what it should (UserError naming bundle.json's field)."""
  from flax_xalign.cli.experiments import gpu_grids

  manifest = os.path.join(path, BUNDLE_FILE)
  problem = shape_problem(bundle, BUNDLE_SHAPE)
  if problem:
    raise UserError(f"{manifest} is damaged or from another version: {problem}; {REMAKE}")
  if bundle["grid"] not in gpu_grids.GRIDS:
    raise UserError(f"{manifest}'s grid {bundle['grid']!r} is not a grid of this checkout (it has "
                    f"{', '.join(sorted(gpu_grids.GRIDS))}): the file was edited or the bundle comes from another "
                    f"version; {REMAKE}")
  kind = bundle["start"]["kind"]
  if kind not in START_KINDS:
    raise UserError(f"{manifest}'s start kind {kind!r} is unknown to this checkout (it knows "
                    f"{', '.join(START_KINDS)}); rebuild the bundle with this checkout's `xalign gpu_bundle`")
  grid = gpu_grids.GRIDS[bundle["grid"]]
  names = [e["name"] for e in bundle["experiments"]]
  problems = []
  if not (math.isfinite(bundle["budget_s"]) and bundle["budget_s"] > 0):
    problems.append(f"{manifest}'s budget_s is {bundle['budget_s']!r}, not a number of seconds above 0")
  inside = [("start.path", bundle["start"]["path"])]
  inside += [(f"caches.{name}.path", cache["path"]) for name, cache in bundle["caches"].items()]
  problems += [f"{manifest}'s {field} {rel!r} is not in the bundle" for field, rel in inside
               if os.path.isabs(rel) or ".." in rel.split("/") or not os.path.exists(os.path.join(path, rel))]
  problems += [f"{manifest} lists experiment {n!r} twice" for n in sorted({n for n in names if names.count(n) > 1})]
  problems += [f"{manifest} lacks grid {grid.name}'s experiment {e.name!r}" for e in grid.all_experiments()
               if e.name not in names]
  problems += [f"{manifest} lacks grid {grid.name}'s family {f.name!r}" for f in grid.families
               if f.name not in bundle["families"]]
  problems += [f"{manifest}'s experiment {e['name']!r} names the unknown family {e['family']!r}"
               for e in bundle["experiments"] if e["family"] not in bundle["families"]]
  problems += [f"{manifest}'s experiment {e['name']!r} starts from the unknown {e['start']!r}"
               for e in bundle["experiments"] if e["start"] not in ("start", *names)]
  problems += [f"{manifest}'s family {name!r} names the unknown cache {f['cache']!r}"
               for name, f in bundle["families"].items() if f["cache"] not in bundle["caches"]]
  if problems:
    raise UserError(f"{problems[0]}; {REMAKE}")
  return grid


# ---------------------------------------------------------------------------- the start weights


START_MARK = "gpu_run_start.json"  # In WORK/start: the start weights it was made from (`start_fingerprint`).


def start_fingerprint(source: str, kind: str) -> dict[str, str]:
  """What the bundle's start weights at `source` (a file or a folder) are: their kind and the sha256 of their
  files (each one's name, size and bytes, in name order)."""
  digest = hashlib.sha256()
  paths = [source] if os.path.isfile(source) else sorted(
      os.path.join(folder, name) for folder, _, names in os.walk(source) for name in names)
  for path in paths:
    digest.update(f"{os.path.relpath(path, source)}\0{os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
      while block := f.read(1 << 20):
        digest.update(block)
  return {"kind": kind, "sha256": digest.hexdigest()}


def make_start(source: str, kind: str, target: str) -> None:
  """The MODEL_DIR `target` from the bundle's start weights at `source` (a folder or e5's trimmed source),
  marked with their fingerprint (START_MARK) so that a later call knows it for theirs."""
  if kind not in START_KINDS:
    raise UserError(f"bundle start kind {kind!r} is unknown to this checkout; rebuild the bundle")
  scratch = target.rstrip("/") + ".partial"
  shutil.rmtree(scratch, ignore_errors=True)
  if kind == "model_dir":
    shutil.copytree(source, scratch)
  else:
    from flax_xalign.interop import e5_trimmed

    e5_trimmed.import_trimmed_source(source, scratch)
  with open(os.path.join(scratch, START_MARK), "w", encoding="utf-8") as f:
    json.dump(start_fingerprint(source, kind), f)
  os.replace(scratch, target)


def reusable_start(bundle_dir: str, bundle: Mapping[str, Any], work: str) -> bool:
  """Whether WORK/start is there and was made from this bundle's start weights (False: not there yet).

  Raises:
    UserError: WORK/start holds something else: another bundle's start, one of another kind, or a folder
      `make_start` did not write; it is never used, nor removed, for this bundle.
  """
  target = os.path.join(work, "start")
  if not os.path.lexists(target):
    return False
  try:
    with open(os.path.join(target, START_MARK), encoding="utf-8") as f:
      made_from = json.load(f)
  except (OSError, ValueError):
    made_from = None
  source = os.path.join(bundle_dir, bundle["start"]["path"])
  if made_from == start_fingerprint(source, bundle["start"]["kind"]):
    if os.path.isdir(os.path.join(target, "checkpoints")):
      return True
    why = "made from this bundle's start weights, but its checkpoints/ are gone"
  elif isinstance(made_from, dict):
    why = "made from another bundle's start weights"
  else:
    why = f"not made by gpu_run from a bundle: it has no readable {START_MARK}"
  raise UserError(f"the work folder {work} holds start weights that are not this bundle's: {target} was {why}; "
                  f"choose a fresh --work, or remove {target} to have it made again from {bundle_dir}")


def start_weights(bundle_dir: str, bundle: Mapping[str, Any], work: str) -> str:
  """WORK/start: the bundle's start weights as a MODEL_DIR (made once; reused when made from them)."""
  target = os.path.join(work, "start")
  if not reusable_start(bundle_dir, bundle, work):
    os.makedirs(work, exist_ok=True)
    make_start(os.path.join(bundle_dir, bundle["start"]["path"]), bundle["start"]["kind"], target)
  return target
