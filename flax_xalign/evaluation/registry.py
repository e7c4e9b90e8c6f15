"""Evaluators by name: `Evaluator(run, **options)()` returns a results dict.

The read side's counterpart of the objectives registry, in big_vision's way
(its `evaluators/common.py` builds `module.Evaluator(predict_fn, **config)`
per named entry of the config; ours are built from a finished run). An
evaluator is any class that is

  * constructed as `Evaluator(run, **options)`, where `run` is a
    `flax_xalign.runs.Run` (spec, dir, params, model, assets, vocabulary) and
    `options` are keyword-only arguments with defaults where a default makes
    sense; the constructor checks them and reads nothing heavy;
  * called with no arguments, returning a JSON-ready dict.

`evaluate(run, ["word_align", "bli"], options)` runs several and returns
`{name: results}`; `python -m flax_xalign.eval --gin.EVALS="['word_align','bli']"
--gin.EVAL_OPTIONS="{'word_align': {'gold': 'gold.txt', 'input': 'pairs.tsv'}}"`
does the same and writes it to MODEL_DIR/eval.json. As in big_vision, an
entry may name its evaluator with `type`, so one evaluator runs twice under
two names: `EVAL_OPTIONS={'wa_cos': {'type': 'word_align', 'similarity': 'cosine', ...}}`.

Adding an evaluation is one file and one line. The file:

    # flax_xalign/evaluation/evaluators/my_score.py
    class MyScore:
      def __init__(self, run, *, layer: int = 0):
        self.run, self.layer = run, layer

      def __call__(self) -> dict:
        from flax_xalign.evaluation import my_library  # heavy imports when run, not when listed
        return my_library.score(self.run.params(), self.run.spec, layer=self.layer)

and its line in `EVALUATORS` below: `"my_score": my_score.MyScore,`.

Evaluator modules never import this one (the protocol is structural), so the
registry stays the only place that lists them.
"""

from __future__ import annotations

import difflib
import inspect
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from flax_xalign.errors import UserError
from flax_xalign.evaluation import eval_json
from flax_xalign.evaluation.evaluators import checks, lexicon, mlm, sentences, word_alignment


class Evaluator(Protocol):
  """What every registered evaluator is (see the module docstring)."""

  def __init__(self, run: Any, **options: Any) -> None:
    ...

  def __call__(self) -> dict[str, Any]:
    ...


# The one registration list: name -> evaluator class.
EVALUATORS: dict[str, type] = {
    "mlm": mlm.MaskedTokenAccuracy,
    "alignment_score": mlm.AlignmentScore,
    "word_align": word_alignment.WordAlignment,
    "bli": lexicon.Bli,
    "rsim": lexicon.Rsim,
    "isomorphism": lexicon.Isomorphism,
    "retrieval": sentences.Retrieval,
    "transfer": sentences.Transfer,
}

# Option keys the registry itself reads (big_vision's `type`).
_TYPE = "type"


def names() -> tuple[str, ...]:
  return tuple(sorted(EVALUATORS))


def _close(name: str, known: Sequence[str]) -> str:
  close = difflib.get_close_matches(name, known, n=3)
  return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


def get(name: str) -> type:
  """The evaluator class registered as `name`; unknown names fail with the close matches."""
  if name not in EVALUATORS:
    raise UserError(f"Unknown evaluator {name!r}.{_close(name, names())} Known evaluators: "
                    f"{', '.join(names())}. Set them as --gin.EVALS=\"['mlm','word_align']\".")
  return EVALUATORS[name]


