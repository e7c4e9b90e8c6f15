"""Evaluators that are one call of an existing evaluation function.

Most evaluations already exist as a library function of a `runs.Run` with
keyword options; `FunctionEvaluator` adapts one to the registry's protocol
without restating its options: they are the function's own keyword
parameters, less those the adapter fills in from the run (`fixed`), with the
function's defaults. The function gets the run itself, at the step it was
opened at, never its folder to open again. So a typo in an option is caught by the registry before
anything runs, and a new option of the function is an evaluator option at once.
`OptionsEvaluator` does the same for a function of a run and a frozen
dataclass of options (the lexicon and retrieval evaluations, whose options
are also a command's flags).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.evaluation.evaluators import checks


class FunctionEvaluator:
  """Calls `function()` with the run's arguments (`run_arguments`) and the user's options.

  Subclasses set `function` (a zero-argument callable returning the evaluation
  function, so that listing evaluators imports nothing heavy), `fixed` (the
  parameter names `run_arguments` fills) and may override `run_arguments`,
  `defaults` and `finish`.
  """

  function: Callable[[], Callable[..., Any]]
  fixed: tuple[str, ...] = ("run",)
  defaults: dict[str, Any] = {}
  files: tuple[str, ...] = ()  # Options naming a file the evaluation reads (checked to exist up front).

  def __init__(self, run: Any, **options: Any):
    self.run = run
    self.options = {**self.defaults, **options}

  @classmethod
  def parameters(cls) -> list[inspect.Parameter]:
    """The evaluation function's keyword parameters the user may set."""
    params = inspect.signature(cls.function()).parameters.values()
    return [p for p in params if p.name not in cls.fixed and p.name != "log"
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]

  @classmethod
  def option_names(cls) -> tuple[str, ...]:
    return tuple(p.name for p in cls.parameters())

  @classmethod
  def required_options(cls) -> tuple[str, ...]:
    return tuple(p.name for p in cls.parameters() if p.default is p.empty and p.name not in cls.defaults)

  @classmethod
  def check_values(cls, entry: str, options: dict[str, Any], *, setting: str, num_layers: int | None) -> None:
    """UserError for an option of the wrong type, a layer out of range or a missing file (no run needed)."""
    checks.check_types(entry, options, {p.name: p.annotation for p in cls.parameters()}, setting=setting)
    checks.check_layers(entry, options, setting=setting, num_layers=num_layers)
    checks.check_files(entry, options, cls.files, setting=setting)

  def run_arguments(self) -> dict[str, Any]:
    return {"run": self.run}

  def finish(self, result: Any) -> dict[str, Any]:
    return result

  def __call__(self) -> dict[str, Any]:
    return self.finish(type(self).function()(**self.run_arguments(), **self.options))


class OptionsEvaluator:
  """Calls `function()(run, options_class()(**options))`: an evaluation whose settings are a frozen dataclass.

  The options are the dataclass's fields, the required ones those without a
  default (plus `required`); a list value becomes the comma list the field
  (a command's flag) takes. The dataclass is built and `check()`ed in the
  constructor, so a bad value stops before any evaluator runs. Subclasses
  set `function` and `options_class` (zero-argument callables, so listing
  evaluators imports nothing heavy) and may set `required`, `defaults` and
  override `finish`.
  """

  function: Callable[[], Callable[..., Any]]
  options_class: Callable[[], type]
  required: tuple[str, ...] = ()
  defaults: dict[str, Any] = {}

  files: tuple[str, ...] = ()  # Options naming a file the evaluation reads (checked to exist up front).
  special_files: dict[str, tuple[str, ...]] = {}  # Values of those options that are not paths.

  def __init__(self, run: Any, **options: Any):
    self.run = run
    self.options = type(self)._build({**self.defaults, **options})

  @classmethod
  def _build(cls, options: dict[str, Any]) -> Any:
    fields = {f.name: f.type for f in dataclasses.fields(cls.options_class())}
    # A list is the comma list the field (a command's flag) takes; a number given to a text field
    # (`layers: 3` for the flag `--layers=3`) is that text.
    values = {k: _as_flag_value(v, str(fields.get(k, ""))) for k, v in options.items()}
    return cls.options_class()(**values).check()

  @classmethod
  def check_values(cls, entry: str, options: dict[str, Any], *, setting: str, num_layers: int | None) -> None:
    """UserError for an option of the wrong type, a layer out of range or a missing file (no run needed)."""
    checks.check_layers(entry, options, setting=setting, num_layers=num_layers)
    fields = {f.name: f.type for f in dataclasses.fields(cls.options_class())}
    values = {k: _as_flag_value(v, str(fields.get(k, ""))) for k, v in {**cls.defaults, **options}.items()}
    checks.check_types(entry, values, fields, setting=setting)
    checks.check_files(entry, values, cls.files, setting=setting, special=cls.special_files)
    try:
      cls._build({**cls.defaults, **options})
    except UserError as e:
      raise UserError(f"{setting}[{entry!r}]: {e}") from None

  @classmethod
  def option_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls.options_class()))

  @classmethod
  def required_options(cls) -> tuple[str, ...]:
    fields = dataclasses.fields(cls.options_class())
    bare = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return tuple(k for k in dict.fromkeys([*bare, *cls.required]) if k not in cls.defaults)

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return result

  def __call__(self) -> dict[str, Any]:
    return self.finish(type(self).function()(self.run, self.options))


def _as_flag_value(value: Any, annotation: str = "") -> Any:
  """[0, 2] -> '0,2' (the comma lists the options take); 3 -> '3' for a text field; anything else as it is."""
  if isinstance(value, Sequence) and not isinstance(value, str):
    return ",".join(map(str, value))
  if annotation.startswith("str") and isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  return value
