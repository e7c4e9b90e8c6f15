"""The one exception type for bad user input.

Entry points catch `UserError`, print its message (which names the problem and
the fix) and exit with status 2, without a traceback. Library code raises it
for anything a user can fix: missing files, malformed rows, unknown names,
mismatched checkpoints.
"""


class UserError(Exception):
  """Bad input that the user can fix; the message says what and how."""
