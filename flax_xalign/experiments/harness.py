"""What the miniature-laboratory drivers share: train a run through the real
entry point (resumable), score it with the BLI/RSIM machinery, read its MLM
accuracy, and run the POS zero-shot transfer of a synthetic-pair model.

Every function runs what a user would run by hand (`xalign train`, `xalign bli`,
`xalign e5_small`, the transfer harness of the ALIGN-MLM grid), so a driver's
table is reproducible command by command. Training goes through gin, which
only `cli/` may import: a driver is handed the edge's trainer (`Trainer`, the
command passes `cli.gin_cli.train`) and calls it with `xalign train`'s flags.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from typing import Any, Callable, Sequence

from flax_xalign import errors
from flax_xalign.run_dir import RunDir

# `xalign train` with these flags (t5x-style gin flags) in this process; its exit status (0, 2, 130, 143, ...).
Trainer = Callable[[Sequence[str]], int]


def split_choices(text: str, known: Sequence[str], what: str) -> list[str]:
  """`a,b` -> ['a', 'b'], refusing names outside `known` (UserError naming --what)."""
  from flax_xalign.errors import UserError

  items = [x.strip() for x in text.split(",") if x.strip()]
  unknown = [x for x in items if x not in known]
  if not items or unknown:
    raise UserError(f"--{what}={text!r}: choose from {', '.join(known)}.")
  return items


def finished(model_dir: str, steps: int) -> bool:
  """Whether the run's newest *complete* step is `steps`: a damaged last step is trained again (train's
  resume sets it aside), not scored at an older step."""
  from flax_xalign.runs.checkpoints import find_latest_step, newest_complete_step

  if find_latest_step(model_dir) != steps:
    return False
  try:
    return newest_complete_step(model_dir)[0] == steps
  except errors.UserError:  # No complete step at all: train says what to do.
    return False


def check_exit(code: int, what: str) -> None:
  """Stops the driver after a command it ran in-process ended with `code` (0: nothing to do).

  A command stopped by Ctrl-C or SIGTERM (130, 143) has said so in its own line, and train has saved;
  one that refused its input (2) has printed its one error line: the driver ends with the same status and
  adds nothing. Any other failure is a UserError naming `what`.
  """
  from flax_xalign.errors import UserError

  if code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 2):
    raise SystemExit(code)  # 2: the command printed its one `error:` line; a second one would only repeat it.
  if code != 0:
    raise UserError(f"{what} failed (exit {code}); see the output above.")


def train(trainer: Trainer, model_dir: str, gin_files: Sequence[str], bindings: Sequence[str], steps: int) -> float:
  """Trains (or resumes) one run through `trainer` (`xalign train`); seconds spent (0 if already finished)."""
  start = time.time()
  if finished(model_dir, steps):
    return 0.0
  flags = [f"--gin_file={f}" for f in gin_files]
  flags += [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}", *[f"--gin.{b}" for b in bindings]]
  check_exit(trainer(flags), f"training {model_dir}")
  return time.time() - start


def import_e5(output: str, *, trim_vocab_to: str, trim_normalize: str = "",
              languages: Sequence[str] | None = None) -> None:
  """`xalign e5_small --output=OUTPUT --trim_vocab_to=... [--trim_normalize=...] [--languages=...]`: the
  same output-folder check (before any work), then multilingual-e5-small imported and trimmed into `output`.

  `languages` None: the import's default (grc, en). A refusal is a UserError, as the command's.
  """
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.interop import e5_small
  from flax_xalign.interop.trim import import_maybe_trimmed

  check_output_folder(output, inputs={"--data_dir": None})
  chosen = list(e5_small.DEFAULT_LANGUAGES if languages is None else languages)

  def write(folder: str) -> None:
    e5_small.import_e5_small(folder, languages=chosen, data_dir=None)

  import_maybe_trimmed(write, output, trim_vocab_to=trim_vocab_to, trim_normalize=trim_normalize)


def bli(run: Any, **options: Any) -> dict[str, Any]:
  """`xalign bli --key=value ...` (options by flag name) on `run` (a `runs.Run`), its result dict.

  Prints what the command prints, its JSON line last.
  """
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, evaluate_lexicon

  options = LexiconOptions(**options).check()
  result = evaluate_lexicon(run, options, log=lambda line: print(line, flush=True))
  print(json.dumps(result, ensure_ascii=False), flush=True)
  return result


def mlm_accuracy(model_dir: str) -> float | None:
  """The last `eval_mlm_accuracy` in MODEL_DIR/metrics.jsonl (None without evaluations)."""
  path = RunDir(model_dir).metrics
  if not os.path.exists(path):
    return None
  last = None
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      if "eval_mlm_accuracy" in row:
        last = row["eval_mlm_accuracy"]
  return last


def logged_train_seconds(model_dir: str) -> float | None:
  """Training time from MODEL_DIR/metrics.jsonl's logged step rates (steps between logs / steps_per_sec).

  Excludes compilation, evaluation and checkpoint pauses; for a run trained by an earlier invocation.
  """
  path = RunDir(model_dir).metrics
  if not os.path.exists(path):
    return None
  total, previous = 0.0, 0
  with open(path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      if row.get("steps_per_sec"):
        total += (row["step"] - previous) / row["steps_per_sec"]
        previous = row["step"]
  return total


def pos_transfer(run: Any, *, finetune_steps: int, cache: dict) -> dict[str, Any]:
  """POS tagging SUP / ZS / Δ of a synthetic-pair run (a `runs.Run`): fine-tune on Greek, test on the derived copy.

  `cache` keeps the gold POS data between calls of one driver.
  """
  from flax_xalign.evaluation.transfer import transfer
  from flax_xalign.evaluation.transfer import transfer_data
  from flax_xalign.tasks import synthetic as synthetic_tasks

  if "pos" not in cache:
    cache["pos"] = transfer_data.greek_pos("train"), transfer_data.greek_pos("test")
  run.register_tasks()
  language = synthetic_tasks.language_of(run.spec.task)
  vocabulary = run.vocabulary().base
  train_data, test_data = cache["pos"]
  result = transfer.zero_shot_transfer(
      run, vocabulary, task_name="pos", train=train_data, test=test_data, language=language,
      natural_lang=synthetic_tasks.NATURAL, derived_lang=synthetic_tasks.derived_language_code(language),
      steps=finetune_steps, batch_size=32, learning_rate=1e-3, seed=0, group_by_length=True, log=None)
  return {k: result[k] for k in ("metric", "sup", "zs", "delta", "natural")}


RESULT_FILES = ("results.json", "results.md")
DRIVER = "an experiment driver"  # The mark (fileio.write_mark) of a --model_dir a driver created: --fresh needs it.
DRIVER_DIR = "a driver's output (results.json, results.md, plots and folders of flax_xalign runs)"


def is_driver_dir(folder: str) -> bool:
  """Whether `folder` holds only what a driver writes: its results and plots at the top, and folders of its
  own: any, beside the results.json a driver writes first (`prepare_driver_dir`), else only folders that
  hold flax_xalign runs. A user's notes or a trained run given as the driver's folder is not, and is never
  written into or deleted (`--fresh`)."""
  from flax_xalign.run_dir import is_run_dir

  from flax_xalign.fileio import MARK

  names = [name for name in os.listdir(folder) if name != MARK]
  marked = RESULT_FILES[0] in names
  for name in names:
    path = os.path.join(folder, name)
    if os.path.isdir(path) and not os.path.islink(path):
      if not marked and os.listdir(path) and not any(is_run_dir(p) for p, _, _ in os.walk(path)):
        return False
    elif name not in RESULT_FILES and not name.endswith(".png"):
      return False
  return True


def prepare_driver_dir(model_dir: str, *, fresh: bool) -> None:
  """--model_dir checked before any work (new, empty or a driver's: `is_driver_dir`); --fresh empties it only
  when it also holds a driver's results.json (a folder of the user's runs alone is not deleted)."""
  from flax_xalign.errors import UserError
  from flax_xalign.fileio import check_marked_by, check_output_folder, mark_new_folder

  check_output_folder(model_dir, setting="--model_dir", owned=is_driver_dir, what=DRIVER_DIR)
  if fresh and os.path.isdir(model_dir) and os.listdir(model_dir):
    if not os.path.isfile(os.path.join(model_dir, RESULT_FILES[0])):
      raise UserError(f"--fresh would delete --model_dir {model_dir}, which holds runs but no driver's "
                      f"{RESULT_FILES[0]}; remove it yourself if it is a driver's, or choose a new folder.")
    check_marked_by(model_dir, DRIVER)  # A results.json is a name; the mark proves a driver made the folder.
    shutil.rmtree(model_dir)
  mark_new_folder(model_dir, DRIVER)
  results = os.path.join(model_dir, RESULT_FILES[0])
  if not os.path.exists(results):  # The mark of a driver's folder, before its first run.
    from flax_xalign.fileio import write_atomically

    write_atomically(results, json.dumps({"rows": [], "args": {}}, indent=2))


def row_key(row: dict) -> tuple:
  """(setting, objective), and the seed when the row has one (settings run with several seeds)."""
  return (row["setting"], row["objective"], *(() if row.get("seed") is None else (row["seed"],)))


class Results:
  """A driver's MODEL_DIR/results.json: rows keyed by `row_key`, rewritten after every row.

  `done` holds the rows of earlier invocations (a rerun skips them); `save(row)`
  records one row at once, so an interrupted driver loses no finished scoring;
  `finish` writes the final rows, results.md and the wall time.
  """

  def __init__(self, model_dir: str, args: Any, *, fresh: bool = False):
    prepare_driver_dir(model_dir, fresh=fresh)
    self.model_dir = model_dir
    self.path = os.path.join(model_dir, "results.json")
    self.args = vars(args)
    self.done: dict[tuple, dict] = {}
    if os.path.exists(self.path):
      with open(self.path, encoding="utf-8") as f:
        for row in json.load(f)["rows"]:
          self.done[row_key(row)] = row
    self.kept = dict(self.done)
    self.start = time.time()

  def save(self, row: dict) -> None:
    from flax_xalign.fileio import write_atomically

    self.kept[row_key(row)] = row
    write_atomically(self.path, json.dumps({"rows": list(self.kept.values()), "args": self.args}, indent=2))

  def finish(self, rows: Sequence[dict], table: str) -> float:
    """Writes the final rows and results.md (the table + wall time); returns the wall time in seconds."""
    from flax_xalign.fileio import write_atomically

    seconds = time.time() - self.start
    write_atomically(self.path, json.dumps({"rows": list(rows), "args": self.args, "seconds": seconds}, indent=2))
    write_atomically(os.path.join(self.model_dir, "results.md"),
                     f"{table}\n\nWall time of this invocation: {seconds / 60:.1f} min.\n")
    return seconds
