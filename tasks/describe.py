"""Describe the tasks behind a name as JSON definitions, and register them again in another process.

`describe(name)` writes the user-defined tasks and mixtures behind a name as
JSON-serialisable definitions (`{"kind": ..., "args": {...}}`);
`register_described` registers them again (the run manifest uses the pair).
A kind names a frozen dataclass of a module of this package (`_KINDS`); the
stored definitions hold kinds only, so modules may move as long as `_KINDS`
follows.
"""

import dataclasses
import functools
import importlib
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence

import seqio

from flax_xalign import errors

from .tables import _MIXTURES, _TASKS, TaskInfo, _check_name, get_provider, task_names

# Kinds of describable definitions -> the module (in this package) defining them.
_KINDS = {"TextTask": "user", "TsvBitextTask": "user", "AlphaMixture": "user",
          "SyntheticTasks": "synthetic", "BibleTasks": "bible", "CodeSwitchedTask": "code_switch",
          "TfdsTasks": "tfds", "DebianTasks": "debian", "PythonModule": "describe"}


def _jsonable(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  raise TypeError(f"cannot describe {value!r} as JSON")


def _spec_definition(spec: Any) -> Dict[str, Any]:
  kind = type(spec).__name__
  if kind not in _KINDS or not dataclasses.is_dataclass(spec):
    raise TypeError(f"{spec!r} is not one of the describable kinds {sorted(_KINDS)}")
  args = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
  return {"kind": kind, "args": _jsonable(args)}


@dataclasses.dataclass(frozen=True)
class PythonModule:
  """Tasks registered in Python: importing `module` registers them again.

  What `describe` records for a task registered by code of the user's (a
  `register_task` call without a spec, or a plain seqio task), so that a
  fresh process (`python -m flax_xalign.eval`) can re-register it.
  """
  module: str

  def register(self) -> "PythonModule":
    if not isinstance(self.module, str) or not _MODULE_NAME.match(self.module):
      raise errors.UserError(f"PythonModule: {self.module!r} is not a Python module name.")
    try:
      importlib.import_module(self.module)
    except ImportError as e:
      raise errors.UserError(
          f"the tasks of this run were registered by the Python module {self.module!r}, which cannot be "
          f"imported here ({type(e).__name__}: {e}); run from the folder that holds it or add that folder "
          "to PYTHONPATH.") from e
    return self


_MODULE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
# Modules whose callables say nothing about who registered a task.
_LIBRARY_MODULES = ("seqio", "tensorflow", "t5", "functools", "builtins", "flax_xalign")


def _callable_module(fn: Any) -> Optional[str]:
  while isinstance(fn, functools.partial):
    fn = fn.func
  fn = getattr(fn, "__func__", fn)  # A bound method: its function.
  if isinstance(fn, (type(_check_name), type)):
    return fn.__module__
  return type(fn).__module__  # A callable object (e.g. a loader class instance).


def _defining_module(name: str) -> Optional[str]:
  """The user module whose import registers task `name`, or None if unknown.

  Read from the task's own callables (loader, dataset_fn, preprocessors):
  the first one defined outside the libraries. `__main__` cannot be
  imported by another process, so it counts as unknown.
  """
  if name in _TASKS:
    candidates = [_TASKS[name].loader]
  elif name in seqio.TaskRegistry.names():
    task = seqio.TaskRegistry.get(name)
    candidates = [getattr(task.source, "_dataset_fn", None), *task.preprocessors]
  else:
    return None
  for fn in candidates:
    module = _callable_module(fn) if fn is not None else None
    if module and not module.split(".")[0] in _LIBRARY_MODULES:
      return None if module == "__main__" else module
  return None


def _registered_on_import(info: Any) -> bool:
  """Registered by importing flax_xalign (the embedded tasks): nothing to record."""
  module = _callable_module(getattr(info, "loader", None)) or ""
  return module.split(".")[0] == "flax_xalign" or module.startswith(__package__ or "flax_xalign.tasks")


def describe(name: str) -> Optional[List[Dict[str, Any]]]:
  """JSON-serialisable definitions that re-register `name` in a new process.

  Returns:
    The definitions of every user-defined task and mixture `name` needs,
    tasks first (`{"kind": "TextTask", "args": {...}}`; kinds TextTask,
    TsvBitextTask, AlphaMixture, SyntheticTasks, ...); a task registered by
    Python code (no spec) is described by the module whose import registers
    it (`{"kind": "PythonModule", "args": {"module": "my_tasks"}}`); `[]`
    when importing flax_xalign.tasks registers everything (the embedded
    Bible tasks); None when some task's registering code is not known (a
    script's `__main__`, or a plain seqio task whose callables are all
    library functions).

  Raises:
    UserError: unknown name.
  """
  get_provider(name)  # UserError if unknown.
  members = list(task_names(name)) + ([name] if name not in _TASKS else [])
  definitions = []
  for member in members:
    info = _TASKS.get(member) or _MIXTURES.get(member)
    if info is not None and info.spec is not None:
      # A spec built on other tasks (CodeSwitchedTask's source) describes them first.
      definitions.extend(d for d in getattr(info.spec, "required_definitions", list)() if d not in definitions)
      definition = _spec_definition(info.spec)
      if definition not in definitions:
        definitions.append(definition)
      continue
    if isinstance(info, TaskInfo) and _registered_on_import(info):
      continue
    module = _defining_module(member)
    if module is None:
      if member != name or member in _TASKS:
        return None
      # A mixture registered in Python: registered on import with its tasks when they all are (the
      # embedded mixtures), else assumed to come from the module of its Python-registered tasks.
      if not definitions or any(d["kind"] == "PythonModule" for d in definitions):
        continue
      return None
    definition = {"kind": "PythonModule", "args": {"module": module}}
    if definition not in definitions:
      definitions.append(definition)
  return definitions


def register_described(definitions: Sequence[Mapping[str, Any]]) -> None:
  """Registers what `describe` returned, in order (idempotent).

  Raises:
    UserError: a malformed definition or one that conflicts with a
      registered name.
  """
  if isinstance(definitions, (str, Mapping)) or not isinstance(
      definitions, Sequence):
    raise errors.UserError(
        f"Task definitions must be a list of {{'kind': ..., 'args': {{...}}}} "
        f"entries (as describe() writes them); got {definitions!r}.")
  for definition in definitions:
    kind = definition.get("kind") if isinstance(definition, Mapping) else None
    args = definition.get("args") if isinstance(definition, Mapping) else None
    if kind not in _KINDS or not isinstance(args, Mapping):
      raise errors.UserError(
          f"Bad task definition {definition!r}: expected {{'kind': one of "
          f"{sorted(_KINDS)}, 'args': {{...}}}}.")
    module = importlib.import_module(f".{_KINDS[kind]}", __package__)
    try:
      spec = getattr(module, kind)(**args)
    except TypeError as e:
      raise errors.UserError(
          f"Bad {kind} definition {dict(args)!r}: {e}.") from e
    spec.register()
