"""Re-registering the tasks a run was trained on, in a fresh process (`Run.register_tasks`).

The run manifest records the definitions of its user-defined tasks
(`RunSpec.task_definitions`: TextTask / TsvBitextTask / AlphaMixture / ...
arguments with absolute paths, or the Python module whose import registers
them). An evaluation in another process registers them again from there, so
`python -m flax_xalign.eval --gin.MODEL_DIR=...` needs nothing else. Two
things may have changed since training, and both are handled here rather than
deep in the input pipeline, where the error could only say "fix files=",
a setting the evaluation does not have:

* the data moved: `relocate={"/old/folder": "/new/folder"}` (the eval
  setting `evaluate.relocate`) rewrites every recorded path under an old
  folder; a recorded file that is still missing is one `UserError` naming
  it and that setting;
* the vocabulary file moved or was deleted: the run's own copy (saved in
  every checkpoint's `assets/` and in MODEL_DIR) is used instead, after its
  sha256 is checked against the manifest.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.run_dir import RunDir
from flax_xalign.run_spec import RunSpec

RELOCATE_SETTING = "evaluate.relocate"
IMPORT_SETTING = "evaluate.import_modules"
# Definition arguments that hold a file or folder path.
_PATH_ARGS = ("vocabulary_path", "dictionary", "data_dir")


def _check_relocate(relocate: Any) -> dict[str, str]:
  if relocate is None:
    return {}
  if not isinstance(relocate, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                  for k, v in relocate.items()):
    raise UserError(f"{RELOCATE_SETTING} must map each recorded folder to its new place, e.g. "
                    f"{{'/old/data': '/new/data'}}; got {relocate!r}.")
  return {os.path.abspath(os.path.expanduser(k)): os.path.abspath(os.path.expanduser(v))
          for k, v in relocate.items()}


def relocated(path: str, relocate: Mapping[str, str]) -> str:
  """`path` with its longest recorded folder prefix in `relocate` replaced by the new folder."""
  for old in sorted(relocate, key=len, reverse=True):
    if path == old or path.startswith(old.rstrip(os.sep) + os.sep):
      return relocate[old] + path[len(old.rstrip(os.sep)):] if path != old else relocate[old]
  return path


def _relocate_args(args: Mapping[str, Any], relocate: Mapping[str, str]) -> dict[str, Any]:
  out = dict(args)
  if not relocate:
    return out
  if isinstance(out.get("files"), Mapping):
    out["files"] = {split: [relocated(g, relocate) for g in ([globs] if isinstance(globs, str) else globs)]
                    for split, globs in out["files"].items()}
  for key in _PATH_ARGS:
    if isinstance(out.get(key), str) and out[key]:
      out[key] = relocated(out[key], relocate)
  return out


def _missing_paths(args: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
  """Recorded files (of `splits`), globs and path arguments that name nothing on disk."""
  missing = []
  files = args.get("files")
  if isinstance(files, Mapping):
    for split in splits:
      globs = files.get(split, ())
      for pattern in [globs] if isinstance(globs, str) else globs:
        if not glob.glob(pattern):
          missing.append(pattern)
  for key in ("dictionary", "data_dir"):
    if isinstance(args.get(key), str) and args[key] and not storage.exists(args[key]):
      missing.append(args[key])
  return missing


def _run_vocabulary_file(run: RunSpec, model_dir: str, step: int | None) -> str | None:
  """The run's own copy of its vocabulary (the checkpoint's, else MODEL_DIR's), if it is there."""
  run_dir = RunDir(model_dir)
  places = [run_dir.file(run.vocabulary.file)]
  if step is not None:
    places.insert(0, os.path.join(run_dir.step_assets(step), run.vocabulary.file))
  return next((p for p in places if storage.isfile(p)), None)


def _moved_error(model_dir: str, task: str, path: str, recorded: str, others: int) -> UserError:
  old_folder = os.path.dirname(recorded.split("*")[0].rstrip(os.sep)) or recorded
  where = path if path == recorded else f"{path} (recorded as {recorded}, relocated by {RELOCATE_SETTING})"
  more = f"; {others} more recorded path(s) are missing too" if others else ""
  return UserError(
      f"{model_dir} was trained on task {task!r}, whose file {where} does not exist{more}. If the data "
      f"moved, point eval at its new place: --gin.{RELOCATE_SETTING}=\"{{'{old_folder}': '/NEW/FOLDER'}}\" "
      "(recorded folder -> where it is now).")


