"""Writers that cannot hurt each other or the user (issue 39, part 4): `xalign cache` under a second writer,
a killed writer, `--overwrite` and Ctrl-C.

References are independent of the writer: locks taken here with `fcntl.flock` directly, leftovers made by
hand the way a killed writer leaves them, a dead pid from a finished `true`, and each written split read back
through `format.open_split` (which checks every shard's size and sha256 against the manifest).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from flax_xalign import errors, fileio
from flax_xalign.data.packed import format as format_lib
from flax_xalign.data.vocab.spec import VocabularySpec
from flax_xalign.errors import INTERRUPTED, UserError
from tests.hardening import harness

WRITER = "xalign cache"


def _cache(capfd, out, *flags):
  return harness.run_main(capfd, "cache", ["--task=tiny_en", f"--output={out}", "--length=19", "--examples=12",
                                           *flags])


def _dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()
  return proc.pid


def _marked(folder, pid: int, files=()) -> None:
  """A folder as a writer of `pid` leaves it: its mark, and the files it lists."""
  os.makedirs(folder, exist_ok=True)
  for name in files:
    with open(os.path.join(folder, name), "wb") as f:
      f.write(b"x")
  with open(os.path.join(folder, fileio.MARK), "w") as f:
    json.dump({"command": WRITER, "files": list(files), "pid": pid, "host": os.uname().nodename}, f)


@pytest.fixture
def written(tiny_corpus, tmp_path, capfd):
  """A cache folder with a complete train split (12 rows)."""
  out = tmp_path / "cache"
  outcome = _cache(capfd, out)
  assert outcome.code == 0, harness.summary(outcome)
  return out


@pytest.mark.contract
def test_a_second_writer_of_the_split_is_refused_and_the_first_is_unharmed(tiny_corpus, tmp_path, capfd):
  out = tmp_path / "cache"
  out.mkdir()
  first = os.open(out / ".train.lock", os.O_RDWR | os.O_CREAT)  # The first writer's lock and staging folder.
  fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
  os.write(first, b"pid 4242 on there: xalign cache --output=cache\n")
  _marked(out / f".train.tmp-{os.getppid()}", os.getppid(), ["part-00000.array_record"])
  before = harness.tree_digest(out)
  try:
    for overwrite in ((), ("--overwrite",)):
      outcome = _cache(capfd, out, *overwrite)
      harness.assert_user_error(outcome, "being written by pid 4242", model_dir=out, before=before)
    other = _cache(capfd, out, "--split=validation")  # Another split of the same cache may be written meanwhile.
    assert other.code == 0, harness.summary(other)
  finally:
    os.close(first)
  assert format_lib.open_split(str(out), "validation").manifest.examples > 0
  assert harness.tree_digest(out / f".train.tmp-{os.getppid()}") is not None


@pytest.mark.contract
def test_a_killed_writers_lock_and_temporaries_do_not_stop_the_next_and_a_live_ones_are_kept(tiny_corpus, tmp_path,
                                                                                           capfd):
  out, dead, alive = tmp_path / "cache", _dead_pid(), os.getppid()
  out.mkdir()
  (out / ".train.lock").write_text(f"pid {dead} on here: xalign cache\n")  # Its flock went with the process.
  _marked(out / f".train.tmp-{dead}", dead, ["part-00000.array_record"])
  _marked(out / f".train.tmp-{alive}", alive)  # (a writer that took no lock: an older version)
  outcome = _cache(capfd, out)
  assert outcome.code == 0, harness.summary(outcome)
  assert sorted(os.listdir(out)) == [f".train.tmp-{alive}", "train"]
  assert format_lib.open_split(str(out), "train").manifest.examples == 12


@pytest.mark.contract
def test_a_split_that_a_killed_overwrite_moved_aside_is_put_back(written, capfd):
  dead = _dead_pid()
  os.rename(written / "train", written / f".train.old-{dead}")  # Killed between its two renames.
  before = harness.tree_digest(written / f".train.old-{dead}")
  outcome = _cache(capfd, written)
  harness.assert_user_error(outcome, "already exists")  # The old split is back, so no --overwrite: refused.
  assert sorted(os.listdir(written)) == ["train"] and harness.tree_digest(written / "train") == before


@pytest.mark.contract
def test_a_removal_cut_short_leaves_a_marked_or_empty_folder_that_the_next_writer_removes(written, capfd):
  dead = _dead_pid()
  _marked(written / f".train.tmp-{dead}", dead, ["part-00000.array_record"])
  (written / f".train.tmp-{dead + 1}").mkdir()  # Killed between making its folder and marking it.
  (written / ".train.old-1").mkdir()  # A removal whose last step (the folder itself) was cut short.
  outcome = _cache(capfd, written, "--overwrite")
  assert outcome.code == 0, harness.summary(outcome)
  assert sorted(os.listdir(written)) == ["train"]


@pytest.mark.contract
def test_an_unmarked_folder_that_looks_like_a_temporary_is_never_removed(written, capfd):
  stray = written / f".train.tmp-{_dead_pid()}"
  stray.mkdir()
  (stray / "mine.txt").write_text("not the cache's\n")
  before = harness.tree_digest(written)
  outcome = _cache(capfd, written, "--split=validation")
  harness.assert_user_error(outcome, "non-empty folder that is not a packed cache", model_dir=written, before=before)


@pytest.mark.contract
@pytest.mark.parametrize("damage, keywords", [
    ("no_mark", ("holds no mark of xalign cache", "remove it yourself")),
    ("foreign_mark", ("holds no mark of xalign cache",)),
    ("user_file", ("notes.txt", "did not write", "move it out")),
    ("symlink", ("not a folder written by xalign cache",)),
])
def test_overwrite_replaces_only_a_split_this_command_wrote(written, damage, keywords, capfd):
  split = written / "train"
  if damage == "no_mark":
    os.remove(split / fileio.MARK)  # As a split written by hand (or by a version before marks) is.
  elif damage == "foreign_mark":
    mark = json.loads((split / fileio.MARK).read_text())
    (split / fileio.MARK).write_text(json.dumps({**mark, "command": "xalign trim"}))
  elif damage == "user_file":
    (split / "notes.txt").write_text("mine\n")
  else:
    shutil.move(split, written.parent / "elsewhere")
    os.symlink(written.parent / "elsewhere", split)
  before = harness.tree_digest(written)
  outcome = _cache(capfd, written, "--overwrite")
  harness.assert_user_error(outcome, *keywords, model_dir=written, before=before)


@pytest.mark.contract
def test_overwrite_replaces_a_split_it_wrote(written, capfd):
  old = harness.tree_digest(written / "train")
  outcome = _cache(capfd, written, "--overwrite", "--seed=5")
  assert outcome.code == 0, harness.summary(outcome)
  assert sorted(os.listdir(written)) == ["train"] and harness.tree_digest(written / "train") != old
  mark = fileio.read_mark(written / "train")
  assert mark["command"] == WRITER and set(mark["files"]) == set(os.listdir(written / "train")) - {fileio.MARK}


@pytest.mark.contract
def test_a_writer_that_fails_before_writing_leaves_no_folder(tiny_corpus, tmp_path, capfd):
  out = tmp_path / "cache"
  outcome = harness.run_main(capfd, "cache", ["--task=no_such_task_here", f"--output={out}"])
  assert outcome.code == 2 and not out.exists(), harness.summary(outcome)


def test_demo_fresh_deletes_only_a_folder_the_demo_created(tmp_path):
  from flax_xalign.experiments import demo

  looks_like_a_demo = tmp_path / "mine"  # Names a demo writes, made by a user (or a demo before marks).
  (looks_like_a_demo / "cold").mkdir(parents=True)
  (looks_like_a_demo / "aer.json").write_text('{"mine": 1}')
  before = harness.tree_digest(looks_like_a_demo)
  with pytest.raises(UserError, match="holds no mark of xalign demo"):
    demo.check_model_dir(str(looks_like_a_demo), fresh=True)
  assert harness.tree_digest(looks_like_a_demo) == before
  ours = tmp_path / "demo"
  fileio.mark_new_folder(ours, demo.COMMAND)  # As a demo does before its first file.
  (ours / "aer.json").write_text("{}")
  demo.check_model_dir(str(ours), fresh=True)
  assert not ours.exists()  # (marked again by the demo before its first file)


# --- fileio's pieces, against the kernel's and the signal module's own behaviour -----------------------


def test_the_lock_is_refused_while_another_open_file_holds_it_and_removed_after(tmp_path):
  path = tmp_path / "out" / ".x.lock"
  with fileio.output_lock(tmp_path / "out", name=".x.lock"):
    other = os.open(path, os.O_RDWR)
    with pytest.raises(BlockingIOError):
      fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)
    assert f"pid {os.getpid()} on" in path.read_text()
    with fileio.output_lock(tmp_path / "out", name=".x.lock"):  # Re-entered by its holder.
      pass
    assert path.exists()
  assert not (tmp_path / "out").exists()  # The lock made the folder; nothing else was written there.


@pytest.fixture
def python_sigint():
  """SIGINT handled as an interactive Python handles it (KeyboardInterrupt). A process started in the background
  (CI's `nohup ... &`, and so its pytest workers) inherits SIGINT ignored, which the block must keep."""
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_inside_interrupts_held_comes_at_its_end(python_sigint):
  del python_sigint
  reached, handler = [], signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    with errors.interrupts_held():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.01)
      reached.append(True)
  assert reached == [True] and signal.getsignal(signal.SIGINT) is handler
  with errors.interrupts_held(deliver=False):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.01)


