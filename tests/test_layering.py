"""Import rules of the package layout, checked on the source (ARCHITECTURE.md, STYLE.md §1, §12 and §14).

Every module of `flax_xalign/` and of the top-level `tasks/` folder (installed
as `flax_xalign.tasks`) belongs to a *unit*: its top-level folder, or, for a
module at the top level, the module itself. Folders are ordered in *layers*:

    0  ops, models          jitted kernels, the pure network
    1  data                 sources, vocabularies, transforms, counting
    2  tasks                the seqio registry
    3  objectives, assets   losses; run-scoped arrays
    4  training             assembly, trainer, loop, checkpoint writing
    5  runs                 reading a finished run
    6  evaluation           evaluators over a run
    7  interop              Hugging Face / t5x / trimming
    8  experiments          the paper drivers' work, the GPU grids, bundle and runner
    9  cli                  THE edge: every command, the gin edge, the `xalign`
                            console script

plus the *core* (`errors`, `fileio`, `storage`, `run_spec`, `run_dir`, the package
`__init__`), which every layer may import and which itself imports only the
core, `data` and `models`, and the two t5x-spelled entry modules `train.py`
and `eval.py`, which import only `cli`. The checks:

* the unit-level import graph has no cycle (each core module a unit of its own);
* no import points up the order (two folders of one layer may import each
  other one way);
* `cli/` is the only edge: no module outside it runs as a program (no
  `__main__` block, no `__main__.py`) but `train.py` and `eval.py`, and the
  top level holds nothing else;
* gin lives at the edge: only cli/ imports it;
* no module is over 600 lines;
* no objective name is special-cased in `training/`.

An import counts wherever it is written: at module level, inside a function,
under `TYPE_CHECKING` or in a `__main__` block.
"""

from __future__ import annotations

import ast
import collections
import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "flax_xalign"
TASKS = REPO / "tasks"

LAYERS = {
    "ops": 0, "models": 0,
    "data": 1,
    "tasks": 2,
    "objectives": 3, "assets": 3,
    "training": 4,
    "runs": 5,
    "evaluation": 6,
    "interop": 7,
    "experiments": 8,
    "cli": 9,
}
CLI_LEVEL = LAYERS["cli"]
CORE = {"__init__", "errors", "fileio", "storage", "run_spec", "run_dir"}
ENTRY_MODULES = {"train", "eval"}  # `python -m flax_xalign.train` / `.eval`: the t5x spellings, thin fronts of cli/.
CORE_MAY_IMPORT = {"data", "models"}
MAX_LINES = 600


# ---------------------------------------------------------------- the graph


def _modules() -> list[tuple[str, pathlib.Path]]:
  """(dotted module name, path) of every source module of the package and of tasks/."""
  out = []
  for root, prefix in ((PACKAGE, "flax_xalign"), (TASKS, "flax_xalign.tasks")):
    for path in sorted(root.rglob("*.py")):
      rel = path.relative_to(root)
      if "__pycache__" in rel.parts:
        continue
      if root == PACKAGE and rel.parts[0] == "tasks":
        continue  # (no such folder today; the installed name maps to the top-level one)
      parts = list(rel.with_suffix("").parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      out.append((".".join([prefix, *parts]), path))
  return out


def _is_main_guard(node: ast.stmt) -> bool:
  return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
          and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
          and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators))


def _imports(name: str, path: pathlib.Path) -> set[str]:
  """Dotted names a module imports, wherever written; `from a import b` gives a and a.b."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      if node.level:  # Relative: resolved against the module's own package.
        base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        module = ".".join([*base, module] if module else base)
      names.add(module)
      names.update(f"{module}.{alias.name}" for alias in node.names)
  return names


def node_of(module: str) -> str | None:
  """The graph unit of a module of ours: its top-level folder, or the top-level module itself; None if not ours."""
  parts = module.split(".")
  if parts[0] != "flax_xalign":
    return None
  return parts[1] if len(parts) > 1 else "__init__"


def level_of(node: str) -> int | None:
  """The unit's layer; None for the core; the cli layer for the two entry modules."""
  if node in CORE:
    return None
  return CLI_LEVEL if node in ENTRY_MODULES else LAYERS[node]


def _gin_edge(name: str) -> bool:
  return node_of(name) == "cli"


def _source(module: str, path: pathlib.Path) -> str:
  return str(path.relative_to(REPO))


