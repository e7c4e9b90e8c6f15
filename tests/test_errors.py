"""`errors.user_message`: a UserError's own text, out of gin's proxy and TF autograph's re-raise."""

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
