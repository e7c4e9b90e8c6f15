"""The experiment drivers' shared steps (flax_xalign.cli.experiments.harness) around the commands they run."""

import pytest

from flax_xalign.cli import train as train_main
from flax_xalign.cli.experiments import harness
from flax_xalign.errors import UserError


@pytest.mark.parametrize("code", [130, 143, 2])
def test_a_nested_command_stopped_by_a_signal_ends_the_driver_with_its_status(code, monkeypatch, tmp_path, capsys):
  # train has said "interrupted"/saved in its own line, or (2) printed its one error line; the driver used to
  # add "error: training ... failed (exit N)": a second error line.
  monkeypatch.setattr(train_main, "main", lambda flags: code)
  with pytest.raises(SystemExit) as stopped:
    harness.train(str(tmp_path / "run"), ["experiments/demo.gin"], [], steps=3)
  assert stopped.value.code == code
  assert capsys.readouterr().err == ""


def test_a_nested_command_that_fails_is_one_error_naming_it(monkeypatch, tmp_path):
  monkeypatch.setattr(train_main, "main", lambda flags: 1)  # A crash: train printed no error line of its own.
  with pytest.raises(UserError, match=r"training .*run failed \(exit 1\)"):
    harness.train(str(tmp_path / "run"), ["experiments/demo.gin"], [], steps=3)
  harness.check_exit(0, "anything")  # success: nothing to do