def folder_graph() -> dict[tuple[str, str], set[str]]:
  """{(importer node, imported node): the files that make the edge}, self-edges left out."""
  edges: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
  for name, path in _modules():
    here = node_of(name)
    for imported in _imports(name, path):
      there = node_of(imported)
      if there is None or there == here or imported == "flax_xalign":
        continue  # `from flax_xalign import x` also names the package itself (x is its own unit).
      edges[(here, there)].add(_source(name, path))
  return dict(edges)


def cycles(edges) -> list[list[str]]:
  """The strongly connected components with more than one node (Tarjan)."""
  graph = collections.defaultdict(set)
  for a, b in edges:
    graph[a].add(b)
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(set(graph) | {b for _, b in edges}):
    if v not in index:
      visit(v)
  return out


@pytest.fixture(scope="module")
def graph():
  return folder_graph()


def _describe(edges, pairs) -> str:
  return "\n".join(f"  {a} -> {b}: {', '.join(sorted(edges[(a, b)]))}" for a, b in sorted(pairs))


# ---------------------------------------------------------------- the rules


def test_the_graph_sees_every_folder(graph):
  """Guards the test itself: every layer folder is a node, and a known arrow is found."""
  folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()} | {"tasks"}
  assert folders <= set(LAYERS), f"folders without a layer (add them to LAYERS): {folders - set(LAYERS)}"
  nodes = {a for a, _ in graph} | {b for _, b in graph}
  assert folders <= nodes, f"folders the scan did not reach: {folders - nodes}"
  assert ("tasks", "data") in graph  # tasks/ is read (flax_xalign.tasks resolves to it) and reads data/.


def test_no_import_cycles_between_units(graph):
  # Every arrow counts, the core's too: each core module is a unit of its own, so a
  # cycle between two of them (errors <-> fileio) is found like any other.
  found = cycles(graph)

  def causes(component):  # The arrows of the cycle that point up the layers close it; else all of them.
    inside = [(a, b) for a, b in graph if a in component and b in component]
    up = [(a, b) for a, b in inside if level_of(a) is not None and level_of(b) is not None
          and level_of(b) > level_of(a)]
    return up or inside

  detail = "\n".join(f"cycle {' <-> '.join(c)}, closed by:\n" + _describe(graph, causes(c)) for c in found)
  assert not found, f"{len(found)} import cycle(s) between units:\n{detail}"


def test_no_import_points_up_the_layers(graph):
  upward = []
  for a, b in graph:
    low, high = level_of(a), level_of(b)
    if low is None:  # The core imports only the core, data and models.
      if b not in CORE_MAY_IMPORT and b not in CORE:
        upward.append((a, b))
    elif a in ENTRY_MODULES:  # train.py / eval.py are fronts of cli/ and nothing else.
      if b != "cli" and b not in CORE:
        upward.append((a, b))
    elif high is not None and high > low:
      upward.append((a, b))
  assert not upward, ("imports against the order ops/models <- data <- tasks <- objectives/assets <- training "
                      "<- runs <- evaluation <- interop <- experiments <- cli (core: errors, fileio, storage, run_spec, run_dir):\n"
                      + _describe(graph, upward))


def test_cli_is_the_only_edge():
  """Only cli/ (and the t5x-spelled train.py / eval.py) runs as a program; the top level holds nothing else."""
  top = {p.stem for p in PACKAGE.glob("*.py")}
  assert top <= CORE | ENTRY_MODULES, (f"modules at the top level of flax_xalign/ besides the core and train/eval "
                                       f"(commands live in cli/): {sorted(top - CORE - ENTRY_MODULES)}")
  runnable = []
  for name, path in _modules():
    if node_of(name) == "cli" or node_of(name) in ENTRY_MODULES:
      continue
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if path.name == "__main__.py" or any(_is_main_guard(node) for node in tree.body):
      runnable.append(str(path.relative_to(REPO)))
  assert not runnable, f"runnable modules outside cli/ (move the command to cli/, drop the alias): {runnable}"


def test_only_the_cli_layer_imports_gin():
  offenders = []
  for name, path in _modules():
    if _gin_edge(name):
      continue  # The gin edge: cli/ (gin_cli, configurables, the commands).
    if any(n == "gin" or n.startswith("gin.") for n in _imports(name, path)):
      offenders.append(str(path.relative_to(REPO)))
  assert not offenders, f"library modules import gin (only cli/ may): {offenders}"


