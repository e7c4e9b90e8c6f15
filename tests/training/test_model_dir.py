"""MODEL_DIR forms (`check_model_dir`) and the single-writer lock, with two real processes contending."""

import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from flax_xalign.errors import UserError
from flax_xalign.training import model_dir as model_dir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- check_model_dir ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   ", None, 3])
def test_empty_or_not_a_name_is_refused(value):
  with pytest.raises(UserError, match=r"MODEL_DIR=.* is not a folder name; .*--gin.MODEL_DIR="):
    model_dir_lib.check_model_dir(value)


def test_tilde_is_the_home_folder_and_the_result_absolute(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  (tmp_path / "home").mkdir()
  assert model_dir_lib.check_model_dir("~/runs/x") == str(tmp_path / "home" / "runs" / "x")
  monkeypatch.chdir(tmp_path)
  assert model_dir_lib.check_model_dir("a/../b/") == str(tmp_path / "b")
  assert not (tmp_path / "home" / "runs").exists() and not (tmp_path / "b").exists()  # Creates nothing.


def test_a_file_or_a_path_under_a_file_is_refused(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(UserError, match="is a file, not a folder"):
    model_dir_lib.check_model_dir(str(tmp_path / "f"))
  with pytest.raises(UserError, match=f"lies under {tmp_path / 'f'}, which is a file"):
    model_dir_lib.check_model_dir(str(tmp_path / "f" / "run"))



def test_read_only_folder_or_parent_is_refused(read_only_dir):
  with pytest.raises(UserError, match="is not writable"):
    model_dir_lib.check_model_dir(str(read_only_dir))
  with pytest.raises(UserError, match=f"would be created in {read_only_dir}, which is not writable"):
    model_dir_lib.check_model_dir(str(read_only_dir / "a" / "b"))


# --- lock -----------------------------------------------------------------------------------------


def _umask():
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def test_lock_records_its_owner_and_leaves_the_file(tmp_path):
  folder = str(tmp_path / "run")
  with model_dir_lib.lock(folder, process_index=0):
    path = os.path.join(folder, ".lock")
    owner = json.loads(pathlib.Path(path).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert owner["started"][:4].isdigit() and owner["command"]
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~_umask()  # Not mkstemp's 0600.
    # A second opener, even in this process, is refused with the owner's pid and host.
    with pytest.raises(UserError, match=rf"MODEL_DIR {folder} is in use by another run \(pid {os.getpid()} on "
                                         rf"host {socket.gethostname()}, since .*kill {os.getpid()}"):
      with model_dir_lib.lock(folder, process_index=0):
        pass
  assert os.path.exists(path) and pathlib.Path(path).read_text() == ""  # Stays (an unlink would race), empty.
  with model_dir_lib.lock(folder, process_index=0):  # Free again.
    pass


def test_other_processes_take_no_lock_and_create_nothing(tmp_path):
  with model_dir_lib.lock(str(tmp_path / "run"), process_index=1):
    assert not (tmp_path / "run").exists()


_HOLDER = textwrap.dedent("""
    import sys, time
    from flax_xalign import errors
    from flax_xalign.training import model_dir
    def work():
      with model_dir.lock(sys.argv[1], process_index=0):
        print("locked", flush=True)
        sys.stdin.readline()
    sys.exit(errors.run_command(work))
""")


def _holder(folder):
  return subprocess.Popen([sys.executable, "-c", _HOLDER, folder], cwd=REPO, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.subprocess  # Two real processes: the flock is per open file, the refusal the command's one line.
def test_two_processes_contend_the_second_is_refused(tmp_path):
  folder = str(tmp_path / "run")
  first = _holder(folder)
  try:
    assert first.stdout.readline().strip() == "locked", first.stderr.read()
    second = subprocess.run([sys.executable, "-c", _HOLDER, folder], cwd=REPO, input="\n",
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "locked" not in second.stdout
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"is in use by another run (pid {first.pid} on host {socket.gethostname()}" in errors[0]
    assert f"kill {first.pid}" in errors[0]
    first.stdin.write("\n")
    first.stdin.flush()
    assert first.wait(timeout=60) == 0
    third = subprocess.run([sys.executable, "-c", _HOLDER, folder], cwd=REPO, input="\n",
                           capture_output=True, text=True, timeout=60)
    assert third.returncode == 0 and "locked" in third.stdout, third.stderr
  finally:
    first.kill()
    first.wait()


@pytest.mark.subprocess  # The kernel releases the flock of a SIGKILLed process.
def test_a_killed_holder_frees_the_lock(tmp_path):
  folder = str(tmp_path / "run")
  first = _holder(folder)
  assert first.stdout.readline().strip() == "locked", first.stderr.read()
  os.kill(first.pid, signal.SIGKILL)
  first.wait()
  assert _record(folder)["pid"] == first.pid  # Its record is left...
  with model_dir_lib.lock(folder, process_index=0):  # ...but the kernel released its flock.
    assert _record(folder)["pid"] == os.getpid()


def _record(folder):
  return json.loads(pathlib.Path(folder, ".lock").read_text())


@pytest.fixture
def no_flock(monkeypatch):
  """A file system without flock, as some network file systems answer."""

  def flock(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(model_dir_lib.fcntl, "flock", flock)


def _write_record(folder, **owner):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, ".lock"), "w") as f:
    json.dump({"started": "2026-01-01T00:00:00+00:00", "command": "train", **owner}, f)


def test_without_flock_a_dead_owner_on_this_host_is_stale(tmp_path, no_flock, capsys):
  gone = subprocess.Popen(["true"])  # Any process will do (no Python start): its pid is dead once reaped.
  gone.wait()
  dead_pid = gone.pid
  folder = str(tmp_path / "run")
  _write_record(folder, pid=dead_pid, host=socket.gethostname())
  with model_dir_lib.lock(folder, process_index=0):
    assert _record(folder)["pid"] == os.getpid()
  err = capsys.readouterr().err
  assert err.startswith("warning: ") and f"pid {dead_pid}" in err and err.count("\n") == 1
  assert pathlib.Path(folder, ".lock").read_text() == ""  # Released: the next run finds it free.
  with model_dir_lib.lock(folder, process_index=0):
    pass
  assert capsys.readouterr().err == ""


def test_without_flock_a_live_owner_or_another_host_is_respected(tmp_path, no_flock):
  folder = str(tmp_path / "run")
  live = subprocess.Popen(["sleep", "600"])  # A live process of this host (no Python start needed).
  try:
    _write_record(folder, pid=live.pid, host=socket.gethostname())
    with pytest.raises(UserError, match=f"in use by another run \\(pid {live.pid}"):
      with model_dir_lib.lock(folder, process_index=0):
        pass
  finally:
    live.kill()
    live.wait()
  _write_record(folder, pid=live.pid, host="elsewhere")  # Its pid means nothing here: never taken over.
  with pytest.raises(UserError, match="on host elsewhere.*delete .*\\.lock and rerun"):
    with model_dir_lib.lock(folder, process_index=0):
      pass


def test_deleting_the_lock_file_under_a_holder_does_not_admit_a_second_writer(tmp_path):
  """The folder itself is locked too: removing .lock (which the old message advised) frees nothing."""
  folder = str(tmp_path / "run")
  with model_dir_lib.lock(folder, process_index=0):
    os.remove(os.path.join(folder, ".lock"))
    with pytest.raises(UserError, match=r"in use by another run \(its record in .lock was deleted\).*no file to "
                                        "delete") as info:
      with model_dir_lib.lock(folder, process_index=0):
        pass
    assert "delete " + os.path.join(folder, ".lock") not in str(info.value)
  with model_dir_lib.lock(folder, process_index=0):  # Released with the holder.
    pass
