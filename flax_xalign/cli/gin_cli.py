"""t5x-style flags shared by the entry points.

`--gin_file=F` (repeatable), `--gin_search_paths=a,b`, `--gin.NAME=VALUE`
(a binding, e.g. `--gin.MODEL_DIR=\\"runs/demo\\"`) and `--gin_bindings=...`.
Gin's own errors (unknown names, syntax) become one `UserError` line.

Gin is driven through its public API (`parse_config_files_and_bindings`,
`clear_config`, `get_configurable`, `operative_config_str`). Three places
reach into gin 0.5's private tables because it offers no public way, each
said where it happens: the include search order and a crashing file-exists
check (`_harden_gin_file_lookup`, which patches them), and, read-only, the
registered names and bound macros that the "did you mean" hints and the
unused-macro check look at (`_gin_table`; without them those hints are left
out, the errors stay).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import tokenize
from collections.abc import Callable
from typing import Any, Sequence

import gin

from flax_xalign import errors
from flax_xalign.errors import ArgumentParser, UserError

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # flax_xalign/ (this file is in cli/)
PACKAGE_GIN_DIR = os.path.join(_PACKAGE, "gin_configs")
REPO_GIN_DIR = os.path.join(os.path.dirname(_PACKAGE), "gin_configs")


def parse_args(argv: Sequence[str], description: str, prog: str | None = None) -> argparse.Namespace:
  """The gin flags of `argv`; `prog` (e.g. "xalign train") is the command an unknown flag's error names.

  `args.prog` keeps it, so later errors can point at the command's own `--help`.
  """
  bindings = []
  rest = []
  for arg in argv:
    match = re.match(r"^--gin\.([^=]+)=(.*)$", arg, re.S)
    if match:
      bindings.append(f"{match.group(1)} = {match.group(2)}")
    else:
      rest.append(arg)
  parser = ArgumentParser(prog=prog, description=description)
  parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
  parser.add_argument("--gin_bindings", action="append", default=[], help="gin binding (repeatable)")
  parser.add_argument("--gin_search_paths", default="", help="comma-separated folders for gin files")
  args = parser.parse_args(rest)
  args.gin_bindings = list(args.gin_bindings) + bindings
  args.prog = parser.prog
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

  Both patch private tables because gin has no public way:
  `gin.add_config_file_search_path` only appends (after the cwd, whose check
  is the one that crashes), and `gin.register_file_reader` only appends a
  reader after the crashing one and cannot replace its existence check.
  """
  from gin import config as gin_config
  from gin import resource_reader

  prefixes = gin_config._LOCATION_PREFIXES
  for folder in reversed(list(paths)):
    if folder in prefixes:
      prefixes.remove(folder)
    prefixes.insert(0, folder)

  def safe_exists(path: str) -> bool:
    try:
      return resource_reader.system_path_file_exists(path)
    except TypeError:
      return False

  readers = gin_config._FILE_READERS
  for i, (reader, exists) in enumerate(readers):
    if exists is resource_reader.system_path_file_exists:
      readers[i] = (reader, safe_exists)


def gin_files(args: argparse.Namespace) -> list[str]:
  """The paths of `args.gin_file` as found on the search paths; UserError for one that is not there."""
  paths = search_paths(args.gin_search_paths)
  return [_resolve(f, paths) for f in args.gin_file]


def check_flags(argv: Sequence[str], *, description: str, default_gin_files: Sequence[str] = (),
                prog: str | None = None) -> argparse.Namespace:
  """The parsed flags, checked before anything heavy loads (the configurables bring in seqio and TensorFlow).

  `--help` and an unknown or malformed flag end here (argparse: exit status 2,
  one `error:` line), a gin file that is not there raises a UserError; so
  usage errors answer in a fraction of a second, not after the imports.
  """
  args = parse_args(argv, description=description, prog=prog)
  if not args.gin_file:
    args.gin_file = list(default_gin_files)
  args.utf8_checked = gin_files(args)
  for path in args.utf8_checked:
    check_utf8(path)
  return args


