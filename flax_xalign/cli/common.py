"""The tail every command shares: process set-up, parse the flags, run, one exit status.

    def main(argv=None) -> int:
      return common.main_of(parse_args, run, argv)

Bad input (a UserError from parsing or running) becomes one `error: ...` line
on stderr and exit status 2 (`errors.run_command`); argparse's own errors exit
with 2 from `errors.ArgumentParser`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign import errors
from flax_xalign.cli._process import setup_process


def argv_of(argv: Sequence[str] | None) -> list[str]:
  """The command line's flags: `argv`, or the process's own when None."""
  return list(sys.argv[1:] if argv is None else argv)


def main_of(parse: Callable[[list[str]], Any], work: Callable[[Any], Any], argv: Sequence[str] | None) -> int:
  """Exit status of a command: set the process up, `args = parse(argv)`, then `work(args)`."""
  setup_process()
  flags = argv_of(argv)
  return errors.run_command(lambda: work(parse(flags)))


def gin_main(argv: Sequence[str] | None, *, description: str, configurable: str, **kwargs) -> tuple[int, Any]:
  """(exit status, result) of a gin command (t5x-style flags, `gin_cli.run`) after the process set-up."""
  setup_process()
  from flax_xalign import gin_cli

  return gin_cli.run(argv_of(argv), description=description, configurable=configurable, **kwargs)
