"""`errors.user_message`: a UserError's own text, out of gin's proxy and TF autograph's re-raise."""

import os

import gin
import pytest

from flax_xalign import errors
from flax_xalign.errors import UserError

MESSAGE = "SentencePiece model /no/such.model does not exist; fix the path.\n  (a continuation line)"


def _raise(_=None):
  raise UserError(MESSAGE)


def _traced(x):  # Autograph converts this function (user code) when tf.data traces it.
  y = _raise(x)
  return y


def test_gin_suffix_is_dropped():
  with gin.unlock_config():  # Another test in this process may have parsed (and locked) a config.
    configurable = gin.external_configurable(_raise, name="raising_for_test_errors", module="test_errors")
  with pytest.raises(UserError) as raised:
    configurable()
  assert "In call to configurable 'raising_for_test_errors'" in str(raised.value)  # What gin 0.5 adds...
  assert errors.user_message(raised.value) == MESSAGE  # ...and what the user sees.


def test_autograph_stack_is_dropped():
  tf = pytest.importorskip("tensorflow")
  with pytest.raises(UserError) as raised:
    tf.data.Dataset.range(3).map(_traced)
  assert "in user code" in str(raised.value)
  assert errors.user_message(raised.value) == MESSAGE


def test_report_prints_one_error_line(capsys):
  assert errors.run_command(lambda: _raise()) == 2
  assert capsys.readouterr().err == f"error: {MESSAGE}\n"
  assert errors.user_message(ValueError("plain")) == "plain"


def test_ctrl_c_in_an_argparse_command_is_one_line_and_exit_130(capsys):
  def work():
    raise KeyboardInterrupt

  assert errors.run_command(work) == 130
  assert capsys.readouterr().err == "interrupted (Ctrl-C); nothing was left half-written\n"


_INTERRUPTED_IN_STRING_CODE = """
import sys
from flax_xalign import errors
try:
  exec("raise KeyboardInterrupt")  # As dataclasses build methods: code from a string.
except KeyboardInterrupt:
  sys.exit(errors.interrupted() if sys.argv[1] == "ours" else 130)
"""


@pytest.mark.subprocess
def test_a_ctrl_c_caught_after_string_code_exits_130_not_by_sigint(tmp_path):
  # CI saw eval print its one line and then end by SIGINT (-2): the Ctrl-C had landed in a dataclass
  # built while flax imported, and CPython then marks it unhandled at exit under `python -m`.
  import subprocess
  import sys

  (tmp_path / "interrupted_probe.py").write_text(_INTERRUPTED_IN_STRING_CODE)
  env = {**os.environ, "PYTHONPATH": str(tmp_path)}
  codes = {}
  for kind in ("plain", "ours"):
    done = subprocess.run([sys.executable, "-m", "interrupted_probe", kind], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    codes[kind] = (done.returncode, done.stderr.strip())
  assert codes["plain"][0] == -2, codes  # The interpreter's behaviour this guards against (Python 3.11).
  assert codes["ours"] == (130, "interrupted (Ctrl-C); nothing was left half-written"), codes


def test_a_leading_tilde_in_a_flag_is_the_home_folder_not_a_folder_named_tilde(tmp_path, monkeypatch, capfd):
  # `--output=~/x` reaches the command unexpanded (the shell expands only a word that starts with ~).
  from tests.hardening import harness

  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  parser = errors.ArgumentParser(prog="x")
  parser.add_argument("--output")
  parser.add_argument("--text", action="append")
  args = parser.parse_args(["--output=~/out.txt", "--text=~/a.txt:en", "--text=b.txt:de"])
  assert args.output == str(tmp_path / "home" / "out.txt")
  assert args.text == [str(tmp_path / "home" / "a.txt") + ":en", "b.txt:de"]
  # End to end: a command writes under HOME and creates nothing named '~' where it runs.
  (tmp_path / "home").mkdir()
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("".join(f"the word number {i} goes here and there\n" for i in range(300)))
  outcome = harness.run_main(capfd, "vocab", [f"--input={corpus}", "--vocab_size=40", "--output=~/spm"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert os.path.isfile(tmp_path / "home" / "spm.model")
  assert not os.path.exists(tmp_path / "~")
