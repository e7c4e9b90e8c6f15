"""The probe harness: run an entry point's `main(argv)` in-process and check the one-error contract (C1).

C1: exit status 2; stderr holds exactly one line starting with `error: ` that names the problem and the
fix (it may continue on indented lines, never with another `error:` line); no `Traceback`, no
`ERROR:absl:` line, no gin `In call to configurable` suffix, no TF autograph stack; MODEL_DIR is
byte-identical before and after (names and contents), and a MODEL_DIR that did not exist is not created.

Every check is collected first and reported in one assertion, so a failing case says everything that is
wrong with it in one readable message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tests.testlib import tiny_encoder_gin, user_mixture_gin

REPO = pathlib.Path(__file__).resolve().parents[2]

ENTRY_POINTS = {
    "train": "flax_xalign.train",
    "eval": "flax_xalign.eval",
    "align": "flax_xalign.cli.align",
    "assets": "flax_xalign.cli.assets",
    "retrieval": "flax_xalign.cli.retrieval",
    "trim": "flax_xalign.cli.trim",
    "demo": "flax_xalign.cli.demo",
    "vocab": "flax_xalign.cli.vocab",
    "lexicon": "flax_xalign.cli.lexicon",
    "debian_data": "flax_xalign.cli.debian_data",
    "align_mlm_grid": "flax_xalign.cli.experiments.align_mlm_grid",
    "bli_table": "flax_xalign.cli.experiments.bli_table",
    "code_switch": "flax_xalign.cli.experiments.code_switch",
    "mlm_gc": "flax_xalign.cli.experiments.mlm_gc",
    "cache": "flax_xalign.cli.cache",
    "cache_beam": "flax_xalign.cli.cache_beam",
    "eflomal": "flax_xalign.cli.eflomal",
    "bli": "flax_xalign.cli.bli",
    "cooc": "flax_xalign.cli.cooc",
    "export_hf": "flax_xalign.cli.export_hf",
    "import_hf": "flax_xalign.cli.import_hf",
    "e5_small": "flax_xalign.cli.e5_small",
    "compile_check": "flax_xalign.cli.compile_check",
    "xalign": "flax_xalign.cli.xalign",
    "gpu_bundle": "flax_xalign.cli.gpu_bundle",
    "gpu_run": "flax_xalign.cli.gpu_run",
    # `train` where TensorFlow, tensorflow_text and seqio cannot be imported (tests/training/no_tf_train.py).
    "train_without_tf": "tests.training.no_tf_train",
}

# Marks of output a user must never see after a refused run (C1).
FORBIDDEN = ("Traceback", "ERROR:absl", "In call to configurable", "autograph", 'File "/')


# --- MODEL_DIR fingerprints -------------------------------------------------


def tree_digest(path: str | os.PathLike) -> dict[str, str] | None:
  """{relative path: sha256 of the file, 'dir' or 'link -> target'} of everything under `path`.

  None if `path` does not exist; a plain file is {'.': its sha256}. Modes are left out on purpose (C1
  promises names and contents).
  """
  path = os.fspath(path)
  if not os.path.lexists(path):
    return None
  if not os.path.isdir(path):
    return {".": _sha256(path)}
  out = {}
  for dirpath, dirnames, filenames in os.walk(path):
    for name in dirnames:
      full = os.path.join(dirpath, name)
      out[os.path.relpath(full, path)] = f"link -> {os.readlink(full)}" if os.path.islink(full) else "dir"
    for name in filenames:
      full = os.path.join(dirpath, name)
      out[os.path.relpath(full, path)] = (f"link -> {os.readlink(full)}" if os.path.islink(full)
                                          else _sha256(full))
  return out


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def digest_difference(before: dict | None, after: dict | None) -> str:
  """A short description of how two tree digests differ ('' if equal)."""
  if before == after:
    return ""
  if before is None:
    return f"MODEL_DIR was created ({sorted(after or {})[:6]})"
  if after is None:
    return "MODEL_DIR was removed"
  added = sorted(set(after) - set(before))
  removed = sorted(set(before) - set(after))
  changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
  return f"MODEL_DIR changed: added {added[:5]}, removed {removed[:5]}, changed {changed[:5]}"


# --- running entry points ------------------------------------------------------


@dataclasses.dataclass
class Outcome:
  code: int
  out: str
  err: str
  seconds: float


def call_main(entry: str, argv: Sequence[str]) -> int:
  """`<entry>.main(argv)` in this process; a SystemExit (argparse) becomes its status."""
  module = importlib.import_module(ENTRY_POINTS[entry])
  try:
    code = module.main(list(argv))
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  return code


def run_main(capfd, entry: str, argv: Sequence[str]) -> Outcome:
  """Runs an entry point in-process, capturing file descriptors 1 and 2 (absl and TF C++ logs too)."""
  capfd.readouterr()
  start = time.monotonic()
  code = call_main(entry, argv)
  seconds = time.monotonic() - start
  captured = capfd.readouterr()
  return Outcome(code, captured.out, captured.err, seconds)


def error_message(err: str) -> str:
  """The `error:` line and its indented continuation lines."""
  lines = err.splitlines()
  for i, line in enumerate(lines):
    if line.startswith("error: "):
      block = [line]
      for more in lines[i + 1:]:
        if more.startswith((" ", "\t")):
          block.append(more)
        else:
          break
      return "\n".join(block)
  return ""


def user_error_problems(outcome: Outcome, keywords: Sequence[str | tuple[str, ...]] = ()) -> list[str]:
  """Everything about `outcome` that breaks C1's form (an empty list: it holds)."""
  problems = []
  if outcome.code != 2:
    problems.append(f"exit status {outcome.code}, expected 2")
  error_lines = [l for l in outcome.err.splitlines() if l.startswith("error") or ": error:" in l]
  proper = [l for l in outcome.err.splitlines() if l.startswith("error: ")]
  if len(proper) != 1 or len(error_lines) != 1:
    problems.append(f"{len(proper)} 'error: ' lines ({len(error_lines)} lines with an error: prefix), "
                    f"expected 1: {error_lines[:3]!r}")
  message = error_message(outcome.err).lower()
  for keyword in keywords:
    options = (keyword,) if isinstance(keyword, str) else keyword
    if message and not any(option.lower() in message for option in options):
      problems.append(f"the error does not mention {' or '.join(map(repr, options))}")
  for mark in FORBIDDEN:
    if mark in outcome.err or mark in outcome.out:
      problems.append(f"output holds {mark!r}")
  return problems


