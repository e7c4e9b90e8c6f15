"""`write_atomically` under faults: a full disk or a file-size limit is one UserError and leaves no temporary file."""

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from flax_xalign.fileio import write_atomically

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LIMITED = textwrap.dedent("""
    import resource, sys
    from flax_xalign import errors
    from flax_xalign.fileio import write_atomically
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # Python ignores SIGXFSZ: writes fail with EFBIG.
    sys.exit(errors.run_command(lambda: write_atomically(sys.argv[1], "x" * 10000)))
""")


@pytest.mark.subprocess  # The limit is per process: set it in a child, never in the test process.
def test_file_size_limit_is_one_error_and_leaves_the_old_file(tmp_path):
  target = tmp_path / "config.gin"
  target.write_text("old\n")
  done = subprocess.run([sys.executable, "-c", _LIMITED, str(target)], cwd=REPO, capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 2, done.stderr
  assert done.stderr.startswith(f"error: no space left writing {target} (File too large); free space or choose "
                                "another MODEL_DIR"), done.stderr
  assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
  assert sorted(os.listdir(tmp_path)) == ["config.gin"] and target.read_text() == "old\n"


class _TooLargeFile:
  """An open file whose writes fail as they do past RLIMIT_FSIZE (EFBIG)."""

  def __init__(self, f):
    self._f = f

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._f.close()

  def fileno(self):
    return self._f.fileno()

  def write(self, data):
    raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))


def test_file_too_large_is_one_error_and_leaves_the_old_file_in_process(tmp_path, monkeypatch, capsys):
  """The same mapping as under a real file-size limit (above, in a child), with the write failing here."""
  from flax_xalign import errors

  target = tmp_path / "config.gin"
  target.write_text("old\n")
  real_fdopen = os.fdopen
  monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: _TooLargeFile(real_fdopen(fd, *a, **k)))
  assert errors.run_command(lambda: write_atomically(target, "x" * 10000)) == 2
  monkeypatch.undo()
  err = capsys.readouterr().err
  assert err.startswith(f"error: no space left writing {target} (File too large); free space or choose "
                        "another MODEL_DIR"), err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert sorted(os.listdir(tmp_path)) == ["config.gin"] and target.read_text() == "old\n"


@pytest.fixture
def tiny_tmpfs(tmp_path):
  folder = tmp_path / "tiny"
  folder.mkdir()
  if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(folder)],
                                         capture_output=True).returncode != 0:
    pytest.skip("needs root and mount to make a 16 KiB tmpfs")
  yield folder
  subprocess.run(["umount", str(folder)], check=True)


def test_full_disk_is_one_error_and_leaves_no_temporary_file(tiny_tmpfs):
  from flax_xalign.errors import UserError

  with pytest.raises(UserError, match=r"no space left writing .*metrics\.json \(No space left on device\)"):
    write_atomically(tiny_tmpfs / "metrics.json", b"x" * 200_000)
  assert os.listdir(tiny_tmpfs) == []


def test_written_files_get_the_umask_mode_not_0600(tmp_path):
  old = os.umask(0o027)
  try:
    write_atomically(tmp_path / "a.txt", "text")
    write_atomically(tmp_path / "b.bin", b"bytes")
  finally:
    os.umask(old)
  assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {"a.txt": 0o640, "b.bin": 0o640}
  assert (tmp_path / "a.txt").read_text() == "text" and (tmp_path / "b.bin").read_bytes() == b"bytes"


# --- the output rules and the one form of an OSError on a path (issue 27) -----------------------------------


