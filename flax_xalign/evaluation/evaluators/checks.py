"""Checking an evaluator's option values before anything runs (no run needed).

`registry.plan` calls `check_values` for every entry of EVALS / TRAIN_EVALS:
each option's value against the type its evaluator declares (the annotation
of the constructor, evaluation function or options dataclass), layer numbers
against the model when its size is known, and the files an evaluator reads
(gold links, pairs, lexicons) for existence. So `eval` stops before opening
the run and `train` before MODEL_DIR is created, with one line naming the
option and the fix, instead of a traceback after minutes of work.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign import fileio
from flax_xalign.errors import UserError

LAYER_OPTIONS = ("layer", "layers")


def _where(entry: str, key: str, setting: str) -> str:
  return f"{setting}[{entry!r}][{key!r}]"


def _fits(value: Any, part: str) -> bool | None:
  """Whether `value` is of the annotation part (`int`, `str`, `Sequence[int]`...); None: not checked."""
  part = part.strip()
  if part == "None":
    return value is None
  if part == "bool":
    return isinstance(value, bool)
  if part == "int":
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
  if part == "float":
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
  if part == "str":
    return isinstance(value, str)
  if part.startswith(("Sequence[", "list[", "tuple[")):
    return isinstance(value, Sequence) and not isinstance(value, str)
  return None


_NAMES = {"int": "an integer", "float": "a number", "str": "a string", "bool": "True or False", "None": "None"}


def check_type(entry: str, key: str, value: Any, annotation: Any, *, setting: str) -> None:
  """UserError when `value` is not of `annotation` (a string like 'int | None'); unknown types pass."""
  if not isinstance(annotation, str):
    annotation = getattr(annotation, "__name__", str(annotation))
  parts = [p.strip() for p in annotation.split("|")]
  verdicts = [_fits(value, p) for p in parts]
  if any(v is None for v in verdicts) or any(verdicts):
    return
  expected = " or ".join(_NAMES.get(p, "a list" if p.startswith(("Sequence", "list", "tuple")) else p)
                         for p in parts)
  if isinstance(value, str) and any(p.startswith(("Sequence", "list", "tuple")) for p in parts):
    items = [x.strip() for x in value.split(",") if x.strip()]
    example = ", ".join(x if x.isdigit() else repr(x) for x in items) if items else "..."
    raise UserError(f"{_where(entry, key, setting)} is the string {value!r} where a list is expected; write a "
                    f"list, e.g. {{'{key}': [{example}]}}.")
  if any(p.startswith(("Sequence", "list", "tuple")) for p in parts) and not isinstance(value, Mapping):
    raise UserError(f"{_where(entry, key, setting)} is {value!r}, one value where a list is expected; write a "
                    f"list, e.g. {{'{key}': [{value!r}]}}.")
  got = type(value).__name__
  got = {"str": "a string", "int": "an integer", "float": "a number", "bool": "True/False"}.get(got, f"a {got}")
  unquoted = " (unquoted)" if any(p in ("int", "float", "bool") for p in parts) else ""
  raise UserError(f"{_where(entry, key, setting)} must be {expected}, got {value!r} ({got}); e.g. "
                  f"--gin.{setting}=\"{{'{entry}': {{'{key}': ...}}}}\" with {expected}{unquoted}.")


def check_types(entry: str, options: Mapping[str, Any], annotations: Mapping[str, Any], *, setting: str) -> None:
  for key, value in options.items():
    if key in annotations:
      check_type(entry, key, value, annotations[key], setting=setting)


def layer_numbers(entry: str, key: str, value: Any, *, setting: str) -> list[int]:
  """The layer numbers of an option value: an int, a list of ints, 'all' (none listed) or a comma list."""
  if value is None or value == "all":
    return []
  if isinstance(value, numbers.Integral) and not isinstance(value, bool):
    return [int(value)]
  items = value.split(",") if isinstance(value, str) else value
  try:
    numbers_ = [int(str(x).strip()) for x in items if str(x).strip()]
  except (TypeError, ValueError):
    example = "[0, 2]} or 'all'" if key == "layers" else "2}"
    raise UserError(f"{_where(entry, key, setting)}={value!r}: give layer numbers (0 = embeddings), e.g. "
                    f"{{'{key}': {example}.") from None
  if any(isinstance(x, bool) for x in items):
    raise UserError(f"{_where(entry, key, setting)}={value!r}: layers are numbers, not True/False.")
  return numbers_


def check_layers(entry: str, options: Mapping[str, Any], *, setting: str, num_layers: int | None) -> None:
  """UserError for a layer option that is not layer numbers, or (size known) outside 0..num_layers."""
  for key in LAYER_OPTIONS:
    if key not in options:
      continue
    wanted = layer_numbers(entry, key, options[key], setting=setting)
    bad = [l for l in wanted if l < 0 or (num_layers is not None and l > num_layers)]
    if bad:
      span = f"0..{num_layers}" if num_layers is not None else ">= 0"
      raise UserError(f"{_where(entry, key, setting)}: layer(s) {bad} outside {span} (0 = embeddings"
                      f"{f', {num_layers} = the last layer of this model' if num_layers is not None else ''}).")


def check_files(entry: str, options: Mapping[str, Any], files: Sequence[str], *, setting: str,
                special: Mapping[str, Sequence[str]] | None = None) -> None:
  """UserError for an option naming a file that is not there (`special` values, e.g. 'token_map', pass)."""
  for key in files:
    value = options.get(key)
    if value is None or value in (special or {}).get(key, ()):
      continue
    if not isinstance(value, (str, os.PathLike)):
      raise UserError(f"{_where(entry, key, setting)} must be a file path, got {value!r}.")
    fileio.check_input_file(os.path.expanduser(os.fspath(value)), setting=_where(entry, key, setting))


def check_names(entry: str, key: str, value: Any, known: Sequence[str], *, setting: str) -> None:
  """UserError unless `value` is None or a list of names from `known` (a bare string is named as such)."""
  if value is None:
    return
  if isinstance(value, str):
    raise UserError(f"{_where(entry, key, setting)} is the string {value!r} where a list is expected; write "
                    f"{{'{key}': [{value!r}]}} (names from {', '.join(known)}).")
  unknown = [v for v in value if v not in known]
  if unknown:
    raise UserError(f"{_where(entry, key, setting)}: unknown {key} {unknown}; use names from {', '.join(known)}.")


def check_choice(entry: str, key: str, value: Any, known: Sequence[str], *, setting: str) -> None:
  if value is not None and value not in known:
    raise UserError(f"{_where(entry, key, setting)}={value!r}: use one of {', '.join(map(repr, known))}.")
