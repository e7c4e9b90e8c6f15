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

  def __init__(self, run: Any, **options: Any):
    self.run = run
    values = {k: _as_flag_value(v) for k, v in {**self.defaults, **options}.items()}
    self.options = type(self).options_class()(**values).check()

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


def _as_flag_value(value: Any) -> Any:
  """[0, 2] -> '0,2' (the comma lists the options take); anything else as it is."""
  if isinstance(value, Sequence) and not isinstance(value, str):
    return ",".join(map(str, value))
  return value