def test_every_os_error_on_a_path_is_one_line_naming_it(tmp_path):
  from flax_xalign.errors import path_error

  for error, words in [(PermissionError(errno.EACCES, "Permission denied", "/x/y"), "permission denied"),
                       (OSError(errno.EROFS, "Read-only file system", "/x/y"), "read-only file system"),
                       (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/x/y"), "is a file, not a folder"),
                       (IsADirectoryError(errno.EISDIR, "Is a directory", "/x/y"), "it is a folder"),
                       (FileNotFoundError(errno.ENOENT, "No such file", "/x/y"), "no such file"),
                       (OSError(errno.ENOSPC, "No space left on device", "/x/y"), "no space left")]:
    message = str(path_error(error, setting="--output"))
    assert "/x/y" in message and words in message and "\n" not in message, message


def test_run_command_reports_an_os_error_on_a_path_as_one_line(tmp_path, capsys):
  from flax_xalign import errors

  def work():
    with open(tmp_path / "missing" / "file.txt") as f:
      f.read()

  assert errors.run_command(work) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: cannot use ") and "missing/file.txt" in err and err.count("\n") == 1


def test_run_command_leaves_an_os_error_without_a_path_alone():
  from flax_xalign import errors

  def work():
    raise OSError("no path here")

  with pytest.raises(OSError):
    errors.run_command(work)


def test_write_atomically_under_a_file_is_one_error(tmp_path):
  from flax_xalign.errors import UserError

  (tmp_path / "afile").write_text("keep\n")
  with pytest.raises(UserError, match="a part of the path is a file"):
    write_atomically(tmp_path / "afile" / "out.txt", "x")
  assert (tmp_path / "afile").read_text() == "keep\n"


def test_an_output_file_is_never_an_input_even_through_a_link(tmp_path):
  from flax_xalign.errors import UserError
  from flax_xalign.fileio import check_output_file

  source = tmp_path / "pairs.tsv"
  source.write_text("a\tb\n")
  (tmp_path / "link.tsv").symlink_to(source)
  os.link(source, tmp_path / "hard.tsv")
  for output in ("pairs.tsv", "link.tsv", "hard.tsv", "./sub/../pairs.tsv"):
    with pytest.raises(UserError, match="is the --input file"):
      check_output_file(str(tmp_path / output), inputs={"--input": str(source), "--gold": None})
  assert check_output_file(str(tmp_path / "new" / "links.txt"), inputs={"--input": str(source)}) == str(
      tmp_path / "new" / "links.txt")
  with pytest.raises(UserError, match="is empty"):
    check_output_file("")
  with pytest.raises(UserError, match="is a folder"):
    check_output_file(str(tmp_path))


def test_an_output_folder_is_new_empty_or_owned_and_holds_no_input(tmp_path):
  from flax_xalign.errors import UserError
  from flax_xalign.fileio import check_output_folder
  from flax_xalign.run_dir import is_run_dir

  user = tmp_path / "mine"
  user.mkdir()
  (user / "notes.txt").write_text("mine\n")
  with pytest.raises(UserError, match="non-empty folder that is not a run"):
    check_output_folder(str(user), owned=is_run_dir, what="a run")
  with pytest.raises(UserError, match="non-empty folder; choose a new or empty folder"):
    check_output_folder(str(user))
  with pytest.raises(UserError, match="holds the --text"):
    check_output_folder(str(tmp_path), inputs={"--text": [str(user / "notes.txt")]}, owned=lambda f: True)
  (user / ".lock").write_text("")
  assert check_output_folder(str(user), owned=is_run_dir) == str(user)
  (tmp_path / "empty").mkdir()
  assert check_output_folder(str(tmp_path / "empty")) == str(tmp_path / "empty")
  with pytest.raises(UserError, match="lies under .*notes.txt, which is a file"):
    check_output_folder(str(user / "notes.txt" / "out"))


def test_an_output_inside_an_input_folder_is_refused_unless_that_input_may_hold_it(tmp_path):
  """Issue 47 (R13): `gpu_run --out=B/out` wrote its results into the bundle it read."""
  from flax_xalign.errors import UserError
  from flax_xalign.fileio import check_output_file, check_output_folder

  bundle = tmp_path / "bundle"
  (bundle / "start").mkdir(parents=True)
  for out in (bundle / "out", bundle / "start" / "new"):
    with pytest.raises(UserError, match="lies inside the bundle .*would change that input"):
      check_output_folder(str(out), setting="--out", inputs={"bundle": str(bundle)})
    assert not out.exists()
  with pytest.raises(UserError, match="lies inside the --data_dir"):
    check_output_file(str(bundle / "links.txt"), inputs={"--data_dir": str(bundle)})
  # A run may hold a new entry (check_outside_run guards its own files); a file input's folder is no input.
  assert check_output_folder(str(bundle / "hf"), inputs={"--model_dir": str(bundle)},
                             inside_ok=("--model_dir",)) == str(bundle / "hf")
  (tmp_path / "pairs.tsv").write_text("a\tb\n")
  assert check_output_file(str(tmp_path / "links.txt"), inputs={"--input": str(tmp_path / "pairs.tsv")})
