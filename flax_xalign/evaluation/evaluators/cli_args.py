"""Evaluators over a command whose logic still lives in its argparse `run(args)` (bli, retrieval).

The lexicon and retrieval evaluations are written as `run(args) -> dict`
in `flax_xalign/bli.py` and `flax_xalign/retrieval.py`. Until that logic
moves down into `evaluation/` (then the commands become wrappers of these
evaluators), an evaluator builds the command's own namespace (its parser's
defaults, so no option is restated here), sets the user's options on it, and
calls `run`. Options are the command's flag names (`dest`s) less the run
directory; list values become the comma lists the flags take.

This is a known upward dependency of `evaluation/` on the command modules
(hidden from the import graph, as it is imported by name). It is meant to go:
move `bli.run` and `retrieval.run` into `evaluation/` as functions of a Run
and replace these classes with `FunctionEvaluator`s over them.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


class CommandEvaluator:
  """Runs `<command>.run(args)` with the run's directory and the user's options.

  Subclasses set `command` (module name under flax_xalign), `required`
  (flags the parser requires besides the run directory, given placeholder
  values only to read the defaults), `run_flag`, `defaults` and may
  override `finish`.
  """

  command: str
  run_flag: str = "checkpoint"
  required: tuple[str, ...] = ()
  defaults: dict[str, Any] = {}

  def __init__(self, run: Any, **options: Any):
    self.run = run
    self.options = {**self.defaults, **options}

  @classmethod
  def _module(cls) -> Any:
    # An upward dependency (evaluation -> a command module), imported by name so that the import
    # graph does not show it: a stopgap, listed in the module docstring, until the logic moves down.
    return importlib.import_module(f"flax_xalign.{cls.command}")

  @classmethod
  def _namespace(cls, values: dict[str, str]) -> Any:
    argv = [f"--{cls.run_flag}={values.pop(cls.run_flag, '.')}"]
    argv += [f"--{name}={values.get(name, 'x')}" for name in cls.required]
    return cls._module().parse_args(argv)

  @classmethod
  def option_names(cls) -> tuple[str, ...]:
    return tuple(k for k in vars(cls._namespace({})) if k != cls.run_flag)

  @classmethod
  def required_options(cls) -> tuple[str, ...]:
    return tuple(k for k in cls.required if k not in cls.defaults)

  def finish(self, result: dict[str, Any]) -> dict[str, Any]:
    return result

  def __call__(self) -> dict[str, Any]:
    args = self._namespace({self.run_flag: self.run.dir.path,
                            **{k: str(self.options[k]) for k in self.required}})
    for name, value in self.options.items():
      if isinstance(value, Sequence) and not isinstance(value, str):
        value = ",".join(map(str, value))
      setattr(args, name, value)
    return self.finish(self._module().run(args))
