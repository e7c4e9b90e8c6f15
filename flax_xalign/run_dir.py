"""MODEL_DIR's layout: the one place that names the files and folders of a run directory.

A run directory holds, whoever wrote it (a training run, an import, a trim):

  config.gin                 the operative gin config (training runs)
  metrics.jsonl              one JSON object per logged step
  tensorboard/               TensorBoard events
  eval.json                  `python -m flax_xalign.eval`'s result
  .lock                      the single-writer lock (training/model_dir.py)
  origin.json, NOTICE        where imported weights came from, their licence
  <asset files>              each asset's files at the run's start (vocabulary.model, dictionary.tsv, ...)
  checkpoints/<step>/        Orbax items: state/, data_iterator/, meta/, assets/
  checkpoints_damaged/<step> damaged steps moved aside, never deleted

`RunDir` is a plain value (a path and the names under it); it reads and
creates nothing. It lives beside `run_spec.py` rather than in `runs/`
because the writer (training/, interop/) and the readers (runs/ and above)
both need it, and training sits below runs. `RunDir.from_user` turns what a
user typed into a checked folder (`check_model_dir`).
"""

from __future__ import annotations

import dataclasses
import os

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.fileio import writable_folder

CHECKPOINTS = "checkpoints"
DAMAGED = "checkpoints_damaged"
CONFIG_GIN = "config.gin"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
EVAL_JSON = "eval.json"
LOCK = ".lock"
ORIGIN = "origin.json"
NOTICE = "NOTICE"
STEP_ASSETS = "assets"  # The assets item of a checkpoint step (training/checkpoints.ASSETS).


@dataclasses.dataclass(frozen=True)
class RunDir:
  """The paths of one MODEL_DIR (see the module docstring); `path` is kept as given.

  Attributes:
    path: the run directory; absolute when made by `from_user`.
  """

  path: str

  def __post_init__(self):
    object.__setattr__(self, "path", os.fspath(self.path))

  def __fspath__(self) -> str:  # A RunDir is the folder's path wherever a path is taken (open, f-strings).
    return self.path

  def __str__(self) -> str:
    return self.path

  @classmethod
  def of(cls, folder: "str | os.PathLike | RunDir") -> "RunDir":
    """`folder` itself when it is a RunDir (`pretrain` makes one per run and hands it down), else its RunDir."""
    return folder if isinstance(folder, RunDir) else cls(folder)

  @property
  def in_bucket(self) -> bool:
    """Whether the run lives in an object store (gs://, s3://): no renames, no flock there."""
    return storage.is_url(self.path)

  @classmethod
  def from_user(cls, path: object, *, setting: str = "MODEL_DIR", writable: bool = True) -> "RunDir":
    """The run directory a user named, checked (`check_model_dir`); creates nothing."""
    return cls(check_model_dir(path, setting=setting, writable=writable))

  def file(self, name: str) -> str:
    """A file directly in MODEL_DIR (an asset's file, an output such as aer.json)."""
    return storage.join(self.path, name)

  @property
  def checkpoints(self) -> str:
    return self.file(CHECKPOINTS)

  @property
  def damaged(self) -> str:
    return self.file(DAMAGED)

  @property
  def config_gin(self) -> str:
    return self.file(CONFIG_GIN)

  @property
  def metrics(self) -> str:
    return self.file(METRICS)

  @property
  def tensorboard(self) -> str:
    return self.file(TENSORBOARD)

  @property
  def eval_json(self) -> str:
    return self.file(EVAL_JSON)

  @property
  def lock(self) -> str:
    return self.file(LOCK)

  @property
  def origin(self) -> str:
    return self.file(ORIGIN)

  @property
  def notice(self) -> str:
    return self.file(NOTICE)

  @property
  def assets(self) -> str:
    """Where the run-level asset files are: MODEL_DIR itself (each asset names its own files)."""
    return self.path

  def step_dir(self, step: int) -> str:
    return storage.join(self.checkpoints, str(int(step)))

  def step_assets(self, step: int) -> str:
    """The asset files saved with checkpoint `step`."""
    return storage.join(self.step_dir(step), STEP_ASSETS)

  def __fspath__(self) -> str:
    return self.path

  def __str__(self) -> str:
    return self.path


def is_run_dir(path: str | os.PathLike) -> bool:
  """Whether `path` is a folder flax_xalign wrote as a run.

  Every writer of a run leaves a mark before its first other file: `train` and
  `assets` take MODEL_DIR/.lock first, imports and trims write checkpoints/
  (a run older than the lock has checkpoints/ too). A folder with neither is a
  user's, and no command writes a run into it unless it is empty.
  """
  run = RunDir(path)
  return storage.isfile(run.lock) or storage.isdir(run.checkpoints) or storage.isdir(run.damaged)


NOT_A_RUN = "a flax_xalign run (it has no checkpoints/ and no .lock)"


def check_model_dir(path: object, *, setting: str = "MODEL_DIR", writable: bool = True) -> str:
  """The absolute, normalised folder for `path`, or a UserError naming what is wrong with it.

  "" is refused (it used to write `./checkpoints` into the current folder),
  `~` and `~user` are expanded to the home folder (they used to become a
  literal folder named `~`), and a path that is a file, lies under a file, or
  cannot be written is refused. Nothing is created: the folder may not exist
  yet (its nearest existing parent must then be a writable folder).
  `writable=False` (a run only read, e.g. evaluated without writing a report)
  checks the name alone. A URL (gs://BUCKET/run) is kept as given, less its
  trailing slashes, once its bucket is found to exist and be reachable.
  """
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).strip():
    raise UserError(f"{setting}={path!r} is not a folder name; give the run's folder, e.g. "
                    f"--gin.{setting}=\\\"runs/demo\\\".")
  text = os.fspath(path)
  if storage.is_url(text):  # A bucket: the store is asked (does it exist, can it be reached) before any work.
    storage.check_run_store(text, setting=setting)
    return storage.absolute(text)
  expanded = os.path.expanduser(text)
  if expanded.startswith("~"):
    raise UserError(f"{setting}={text!r}: no home folder for {expanded.split(os.sep)[0]!r}; "
                    "spell the folder out.")
  folder = os.path.abspath(expanded)
  if not writable:
    return folder
  if os.path.exists(folder) and not os.path.isdir(folder):
    raise UserError(f"{setting}={text!r} is a file, not a folder; choose another {setting} or move the file.")
  existing = folder
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserError(f"{setting}={text!r} lies under {existing}, which is a file; choose another {setting}.")
  if not writable_folder(existing):
    where = "is" if existing == folder else f"would be created in {existing}, which is"
    raise UserError(f"{setting}={text!r} {where} not writable; choose a writable {setting} or fix the "
                    "folder's permissions.")
  return folder
