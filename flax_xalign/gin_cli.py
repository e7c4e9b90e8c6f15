"""t5x-style flags shared by the entry points.

`--gin_file=F` (repeatable), `--gin_search_paths=a,b`, `--gin.NAME=VALUE`
(a binding, e.g. `--gin.MODEL_DIR=\\"runs/demo\\"`) and `--gin_bindings=...`.
Gin's own errors (unknown names, syntax) become one `UserError` line.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from typing import Any, Sequence

import gin

from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

PACKAGE_GIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gin_configs")
REPO_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin_configs")


def parse_args(argv: Sequence[str], description: str) -> argparse.Namespace:
  bindings = []
  rest = []
  for arg in argv:
    match = re.match(r"^--gin\.([^=]+)=(.*)$", arg, re.S)
    if match:
      bindings.append(f"{match.group(1)} = {match.group(2)}")
    else:
      rest.append(arg)
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
  parser.add_argument("--gin_bindings", action="append", default=[], help="gin binding (repeatable)")
  parser.add_argument("--gin_search_paths", default="", help="comma-separated folders for gin files")
  args = parser.parse_args(rest)
  args.gin_bindings = list(args.gin_bindings) + bindings
  return args


def search_paths(extra: str) -> list[str]:
  paths = [p for p in extra.split(",") if p]
  for default in (os.getcwd(), REPO_GIN_DIR, PACKAGE_GIN_DIR):
    if os.path.isdir(default) and default not in paths:
      paths.append(default)
  return paths


def _resolve(path: str, paths: Sequence[str]) -> str:
  if os.path.exists(path):
    return path
  for folder in paths:
    for candidate in (os.path.join(folder, path), os.path.join(folder, path.removeprefix("gin_configs/"))):
      if os.path.exists(candidate):
        return candidate
  raise UserError(f"gin file {path!r} not found (searched: {', '.join(paths)}); check the path or "
                  "add its folder with --gin_search_paths.")


def _harden_gin_file_lookup(paths: Sequence[str]) -> None:
  """Works around two gin 0.5 file-lookup flaws (gin-config is pinned to 0.5.0).

  1. Includes are tried relative to the cwd first; so search our gin folders
     before the cwd, so `include 'runs/pretrain.gin'` finds ours.
  2. Its package-path reader crashes (TypeError) when the cwd holds a plain
     folder named like the include's first component (e.g. `runs/`, the usual
     MODEL_DIR parent); treat that as "not found" instead.
  """
  from gin import config as gin_config
  from gin import resource_reader

  prefixes = gin_config._LOCATION_PREFIXES  # noqa: SLF001
  for folder in reversed(list(paths)):
    if folder in prefixes:
      prefixes.remove(folder)
    prefixes.insert(0, folder)

  def safe_exists(path: str) -> bool:
    try:
      return resource_reader.system_path_file_exists(path)
    except TypeError:
      return False

  readers = gin_config._FILE_READERS  # noqa: SLF001
  for i, (reader, exists) in enumerate(readers):
    if exists is resource_reader.system_path_file_exists:
      readers[i] = (reader, safe_exists)


def parse_gin(args: argparse.Namespace) -> None:
  gin.clear_config()  # One configuration per call (notebooks and tests call main twice).
  paths = search_paths(args.gin_search_paths)
  _harden_gin_file_lookup(paths)
  files = [_resolve(f, paths) for f in args.gin_file]
  try:
    gin.parse_config_files_and_bindings(files, args.gin_bindings, finalize_config=True)
  except (ValueError, KeyError, SyntaxError, IOError) as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
    name = re.search(r"'([^']+)'", message)
    hint = ""
    if name:
      known = [c for c in _known_names()]
      close = difflib.get_close_matches(name.group(1), known, n=3)
      if close:
        hint = f" Did you mean {', '.join(close)}?"
    raise UserError(f"gin configuration error: {message}.{hint}") from e
  _check_macros_used(args.gin_bindings)


_MACRO_BINDING = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _check_macros_used(bindings: Sequence[str]) -> None:
  """Refuses a command-line macro that no binding refers to.

  gin accepts `--gin.TRAIN_STEP=20` (a new macro nobody reads) without a word,
  so a misspelt setting would silently train with the default. Only macros
  bound on the command line are checked: gin files may define macros for
  objectives or experiments a run does not include.
  """
  from gin import config as gin_config

  bound = []
  for binding in bindings:
    match = _MACRO_BINDING.match(binding)
    if match and "." not in match.group(1):
      bound.append(match.group(1))
  if not bound:
    return
  referenced = set()

  def collect(value: Any) -> None:
    if isinstance(value, gin_config.ConfigurableReference):
      selector = value.scoped_selector
      if selector.endswith("/gin.macro"):
        referenced.add(selector[: -len("/gin.macro")])
    elif isinstance(value, dict):
      for item in value.values():
        collect(item)
    elif isinstance(value, (list, tuple, set)):
      for item in value:
        collect(item)

  for params in gin_config._CONFIG.values():  # noqa: SLF001
    for value in params.values():
      collect(value)
  unused = [name for name in dict.fromkeys(bound) if name not in referenced]
  if unused:
    name = unused[0]
    defined = sorted({key[0] for key in gin_config._CONFIG if key[1] == "gin.macro"} & referenced)  # noqa: SLF001
    close = difflib.get_close_matches(name, defined, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else (
        "no gin file in this run refers to it; check the spelling or include the file that uses it.")
    raise UserError(f"--gin.{name} sets a macro that nothing in this configuration reads; {hint}")


def _known_names() -> list[str]:
  from gin import config as gin_config

  names = set()
  for selector in gin_config._REGISTRY.get_all_matches(""):  # noqa: SLF001
    names.add(selector.split(".")[-1])
    configurable = gin_config._REGISTRY[selector]  # noqa: SLF001
    for param in getattr(configurable, "valid_params", None) or ():
      names.add(f"{selector.split('.')[-1]}.{param}")
  return sorted(names)


def write_operative_config(model_dir: str, filename: str = "config.gin") -> None:
  """Writes gin's operative config atomically into `model_dir`."""
  write_atomically(os.path.join(model_dir, filename), gin.operative_config_str())