def summary(outcome: Outcome) -> str:
  tail = outcome.err.strip().splitlines()[-6:]
  return f"exit {outcome.code}; stderr tail: {tail!r}"


def assert_user_error(outcome: Outcome, *keywords: str | tuple[str, ...], model_dir=None,
                      before: dict | str | None = "skip") -> None:
  """C1 for one refused run; `before` is MODEL_DIR's tree_digest before the run ('skip': not checked)."""
  problems = user_error_problems(outcome, keywords)
  if before != "skip":
    difference = digest_difference(before, tree_digest(model_dir))
    if difference:
      problems.append(difference)
  assert not problems, "; ".join(problems) + " -- " + summary(outcome)


def warning_lines(text: str) -> list[str]:
  return [l for l in text.splitlines() if l.startswith("warning: ")]


# --- tiny runs -----------------------------------------------------------------


def write_run_gin(path: pathlib.Path, corpus: dict, *, tag: str, en: dict | None = None, tsv: dict | None = None,
                  vocab: str | None = None, tasks: Sequence[str] | None = None, extra: str = "",
                  checkpoint_every: int = 2, eval_every: int = 0) -> str:
  """A run gin file over the tiny corpus: tasks `<tag>_en`, `<tag>_de_en` and mixture `<tag>_mix`.

  Task names are global in a process and a name cannot be redefined differently, so every test that
  changes a task's files passes its own `tag`.
  """
  files = corpus["files"]
  en = en or {"train": files[("en", "train")], "validation": files[("en", "validation")]}
  tsv = tsv or {"train": files[("de_en", "train")], "validation": files[("de_en", "validation")]}
  vocab = vocab or corpus["vocab"]
  tasks = list(tasks or [f"{tag}_en", f"{tag}_de_en"])
  user_tasks = user_mixture_gin(
      scope="h", en_name=f"{tag}_en", pair_name=f"{tag}_de_en", mixture_name=f"{tag}_mix",
      en_files=en, tsv_files=tsv, vocab=vocab, tasks=tasks, mixture_scope="h_mix")
  path.write_text(_run_gin_text(user_tasks, checkpoint_every=checkpoint_every, eval_every=eval_every, extra=extra))
  return str(path)