def check_utf8(path: str) -> None:
  """UserError naming a gin file that is not UTF-8 text (gin's own error names no file)."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError:
    return  # (gin's reading error is turned into one line where it is parsed.)
  try:
    data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise UserError(f"gin file {path} is not UTF-8 text (line {line}, byte {e.start}: "
                    f"{e.reason}); save it as UTF-8.") from None


def parse_gin(args: argparse.Namespace) -> None:
  """Parses the gin files and bindings; the task families are registered only when the config names one."""
  from flax_xalign.cli import configurables

  paths = search_paths(args.gin_search_paths)
  _harden_gin_file_lookup(paths)
  files = [_resolve(f, paths) for f in args.gin_file]
  for path in files:
    if path not in getattr(args, "utf8_checked", ()):  # (`check_flags` read the command line's already)
      check_utf8(path)
  for attempt in range(2):
    gin.clear_config()  # One configuration per call (notebooks and tests call main twice).
    try:
      gin.parse_config_files_and_bindings(files, args.gin_bindings, finalize_config=True)
      break
    except (OSError, ValueError, KeyError, SyntaxError, tokenize.TokenError) as e:
      if attempt == 0 and _names_a_task_family(e, configurables.TASK_CONFIGURABLES):
        configurables.register_tasks()  # seqio and TensorFlow load here, for configs that define tasks.
        continue
      raise parse_error(e, files, args.gin_bindings) from e
  _check_macros_used(args.gin_bindings)


def _names_a_task_family(e: BaseException, names: Sequence[str]) -> bool:
  """Whether gin failed on an unknown configurable that is one of the (not yet registered) task families."""
  match = re.search(r"No configurable matching (?:reference )?'@?(?:[\w.]+/)?([\w.]+?)(?:\(\))?'", str(e))
  return bool(match) and match.group(1).split(".")[-1] in names


_LOCATION = re.compile(r'\n\s*In (?:file "(.+?)",|bindings string) line (\d+)')


# gin 0.5's words for a `%gin.REQUIRED` value left unset: `MODEL_DIR/macro.value set to ...` (a macro)
# or `evaluate.split set to ...` (a parameter).
_REQUIRED = re.compile(r"^(?:([\w.]+)/macro\.value|(?:[\w.]+/)?(?:flax_xalign\.)?([\w.]+)) "
                       r"set to `%gin\.REQUIRED` but not subsequently")


def parse_error(e: BaseException, files: Sequence[str], bindings: Sequence[str]) -> UserError:
  """One line for a gin parse error: where (file:line or the binding), what, and a close match.

  gin 0.5 reports syntax errors as SyntaxError (with its file and line), an
  unclosed bracket as tokenize's TokenError (no file), and unknown names as a
  ValueError whose text goes on with the location and the offending line.
  A `%gin.REQUIRED` setting left unset keeps gin's words (callers such as
  `compile_check` read them) and carries its name as `required_setting`, which
  `run` turns into the flag that sets it (`required_setting_error`).
  """
  if isinstance(e, UnicodeDecodeError):  # An included file (the top-level ones are checked before).
    return UserError(f"gin configuration error: a file that {', '.join(files) or 'the bindings'} include "
                     f"is not UTF-8 text ({e.reason}); save it as UTF-8.")
  if isinstance(e, SyntaxError):
    return UserError(f"gin syntax error{_where(e.filename, e.lineno, bindings)}: {e.msg.rstrip('.')}; "
                     "fix the line (gin binds one `name = value` per line).")
  if isinstance(e, tokenize.TokenError):
    return UserError(f"gin syntax error{_unclosed(files, bindings)}: a bracket or quote is opened and never "
                     "closed; close it.")
  text = str(e).strip() or repr(e)
  location = _LOCATION.search(text)
  where = _where(location.group(1), int(location.group(2)), bindings) if location else ""
  message = text[:location.start()] if location else text.splitlines()[0]
  message = message.strip().rstrip(".")
  required = _REQUIRED.match(message)
  macro = re.match(r"No bindings specified for '([^']+)/gin\.macro'", message)
  if macro:  # gin goes on with the whole config as it stands, and finds this after parsing: no location.
    message = f"No bindings specified for '{macro.group(1)}/gin.macro' (%{macro.group(1)} is used but never set)"
    where = where or _first_use(rf"%{re.escape(macro.group(1))}\b", files, bindings)
  error = UserError(f"gin configuration error{where}: {message}.{_did_you_mean(message)}")
  if required:
    error.required_setting = required.group(1) or required.group(2)
  return error


def _where(filename: str | None, line: int | None, bindings: Sequence[str]) -> str:
  """' in FILE:LINE', or ' in the binding `...`' for a line of the joined bindings string."""
  if filename:
    return f" in {filename}:{line}" if line else f" in {filename}"
  if line:
    first = 1
    for binding in bindings:  # gin parses the bindings as one string joined with newlines.
      last = first + binding.count("\n")
      if first <= line <= last:
        return f" in the binding `{binding.strip()}`"
      first = last + 1
  return ""


def _first_use(pattern: str, files: Sequence[str], bindings: Sequence[str]) -> str:
  """' in the binding `...`' or ' in FILE:LINE' of the first binding or top-level file line matching `pattern`."""
  for binding in bindings:
    if re.search(pattern, binding):
      return f" in the binding `{binding.strip()}`"
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
          if re.search(pattern, line.split("#", 1)[0]):
            return f" in {path}:{number}"
    except (OSError, UnicodeDecodeError):
      continue
  return ""


def _unclosed(files: Sequence[str], bindings: Sequence[str]) -> str:
  """Where a bracket or quote is left open: the first top-level file or binding Python's tokenizer rejects."""
  import io

  def rejected(text: str) -> tuple[int, int] | None:
    try:
      for _ in tokenize.generate_tokens(io.StringIO(text).readline):
        pass
    except tokenize.TokenError as e:
      return e.args[1] if len(e.args) > 1 else (0, 0)
    except (SyntaxError, ValueError):  # Other damage: gin reports it on its own.
      return None
    return None

  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        found = rejected(f.read())
    except (OSError, UnicodeDecodeError):
      continue
    if found:
      return f" in {path} (still open at its end, line {found[0]})"
  for binding in bindings:
    if rejected(binding):
      return f" in the binding `{binding.strip()}`"
  return ""