def test_an_ignored_ctrl_c_stays_ignored_through_interrupts_held():
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    with errors.interrupts_held():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, before)


def _swallowing_library(swallowed: list) -> None:
  """A stand-in for TensorFlow's iterator (TFE_Py_FastPathExecute calling TensorShape.__len__, seen swallowing
  a KeyboardInterrupt): Python code run from a caller that discards whatever it raises, during which a Ctrl-C
  (SIGINT) comes."""
  try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
  except BaseException as e:  # noqa: BLE001 -- the native caller's behaviour this stands in for
    swallowed.append(type(e).__name__)


def test_the_stand_in_library_swallows_a_ctrl_c_raised_inside_it(python_sigint):
  """The reference: without interrupts_polled, Python's handler raises inside the library and the Ctrl-C is lost."""
  del python_sigint
  swallowed = []
  _swallowing_library(swallowed)
  assert swallowed == ["KeyboardInterrupt"]


def test_a_ctrl_c_inside_interrupts_polled_comes_at_the_next_check_not_inside_the_library(python_sigint):
  del python_sigint
  swallowed, reached, handler = [], [], signal.getsignal(signal.SIGINT)
  with pytest.raises(KeyboardInterrupt):
    with errors.interrupts_polled():
      errors.check_interrupt()  # Nothing came yet.
      _swallowing_library(swallowed)
      reached.append("after the library")
      with errors.interrupts_polled():  # A nested block is the outer one.
        errors.check_interrupt()
      reached.append("after the check")
  assert swallowed == [] and reached == ["after the library"]
  assert signal.getsignal(signal.SIGINT) is handler and not errors._POLLED
  errors.check_interrupt()  # Outside a block it never raises.


