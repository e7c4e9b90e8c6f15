"""Where a run's folder becomes a `runs.Run`: the bridge the gin edge registers the evaluations through.

Library evaluations take the run itself, at the step it was opened at
(`mlm_eval.evaluate(run, ...)`, `transfer.pair_transfer_from_files(run, ...)`),
while gin files name a folder (`evaluate.model_dir = %MODEL_DIR`).
`taking_model_dir(evaluation)` is the one bridge: the same function with
`model_dir` in place of `run`, which it opens once and passes down. Its
signature is the evaluation's own (less `run`, plus `model_dir`), so gin
checks every binding against the real options, and config.gin and the
`--gin.evaluate.*` flags read as they always have.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def taking_model_dir(evaluation: Callable[..., Any]) -> Callable[..., Any]:
  """`evaluation(run, **options)` as `f(*, model_dir, **options)`, the run opened at its latest step."""
  parameters = list(inspect.signature(evaluation).parameters.values())
  if not parameters or parameters[0].name != "run":
    raise TypeError(f"{evaluation.__qualname__} does not take a run first")

  def opened(*, model_dir: str, **options: Any) -> Any:
    from flax_xalign.run_dir import RunDir
    from flax_xalign.runs import Run

    # Checked as a user's path (`~` expanded, a file refused); whether it must be writable is the
    # evaluation's to say, once it knows its output.
    return evaluation(Run.open(RunDir.from_user(model_dir, writable=False)), **options)

  opened.__name__, opened.__qualname__ = evaluation.__name__, evaluation.__qualname__
  opened.__module__, opened.__doc__ = evaluation.__module__, evaluation.__doc__
  model_dir = inspect.Parameter("model_dir", inspect.Parameter.KEYWORD_ONLY, annotation="str")
  opened.__signature__ = inspect.signature(evaluation).replace(parameters=[model_dir, *parameters[1:]])
  return opened