def test_no_module_is_over_600_lines():
  long = {str(path.relative_to(REPO)): n for _, path in _modules()
          if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines (split them along their seams): {long}"


def test_training_names_no_objective():
  from flax_xalign import objectives  # The package registers every built-in objective.

  pattern = re.compile(r"""["'](%s)["']""" % "|".join(map(re.escape, objectives.names())))
  found = {str(p.relative_to(REPO)): pattern.findall(p.read_text(encoding="utf-8"))
           for p in sorted((PACKAGE / "training").rglob("*.py"))}
  offenders = {path: names for path, names in found.items() if names}
  assert not offenders, f"training/ names objectives (pass them in from the run's config instead): {offenders}"


# ---------------------------------------------------------------- the checker, on a made-up tree


def test_the_checker_finds_cycles_and_resolves_relative_imports(tmp_path):
  edges = {("a", "b"): {"x"}, ("b", "c"): {"y"}, ("c", "a"): {"z"}, ("c", "d"): {"w"}, ("e", "f"): {"v"},
           ("f", "e"): {"u"}}
  assert sorted(cycles(edges)) == [["a", "b", "c"], ["e", "f"]]
  assert cycles({("a", "b"): {"x"}, ("b", "c"): {"y"}}) == []
  module = tmp_path / "registry.py"
  module.write_text("from . import user\nfrom .data import x\nfrom ..ops import csls\n"
                    "import gin\n\nif __name__ == '__main__':\n  from flax_xalign.cli import main\n")
  got = _imports("flax_xalign.tasks.registry", module)
  assert {"flax_xalign.tasks.user", "flax_xalign.tasks.data.x", "flax_xalign.ops.csls", "gin"} <= got
  assert "flax_xalign.cli" in got  # An import in a `__main__` block counts like any other.
  assert node_of("flax_xalign.tasks.user") == "tasks" and node_of("flax_xalign.train") == "train"
  assert level_of("train") == CLI_LEVEL and level_of("run_spec") is None and node_of("numpy") is None
  assert node_of("flax_xalign.errors") == "errors" and node_of("flax_xalign.fileio") == "fileio"
  assert cycles({("errors", "fileio"): {"a"}, ("fileio", "errors"): {"b"}}) == [["errors", "fileio"]]
  assert level_of(node_of("flax_xalign.cli.gin_cli")) == CLI_LEVEL


# ---------------------------------------------------------------- cli/: one floor of commands over the gin edge

# The modules of cli/ that are not commands: the gin edge and the process set-up every command shares.
CLI_EDGE = {"__init__", "__main__", "xalign", "common", "_process", "gin_cli", "configurables", "cache_flags",
            "experiments"}  # (experiments: the subpackage's __init__, a folder of commands.)
MAX_COMMAND_LINES = 150
MAX_FUNCTION_LINES = 100


def _cli_modules() -> dict[str, tuple[pathlib.Path, bool]]:
  """{name inside cli/ (`align`, `experiments.mlm_gc`): (path, whether it is a command)}."""
  out = {}
  for name, path in _modules():
    if node_of(name) != "cli":
      continue
    inner = name[len("flax_xalign.cli."):] if name != "flax_xalign.cli" else "__init__"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out[inner] = (path, any(_is_main_guard(node) for node in tree.body))
  return out


def _cli_imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
  """The cli/ modules a cli/ module imports (`from flax_xalign.cli import align` names `align`)."""
  dotted = "flax_xalign.cli" if name == "__init__" else f"flax_xalign.cli.{name}"
  found = set()
  for imported in _imports(dotted, path):
    if not imported.startswith("flax_xalign.cli."):
      continue
    parts = imported[len("flax_xalign.cli."):].split(".")
    for k in range(len(parts), 0, -1):  # The longest prefix that is a module: `a.b.c` of a module `a.b` is `a.b`.
      if ".".join(parts[:k]) in known:
        found.add(".".join(parts[:k]))
        break
  found.discard(name)
  return found


def test_every_cli_module_is_a_command_or_the_gin_edge():
  modules = _cli_modules()
  other = sorted(name for name, (_, command) in modules.items() if not command and name not in CLI_EDGE)
  assert not other, (f"cli/ modules that are neither a command (a __main__ block) nor the gin edge {sorted(CLI_EDGE)}: "
                     f"{other} (library code goes below cli/: experiments/, data/packed/, ...)")
  edge_commands = sorted(name for name, (_, command) in modules.items() if command and name in CLI_EDGE
                         and name not in {"__main__", "xalign"})
  assert not edge_commands, f"gin-edge modules that run as a command: {edge_commands}"


def test_no_command_imports_another_command_and_cli_is_two_floors():
  modules = _cli_modules()
  commands = {name for name, (_, command) in modules.items() if command and name not in CLI_EDGE}
  offenders = {}
  for name, (path, _) in modules.items():
    wrong = sorted(_cli_imports(path, name, set(modules)) & commands)
    if wrong:
      offenders[name] = wrong
  assert not offenders, ("cli/ modules that import a command (call the library function the command calls, with "
                         f"typed arguments): {offenders}")
  # Two floors: the commands over the edge. Inside the edge a module stands at most one over another (gin_cli
  # over configurables and _process, common over _process), so no chain of cli/ imports is longer than three.
  graph = {name: _cli_imports(path, name, set(modules)) for name, (path, _) in modules.items()}

  def chain(name: str, seen: tuple[str, ...] = ()) -> tuple[str, ...]:
    longest = max((chain(m, (*seen, name)) for m in graph[name] if m not in seen), key=len, default=())
    return (name, *longest)

  deepest = max((chain(name) for name in graph), key=len)
  assert len(deepest) <= 3, f"cli/ imports stack {len(deepest)} deep (at most a command over two edge floors): " + \
      " -> ".join(deepest)


def test_commands_and_functions_are_short():
  modules = _cli_modules()
  long_commands = {str(path.relative_to(REPO)): n for name, (path, command) in modules.items()
                   if command and name not in CLI_EDGE
                   and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_COMMAND_LINES}
  assert not long_commands, f"commands over {MAX_COMMAND_LINES} lines (move the work into the library): {long_commands}"
  long_functions = {}
  for _, path in _modules():
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
          long_functions[f"{path.relative_to(REPO)}:{node.lineno} {node.name}"] = n
  assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long_functions}"


