"""`Run.open(model_dir)`: the one way to read a finished run.

Evaluation, the aligner, BLI, retrieval, transfer, export and trim, the
reports, the CLIs and the experiment drivers all read a run through this
handle rather than opening checkpoints piecemeal:

    run = Run.open("runs/demo")            # the latest step; Run.open(d, step=3) for another
    run.spec                               # the run manifest (RunSpec) of that step
    params = run.params()                  # the encoder's parameters, sharded on a mesh
    run.model                              # the plain MLM model they belong to
    vocabulary = run.vocabulary()          # the run's own tokenizer, checked against the manifest
    run.assets(("token_map",))             # asset values saved with the step, fingerprint-checked
    run.register_tasks()                   # the run's user-defined tasks, registered again
    data = run.task_data("test")           # its task, checked to fit the run (languages, vocabulary)

Opening reads the step's manifest only; parameters, assets and vocabulary
are read when asked for. Nothing here writes into MODEL_DIR. A run written
before this module existed opens unchanged: the layout (`RunDir`) and the
checkpoint items are the ones training has always written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Mapping, Sequence

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.run_dir import RunDir
from flax_xalign.run_spec import RunSpec
from flax_xalign.runs import checkpoints as run_checkpoints


def _no_checkpoint(run_dir: RunDir) -> str:
  """Why a folder without a finished checkpoint cannot be read, told apart: not a run at all, or not trained yet."""
  from flax_xalign.run_dir import is_run_dir

  path = run_dir.path
  storage.check_store(path, setting="MODEL_DIR")  # A URL whose bucket is missing is that, not an untrained run.
  names = sorted(storage.listdir(path)) if storage.isdir(path) else []
  if names and not is_run_dir(path) and not storage.isfile(run_dir.config_gin):
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (f"{path} is not a flax_xalign run: it has no checkpoint and no checkpoints/ folder, and holds {shown}; "
            "pass the MODEL_DIR that python -m flax_xalign.train (or an import) wrote.")
  return f"{path} has no checkpoint to evaluate; train first (python -m flax_xalign.train)."


@dataclasses.dataclass(frozen=True)
class Run:
  """A finished run at one checkpoint step (see the module docstring).

  Attributes:
    dir: its MODEL_DIR layout (`dir.path` is the folder as given to `open`).
    step: the step opened (the latest unless `open` was given one).
    latest_step: the latest finished step.
    spec: the run manifest saved with `step`.
    fingerprints: the asset fingerprints saved with `step`.
  """

  dir: RunDir
  step: int
  latest_step: int
  spec: RunSpec
  fingerprints: Mapping[str, Any]

  @classmethod
  def open(cls, model_dir: str | os.PathLike | RunDir, *, step: int | None = None) -> "Run":
    """The run in `model_dir` at `step` (by default the newest complete one); reads only its manifest.

    A damaged newer step (an interrupted save, a deleted item, a `state/`
    whose parameters do not read back: each is read once to know) is
    named in one warning line, once per process, and skipped: readers never
    move or change a run's files. A `step` asked for is never replaced: when
    it is missing or damaged, that is the error.

    Raises:
      UserError: no finished checkpoint in `model_dir`, no complete one, or a
        given step that is missing or damaged.
    """
    run_dir = model_dir if isinstance(model_dir, RunDir) else RunDir(os.fspath(model_dir))
    storage.check_run_store(run_dir.path, setting="MODEL_DIR")  # (s3://: Orbax cannot read a run there)
    latest = run_checkpoints.find_latest_step(run_dir.path)
    if latest is None:
      raise UserError(_no_checkpoint(run_dir))
    if step is None:
      from flax_xalign.training.run_reader import warn_damaged_once

      step, damaged = run_checkpoints.newest_complete_step(run_dir.path)
      warn_damaged_once(run_dir.path, damaged, step)
    else:
      run_checkpoints.check_requested_step(run_dir.path, int(step))
    step = int(step)
    _, spec, fingerprints = run_checkpoints.read_run_spec(run_dir.path, step=step)
    return cls(dir=run_dir, step=step, latest_step=latest, spec=spec, fingerprints=dict(fingerprints))

  @property
  def path(self) -> str:
    return self.dir.path

  def at(self, step: int | None) -> "Run":
    """This run at another checkpoint step (itself for None or its own step)."""
    return self if step is None or int(step) == self.step else Run.open(self.dir, step=step)

  @property
  def model(self) -> Any:
    """The plain masked forward pass (MLM) with the run's encoder config and special ids.

    Objectives that need assets are not rebuilt: every evaluation reads the
    encoder (and the MLM head) only.
    """
    from flax_xalign.models.encoder import Encoder
    from flax_xalign.objectives.model import PretrainingModel

    return PretrainingModel(encoder=Encoder(self.spec.model), objectives={"mlm": 1.0},
                            specials=self.spec.vocabulary.specials, vocab_copies=self.spec.vocabulary.factor)

  def params(self, step: int | None = None, *, num_partitions: int = 1, mesh: Any = None) -> Any:
    """The parameters of `model` saved at `step` (default: the opened one).

    Sharded by the training rules on `mesh`, by default a ('data', 'model')
    mesh over every device with `num_partitions` on 'model'.
    """
    import flax.linen as nn
    import jax

    from flax_xalign.training import partitioning
    from flax_xalign.training.checkpoints import restore_params

    model = self.model
    partitioner = partitioning.Partitioner(mesh=mesh if mesh is not None else partitioning.make_mesh(num_partitions))
    boxed = jax.eval_shape(lambda k: model.init(k, batch=1, length=8), jax.random.key(0))
    shardings = partitioner.shardings_for(boxed)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            nn.meta.unbox(boxed), shardings)
    from flax_xalign.training.checkpoints import DamagedCheckpointError

    try:
      return restore_params(self.dir.path, abstract, step=self.step if step is None else step)
    except DamagedCheckpointError as e:
      raise run_checkpoints.requested_step_damaged(self.dir.path, e) from None

  def assets(self, names: Sequence[str], step: int | None = None) -> dict[str, Any]:
    """Host values of the assets `names` saved at `step`, each checked against that step's fingerprint.

    The run's tasks are registered first: an asset may need its task (e.g.
    the token map of a synthetic language).
    """
    from flax_xalign.assets import registry
    from flax_xalign.training.checkpoints import load_step_assets

    at = self.at(step)
    at.register_tasks()
    assets = {name: registry.create(name, at.spec) for name in names}
    return load_step_assets(at.dir.path, at.step, assets, at.fingerprints)

  def vocabulary(self, step: int | None = None, *, path: str | None = None) -> Any:
    """The seqio vocabulary the run was trained with, checked against its manifest.

    From the run's own copy in MODEL_DIR, else the one saved with checkpoint
    `step` (default: the opened one). `path` (a SentencePiece model) replaces
    both; it must be the file the run was trained with.
    """
    from flax_xalign.assets.vocabulary import load_run_vocabulary

    if path:
      from flax_xalign.data.vocab import sentencepiece as vocab_lib
      vocabulary = vocab_lib.load_vocabulary(path)
      if hashlib.sha256(vocabulary.sp_model).hexdigest() != self.spec.vocabulary.sha256:
        raise UserError(f"{path} is not the vocabulary {self.dir.path} was trained with (sha256 "
                        "differs); pass the SentencePiece model of that run.")
      return vocabulary
    step_copy = self.dir.step_assets(self.step if step is None else step)
    if (not storage.isfile(self.dir.file(self.spec.vocabulary.file))
        and storage.isfile(os.path.join(step_copy, self.spec.vocabulary.file))):
      return load_run_vocabulary(step_copy, self.spec.vocabulary)
    return load_run_vocabulary(self.dir.assets, self.spec.vocabulary)

  def register_tasks(self, *, relocate: Mapping[str, str] | None = None, splits: Sequence[str] = (),
                     import_modules: Sequence[str] = (), user_tasks: Sequence[Any] = ()) -> None:
    """Registers the user-defined tasks (user files, synthetic languages) the run was trained on.

    A no-op when the run's task is registered already and no module or
    task is given. The options are `runs.tasks.register_run_tasks`'s: data
    that moved (`relocate`), the splits whose files are checked, Python
    modules to import and task specs to register first.
    """
    from flax_xalign import tasks
    from flax_xalign.runs import tasks as run_tasks

    if not (import_modules or user_tasks):
      if not self.spec.task:
        return  # An imported model: trained on no task of ours.
      try:
        tasks.get_provider(self.spec.task)
        return
      except UserError:
        pass
    run_tasks.register_run_tasks(self.spec, model_dir=self.dir.path, step=self.step, relocate=relocate,
                                 splits=splits, import_modules=import_modules, user_tasks=user_tasks)

  def task_data(self, split: str, *, name: str | None = None, data: str = "seqio", **options: Any) -> Any:
    """The task (the run's own, or `name`) to read `split` of, checked to fit the run.

    `data` is where it is read from, as `train.data` ("seqio", "cache:DIR").
    Registers the run's tasks first when the registry is read (`options`
    are `register_tasks`'s), and refuses a task with other languages or
    another vocabulary than the run's.

    Returns:
      a `training.data_source.DataSource` (its `batches(...)`).
    """
    from flax_xalign.training.data import resolve_task

    run = self.spec
    name = name or run.task
    languages = list(run.languages)
    data = resolve_task(name, languages=languages if name == run.task else None, data=data,
                        register_tasks=lambda: self.register_tasks(splits=("train", split), **options))
    if list(data.languages) != languages:
      raise UserError(f"{name!r} has languages {list(data.languages)} but {self.dir.path} was trained on "
                      f"{languages}; evaluate on a task with the run's languages.")
    if data.vocabulary_spec.sha256 != run.vocabulary.sha256:
      fix = ("its vocabulary file changed since training: restore it, or move it aside so that eval uses the "
             f"run's own copy ({self.dir.file(run.vocabulary.file)})" if name == run.task else
             "evaluate on a task with the run's vocabulary")
      raise UserError(f"{name!r} tokenises with another vocabulary than {self.dir.path} was trained with (sha256 "
                      f"{data.vocabulary_spec.sha256[:12]} vs {run.vocabulary.sha256[:12]} in its run "
                      f"manifest); {fix}.")
    return data