def test_interrupts_polled_delivers_at_its_end_drops_when_it_raised_and_keeps_an_ignored_ctrl_c(python_sigint):
  del python_sigint
  reached = []
  with pytest.raises(KeyboardInterrupt):
    with errors.interrupts_polled():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
      reached.append(True)
  assert reached == [True]
  with pytest.raises(ValueError):  # Already stopping: the Ctrl-C is not raised over the error.
    with errors.interrupts_polled():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
      raise ValueError("the block's own error")
  with errors.interrupts_polled():  # A held Ctrl-C inside is handed to the polled block, not raised at once.
    with errors.interrupts_held():
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
      errors.check_interrupt()
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  with errors.interrupts_polled():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    errors.check_interrupt()
  assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_ctrl_c_the_rows_iterator_would_swallow_stops_the_write_at_the_next_row(python_sigint, tmp_path):
  """write_split over rows from the stand-in library: the Ctrl-C that comes while row 5 is made stops the write
  (KeyboardInterrupt, nothing left), where Python's own handler would have let the library swallow it."""
  del python_sigint
  from tests.data.test_packed_verify import LENGTH, _rows
  from flax_xalign.data.packed import write

  swallowed, made = [], []

  def rows():
    for i, row in enumerate(_rows(40, seed=3)):
      if i == 5:
        _swallowing_library(swallowed)
      made.append(i)
      yield row

  vocab = b"a stand-in vocabulary file"
  spec = VocabularySpec(file="vocabulary.model", sha256=hashlib.sha256(vocab).hexdigest(), size=61, pieces=61)
  info = write.split_info(task="synthetic_mix", split="train", length=LENGTH, pack=True, pair_layout="restart",
                          both_directions=False, languages=("de", "en"), language_pairs=(), vocabulary=spec,
                          task_definitions=None, seed=0, order={"examples": 40})
  with pytest.raises(KeyboardInterrupt):
    write.write_split(rows(), info, output=str(tmp_path / "cache"), vocabulary_bytes=vocab, log=io.StringIO())
  assert swallowed == [] and made == list(range(6))
  assert not (tmp_path / "cache").exists()  # No split, staging folder or lock (the lock made the folder).


