"""The gin edge: every name a gin file may bind, registered in one place.

Library modules never import gin. Every gin command (train, eval, assets, cache's and compile_check's gin
runs) reaches `register()` through `gin_cli`, which registers the library's dataclasses and entry functions
under short, stable names (`EncoderConfig`, `OptimizerConfig`, `train` (the `TrainConfig` of a run),
`train_job`, `evaluate`, ...); `train_job` and `eval_job` below are what `xalign train` and `xalign eval`
run, with the evaluators' training hook (`evaluation.during_training`) built here.
The registrations live in a library module, not in `__main__`, because gin 0.5
resolves configurables by module and `python -m` renames the entry module.
Importing this module is cheap: the library is imported by `register()`,
after a command has checked its flags (`gin_cli.check_flags`). The task
families' definitions (`TextTask`, `BibleTasks`, ...) import seqio and
TensorFlow, so `register_tasks()` registers them apart, only for a
configuration that names one (`gin_cli.parse_gin` retries a parse that failed
on one of `TASK_CONFIGURABLES`): a run from a packed cache imports neither.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  (gin 0.5 needs importlib.util loaded before --gin_file)

import gin

_REGISTERED = False
_TASKS_REGISTERED = False
# The gin names of the task families' definitions (registered by `register_tasks`).
TASK_CONFIGURABLES = ("TextTask", "TsvBitextTask", "AlphaMixture", "SyntheticTasks", "BibleTasks",
                      "CodeSwitchedTask", "TfdsTasks", "DebianTasks")
# The configurables a command's entry never calls: evaluations read the model, its objectives and its
# training settings from the run's saved config, so a binding of one is refused (`gin_cli.check_bindings_read`).
_TRAINING_ONLY = ("EncoderConfig", "OptimizerConfig", "MaskingConfig", "CheckpointConfig", "DwaConfig", "SoConfig",
                  "train", "train_job")
NOT_CALLED_BY = {"eval_job": _TRAINING_ONLY}


def eval_job(job=None, evals=()):
  """What `python -m flax_xalign.eval` runs: `eval_job.job = @evaluate` (runs/eval.gin, the
  masked-token accuracy) or `@pair_transfer` (runs/eval_pairs.gin, XNLI / PAWS-X transfer);
  with `eval_job.evals = %EVALS` non-empty, the registered evaluators of that list instead
  (`evaluators`, `evaluation/registry.run_evaluators`: one eval.json keyed by evaluator)."""
  if evals:
    # A string stays one (registry.plan names it as such) rather than becoming a list of its letters.
    return gin.get_configurable("flax_xalign.evaluators")(evals=evals if isinstance(evals, str) else list(evals))
  if job is None:
    from flax_xalign.errors import UserError

    raise UserError("nothing to evaluate: no gin file sets eval_job.job, and --gin_file replaces the default "
                    "runs/eval.gin; add --gin_file=runs/eval.gin (masked-token accuracy, or EVALS) or "
                    "--gin_file=runs/eval_pairs.gin (pair transfer); see xalign eval --help.")
  return job()


def train_job(evals=(), eval_options=None, evals_every=0, *, write_config=False, assets_only=False):
  """What `python -m flax_xalign.train` and `.assets` run: `pretrain` with the gin-bound `train`
  settings (a `TrainConfig`) and, with `train_job.evals = %TRAIN_EVALS` non-empty, the registered
  evaluators run on the checkpoint of every `evals_every` = %TRAIN_EVALS_EVERY-th step (options
  %TRAIN_EVAL_OPTIONS, as EVAL_OPTIONS), logged as `eval_<evaluator>_<key>` (runs/pretrain.gin).

  `write_config` (xalign train: write gin's operative config as MODEL_DIR/config.gin once the run is
  valid and restored) and `assets_only` come from the command, not from gin; they are handed to `train`
  only when set, so the operative config lists the same `train.*` lines as ever.
  """
  from flax_xalign.evaluation.during_training import evaluator_hook

  given = {"write_config": write_operative_config} if write_config else {}
  if assets_only:
    given["assets_only"] = True
  from flax_xalign.training.pretrain import pretrain

  _check_run_configured(given, prog="xalign assets" if assets_only else "xalign train")
  config = gin.get_configurable("flax_xalign.train")(**given)
  hooks = []
  if evals and not config.assets_only:
    hooks.append(evaluator_hook(config.model_dir, evals, eval_options, evals_every,
                                num_layers=getattr(config.encoder, "num_layers", None)))
  return pretrain(config, hooks=hooks)


def write_operative_config(model_dir: str) -> None:
  """Writes gin's operative config atomically as MODEL_DIR/config.gin (what the run was trained with)."""
  from flax_xalign.fileio import write_atomically
  from flax_xalign.run_dir import CONFIG_GIN, RunDir

  write_atomically(RunDir(model_dir).file(CONFIG_GIN), gin.operative_config_str())