def prepared_definitions(run: RunSpec, *, model_dir: str | None = None, step: int | None = None,
                         relocate: Mapping[str, str] | None = None, splits: Sequence[str] = ()
                         ) -> list[dict[str, Any]]:
  """The run's task definitions, relocated, with checked paths and the run's vocabulary copy.

  Definitions of names this process has registered already are passed on
  unchanged (registering an equal definition again is a no-op).

  Raises:
    UserError: a recorded file of `splits` (or a dictionary / data folder)
      is missing (naming it and `evaluate.relocate`), or a file task has no
      files for an evaluated split.
  """
  from flax_xalign import tasks

  relocate = _check_relocate(relocate)
  registered = set(tasks.registered_names())
  vocabulary = None
  out = []
  for definition in run.task_definitions or ():
    kind, recorded_args = definition.get("kind"), definition.get("args")
    if not isinstance(recorded_args, Mapping) or recorded_args.get("name") in registered:
      out.append(definition)
      continue
    args = _relocate_args(recorded_args, relocate)
    name = args.get("name") or args.get("prefix") or kind
    files = args.get("files")
    if isinstance(files, Mapping):
      for split in splits:
        if split != "train" and split not in files:
          raise UserError(f"{model_dir or 'the run'} was trained on task {name!r}, which has no {split!r} "
                          f"files (it has {', '.join(sorted(files))}); evaluate another split, e.g. "
                          f"--gin.SPLIT=\"'{max(files)}'\".")
    missing = _missing_paths(args, splits)
    if missing:
      recorded = _relocate_back(missing[0], recorded_args, args)
      raise _moved_error(model_dir or "the run", name, missing[0], recorded, len(missing) - 1)
    path = args.get("vocabulary_path")
    if (model_dir and isinstance(path, str) and os.path.isabs(path) and not storage.exists(path)
        and run.vocabulary.kind == "sentencepiece"):
      vocabulary = vocabulary or _run_vocabulary_file(run, model_dir, step)
      if vocabulary is None:
        raise _moved_error(model_dir, name, path, recorded_args.get("vocabulary_path", path), 0)
      # A run in a bucket: seqio opens a task's vocabulary with TensorFlow's gfile, so it gets a local copy.
      args["vocabulary_path"] = storage.local_copy(vocabulary)
    out.append({"kind": kind, "args": args})
  return out


def _relocate_back(path: str, recorded_args: Mapping[str, Any], args: Mapping[str, Any]) -> str:
  """The recorded form of a (possibly relocated) path, for the error message."""
  files, recorded_files = args.get("files") or {}, recorded_args.get("files") or {}
  for split, globs in files.items():
    old = recorded_files.get(split, ())
    old = [old] if isinstance(old, str) else list(old)
    for i, pattern in enumerate([globs] if isinstance(globs, str) else globs):
      if pattern == path and i < len(old):
        return old[i]
  for key in _PATH_ARGS:
    if args.get(key) == path:
      return recorded_args.get(key, path)
  return path


def register_run_tasks(run: RunSpec, *, model_dir: str | None = None, step: int | None = None,
                       relocate: Mapping[str, str] | None = None, splits: Sequence[str] = (),
                       import_modules: Sequence[str] = (), user_tasks: Sequence[Any] = ()) -> None:
  """Registers the tasks a run was trained on (see the module docstring), then checks its task is known.

  Args:
    run: the run manifest.
    model_dir: its MODEL_DIR (for messages and the run's vocabulary copy).
    step: the checkpoint step read (its `assets/` hold the vocabulary copy).
    relocate: recorded folder -> its new place, for data that moved.
    splits: the splits that will be read; their recorded files are checked.
    import_modules: Python modules to import first (tasks registered in
      Python that the manifest could not record).
    user_tasks: TextTask / TsvBitextTask / AlphaMixture / ... specs to
      register first (their `register()` is called).

  Raises:
    UserError: a missing file (see `prepared_definitions`), a module that
      cannot be imported, or the run's task still unknown afterwards.
  """
  from flax_xalign import tasks
  from flax_xalign.tasks.registry import PythonModule

  if isinstance(import_modules, str):
    import_modules = [import_modules]
  for module in import_modules:
    PythonModule(module).register()
  for spec in user_tasks:
    spec.register()
  definitions = prepared_definitions(run, model_dir=model_dir, step=step, relocate=relocate, splits=splits)
  if definitions:
    tasks.register_described(definitions)
  try:
    tasks.get_provider(run.task)
  except UserError as e:
    what = ("registered by Python code the run manifest could not record (a script's __main__, or a plain "
            "seqio task)" if run.task_definitions is None else
            "not recorded in its run manifest (a manifest written before task definitions were recorded)")
    raise UserError(
        f"{model_dir or 'the run'} was trained on {run.task!r}, {what}, and it is not registered here. "
        f"Register it before evaluating: --gin.{IMPORT_SETTING}=\"['my_tasks']\" imports the module that "
        "registers it (on PYTHONPATH), or add a gin file with evaluate.user_tasks = [@TextTask(), ...] "
        "(--gin_file=runs/eval.gin --gin_file=my_tasks.gin).") from e
