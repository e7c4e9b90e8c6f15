"""Session fixtures shared across test files (pytest plugin, loaded by tests/conftest.py).

* `shared_run`: ONE tiny MODEL_DIR trained once per pytest run by the real entry point
  (`flax_xalign.cli.train.main`, in-process): the tiny encoder of tests/testlib.py on a copy of the
  session's tiny corpus (tasks `hz_en`, `hz_de` (monolingual text of both languages, which the contextual
  layers of `bli` need), `hz_de_en`, mixture `hz_mix`), 4 steps, a loss row per step,
  checkpoints at steps 2 and 4 and a held-out evaluation at step 4. Under pytest-xdist the first worker
  that asks trains it under a file lock in the folder every worker shares; the others wait and reuse it,
  so it is trained once per run. Read-only: a test that resumes, evaluates into or damages a run takes
  `shared_run_copy`.
* `shared_run_copy`: a private copy of that MODEL_DIR.

The run's gin file and its corpus live in the shared folder (not in one worker's tmp), so any worker can
resume it; a test that writes another gin file for the same tasks (tag `hz`) writes it with
`write_shared_run_gin` (same tasks, same files), since a task name cannot be registered twice with other
definitions.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil

import pytest

SHARED_TAG = "hz"
SHARED_STEPS = 4
_DONE = "shared_run.json"


def _shared_root(tmp_path_factory):
  """The folder all xdist workers of this run share (the run's own basetemp without xdist)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _copy_corpus(corpus: dict, folder) -> dict:
  """The tiny corpus's files and vocabulary copied under `folder`, as a corpus dict for write_run_gin."""
  folder.mkdir(parents=True, exist_ok=True)
  files = {}
  for key, path in corpus["files"].items():
    target = folder / os.path.basename(path)
    shutil.copyfile(path, target)
    files[key] = str(target)
  vocab = folder / os.path.basename(corpus["vocab"])
  shutil.copyfile(corpus["vocab"], vocab)
  return {"root": folder, "files": files, "vocab": str(vocab)}


# The German monolingual task, added to harness.write_run_gin's English and de-en tasks.
_DE_TASK = """
h_de/TextTask.name = '{tag}_de'
h_de/TextTask.files = {files}
h_de/TextTask.lang = 'de'
h_de/TextTask.vocabulary_path = '{vocab}'
h_mix/AlphaMixture.tasks = ['{tag}_en', '{tag}_de', '{tag}_de_en']
train.user_tasks = [@h_en/TextTask(), @h_de/TextTask(), @h_pairs/TsvBitextTask(), @h_mix/AlphaMixture(){more}]
"""


def write_shared_run_gin(path, corpus: dict, *, extra: str = "", more_user_tasks: str = "") -> str:
  """The shared run's gin file (tasks `hz_en`, `hz_de`, `hz_de_en`, `hz_mix` over `corpus`) at `path`.

  `extra` is appended; `more_user_tasks` (e.g. ", @h_mix2/AlphaMixture()") extends `train.user_tasks`.
  """
  from tests.hardening import harness

  files = {s: corpus["files"][("de", s)] for s in ("train", "validation")}
  de_task = _DE_TASK.format(tag=SHARED_TAG, files=json.dumps(files), vocab=corpus["vocab"], more=more_user_tasks)
  return harness.write_run_gin(path, corpus, tag=SHARED_TAG, extra=de_task + extra)


def _train(folder, tiny_corpus) -> dict:
  from flax_xalign.cli import train as train_cli
  from tests.hardening import harness

  corpus = _copy_corpus(tiny_corpus, folder / "corpus")
  gin_file = write_shared_run_gin(folder / "run.gin", corpus)
  model_dir = folder / "model"
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = train_cli.main(harness.train_argv(gin_file, model_dir, f"--gin.TRAIN_STEPS={SHARED_STEPS}",
                                               f"--gin.EVAL_EVERY={SHARED_STEPS}"))
    except SystemExit as e:
      code = e.code
  return {"code": code, "dir": str(model_dir), "gin": gin_file, "stdout": out.getvalue(), "stderr": err.getvalue(),
          "corpus": {"files": [[list(k), v] for k, v in corpus["files"].items()], "vocab": corpus["vocab"]}}


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory, tiny_corpus):
  """{dir, gin, tag, steps, stdout, stderr, corpus} of the session's one trained MODEL_DIR (read-only)."""
  import pathlib

  folder = _shared_root(tmp_path_factory) / "shared_run"
  folder.mkdir(exist_ok=True)
  with open(folder / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      done = folder / _DONE
      if not done.exists():
        for stale in ("model", "corpus"):  # An earlier worker died half way.
          shutil.rmtree(folder / stale, ignore_errors=True)
        record = _train(folder, tiny_corpus)
        done.write_text(json.dumps(record))
      record = json.loads(done.read_text())
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)
  if record["code"] != 0:
    pytest.fail(f"the shared tiny training run failed (exit {record['code']}): {record['stderr'][-3000:]}")
  corpus = {"root": folder / "corpus", "vocab": record["corpus"]["vocab"],
            "files": {tuple(k): v for k, v in record["corpus"]["files"]}}
  return {"dir": pathlib.Path(record["dir"]), "gin": record["gin"], "tag": SHARED_TAG, "steps": SHARED_STEPS,
          "stdout": record["stdout"], "stderr": record["stderr"], "corpus": corpus}


@pytest.fixture
def shared_run_copy(shared_run, tmp_path):
  """A private copy of the shared MODEL_DIR (a test may resume, evaluate into or damage it)."""
  target = tmp_path / "shared_model"
  shutil.copytree(shared_run["dir"], target, symlinks=True)
  return target
