"""The aligner's settings when the user leaves them out: what the model was trained for.

A sentence encoder imported as is (multilingual-e5, an HF BERT) aligns ~20 AER
points better with each side encoded alone and cosine similarity (SimAlign's
way) than with the pair in one attention segment and dot products
(XLM-Align's way), and a vocabulary trimmed from stripped Greek needs the same
stripping at alignment time. The run manifest knows both, so nobody should
have to:

* `encoding` and `similarity`: a run (or the run it was warm-started from,
  followed through `init_from_checkpoint` while that folder exists) that
  trained DWA aligns the way DWA self-labelled (`DwaConfig.self_label_encoding`
  and its solver's similarity); one that trained SO (awesome-align's
  objective, each side alone) "separate" with cosine (which aligned its
  runs at least as well as dot products); one that trained TLM saw joint
  pairs, so "joint" with dot products; anything else "separate" with cosine.
* `normalize`: the normaliser the training tasks applied (their recorded
  definitions), or the one an imported vocabulary was trimmed with
  (`origin.json`'s `normalizers`), else none.

Every setting a user passes wins; `AlignerDefaults.describe()` is the line the
commands print so the choice is never silent.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from flax_xalign import storage
from flax_xalign.run_spec import RunSpec

# Objectives that put both sides of a pair into one attention segment.
JOINT_PAIR_OBJECTIVES = ("tlm", "dwa")
_MAX_LINEAGE = 8


@dataclasses.dataclass(frozen=True)
class AlignerDefaults:
  """Resolved aligner settings and where each came from.

  Attributes:
    normalize: text normaliser name ("" = none).
    encoding: "joint" or "separate".
    similarity: "dot" or "cosine".
    sources: setting -> "flag" (the user passed it) or the model's reason.
  """

  normalize: str
  encoding: str
  similarity: str
  sources: Mapping[str, str]

  def describe(self) -> str:
    """One line naming each setting and why it was chosen."""
    groups: dict[str, list[str]] = {}  # Settings that share a reason are named together.
    for name in ("encoding", "similarity", "normalize"):
      source = self.sources[name]
      groups.setdefault("as passed" if source == "flag" else source, []).append(
          f"{name}={getattr(self, name) or 'none'}")
    return "aligner settings: " + "; ".join(f"{', '.join(names)} ({why})" for why, names in groups.items())


def _origin(model_dir: str) -> dict[str, Any] | None:
  from flax_xalign.run_dir import RunDir

  path = RunDir(model_dir).origin
  if not storage.isfile(path):
    return None
  try:
    return json.loads(storage.read_text(path))
  except (OSError, ValueError):
    return None  # Only a hint for defaults; the run itself is read elsewhere.


def _identity(path: str) -> str:
  """What tells two names of one run apart from two runs: symlinks followed locally, a URL as written."""
  return storage.absolute(path) if storage.is_url(path) else os.path.realpath(path)


def lineage(run: Any) -> list[tuple[str, RunSpec]]:
  """(MODEL_DIR, manifest) of `run` (a `runs.Run`) at its step, then of each warm-start source that still exists.

  A source is read at its latest step: the manifest records its folder, not
  the step the warm start took.
  """
  from flax_xalign.runs.checkpoints import read_run_spec

  chain, seen = [(run.path, run.spec)], {_identity(run.path)}
  while len(chain) < _MAX_LINEAGE:
    source = chain[-1][1].init_from_checkpoint
    if not source or not storage.isdir(source) or _identity(source) in seen:
      break
    seen.add(_identity(source))
    try:
      chain.append((source, read_run_spec(source)[1]))
    except Exception:  # noqa: BLE001 - an unreadable source only ends the hints.
      break
  return chain


def _task_normalizers(run: RunSpec) -> set[str]:
  found = set()
  for definition in run.task_definitions or ():
    args = definition.get("args", {}) if isinstance(definition, Mapping) else {}
    if isinstance(args, Mapping) and args.get("normalize"):
      found.add(str(args["normalize"]))
  return found


def _model_normalize(chain: list[tuple[str, RunSpec]]) -> tuple[str, str]:
  for model_dir, run in chain:
    found = _task_normalizers(run)
    if len(found) == 1:
      (name,) = found
      return name, f"the training tasks of {model_dir} normalise with it"
    if len(found) > 1:
      return "", f"the training tasks of {model_dir} use several normalisers ({', '.join(sorted(found))})"
    origin = _origin(model_dir) or {}
    trimmed = [n for n in origin.get("normalizers", ()) if n]
    if len(trimmed) == 1:
      return trimmed[0], f"the vocabulary of {model_dir} was trimmed with it (origin.json)"
  return "", "no normaliser recorded in the run"


def _model_encoding(chain: list[tuple[str, RunSpec]]) -> tuple[str, str, str]:
  """(encoding, similarity, reason)."""
  for model_dir, run in chain:
    if "dwa" in run.objectives:
      options = dict(run.objective_options.get("dwa", {}))
      encoding = options.get("self_label_encoding", "joint")
      similarity = dict(options.get("solver", {})).get("similarity", "dot")
      return encoding, similarity, f"as DWA self-labelled in {model_dir}"
    if "so" in run.objectives:  # awesome-align's objective trains each side encoded alone.
      return "separate", "cosine", f"as SO trained in {model_dir} (each side encoded alone)"
    if any(name in run.objectives for name in JOINT_PAIR_OBJECTIVES):
      return "joint", "dot", f"{model_dir} trained on joint pairs (TLM)"
  return "separate", "cosine", "never trained on joint pairs (no TLM/DWA in the run or its warm start): SimAlign's way"


def resolve(run: Any, *, normalize: str | None = None, encoding: str | None = None,
            similarity: str | None = None, pair_layout: str = "restart") -> AlignerDefaults:
  """The settings to align with: each passed value, else the model's default.

  Args:
    run: a `runs.Run`: its manifest at the opened step, its `origin.json`
      and its warm-start chain are read.
    normalize, encoding, similarity: what the user passed; None = follow the model.
    pair_layout: the layout the aligner will use; "continuous" has no separate encoding.
  """
  chain = lineage(run)
  sources = {}
  if normalize is None:
    normalize, sources["normalize"] = _model_normalize(chain)
  else:
    sources["normalize"] = "flag"
  model_encoding, model_similarity, why = _model_encoding(chain)
  if pair_layout == "continuous" and model_encoding == "separate":
    model_encoding, model_similarity, why = "joint", "dot", "the continuous pair layout encodes pairs jointly"
  if encoding is None:
    encoding, sources["encoding"] = model_encoding, why
  else:
    sources["encoding"] = "flag"
  if similarity is None:
    if sources["encoding"] == "flag" and encoding != model_encoding:
      model_similarity, why = ("cosine", "separate encoding: SimAlign's") if encoding == "separate" else (
          "dot", "joint encoding: XLM-Align's")
    similarity, sources["similarity"] = model_similarity, why
  else:
    sources["similarity"] = "flag"
  return AlignerDefaults(normalize=normalize, encoding=encoding, similarity=similarity, sources=sources)
