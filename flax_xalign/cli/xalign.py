"""`xalign <command> [flags]`: the one console script, a front for every command under `flax_xalign/cli/`.

`xalign <command> ...` runs exactly what `python -m flax_xalign.cli.<command> ...`
runs (the experiment drivers: `python -m flax_xalign.cli.experiments.<command>`);
`xalign --help` lists the commands with the first line of each one's docstring,
and `xalign <command> --help` is the command's own help. The table is read from
the source (a module is a command when it has a `__main__` block), so listing
imports nothing heavy and a new command is listed without being registered.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import sys
from collections.abc import Sequence

HERE = pathlib.Path(__file__).resolve().parent
FOLDERS = ((HERE, "flax_xalign.cli"), (HERE / "experiments", "flax_xalign.cli.experiments"))


def _is_main_guard(node: ast.stmt) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
          and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def _summary(docstring: str) -> str:
  """The docstring's first line, without a leading "`python -m ...`:" or "`xalign ...`:" of its own."""
  line = docstring.strip().splitlines()[0] if docstring.strip() else ""
  if line.startswith("`") and "`:" in line:
    line = line.split("`:", 1)[1].strip()
  return line[:1].upper() + line[1:]


def commands() -> dict[str, tuple[str, str]]:
  """{command: (module, one-line summary)}, in the order `xalign --help` lists them."""
  found: dict[str, tuple[str, str]] = {}
  for folder, prefix in FOLDERS:
    for path in sorted(folder.glob("*.py")):
      tree = ast.parse(path.read_text(encoding="utf-8"))
      if path.stem.startswith("_") or not any(_is_main_guard(node) for node in tree.body):
        continue
      if path.stem in found:  # Two modules, one name: `xalign NAME` could not say which.
        raise RuntimeError(f"two commands named {path.stem}: {found[path.stem][0]} and {prefix}.{path.stem}")
      found[path.stem] = (f"{prefix}.{path.stem}", _summary(ast.get_docstring(tree) or ""))
  return found


def usage(table: dict[str, tuple[str, str]]) -> str:
  width = max(map(len, table))
  lines = ["usage: xalign <command> [flags]   (xalign <command> --help: the command's own flags)", "",
           "commands:"]
  lines += [f"  {name:<{width}}  {summary}" for name, (_, summary) in table.items()]
  lines += ["", "`xalign <command>` = `python -m flax_xalign.cli.<command>`; "
            "`python -m flax_xalign.train` / `.eval` are the t5x spellings of train and eval."]
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  flags = list(sys.argv[1:] if argv is None else argv)
  table = commands()
  if not flags or flags[0] in ("-h", "--help", "help"):
    print(usage(table))
    return 0 if flags else 2
  name, rest = flags[0], flags[1:]
  if name not in table:
    print(f"error: xalign has no command {name!r}; `xalign --help` lists them.", file=sys.stderr)
    return 2
  module = importlib.import_module(table[name][0])
  return module.main(rest)