# Module circles kept on purpose, each with its reason.
MODULE_CYCLES_ALLOWED = {
    # format.open_split(URL) hands a bucket's split to staging (which stages it with format's own reader) so
    # that every reader opens a cache one way, local or gs://; the import is lazy and one-way at load time.
    ("flax_xalign.data.packed.format", "flax_xalign.data.packed.staging"),
}


def module_graph() -> set[tuple[str, str]]:
  """(importer, imported) between the modules of ours, every import counted; a package's own submodules and
  its parents are left out (`from flax_xalign.data import x` names the package, not a circle)."""
  modules = dict(_modules())
  edges = set()
  for name, path in modules.items():
    for imported in _imports(name, path):
      parts = imported.split(".")
      for k in range(len(parts), 0, -1):
        target = ".".join(parts[:k])
        if target in modules:
          if target != name and not name.startswith(target + "."):
            edges.add((name, target))
          break
  return edges


def test_no_import_circle_between_modules():
  """Within a folder too: `training/checkpoints.py` <-> `training/data_positions.py` was one (a lazy import)."""
  found = [tuple(c) for c in cycles({edge: set() for edge in module_graph()})]
  unexpected = [c for c in found if tuple(sorted(c)) not in MODULE_CYCLES_ALLOWED]
  assert not unexpected, f"import circles between modules (move what both need into a third): {unexpected}"


def test_bench_imports_no_command():
  """A benchmark drives the library (or the edge's `gin_cli.train`), never a command's module."""
  modules = _cli_modules()
  commands = {name for name, (_, command) in modules.items() if command and name not in CLI_EDGE}
  offenders = {}
  for path in sorted((REPO / "bench").glob("*.py")):
    found = set()
    for imported in _imports(f"bench.{path.stem}", path):
      if imported.startswith("flax_xalign.cli."):
        parts = imported[len("flax_xalign.cli."):].split(".")
        found |= {".".join(parts[:k]) for k in range(1, len(parts) + 1)} & commands
    if found:
      offenders[str(path.relative_to(REPO))] = sorted(found)
  assert not offenders, f"benchmarks that import a command (call the library): {offenders}"
