"""The one exception type for bad user input.

Entry points catch `UserError`, print its message (which names the problem and
the fix) and exit with status 2, without a traceback. Library code raises it
for anything a user can fix: missing files, malformed rows, unknown names,
mismatched checkpoints.
"""


import sys
from typing import Any, Callable


class UserError(Exception):
  """Bad input that the user can fix; the message says what and how."""


def run_command(work: Callable[[], Any]) -> int:
  """A command's exit status: 0 after `work()`, or 2 with `error: <message>` on stderr for a UserError."""
  try:
    work()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0