def _gin_table(name: str) -> Any:
  """gin 0.5's private `_REGISTRY` (configurables by name) or `_CONFIG` (bindings), read-only; None if absent.

  gin has no public listing of the registered configurables or of the bound
  macros, which the hints below need; another gin version without the table
  loses the hints, not the error.
  """
  from gin import config as gin_config

  return getattr(gin_config, name, None)


def _did_you_mean(message: str) -> str:
  """' Did you mean X?' for an unknown configurable, parameter or macro that resembles a known one."""
  registry_table, config_table = _gin_table("_REGISTRY"), _gin_table("_CONFIG")
  if registry_table is None or config_table is None:
    return ""
  registry = dict(registry_table.items())
  candidates: list[str] = []
  name = None
  unknown = re.search(r"No configurable matching (?:reference )?'@?([^'(]+)(?:\(\))?'", message)
  param = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", message)
  macro = re.search(r"No bindings specified for '([^']+)/gin\.macro'", message)
  if unknown:
    name = unknown.group(1).split("/")[-1].split(".")[-1]
    candidates = sorted({s.split(".")[-1] for s in registry if not s.startswith("gin.")})
  elif param:
    configurable = registry_table.get_match(param.group(1))
    name, candidates = param.group(2), _parameters(configurable)
  elif macro:
    name = macro.group(1).split("/")[-1]
    candidates = sorted({key[0].split("/")[-1] for key in config_table if key[1] == "gin.macro"})
  close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6) if name else []
  return f" Did you mean {' or '.join(close)}?" if close else ""