def option_names(cls: type) -> tuple[str, ...]:
  """The options an evaluator class takes: its `option_names()`, else its constructor's keywords."""
  if hasattr(cls, "option_names"):
    return tuple(cls.option_names())
  params = list(inspect.signature(cls).parameters.values())[1:]
  return tuple(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def required_options(cls: type) -> tuple[str, ...]:
  """Options without a default: its `required_options()`, else its constructor's."""
  if hasattr(cls, "required_options"):
    return tuple(cls.required_options())
  params = list(inspect.signature(cls).parameters.values())[1:]
  return tuple(p.name for p in params if p.default is p.empty and p.kind == p.KEYWORD_ONLY)


def check_options(name: str, cls: type, options: Mapping[str, Any]) -> None:
  """UserError naming an option `cls` does not take (with the close match) or a required one missing."""
  known = option_names(cls)
  for key in options:
    if key not in known:
      raise UserError(f"evaluator {name!r} has no option {key!r}.{_close(key, known)} Its options: "
                      f"{', '.join(known) or 'none'}.")
  missing = [key for key in required_options(cls) if key not in options]
  if missing:
    raise UserError(f"evaluator {name!r} needs option(s) {', '.join(missing)}: pass them as "
                    f"--gin.EVAL_OPTIONS=\"{{'{name}': {{'{missing[0]}': ...}}}}\".")


def create(name: str, run: Any, **options: Any) -> Evaluator:
  """`get(name)(run, **options)`, its options checked first."""
  cls = get(name)
  check_options(name, cls, options)
  return cls(run, **options)


def check_values(entry: str, cls: type, options: Mapping[str, Any], *, setting: str = "EVAL_OPTIONS",
                 num_layers: int | None = None) -> None:
  """UserError for an option value `cls` cannot run with: its `check_values`, else its constructor's types."""
  if hasattr(cls, "check_values"):
    cls.check_values(entry, dict(options), setting=setting, num_layers=num_layers)
    return
  params = list(inspect.signature(cls).parameters.values())[1:]
  checks.check_types(entry, options, {p.name: p.annotation for p in params}, setting=setting)
  checks.check_layers(entry, options, setting=setting, num_layers=num_layers)


def plan(evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None, *,
         setting: str = "EVALS", num_layers: int | None = None) -> list[tuple[str, type, dict[str, Any]]]:
  """(entry name, evaluator class, its options) per entry of `evals`, every name, option and value checked.

  Nothing runs and no run is needed: a typo or a missing gold file in the
  last entry stops before the first one spends minutes (and, in training,
  before MODEL_DIR is created). `setting` names the list in messages (EVALS
  or TRAIN_EVALS; its options are `<setting minus S>_OPTIONS`); `num_layers`,
  when known, bounds the layer options.
  """
  options_setting = setting.removesuffix("S") + "_OPTIONS"
  if options is not None and not isinstance(options, Mapping):
    raise UserError(f"{options_setting} must be a dict {{evaluator: {{option: value}}}}, got {options!r}.")
  options = dict(options or {})
  if isinstance(evals, str) or not isinstance(evals, Sequence):
    raise UserError(f"{setting} must be a list of evaluator names, e.g. ['mlm', 'word_align'], got {evals!r}"
                    + (f" (a string: write ['{evals}'])" if isinstance(evals, str) else "") + ".")
  if len(set(evals)) != len(evals):
    raise UserError(f"{setting} lists an evaluator twice ({list(evals)}); give a second entry its own name "
                    f"and its evaluator as 'type' in {options_setting}.")
  for key in options:
    if key not in evals:
      raise UserError(f"{options_setting} has options for {key!r}, which {setting} does not list "
                      f"({list(evals)}).{_close(key, evals)}")
  entries = []
  for entry in evals:
    spec = options.get(entry, {})
    if not isinstance(spec, Mapping):
      raise UserError(f"{options_setting}[{entry!r}] must be a dict of options, got {spec!r}.")
    spec = dict(spec)
    kind = spec.pop(_TYPE, entry)
    cls = get(kind)
    check_options(entry, cls, spec)
    check_values(entry, cls, spec, setting=options_setting, num_layers=num_layers)
    entries.append((entry, cls, spec))
  return entries


def check_data(evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None, data: Any, *,
               setting: str = "TRAIN_EVALS") -> None:
  """UserError when an evaluator reads a split of the run's own task that `data` (a DataSource) lacks.

  What training checks before MODEL_DIR is created, so a run does not train
  for an hour and stop at its first evaluation (`mlm`'s default split is
  'test', which a user's task often lacks). Evaluators say which split they
  read of the run's task with `data_split(options)` (None: none).
  """
  options_setting = setting.removesuffix("S") + "_OPTIONS"
  for entry, cls, spec in plan(evals, options, setting=setting):
    split = cls.data_split(spec) if hasattr(cls, "data_split") else None
    if split is not None and not data.has_split(split):
      raise UserError(f"{setting} entry {entry!r} reads the {split!r} split of {data.where}, which has no such "
                      f"split: set {options_setting}={{'{entry}': {{'split': 'validation'}}}} (a split it has), or "
                      f"{data.how_to_add_split(split)}.")


# Options that change where an evaluator finds the run's task: with them, it checks its split itself.
_TASK_OPTIONS = ("relocate", "import_modules", "user_tasks", "data", "mixture_or_task_name", "task")


def _check_run_splits(run: Any, entries: Sequence[tuple[str, type, dict[str, Any]]]) -> None:
  """UserError before any evaluator runs when one reads a split of the run's task that it lacks."""
  wanted = [(entry, cls.data_split(spec)) for entry, cls, spec in entries
            if hasattr(cls, "data_split") and not any(k in spec for k in _TASK_OPTIONS)]
  wanted = [(entry, split) for entry, split in wanted if split is not None]
  if not wanted:
    return
  def refuse(entry: str, split: str, why: str) -> UserError:
    return UserError(f"EVALS entry {entry!r} reads the {split!r} split of the run's task, but {why}: set "
                     f"EVAL_OPTIONS={{'{entry}': {{'split': 'validation'}}}} (a split it has).")

  try:
    data = run.task_data(wanted[0][1])  # Registers the run's tasks.
  except UserError as e:  # Its fix names --gin.SPLIT, which is not what sets an evaluator's split.
    raise refuse(wanted[0][0], wanted[0][1], str(e).split("; ")[0]) from None
  for entry, split in wanted:
    if not data.has_split(split):
      raise refuse(entry, split, f"{data.where} has no such split")


def evaluate(run: Any, evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None,
             *, log: Any = print) -> dict[str, dict[str, Any]]:
  """{entry: results} of the evaluators `evals` on `run`, in order (all checked before any runs)."""
  entries = plan(evals, options)
  evaluators = [(entry, cls(run, **spec)) for entry, cls, spec in entries]
  results = {}
  for entry, evaluator in evaluators:
    if log is not None:
      log(f"evaluator {entry}:")
    results[entry] = evaluator()
  return results


def run_evaluators(*, model_dir: str, evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None,
                   output: str | None = "eval.json") -> dict[str, dict[str, Any]]:
  """Opens the run in `model_dir`, runs `evals` and writes `{entry: results}` to MODEL_DIR/`output`."""
  import jax

  from flax_xalign.fileio import write_atomically
  from flax_xalign.runs import Run

  plan(evals, options)  # Before the run is opened: a typo costs nothing.
  run = Run.open(model_dir)
  plan(evals, options, num_layers=run.spec.model.num_layers)  # The layers, now that the size is known.
  if output:
    eval_json.check_layout(run.dir.file(output), eval_json.EVALUATORS, setting="evaluators.output")
  _check_run_splits(run, plan(evals, options))
  results = evaluate(run, evals, options)
  if output and jax.process_index() == 0:
    write_atomically(run.dir.file(output), json.dumps(results, indent=2, default=_json_default) + "\n")
  return results


def _json_default(value: Any) -> Any:
  """NumPy scalars and arrays, tuples' keys aside, as JSON (evaluators return plain dicts of them)."""
  import numpy as np

  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def format_summary(results: Mapping[str, Mapping[str, Any]]) -> str:
  """A few lines per entry: its headline numbers (numbers at the top level of its dict)."""
  lines = []
  for entry, result in results.items():
    head = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(head.items())[:8])
    lines.append(f"{entry}: {shown or 'see eval.json'}")
  return "\n".join(lines)
