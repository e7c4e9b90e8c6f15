"""Drivers that run their stages in this process (demo, the experiment drivers) stop on SIGTERM with one line
and 143, as on Ctrl-C with 130 (issue 47: a scheduler's SIGTERM ended them with no word, rc -15); a stage's
own exit status (a training that stopped after its step: 143, with its line) is kept."""

import os
import signal
import time

import pytest

from flax_xalign import errors
from flax_xalign.cli import common


def _signalled(sig):
  def main(argv):
    del argv
    os.kill(os.getpid(), sig)
    time.sleep(5)  # (the handler raises during the sleep)
    raise AssertionError("the signal did not stop the driver")
  return main


@pytest.mark.parametrize("sig, code, line", [(signal.SIGTERM, 143, errors.TERMINATED),
                                             (signal.SIGINT, 130, errors.INTERRUPTED)])
def test_a_signal_outside_training_is_one_line_and_the_shells_status(sig, code, line, capfd):
  before = signal.getsignal(signal.SIGINT)
  signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job starts with SIGINT ignored)
  try:
    assert common.run_driver(_signalled(sig), []) == code
  finally:
    signal.signal(signal.SIGINT, before)
  assert capfd.readouterr().err.strip().splitlines() == [line]
  assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)  # (put back after the driver)


def test_a_stages_exit_status_is_the_drivers_and_cleanup_runs_on_sigterm(capfd):
  cleaned = []

  def main(argv):
    del argv
    try:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(5)
    finally:
      cleaned.append(True)

  assert common.run_driver(main, []) == 143 and cleaned == [True]
  assert common.run_driver(lambda argv: 7, []) == 7
  with pytest.raises(SystemExit) as stage:  # harness.check_exit: the stage printed its own line already.
    common.run_driver(lambda argv: (_ for _ in ()).throw(SystemExit(143)), [])
  assert stage.value.code == 143
  capfd.readouterr()
