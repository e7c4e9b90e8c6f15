"""Readers and a damaged newest step: one warning, the previous step, nothing moved (docs/safety.md).

The shared run has checkpoints 2 and 4; each case damages step 4's `state/` the way a crash, a full disk or
a hand-deleted file does (the probe got a 105-line Orbax traceback from `eval`). Every reader (`eval` with
and without EVALS, `align`, `bli`, `retrieval`, `Run.open` and a warm start's source) must print exactly one
`warning:` line naming step 4 and read step 2; the damaged step stays where it is (only training's resume
moves a step, to checkpoints_damaged/). A step asked for by number is never replaced: one error line.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from flax_xalign.errors import UserError
from tests.hardening import harness

pytestmark = pytest.mark.contract  # In-process readers on the shared trained run; no training.


def _data_files(state: pathlib.Path) -> list[pathlib.Path]:
  files = sorted((state / "ocdbt.process_0" / "d").iterdir())
  assert files, f"no data files under {state}"
  return files


def _truncate_all(state):
  for path in _data_files(state):
    os.truncate(path, 10)


def _delete_data_files(state):
  for path in _data_files(state):
    path.unlink()


def _delete_process_folder(state):
  for path in sorted((state / "ocdbt.process_0").rglob("*"), reverse=True):
    path.unlink() if path.is_file() else path.rmdir()
  (state / "ocdbt.process_0").rmdir()


def _delete_metadata(state):
  (state / "_METADATA").unlink()


def _empty_manifests(state):
  for path in (state / "manifest.ocdbt", state / "ocdbt.process_0" / "manifest.ocdbt"):
    os.truncate(path, 0)


# A file cut part way is not always damage to a reader: which bytes hold the parameters (all a reader needs)
# and which only the optimiser state differs from run to run, and a step whose parameters read back is
# complete for a reader. So the cuts here leave no parameter intact.
DAMAGE = {"truncated": _truncate_all, "data_files_deleted": _delete_data_files,
          "partly_deleted": _delete_process_folder, "metadata_deleted": _delete_metadata,
          "manifests_emptied": _empty_manifests}


def _damage(model_dir, how: str, step: int = 4) -> None:
  DAMAGE[how](pathlib.Path(model_dir) / "checkpoints" / str(step) / "state")


def _assert_fell_back(outcome: harness.Outcome, model_dir, *, code: int = 0) -> None:
  """Exit `code`, one warning naming step 4 and step 2, no traceback, step 4 left where it was."""
  problems = []
  if outcome.code != code:
    problems.append(f"exit {outcome.code}, expected {code}")
  warnings = [l for l in outcome.err.splitlines() if "damaged" in l]
  if len(warnings) != 1 or not warnings[0].startswith("warning: checkpoint step 4 "):
    problems.append(f"expected one 'warning: checkpoint step 4 ...' line, got {warnings!r}")
  elif "reading step 2" not in warnings[0]:
    problems.append(f"the warning does not say it reads step 2: {warnings[0]!r}")
  for mark in harness.FORBIDDEN:
    if mark in outcome.err or mark in outcome.out:
      problems.append(f"output holds {mark!r}")
  if not (pathlib.Path(model_dir) / "checkpoints" / "4").is_dir():
    problems.append("the damaged step was moved or removed (readers move nothing)")
  if (pathlib.Path(model_dir) / "checkpoints_damaged").exists():
    problems.append("a reader created checkpoints_damaged/")
  assert not problems, "; ".join(problems) + " -- " + harness.summary(outcome)


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_eval_reads_the_previous_step_with_one_warning(how, trained_copy, capfd):
  _damage(trained_copy, how)
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{trained_copy}'", "--gin.SPLIT='validation'",
                                             "--gin.BATCH_SIZE=6"])
  _assert_fell_back(outcome, trained_copy)
  assert json.loads((trained_copy / "eval.json").read_text())["step"] == 2


def _pairs(tmp_path, trained) -> str:
  lines = pathlib.Path(trained["corpus"]["files"][("de_en", "validation")]).read_text().splitlines()[:4]
  path = tmp_path / "pairs.tsv"
  path.write_text("\n".join(lines) + "\n")
  return str(path)


READERS = {
    "eval_evaluators": lambda d, c: ("eval", [f"--gin.MODEL_DIR='{d}'", "--gin.EVALS=['word_align','mlm']",
                                              "--gin.EVAL_OPTIONS={'mlm': {'split': 'validation', 'batch_size': 6},"
                                              f"'word_align': {{'input': '{c['pairs']}', 'gold': '{c['gold']}', "
                                              "'layers': [1], 'methods': ['argmax']}}"]),
    "align": lambda d, c: ("align", [f"--model_dir={d}", f"--input={c['pairs']}", f"--output={c['out']}",
                                     "--layer=1"]),
    "bli": lambda d, c: ("bli", [f"--model_dir={d}", "--src=de", "--tgt=en", "--layer=0", "--min_count=0"]),
    "retrieval": lambda d, c: ("retrieval", [f"--model_dir={d}", f"--tsv={c['pairs']}", "--layers=1"]),
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_reads_the_previous_step_with_one_warning(reader, trained, trained_copy, tmp_path, capfd):
  pairs = _pairs(tmp_path, trained)
  gold = tmp_path / "gold.txt"
  gold.write_text("0-0\n" * 4)
  _damage(trained_copy, "truncated")
  entry, argv = READERS[reader](trained_copy, {"pairs": pairs, "gold": gold, "out": tmp_path / "out.txt"})
  outcome = harness.run_main(capfd, entry, argv)
  _assert_fell_back(outcome, trained_copy)


def test_run_open_warns_once_per_process_and_reads_the_previous_step(trained_copy, capfd):
  from flax_xalign.runs import Run

  _damage(trained_copy, "partly_deleted")
  capfd.readouterr()
  first, again = Run.open(trained_copy), Run.open(trained_copy)
  assert (first.step, again.step, first.latest_step) == (2, 2, 4)
  first.params()  # Reads back: the step chosen is complete.
  err = capfd.readouterr().err
  warnings = [l for l in err.splitlines() if l.startswith("warning: ")]
  assert len(warnings) == 1 and "checkpoint step 4" in warnings[0] and "reading step 2" in warnings[0], err


def test_two_damaged_steps_are_one_warning(trained_copy, capfd):
  from flax_xalign.runs import Run

  import shutil

  shutil.copytree(trained_copy / "checkpoints" / "4", trained_copy / "checkpoints" / "6")
  meta = trained_copy / "checkpoints" / "6" / "meta" / "metadata"
  meta.write_text(meta.read_text().replace('"step": 4', '"step": 6'))
  _damage(trained_copy, "truncated", step=6)
  _damage(trained_copy, "metadata_deleted", step=4)
  capfd.readouterr()
  assert Run.open(trained_copy).step == 2
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("warning: ")]
  assert len(warnings) == 1 and "steps 6, 4" in warnings[0] and "reading step 2" in warnings[0], warnings


def test_a_damaged_step_asked_for_is_one_error_not_a_fallback(trained_copy):
  from flax_xalign.runs import Run

  _damage(trained_copy, "truncated")
  with pytest.raises(UserError) as damaged:
    Run.open(trained_copy, step=4).params()
  message = str(damaged.value)
  assert "checkpoint step 4" in message and "damaged" in message and "\n" not in message, message
  with pytest.raises(UserError, match=r"has no checkpoint step 7 \(its steps: 2, 4\)"):
    Run.open(trained_copy, step=7)
  _damage(trained_copy, "metadata_deleted")
  with pytest.raises(UserError, match=r"checkpoint step 4 .* is damaged \(state/_METADATA is missing\)"):
    Run.open(trained_copy, step=4)


def test_a_warm_start_source_takes_the_newest_complete_step(trained_copy, capfd):
  import shutil

  from flax_xalign.training.run_reader import SourceRun

  shutil.rmtree(trained_copy / "checkpoints" / "4" / "state")
  capfd.readouterr()
  assert SourceRun.open(str(trained_copy)).step == 2
  warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("warning: ")]
  assert len(warnings) == 1 and "4" in warnings[0] and "state/ is missing" in warnings[0], warnings


def test_an_experiment_driver_trains_a_damaged_last_step_again(trained_copy):
  from flax_xalign.experiments import harness as drivers

  assert drivers.finished(str(trained_copy), 4)
  _damage(trained_copy, "truncated")
  assert not drivers.finished(str(trained_copy), 4)  # Not scored at step 2 as if it were the finished run.


@pytest.mark.slow  # Resumes the shared run for two steps (a compile and a restore).
def test_resume_past_a_damaged_step_with_new_train_steps_warns_once_each(trained, trained_copy, capfd):
  # Training keeps its own rule (docs/safety.md): the damaged step is moved to checkpoints_damaged/ and the
  # previous one resumed. The TRAIN_STEPS warning used to come twice: for step 4, then for step 2.
  _damage(trained_copy, "truncated")
  outcome = harness.run_main(capfd, "train", harness.train_argv(trained["gin"], trained_copy, "--gin.TRAIN_STEPS=5"))
  assert outcome.code == 0, harness.summary(outcome)
  warnings = harness.warning_lines(outcome.err)
  assert len([w for w in warnings if "TRAIN_STEPS=5" in w]) == 1, warnings
  assert len([w for w in warnings if "damaged" in w]) == 1, warnings
  assert (trained_copy / "checkpoints_damaged" / "4").is_dir()
  assert harness.checkpoint_steps(trained_copy)[-1] == 5
