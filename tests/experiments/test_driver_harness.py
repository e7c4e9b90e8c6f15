"""The experiment drivers' shared steps (flax_xalign.experiments.harness) around the commands they run."""

import pytest

from flax_xalign.errors import UserError
from flax_xalign.experiments import harness


@pytest.mark.parametrize("code", [130, 143, 2])
def test_a_nested_command_stopped_by_a_signal_ends_the_driver_with_its_status(code, tmp_path, capsys):
  # train has said "interrupted"/saved in its own line, or (2) printed its one error line; the driver used to
  # add "error: training ... failed (exit N)": a second error line.
  with pytest.raises(SystemExit) as stopped:
    harness.train(lambda flags: code, str(tmp_path / "run"), ["experiments/demo.gin"], [], steps=3)
  assert stopped.value.code == code
  assert capsys.readouterr().err == ""


def test_a_nested_command_that_fails_is_one_error_naming_it(tmp_path):
  trainer = lambda flags: 1  # noqa: E731  (A crash: train printed no error line of its own.)
  with pytest.raises(UserError, match=r"training .*run failed \(exit 1\)"):
    harness.train(trainer, str(tmp_path / "run"), ["experiments/demo.gin"], [], steps=3)
  harness.check_exit(0, "anything")  # success: nothing to do


def test_the_trainer_is_given_the_run_s_flags(tmp_path):
  seen = []
  harness.train(lambda flags: seen.append(list(flags)) or 0, str(tmp_path / "run"), ["a.gin"], ["X=1"], steps=3)
  assert seen == [["--gin_file=a.gin", f"--gin.MODEL_DIR='{tmp_path / 'run'}'", "--gin.TRAIN_STEPS=3", "--gin.X=1"]]


def test_import_e5_does_what_the_e5_small_command_does(tmp_path, monkeypatch, capsys):
  from flax_xalign.cli import e5_small as e5_small_cli
  from flax_xalign.interop import e5_small, trim

  calls = []
  monkeypatch.setattr(e5_small, "import_e5_small", lambda output, **kw: calls.append(("import", kw)))

  def trimmed(import_into, output, task, *, normalizers):
    calls.append(("trim", task, normalizers))
    import_into(output)

  monkeypatch.setattr(trim, "import_trimmed", trimmed)
  for flags, options in [(["--trim_vocab_to=T", "--trim_normalize=nfd_strip_marks"],
                          {"trim_vocab_to": "T", "trim_normalize": "nfd_strip_marks"}),
                         (["--trim_vocab_to=T", "--languages=en,de,fr"], {"trim_vocab_to": "T",
                                                                          "languages": ["en", "de", "fr"]})]:
    calls.clear()
    assert e5_small_cli.main([f"--output={tmp_path / 'by_command'}", *flags]) == 0
    by_command = list(calls)
    calls.clear()
    harness.import_e5(str(tmp_path / "by_driver"), **options)
    assert calls == by_command and len(calls) == 2
  calls.clear()
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("mine\n")
  assert e5_small_cli.main([f"--output={mine}", "--trim_vocab_to=T"]) == 2
  error = capsys.readouterr().err.strip().removeprefix("error: ")
  with pytest.raises(UserError) as refused:
    harness.import_e5(str(mine), trim_vocab_to="T")
  assert str(refused.value) == error and not calls