def test_a_ctrl_c_held_through_the_rename_comes_after_it_and_keeps_the_split(python_sigint, tmp_path, monkeypatch):
  """The Ctrl-C held while the split is renamed into place is delivered after the rename: KeyboardInterrupt (not
  an OSError on the renamed staging folder), and the split stays, complete."""
  del python_sigint
  from tests.data.test_packed_verify import write_cache
  from flax_xalign.data.packed import write

  real = write._move_into_place

  def move_then_ctrl_c(tmp, target):
    real(tmp, target)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)

  monkeypatch.setattr(write, "_move_into_place", move_then_ctrl_c)
  with pytest.raises(KeyboardInterrupt):
    write_cache(tmp_path / "cache")
  assert format_lib.open_split(str(tmp_path / "cache"), "train").manifest.examples == 150
  assert not _leftovers(tmp_path / "cache")


# --- Ctrl-C at random moments of a real write (a child process per run) ------------------------------

INTERRUPTS, ROWS = 30, 3000
# A Ctrl-C in the interpreter's first moments, before the command's `main` runs (Python's start, `python -m`
# importing the module: ~0.1 s idle, several times that under load), gets Python's own handling (a traceback,
# exit 1, or death by SIGINT) that no code of ours can change; the "start" moments begin after it.
STARTED = 1.0


def _leftovers(out) -> list[str]:
  found = []
  for dirpath, dirnames, filenames in os.walk(out):
    found += [os.path.join(dirpath, n) for n in dirnames + filenames if ".tmp" in n or ".old-" in n
              or n.endswith(".lock")]
  return found


