"""The gin edge: every name a gin file may bind, registered in one place.

Library modules never import gin. `train.py` and `eval.py` import this module,
which registers the library's dataclasses and entry functions under short,
stable names (`EncoderConfig`, `OptimizerConfig`, `train`, `evaluate`, ...).
The registrations live in a library module, not in `__main__`, because gin 0.5
resolves configurables by module and `python -m` renames the entry module.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (gin 0.5 needs importlib.util loaded before --gin_file)

import gin

from flax_xalign.evaluation import mlm_eval
from flax_xalign.evaluation import registry as evaluation_registry
from flax_xalign.evaluation import transfer
from flax_xalign.models.config import EncoderConfig
from flax_xalign.objectives.dwa import DwaConfig
from flax_xalign.ops.align_solver import AlignmentSolver
from flax_xalign.objectives.model import MaskingConfig
from flax_xalign.tasks import bible as bible_tasks
from flax_xalign.tasks import code_switch as code_switch_tasks
from flax_xalign.tasks import debian as debian_tasks
from flax_xalign.tasks import synthetic as synthetic_tasks
from flax_xalign.tasks import tfds as tfds_tasks
from flax_xalign.tasks import user as user_tasks
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain

_REGISTERED = False


def eval_job(job=None, evals=()):
  """What `python -m flax_xalign.eval` runs: `eval_job.job = @evaluate` (runs/eval.gin, the
  masked-token accuracy) or `@pair_transfer` (runs/eval_pairs.gin, XNLI / PAWS-X transfer);
  with `eval_job.evals = %EVALS` non-empty, the registered evaluators of that list instead
  (`evaluators`, `evaluation/registry.run_evaluators`: one eval.json keyed by evaluator)."""
  if evals:
    return gin.get_configurable("flax_xalign.evaluators")(evals=list(evals))
  if job is None:
    raise RuntimeError("Required bindings for `eval_job` not provided in config: ['job']")
  return job()


def register() -> None:
  """Registers the configurables once per process."""
  global _REGISTERED
  if _REGISTERED:
    return
  for cls in (EncoderConfig, OptimizerConfig, MaskingConfig, CheckpointConfig, DwaConfig, AlignmentSolver,
              user_tasks.TextTask, user_tasks.TsvBitextTask, user_tasks.AlphaMixture,
              synthetic_tasks.SyntheticTasks, bible_tasks.BibleTasks, code_switch_tasks.CodeSwitchedTask,
              tfds_tasks.TfdsTasks, debian_tasks.DebianTasks):
    gin.external_configurable(cls, name=cls.__name__, module="flax_xalign")
  gin.external_configurable(pretrain, name="train", module="flax_xalign")
  gin.external_configurable(mlm_eval.evaluate, name="evaluate", module="flax_xalign")
  gin.external_configurable(transfer.pair_transfer_from_files, name="pair_transfer", module="flax_xalign")
  gin.external_configurable(eval_job, name="eval_job", module="flax_xalign")
  gin.external_configurable(evaluation_registry.run_evaluators, name="evaluators", module="flax_xalign")
  _REGISTERED = True
