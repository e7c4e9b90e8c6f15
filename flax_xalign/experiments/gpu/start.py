"""A bundle's start weights on the host: WORK/start, made once from the carried form and marked with its
fingerprint (`make_start`); reused only when that mark says it was made from this bundle's (`reusable_start`).

The builder makes the same MODEL_DIR in its host work folder (`builder.start_weights`), from the carried form,
so the assets and the suite it builds are the host's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu.bundle import START_KINDS, Bundle

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


def reusable_start(bundle_dir: str, bundle: Bundle, work: str) -> bool:
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
  source = os.path.join(bundle_dir, bundle.start.path)
  if made_from == start_fingerprint(source, bundle.start.kind):
    if os.path.isdir(os.path.join(target, "checkpoints")):
      return True
    why = "made from this bundle's start weights, but its checkpoints/ are gone"
  elif isinstance(made_from, dict):
    why = "made from another bundle's start weights"
  else:
    why = f"not made by gpu_run from a bundle: it has no readable {START_MARK}"
  raise UserError(f"the work folder {work} holds start weights that are not this bundle's: {target} was {why}; "
                  f"choose a fresh --work, or remove {target} to have it made again from {bundle_dir}")


def start_weights(bundle_dir: str, bundle: Bundle, work: str) -> str:
  """WORK/start: the bundle's start weights as a MODEL_DIR (made once; reused when made from them)."""
  target = os.path.join(work, "start")
  if not reusable_start(bundle_dir, bundle, work):
    os.makedirs(work, exist_ok=True)
    make_start(os.path.join(bundle_dir, bundle.start.path), bundle.start.kind, target)
  return target