def _start_cache(gin_file, out, tmp_path):
  """`xalign cache` of the run `gin_file` into `out`, in a child with SIGINT as a terminal gives it (a shell starts
  background jobs, CI's included, with SIGINT ignored); its stdout and stderr go to tmp_path/std{out,err}."""
  with open(tmp_path / "stdout", "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
    return subprocess.Popen([sys.executable, "-m", "flax_xalign.cli.cache", f"--gin_file={gin_file}",
                             f"--output={out}", f"--examples={ROWS}"],
                            cwd=harness.REPO, env=harness.child_env(PYTHONFAULTHANDLER="1"), stdout=stdout,
                            stderr=stderr,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for_staging(proc, out) -> float:
  """Seconds until the split's staging folder appears (or the child ends)."""
  start = time.monotonic()
  while proc.poll() is None and not any(".tmp-" in n for n in (os.listdir(out) if out.is_dir() else ())):
    time.sleep(0.01)
  return time.monotonic() - start


@pytest.mark.slow
def test_ctrl_c_at_random_moments_of_a_write_is_one_line_130_and_no_half_split(tiny_corpus, tmp_path):
  """INTERRUPTS runs, each SIGINTed at a seeded random moment: a third before the write (imports, the task's
  load: from STARTED to when an uninterrupted run's staging folder appeared), the rest from the moment its staging
  folder appears to a little after an uninterrupted write of the same split ended, its teardown included (both
  measured first, so the moments cover the write on a fast machine as on a slow one). A Ctrl-C that came before
  the command reported its write must stop it (130): one raised inside TensorFlow's iterator was swallowed
  there (the write went on, exit 0) or crashed it (SIGSEGV, twice in CI) until the writer took Ctrl-C only
  between rows (errors.interrupts_polled). Every run is a fresh interpreter with Python's fault handler on, so
  a crash prints its stacks. About 15 s a run on an idle 2-core machine, a minute under load."""
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="intr")
  proc = _start_cache(gin_file, tmp_path / "whole", tmp_path)
  before_write = _wait_for_staging(proc, tmp_path / "whole")
  start = time.monotonic()
  assert proc.wait(300) == 0, (tmp_path / "stderr").read_text()[-2000:]
  writing = time.monotonic() - start  # From the staging folder to the exit.
  rng, outcomes, problems = random.Random(39), [], []
  for run in range(INTERRUPTS):
    out = tmp_path / f"out{run}"
    start = time.monotonic()
    proc = _start_cache(gin_file, out, tmp_path)
    if run % 3 == 0:
      moment = "start", rng.uniform(STARTED, max(STARTED, before_write))
    else:
      _wait_for_staging(proc, out)
      moment = "write", rng.uniform(0.0, 1.2 * writing)
    time.sleep(moment[1])
    proc.send_signal(signal.SIGINT)
    # Read after the signal was sent: a report that is not there yet comes after the Ctrl-C.
    reported = "wrote " in (tmp_path / "stdout").read_text(errors="replace")
    try:
      code = proc.wait(180)
    except subprocess.TimeoutExpired:
      proc.kill()
      code = "hung"
    err = [l for l in (tmp_path / "stderr").read_text(errors="replace").splitlines() if l.strip()]
    done = (out / "train").is_dir()
    outcomes.append((run, *moment, code, done, round(time.monotonic() - start, 1)))
    wrong = []
    if code not in (0, 130):
      wrong.append(f"exit {code}: {err[:14]}")
    elif code == 0 and not reported:
      wrong.append("exit 0: the Ctrl-C came before the write was reported, and it was lost")
    if code == 130 and err != [INTERRUPTED] or code != 130 and err:
      wrong.append(f"stderr {err[-6:]}")
    if _leftovers(out):
      wrong.append(f"left {_leftovers(out)}")
    if done:
      try:
        examples = format_lib.open_split(str(out), "train").manifest.examples
      except UserError as e:
        examples = str(e)
      if examples != ROWS:
        wrong.append(f"split {examples}")
    if code == 0 and not done:
      wrong.append("exit 0 without the split")
    if wrong:
      problems.append(f"run {run} ({moment[0]} +{moment[1]:.2f} s): {'; '.join(wrong)}")
    shutil.rmtree(out, ignore_errors=True)
  print(f"uninterrupted run: {before_write:.1f} s to its staging folder, {writing:.1f} s more to its exit")
  print("\n".join(map(str, outcomes)))
  assert not problems, "\n".join(problems)
  assert sum(code == 130 for _, _, _, code, _, _ in outcomes) >= INTERRUPTS // 3, outcomes  # Many were stopped.