def write_cache_run_gin(path: pathlib.Path, cache, *, task: str, extra: str = "", checkpoint_every: int = 2,
                        eval_every: int = 0) -> str:
  """`write_run_gin`'s run reading the packed cache `cache` (`build_cache` of that run's gin file), task `task`.

  It defines no task, so a training child never imports seqio or TensorFlow (~12 s less CPU per child than
  the seqio run, measured): for tests whose subject is not the input pipeline (a lock, a signal, a resume).
  """
  source = f"MIXTURE_OR_TASK_NAME = '{task}'\ntrain.data = 'cache:{cache}'\n"
  path.write_text(_run_gin_text(source, checkpoint_every=checkpoint_every, eval_every=eval_every, extra=extra))
  return str(path)


def build_cache(gin_file: str, output, *, examples: int = 96) -> str:
  """The packed cache (`xalign cache`, in-process) of the run `gin_file` describes: its first `examples` rows."""
  code = call_main("cache", [f"--gin_file={gin_file}", f"--output={output}", f"--examples={examples}"])
  assert code == 0, f"xalign cache --gin_file={gin_file} exited {code}"
  return str(output)


def _run_gin_text(tasks: str, *, checkpoint_every: int, eval_every: int, extra: str) -> str:
  return f"""
include 'runs/pretrain.gin'
{tiny_encoder_gin()}
{tasks}
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 1
CHECKPOINT_EVERY = {checkpoint_every}
EVAL_EVERY = {eval_every}
train.eval_batches = 2
OptimizerConfig.warmup_steps = 2
{extra}
"""


def train_argv(gin_file: str, model_dir, *extra: str) -> list[str]:
  return [f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", *extra]


def metrics_losses(model_dir) -> dict[int, list[float]]:
  """{step: [loss of every training row of that step]} of MODEL_DIR/metrics.jsonl (torn lines skipped)."""
  out: dict[int, list[float]] = {}
  path = os.path.join(model_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return out
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  for line in lines:
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if "loss" in row:
      out.setdefault(int(row["step"]), []).append(row["loss"])
  return out


def checkpoint_steps(model_dir) -> list[int]:
  folder = os.path.join(model_dir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit())


# --- subprocesses (signals, two writers, resource limits) -------------------------------


class Child:
  """`python -m <ENTRY_POINTS[entry]> argv` in a child process whose merged output is read by a thread."""

  def __init__(self, entry: str, argv: Sequence[str], *, env: dict | None = None,
               preexec_fn: Callable[[], None] | None = None, prefix: Sequence[str] = ()):
    module = ENTRY_POINTS[entry].removesuffix(".__main__")
    # `prefix`: a wrapper that starts the Python (e.g. setpriv, to run it with fewer privileges).
    self.proc = subprocess.Popen([*prefix, sys.executable, "-m", module, *argv], cwd=REPO, env=env or child_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 preexec_fn=preexec_fn)  # noqa: PLW1509  (only for resource limits)
    self._chunks: list[str] = []
    self._lock = threading.Lock()
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    fd = self.proc.stdout.fileno()
    while True:
      data = os.read(fd, 65536)
      if not data:
        return
      with self._lock:
        self._chunks.append(data.decode("utf-8", "replace"))

  @property
  def output(self) -> str:
    with self._lock:
      return "".join(self._chunks)

  def wait_for(self, pattern: str, timeout: float) -> re.Match | None:
    """The first match of `pattern` in the output so far, waiting up to `timeout` s (None: not seen)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      match = re.search(pattern, self.output)
      if match:
        return match
      if self.proc.poll() is not None:
        self._reader.join(5)
        return re.search(pattern, self.output)
      time.sleep(0.05)
    return None

  def finish(self, timeout: float) -> int:
    """The exit status, killing the child (and failing) if it runs past `timeout` s."""
    try:
      code = self.proc.wait(timeout)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
      raise AssertionError(f"still running after {timeout} s; output tail: {self.output[-1500:]!r}")
    self._reader.join(5)
    return code

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    self._reader.join(5)


def child_env(**overrides: str | None) -> dict[str, str]:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  for key, value in overrides.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  return env


def run_child(entry: str, argv: Sequence[str], *, timeout: float, **kwargs: Any) -> Outcome:
  """A child run to completion: Outcome with the merged output in both `out` and `err`."""
  start = time.monotonic()
  child = Child(entry, argv, **kwargs)
  code = child.finish(timeout)
  return Outcome(code, child.output, child.output, time.monotonic() - start)
