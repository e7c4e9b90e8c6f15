"""An evaluator that is one call of an existing evaluation function.

Most evaluations already exist as a library function of a MODEL_DIR with
keyword options; `FunctionEvaluator` adapts one to the registry's protocol
without restating its options: they are the function's own keyword
parameters, less those the adapter fills in from the run (`fixed`), with the
function's defaults. So a typo in an option is caught by the registry before
anything runs, and a new option of the function is an evaluator option at once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


class FunctionEvaluator:
  """Calls `function()` with the run's arguments (`run_arguments`) and the user's options.

  Subclasses set `function` (a zero-argument callable returning the evaluation
  function, so that listing evaluators imports nothing heavy), `fixed` (the
  parameter names `run_arguments` fills) and may override `run_arguments`,
  `defaults` and `finish`.
  """

  function: Callable[[], Callable[..., Any]]
  fixed: tuple[str, ...] = ("model_dir",)
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
    return {"model_dir": self.run.dir.path}

  def finish(self, result: Any) -> dict[str, Any]:
    return result

  def __call__(self) -> dict[str, Any]:
    return self.finish(type(self).function()(**self.run_arguments(), **self.options))
