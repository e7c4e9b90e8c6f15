"""The registered evaluators run during training: the `CheckpointHook` `xalign train` injects into `pretrain`.

The training layer knows neither the evaluators nor the run handle; the gin edge (`train_job`) builds this
hook from TRAIN_EVALS / TRAIN_EVAL_OPTIONS / TRAIN_EVALS_EVERY and hands it to `pretrain(hooks=...)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.errors import UserError


def evaluator_hook(model_dir: str, evals: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None,
                   every: int, *, num_layers: int | None = None) -> Any:
  """The training loop's hook that runs the registered evaluators `evals` every `every` steps.

  `TRAIN_EVALS=['word_align']`, `TRAIN_EVAL_OPTIONS={'word_align': {...}}` (as
  EVALS / EVAL_OPTIONS of `python -m flax_xalign.eval`) and
  `TRAIN_EVALS_EVERY=N` (a multiple of CHECKPOINT_EVERY). At each of those
  steps, once its checkpoint is written, the run is opened at that step and
  each evaluator's numbers are logged as `eval_<evaluator>_<key>`. Names and
  options are checked here, before training starts and before MODEL_DIR is
  created: names, every option's type and value, layers against
  `num_layers` (the model's), and that the files they read are there.
  """
  from flax_xalign.evaluation import registry
  from flax_xalign.runs import Run
  from flax_xalign.training.hooks import CheckpointHook

  registry.plan(evals, options, setting="TRAIN_EVALS", num_layers=num_layers)
  if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
    raise UserError(f"TRAIN_EVALS={list(evals)} needs TRAIN_EVALS_EVERY > 0 (got {every!r}): the steps between "
                    "evaluations, a multiple of CHECKPOINT_EVERY.")

  def run_evaluators(step: int) -> dict[str, Any]:
    print(f"  evaluators at step {step}: {', '.join(evals)}", flush=True)
    return registry.evaluate(Run.open(model_dir, step=step), evals, options, log=None)

  def check(data: Any) -> None:  # The run's data, once assembled: before MODEL_DIR exists.
    registry.check_data(evals, options, data, setting="TRAIN_EVALS")

  return CheckpointHook(name="evaluators", fn=run_evaluators, every=every, prefix="eval_",
                        setting="TRAIN_EVALS_EVERY", check=check)