# How a user sets each required TrainConfig field (runs/pretrain.gin binds the macros).
_REQUIRED_TRAIN = {"model_dir": "MODEL_DIR", "mixture_or_task_name": "MIXTURE_OR_TASK_NAME",
                   "task_feature_lengths": "TASK_FEATURE_LENGTHS", "batch_size": "BATCH_SIZE",
                   "train_steps": "TRAIN_STEPS", "encoder": "a model size (models/*.gin)",
                   "objectives": "objectives (objectives/*.gin)"}


def _check_run_configured(given, *, prog: str) -> None:
  """One line naming what to pass when the gin files bind no run (`xalign train` with no flags).

  Without it the run's TrainConfig fails on its missing fields with a TypeError.
  """
  import dataclasses

  from flax_xalign.errors import UserError
  from flax_xalign.training.config import TrainConfig

  missing = []
  for field in dataclasses.fields(TrainConfig):
    required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    if required and field.name not in given:
      try:
        gin.query_parameter(f"flax_xalign.train.{field.name}")
      except ValueError:
        missing.append(_REQUIRED_TRAIN.get(field.name, f"train.{field.name}"))
  if missing:
    raise UserError(f"no run to {'build' if 'assets' in prog else 'train'}: nothing sets {', '.join(missing)}; "
                    "pass a run's gin files and its folder, e.g. --gin_file=runs/pretrain.gin "
                    "--gin_file=models/tiny.gin --gin.MODEL_DIR=\\\"runs/demo\\\" (an experiment's gin "
                    f"file sets the rest); see {prog} --help.")


def register() -> None:
  """Registers the configurables once per process."""
  global _REGISTERED
  if _REGISTERED:
    return
  from flax_xalign.runs.by_folder import taking_model_dir
  from flax_xalign.evaluation import mlm_eval
  from flax_xalign.evaluation import registry as evaluation_registry
  from flax_xalign.evaluation.transfer import transfer
  from flax_xalign.models.config import EncoderConfig
  from flax_xalign.objectives.dwa import DwaConfig
  from flax_xalign.objectives.model import MaskingConfig
  from flax_xalign.objectives.so import SoConfig
  from flax_xalign.ops.align_solver import AlignmentSolver
  from flax_xalign.training.checkpoints import CheckpointConfig
  from flax_xalign.training.config import TrainConfig
  from flax_xalign.training.optimizer import OptimizerConfig

  for cls in (EncoderConfig, OptimizerConfig, MaskingConfig, CheckpointConfig, DwaConfig, SoConfig,
              AlignmentSolver):
    gin.external_configurable(cls, name=cls.__name__, module="flax_xalign")
  # `train.<field>` bindings fill the fields of the run's TrainConfig; `train_job` runs it.
  gin.external_configurable(TrainConfig, name="train", module="flax_xalign")
  gin.external_configurable(train_job, name="train_job", module="flax_xalign",
                            denylist=["write_config", "assets_only"])
  # The evaluations take a runs.Run; gin names its folder, opened once here.
  gin.external_configurable(taking_model_dir(mlm_eval.evaluate), name="evaluate", module="flax_xalign")
  gin.external_configurable(taking_model_dir(transfer.pair_transfer_from_files), name="pair_transfer",
                            module="flax_xalign")
  gin.external_configurable(eval_job, name="eval_job", module="flax_xalign")
  gin.external_configurable(evaluation_registry.run_evaluators, name="evaluators", module="flax_xalign")
  _REGISTERED = True


def register_tasks() -> None:
  """Registers the task families' definitions (imports seqio and TensorFlow); once per process."""
  global _TASKS_REGISTERED
  if _TASKS_REGISTERED:
    return
  from flax_xalign.tasks import bible as bible_tasks
  from flax_xalign.tasks import code_switch as code_switch_tasks
  from flax_xalign.tasks import debian as debian_tasks
  from flax_xalign.tasks import synthetic as synthetic_tasks
  from flax_xalign.tasks import tfds as tfds_tasks
  from flax_xalign.tasks import user as user_tasks

  for cls in (user_tasks.TextTask, user_tasks.TsvBitextTask, user_tasks.AlphaMixture, synthetic_tasks.SyntheticTasks,
              bible_tasks.BibleTasks, code_switch_tasks.CodeSwitchedTask, tfds_tasks.TfdsTasks,
              debian_tasks.DebianTasks):
    assert cls.__name__ in TASK_CONFIGURABLES, cls
    gin.external_configurable(cls, name=cls.__name__, module="flax_xalign")
  _TASKS_REGISTERED = True