def _parameters(configurable: Any) -> list[str]:
  """The parameter names gin accepts for `configurable` (its allowlist, else its signature less the denylist)."""
  import inspect

  if configurable is None:
    return []
  if configurable.allowlist:
    return list(configurable.allowlist)
  try:
    names = list(inspect.signature(configurable.wrapped).parameters)
  except (TypeError, ValueError):
    return []
  return [n for n in names if n not in ("self", "args", "kwargs") and n not in (configurable.denylist or ())]


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

  config_table = _gin_table("_CONFIG")
  if config_table is None:
    return
  for params in config_table.values():
    for value in params.values():
      collect(value)
  unused = [name for name in dict.fromkeys(bound) if name not in referenced]
  if unused:
    name = unused[0]
    defined = sorted({key[0] for key in config_table if key[1] == "gin.macro"} & referenced)
    close = difflib.get_close_matches(name, defined, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else (
        "no gin file in this run refers to it; check the spelling or include the file that uses it.")
    raise UserError(f"--gin.{name} sets a macro that nothing in this configuration reads; {hint}")


def required_setting_error(names: Sequence[str], *, prog: str | None = None) -> UserError:
  """The one line for settings a command needs and no gin file or flag gave: the flags that set them."""
  flags = " ".join(f"--gin.{name}=" + ('\\"runs/demo\\"' if name == "MODEL_DIR" else "...") for name in names)
  help_hint = f"; see {prog} --help" if prog else ""
  return UserError(f"missing required setting{'s' * (len(names) > 1)} {', '.join(names)}: pass {flags} "
                   f"or set {'them' if len(names) > 1 else 'it'} in a gin file{help_hint}.")


def required_binding_error(e: RuntimeError, *, prog: str | None = None) -> UserError | None:
  """Turns gin's 'Required bindings for `fn` not provided in config: [...]' into a flag hint."""
  text = str(e)
  if "Required bindings" not in text:
    return None
  where = re.search(r"for `([\w.]+)`", text)
  missing = re.findall(r"'([^']+)'", text[where.end():] if where else text)
  prefix = f"{where.group(1).split('.')[-1]}." if where else ""
  return required_setting_error([f"{prefix}{name}" for name in missing] or [text], prog=prog)


# The gin commands' names by the configurable they run (an assets build is `train_job` with assets_only).
PROGS = {"train_job": "xalign train", "eval_job": "xalign eval"}


def prog_of(configurable: str, call_kwargs: dict) -> str | None:
  """The command (e.g. "xalign eval") that runs `configurable`, whose `--help` an error names."""
  if configurable == "train_job" and call_kwargs.get("assets_only"):
    return "xalign assets"
  return PROGS.get(configurable)


_CONFIGURABLE_BINDING = re.compile(r"\s*(?:[\w.]+/)?([\w.]+)\.(\w+)\s*=\s*(.*)$", re.S)


def check_bindings_read(bindings: Sequence[str], configurable: str, *, prog: str | None = None) -> None:
  """Refuses a command-line binding of a configurable that `configurable` never calls.

  gin takes `--gin.EncoderConfig.num_layers=4` on `eval` without a word, and the
  evaluation reads the model's settings from the run's saved config, so the
  binding would be dropped silently (as a misspelt macro would, `_check_macros_used`).
  Which configurables a command never calls is `configurables.NOT_CALLED_BY`'s.
  """
  from flax_xalign.cli import configurables

  unread = configurables.NOT_CALLED_BY.get(configurable, ())
  for binding in bindings:
    match = _CONFIGURABLE_BINDING.match(binding)
    if match and match.group(1).split(".")[-1] in unread:
      name = match.group(1).split(".")[-1]
      raise UserError(f"--gin.{match.group(1)}.{match.group(2)}={match.group(3).strip()} is not read by "
                      f"{prog or configurable}: the run's saved config in MODEL_DIR sets {name} (model size, "
                      "objectives and training settings come from the checkpoint, and it wins); drop the "
                      "binding, or train a run with it.")


def run(argv: Sequence[str], *, description: str, configurable: str,
        default_gin_files: Sequence[str] = (), prog: str | None = None,
        after_flags: Callable[[], None] | None = None, **call_kwargs):
  """Sets the process up, checks the flags (once), parses gin, then calls the gin configurable `configurable`.

  Returns (exit_code, result): 2 with a one-line message on stderr for bad
  input, else 0 and whatever the configurable returned. `prog` is the
  command's name in errors (default: the gin command that runs `configurable`).
  `after_flags()` runs once the flags are checked, before the library loads (train joins a multi-process
  job there); its UserError is reported like any other.
  """
  import sys

  from flax_xalign.cli import _process

  _process.setup_process()  # The one set-up of a gin command (`gin_main`, `train` and `build_assets` are `run`).
  noise = _process.known_noise()
  noise.held.clear()  # What seqio holds back belongs to this call only (tests and notebooks call run twice).
  prog = prog or prog_of(configurable, call_kwargs)
  try:
    args = check_flags(argv, description=description, default_gin_files=default_gin_files, prog=prog)
    if after_flags is not None:
      after_flags()
    from flax_xalign.cli import configurables  # After the flags: it imports the library (seqio, TensorFlow, JAX).

    configurables.register()
    parse_gin(args)
    check_bindings_read(args.gin_bindings, configurable, prog=prog)
    fn = gin.get_configurable(f"flax_xalign.{configurable}")
    try:
      return 0, fn(**call_kwargs)
    except RuntimeError as e:
      hint = required_binding_error(errors.original(e), prog=prog)
      if hint is None:
        raise
      raise hint from e
    except TypeError as e:
      text = errors.user_message(e)
      if "EncoderConfig" in text and "missing" in text:
        raise UserError("no model size given: add a model gin file, e.g. "
                        "--gin_file=gin_configs/models/tiny.gin") from e
      raise
  except UserError as e:
    required = getattr(e, "required_setting", None)  # (gin's words: `MODEL_DIR/macro.value set to ...`)
    return errors.report(required_setting_error([required], prog=prog) if required else e), None
  except errors.Terminated:  # A driver's SIGTERM outside a training step (errors.sigterm_raises).
    return errors.terminated(), None
  except KeyboardInterrupt:
    # Ctrl-C outside a training step (train turns the first one into a stop after the step).
    return errors.interrupted(), None
  except BaseException as e:
    problem = errors.path_problem(e)
    if problem is not None:
      return errors.report(problem), None
    for line in noise.held:  # A crash: what seqio said about it is worth reading after all.
      print(line, file=sys.stderr)
    raise


# ---------------------------------------------------------------- a run's settings, without training it

# Macros a gin file may leave `%gin.REQUIRED` for training (where to write, what to warm-start from).
TRAINING_ONLY_MACROS = ("MODEL_DIR", "INIT_FROM_CHECKPOINT")


def parse_gin_without_training_macros(args: argparse.Namespace) -> None:
  """parse_gin, with the `%gin.REQUIRED` macros only training needs bound to None (cache, compile_check)."""
  for _ in range(len(TRAINING_ONLY_MACROS) + 1):
    try:
      return parse_gin(args)
    except UserError as e:
      match = re.search(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", str(e))
      if not match or match.group(1) not in TRAINING_ONLY_MACROS:
        raise
      args.gin_bindings = [*args.gin_bindings, f"{match.group(1)} = None"]
  raise AssertionError("unreachable")


def train_bindings(args: argparse.Namespace) -> dict[str, Any]:
  """The run's `train.*` bindings, unresolved (a `copy.deepcopy` of a value resolves its macros and references),
  of the gin flags `args` parsed without training's macros; the configurables are registered first."""
  from flax_xalign.cli import configurables

  configurables.register()
  parse_gin_without_training_macros(args)
  return dict(gin.get_bindings("flax_xalign.train", resolve_references=False))


# ---------------------------------------------------------------- the gin commands, callable in this process


def gin_main(argv: Sequence[str] | None, *, description: str, configurable: str, **kwargs) -> tuple[int, Any]:
  """(exit status, result) of a gin command with the flags `argv` (None: the process's own): `run`."""
  import sys

  return run(list(sys.argv[1:] if argv is None else argv), description=description, configurable=configurable,
             **kwargs)


ASSETS_DESCRIPTION = "Builds a run's assets into MODEL_DIR without training (the explicit build step)."


def build_assets(argv: Sequence[str] | None, *, description: str = ASSETS_DESCRIPTION) -> int:
  """The exit status of `xalign assets` with the flags `argv` (the flags of `xalign train`), in this process:
  every asset the run's objectives require built into MODEL_DIR, one line per asset."""
  code, run = gin_main(argv, description=description, configurable="train_job", assets_only=True)
  if code == 0:
    for name, fingerprint in sorted(run.assets.items()):
      print(f"  {name}: version {fingerprint.get('version')}, sha256 {str(fingerprint.get('sha256'))[:16]}…")
  return code


TRAIN_DESCRIPTION = "Pretraining entry point (t5x-style flags)."


def train(argv: Sequence[str] | None, *, description: str = TRAIN_DESCRIPTION) -> int:
  """The exit status of `xalign train` with the flags `argv` (None: the process's own), in this process.

  The flags are checked once, before JAX and TensorFlow load; then this process joins a multi-process job
  (if one is configured) and turns the compilation cache on, before anything touches a device. A run
  stopped by a signal exits 128 + the signal (Ctrl-C 130, SIGTERM 143) once it has saved. Library code that
  must train through gin (the experiment drivers) is handed this function.
  """
  def join_and_cache() -> None:
    from flax_xalign.training import distributed

    distributed.maybe_initialize_distributed()
    distributed.enable_compilation_cache()

  code, result = gin_main(argv, description=description, configurable="train_job", after_flags=join_and_cache,
                          write_config=True)
  if code == 0 and result.interrupted:
    # Several processes stop together through jax's preemption service (a SIGTERM), not a signal of their own.
    import signal

    import jax

    return 128 + (result.stop_signal or (signal.SIGTERM if jax.process_count() > 1 else signal.SIGINT))
  return code