def required_binding_error(e: RuntimeError) -> UserError | None:
  """Turns gin's 'Required bindings ... not provided' into a flag hint."""
  text = str(e)
  if "Required bindings" not in text:
    return None
  missing = re.findall(r"'([^']+)'", text)
  return UserError(f"missing required setting(s) {', '.join(missing) or text}: pass them as "
                   "--gin.MACRO=VALUE (e.g. --gin.MODEL_DIR=\\\"runs/demo\\\") or in a gin file.")


class _DropKnownNoise:
  """Drops log lines that are expected and say nothing to a user.

  gin logs an ERROR for every search-path miss before it finds an included
  file, and seqio warns on every uncached in-memory source (ours are shuffled
  over the whole split in-graph, so its concern does not apply).
  """

  PREFIXES = ("Path not found:", "Using an uncached FunctionDataset")

  def filter(self, record) -> bool:
    return not str(record.msg).startswith(self.PREFIXES)


def quiet_known_noise() -> None:
  import logging

  noise = _DropKnownNoise()
  for name in ("", "absl"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _DropKnownNoise) for f in logger.filters):
      logger.addFilter(noise)


def run(argv: Sequence[str], *, description: str, configurable: str,
        default_gin_files: Sequence[str] = (), **call_kwargs):
  """Parses flags and gin, then calls the gin configurable `configurable`.

  Returns (exit_code, result): 2 with a one-line message on stderr for bad
  input, else 0 and whatever the configurable returned.
  """
  import sys

  from flax_xalign import configurables

  quiet_known_noise()
  try:
    args = parse_args(argv, description=description)
    if not args.gin_file:
      args.gin_file = list(default_gin_files)
    configurables.register()
    parse_gin(args)
    fn = gin.get_configurable(f"flax_xalign.{configurable}")
    try:
      return 0, fn(**call_kwargs)
    except RuntimeError as e:
      hint = required_binding_error(e)
      if hint is None:
        raise
      raise hint from e
    except TypeError as e:
      if "EncoderConfig" in str(e) and "missing" in str(e):
        raise UserError("no model size given: add a model gin file, e.g. "
                        "--gin_file=gin_configs/models/tiny.gin") from e
      raise
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2, None
