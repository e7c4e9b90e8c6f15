"""`xalign <command>`: the one console script in front of every command under flax_xalign/cli/."""

from __future__ import annotations

import importlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from flax_xalign.cli import xalign

CLI = pathlib.Path(xalign.__file__).resolve().parent


def _runnable_modules() -> set[str]:
  """Modules under cli/ that run as programs, found by text (independently of xalign's AST scan)."""
  found = set()
  for path in [*CLI.glob("*.py"), *(CLI / "experiments").glob("*.py")]:
    if path.name.startswith("_"):
      continue
    lines = path.read_text(encoding="utf-8").splitlines()
    if any(line.startswith("if __name__ == ") for line in lines):
      found.add(path.stem)
  return found


def test_every_runnable_module_of_cli_is_a_command_and_nothing_else():
  table = xalign.commands()
  assert set(table) == _runnable_modules()
  assert {"train", "eval", "align", "bli", "cache", "demo", "code_switch", "mlm_gc"} <= set(table)
  assert table["code_switch"][0] == "flax_xalign.cli.experiments.code_switch"
  assert table["align"][0] == "flax_xalign.cli.align"
  for name, (module, summary) in table.items():
    assert summary and "\n" not in summary and not summary.startswith("`"), (name, summary)


def test_every_command_has_a_main_that_takes_argv():
  for name, (module, _) in xalign.commands().items():
    main = importlib.import_module(module).main
    assert "argv" in main.__code__.co_varnames[:main.__code__.co_argcount], name


def test_help_lists_each_command_on_one_line(capsys):
  assert xalign.main(["--help"]) == 0
  out = capsys.readouterr().out
  for name in xalign.commands():
    assert sum(line.split()[:1] == [name] for line in out.splitlines()) == 1, name


def test_no_command_is_usage_and_exit_2(capsys):
  assert xalign.main([]) == 2
  assert capsys.readouterr().out.startswith("usage: xalign <command>")


def test_an_unknown_command_is_one_error_line(capsys):
  assert xalign.main(["aling", "--model_dir=x"]) == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  assert captured.err.splitlines() == ["error: xalign has no command 'aling'; `xalign --help` lists them."]


def test_a_command_gets_the_flags_after_its_name(monkeypatch):
  seen = []
  from flax_xalign.cli import bli

  monkeypatch.setattr(bli, "main", lambda argv=None: seen.append(list(argv)) or 7)
  assert xalign.main(["bli", "--model_dir=m", "--languages=de"]) == 7
  assert seen == [["--model_dir=m", "--languages=de"]]


def test_two_commands_of_one_name_are_refused(tmp_path, monkeypatch):
  for folder in ("a", "b"):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "same.py").write_text('"""Doc."""\n\nif __name__ == "__main__":\n  pass\n')
  monkeypatch.setattr(xalign, "FOLDERS", ((tmp_path / "a", "x.a"), (tmp_path / "b", "x.b")))
  with pytest.raises(RuntimeError, match="two commands named same"):
    xalign.commands()


@pytest.mark.subprocess
def test_the_console_script_and_python_m_cli_run_a_command(tmp_path):
  script = shutil.which("xalign", path=os.path.dirname(sys.executable))
  assert script, "the console script is not installed: pip install -e . (setup.py's entry_points)"
  env = {**os.environ, "HOME": str(tmp_path)}
  for argv in ([script, "--help"], [sys.executable, "-m", "flax_xalign.cli", "--help"]):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0 and "code_switch" in done.stdout and done.stderr == "", done.stderr[-2000:]
  done = subprocess.run([script, "retrieval", "--help"], capture_output=True, text=True, timeout=300, env=env,
                        cwd=tmp_path)
  assert done.returncode == 0 and done.stdout.startswith("usage: xalign retrieval"), done.stderr[-2000:]


@pytest.mark.contract
def test_xalign_runs_a_real_command_in_process(tmp_path, capfd):
  from flax_xalign.data.vocab import sentencepiece as vocab
  from tests.conftest import tiny_sentences
  from tests.hardening import harness

  text = tmp_path / "in.txt"
  text.write_text("\n".join(tiny_sentences("en", 200)), encoding="utf-8")
  outcome = harness.run_main(capfd, "xalign", ["vocab", f"--input={text}", "--vocab_size=45",
                                               f"--output={tmp_path / 'v'}", "--model_type=bpe"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert vocab.load_vocabulary(tmp_path / "v.model").vocab_size == 45
  refused = harness.run_main(capfd, "xalign", ["vocab", "--vocab_size=45", f"--output={tmp_path / 'w'}"])
  harness.assert_user_error(refused, "--input")  # The command's own one-line refusal, passed through.
  assert not list(tmp_path.glob("w*"))
