"""Every shell command shown in README.md and docs/ is run here, or says why it is not (STYLE.md §16).

How a fenced block is marked (the line right before its opening fence, an HTML comment GitHub hides):

  <!-- runnable -->          run by this file in the `subprocess` tier: seconds, no training
  <!-- runnable: slow -->    run in the `slow` tier: it trains (a few steps of a tiny model), or reads
                             the embedded Bible corpus (fetched once, as the tests fetch it)
  <!-- not-run: REASON -->   shown and never run; REASON says why (a TPU pod, a GPU, hours of CPU,
                             the network, a second virtualenv, ...)

A shell block is a fence whose info string is bash, sh, shell, console or zsh. A fence without an
info string is refused (name it: `text` for output, `gin` for gin), so no command hides in one, and
every shell block must carry one of the marks: the unit tier fails for one that does not.

How runnable blocks run: the blocks of one markdown file, in order, as one `bash -euo pipefail`
script each, in one fresh temporary folder per file (a later block may read what an earlier one
wrote, e.g. `runs/tiny`). The folder links the repository's inputs (docs/, gin_configs/, bench/,
tools/, flax_xalign/, tasks/, notebooks/, the Makefile: `LINKED`), so a block reads as typed in the
repository root, and `$REPO` names the root; the toy corpus of the examples is docs/examples/.
`xalign ...` runs `python -m flax_xalign.cli ...`, the console script's own front (in a checkout
without it, `xalign NAME` runs `python -m flax_xalign.cli.NAME` or, for an experiment driver,
`flax_xalign.cli.experiments.NAME`), and `python`/`python3` is this interpreter (`sys.executable`),
with this checkout first on PYTHONPATH and JAX on the CPU.

The unit tier also checks, without running anything: every `xalign NAME` in the docs names a
command; README's table of commands lists exactly the command modules of flax_xalign/cli/ (those
with a `__main__` block); no removed `python -m flax_xalign.<module>` spelling is left (only
`flax_xalign.train` and `flax_xalign.eval` stay); relative links point at files that exist and
their #anchors at headings; each guide (docs/*.md) starts with a runnable block.

Tiers: `test_runnable_blocks` starts Pythons, so it is `subprocess` (tests/tiers.py: `contract` is
in-process), ~4-5 min on 2 loaded cores; `test_runnable_blocks_that_train` is `slow`. Each runnable block
runs in one tier: a page with slow blocks runs up to its last slow block in the slow tier, the cheap
blocks before it included (a slow block may read what they wrote), and its cheap blocks after it in the
subprocess tier (`_page_part`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CLI = REPO / "flax_xalign" / "cli"
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# Repository folders a block may read by a relative path; linked into each file's temporary folder.
LINKED = ("docs", "gin_configs", "bench", "tools", "flax_xalign", "tasks", "notebooks", "Makefile", "setup.py", "pyproject.toml")
TIMEOUT_S = {"subprocess": 300, "slow": 1200}

_MARK = re.compile(r"^\s*<!--\s*(runnable(?::\s*(?P<tier>\w+))?|not-run:(?P<reason>.*?))\s*-->\s*$")
_FENCE = re.compile(r"^(?P<indent>\s{0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")

PRELUDE = r"""
xalign() {
  local name="${1:-}"
  if [ -f "$REPO/flax_xalign/cli/__main__.py" ]; then
    "$PY" -m flax_xalign.cli "$@"
  elif [ -n "$name" ] && [ -f "$REPO/flax_xalign/cli/$name.py" ]; then
    shift; "$PY" -m "flax_xalign.cli.$name" "$@"
  elif [ -n "$name" ] && [ -f "$REPO/flax_xalign/cli/experiments/$name.py" ]; then
    shift; "$PY" -m "flax_xalign.cli.experiments.$name" "$@"
  else
    "$PY" -m flax_xalign.cli "$@"
  fi
}
python() { "$PY" "$@"; }
python3() { "$PY" "$@"; }
"""


@dataclasses.dataclass(frozen=True)
class Block:
  path: str          # relative to the repository root
  line: int          # 1-based line of the opening fence
  info: str          # the info string's first word ('' when there is none)
  mark: str | None   # 'runnable', 'not-run' or None
  tier: str | None   # 'subprocess' or 'slow' for runnable blocks
  reason: str        # why a not-run block is not run
  text: str

  @property
  def where(self) -> str:
    return f"{self.path}:{self.line}"


def markdown_files() -> list[pathlib.Path]:
  return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _rel(path: pathlib.Path) -> str:
  return path.relative_to(REPO).as_posix()


def parse_blocks(path: pathlib.Path) -> list[Block]:
  """The fenced blocks of one markdown file, with the mark on the line before each."""
  lines = path.read_text(encoding="utf-8").splitlines()
  blocks, i = [], 0
  while i < len(lines):
    m = _FENCE.match(lines[i])
    if not m:
      i += 1
      continue
    fence, info = m.group("fence"), m.group("info").strip()
    start, body = i, []
    i += 1
    while i < len(lines) and not re.match(rf"^\s{{0,3}}{fence[0]}{{{len(fence)},}}\s*$", lines[i]):
      body.append(lines[i])
      i += 1
    i += 1  # The closing fence (or the end of the file).
    mark = tier = None
    reason = ""
    prev = _MARK.match(lines[start - 1]) if start > 0 else None
    if prev:
      if prev.group("reason") is not None:
        mark, reason = "not-run", prev.group("reason").strip()
      else:
        mark, tier = "runnable", {None: "subprocess", "slow": "slow"}.get(prev.group("tier"), prev.group("tier"))
    blocks.append(Block(_rel(path), start + 1, info.split()[0] if info else "", mark, tier, reason,
                        "\n".join(body)))
  return blocks


def all_blocks() -> list[Block]:
  return [b for path in markdown_files() for b in parse_blocks(path)]


def command_modules() -> dict[str, str]:
  """{command: module} of every module of flax_xalign/cli/ (and experiments/) with a `__main__` block."""
  out = {}
  for folder, package in ((CLI, "flax_xalign.cli"), (CLI / "experiments", "flax_xalign.cli.experiments")):
    for path in sorted(folder.glob("*.py")):
      if path.name.startswith("_"):
        continue
      if re.search(r"^if __name__ == [\"']__main__[\"']", path.read_text(encoding="utf-8"), re.M):
        out[path.stem] = f"{package}.{path.stem}"
  return out


# --- unit tier: parsing only ---------------------------------------------------------------------


def test_every_shell_block_is_marked_and_every_fence_is_named():
  problems = []
  for b in all_blocks():
    if not b.info:
      problems.append(f"{b.where}: a fence without an info string (name it: bash, text, gin, python, ...)")
    elif b.info in SHELL_LANGS and b.mark is None:
      problems.append(f"{b.where}: a {b.info} block with no mark: put `<!-- runnable -->`, "
                      "`<!-- runnable: slow -->` or `<!-- not-run: why -->` on the line before it")
    if b.mark == "not-run" and len(b.reason) < 8:
      problems.append(f"{b.where}: `not-run:` needs a reason (a TPU pod, a GPU, hours of CPU, ...)")
    if b.mark == "runnable" and b.info not in SHELL_LANGS:
      problems.append(f"{b.where}: only shell blocks run; this one is `{b.info}`")
    if b.mark == "runnable" and b.tier not in TIMEOUT_S:
      problems.append(f"{b.where}: unknown tier {b.tier!r} (runnable, or runnable: slow)")
  assert not problems, "\n".join(problems)


def test_each_guide_starts_with_a_runnable_block():
  """STYLE.md §16: a guide's first fenced block is a command that runs (results pages and INTERFACES excepted)."""
  problems = []
  for path in sorted((REPO / "docs").glob("*.md")):
    if path.name == "INTERFACES.md":
      continue
    blocks = parse_blocks(path)
    if not blocks or blocks[0].mark != "runnable":
      problems.append(f"{_rel(path)}: its first fenced block is not marked runnable")
  assert not problems, "\n".join(problems)


def test_readme_table_lists_every_command_once():
  text = (REPO / "README.md").read_text(encoding="utf-8")
  rows = re.findall(r"^\|\s*`xalign ([a-z0-9_]+)`", text, re.M)
  commands = command_modules()
  assert len(rows) == len(set(rows)), sorted(r for r in rows if rows.count(r) > 1)
  assert set(rows) == set(commands), {"missing from the README table": sorted(set(commands) - set(rows)),
                                      "not a command": sorted(set(rows) - set(commands))}


def test_every_command_is_shown_in_a_guide():
  """Each command appears in a shell block of docs/ (train and eval in their t5x spelling, or as xalign)."""
  shown = "\n".join(b.text for b in all_blocks() if b.path.startswith("docs/") and b.info in SHELL_LANGS)
  missing = [name for name in command_modules()
             if not re.search(rf"xalign {name}\b|flax_xalign\.{name}\b", shown)]
  assert not missing, f"commands no guide shows in a shell block: {missing}"


def test_every_xalign_command_in_the_docs_exists():
  commands = command_modules()
  problems = []
  for path in markdown_files():
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      for name in re.findall(r"(?:^|[\s`(;&|])xalign ([a-z][a-z0-9_]*)", line):
        if name not in commands:
          problems.append(f"{_rel(path)}:{n}: `xalign {name}` is not a command ({', '.join(sorted(commands))})")
  assert not problems, "\n".join(problems)


def test_no_removed_spellings():
  """`python -m flax_xalign.X` is gone for every X but train and eval: `xalign X` instead."""
  kept = re.compile(r"flax_xalign\.(train|eval|cli)\b")
  problems = []
  for path in markdown_files():
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      for m in re.finditer(r"-m\s+(flax_xalign(?:\.\w+)+)", line):
        if not kept.match(m.group(1)):
          problems.append(f"{_rel(path)}:{n}: `-m {m.group(1)}`: write `xalign <command>`")
  assert not problems, "\n".join(problems)


def anchors(path: pathlib.Path) -> set[str]:
  """GitHub's anchors of a markdown file's headings (outside fenced blocks)."""
  out, seen, fence = set(), {}, None
  for line in path.read_text(encoding="utf-8").splitlines():
    m = _FENCE.match(line)
    if m and (fence is None or m.group("fence")[0] == fence):
      fence = None if fence else m.group("fence")[0]
      continue
    heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
    if fence is None and heading:
      slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
      out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
      seen[slug] = seen.get(slug, 0) + 1
  return out


def test_relative_links_resolve():
  """Every relative link names a file that exists, and its #anchor a heading of that file."""
  problems = []
  for path in markdown_files():
    text = path.read_text(encoding="utf-8")
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
      target, _, anchor = m.group(1).partition("#")
      if re.match(r"^[a-z]+:", target):
        continue
      line = text[:m.start()].count("\n") + 1
      resolved = (path.parent / target) if target else path
      if not resolved.exists():
        problems.append(f"{_rel(path)}:{line}: link to {m.group(1)}, which does not exist")
      elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        problems.append(f"{_rel(path)}:{line}: link to {m.group(1)}: no such heading in {resolved.name}")
  assert not problems, "\n".join(problems)


# --- subprocess and slow tiers: running the blocks -----------------------------------------------


def _page_part(blocks: list[Block], tier: str) -> list[Block]:
  """The runnable blocks of one page that `tier` runs, in order; each runnable block in exactly one tier.

  The slow tier runs a page with slow blocks up to its last slow block, its cheap blocks before it
  included (a slow block may read what they wrote); the subprocess tier runs the cheap blocks after it
  (all of a page's cheap blocks when it has no slow block). Such a cheap block cannot read what a block
  before that last slow block writes.
  """
  runnable = [b for b in blocks if b.mark == "runnable"]
  last_slow = max((i for i, b in enumerate(runnable) if b.tier == "slow"), default=-1)
  return runnable[:last_slow + 1] if tier == "slow" else runnable[last_slow + 1:]


def _pages_with(tier: str) -> list[str]:
  """The pages with runnable blocks that `tier` runs (for the slow tier: the pages with a slow block)."""
  return [_rel(path) for path in markdown_files() if _page_part(parse_blocks(path), tier)]


def _run_file(rel: str, tier: str, tmp_path: pathlib.Path, extra_env: dict[str, str]) -> None:
  for name in LINKED:
    os.symlink(REPO / name, tmp_path / name)
  env = dict(os.environ)
  env.update(REPO=str(REPO), PY=sys.executable, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p), **extra_env)
  for block in _page_part(parse_blocks(REPO / rel), tier):
    script = "set -euo pipefail\n" + PRELUDE + block.text + "\n"
    try:
      proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT_S[block.tier])
    except subprocess.TimeoutExpired as e:
      pytest.fail(f"{block.where}: still running after {e.timeout} s:\n{block.text}")
    assert proc.returncode == 0, (f"{block.where} exited {proc.returncode}:\n{block.text}\n--- stdout\n"
                                  f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def test_each_runnable_block_runs_in_one_tier():
  """`_page_part` splits each page's runnable blocks between the two tiers: every block once, in page order."""
  blocks = [Block("p.md", n, "bash", "runnable", tier, "", "") for n, tier in
            enumerate(["subprocess", "slow", "subprocess", "slow", "subprocess", "subprocess"])]
  assert [b.line for b in _page_part(blocks, "slow")] == [0, 1, 2, 3]
  assert [b.line for b in _page_part(blocks, "subprocess")] == [4, 5]
  cheap = [b for b in blocks if b.tier == "subprocess"]
  assert _page_part(cheap, "subprocess") == cheap and _page_part(cheap, "slow") == []
  for path in markdown_files():
    page = [b for b in parse_blocks(path) if b.mark == "runnable"]
    assert _page_part(page, "slow") + _page_part(page, "subprocess") == page, _rel(path)


@pytest.mark.subprocess
@pytest.mark.parametrize("rel", _pages_with("subprocess"))
def test_runnable_blocks(rel, tmp_path):
  """The cheap blocks of one page (`<!-- runnable -->`) that the slow tier does not run (`_page_part`), in order."""
  _run_file(rel, "subprocess", tmp_path, {})


# The method guides' slow pages run from tests/test_docs_method_examples.py: xdist's --dist loadfile keeps a
# file on one worker, and the slow pages together are minutes of training, so two files let two workers share
# them. Each page is run by exactly one of the two (test_every_slow_page_runs_in_one_of_the_two_files).
METHOD_GUIDES = ("docs/xlm_align.md", "docs/align_mlm.md", "docs/code_switch.md", "docs/mlm_gc.md")


def slow_pages(*, methods: bool) -> list[str]:
  return [rel for rel in _pages_with("slow") if (rel in METHOD_GUIDES) == methods]


def run_slow_page(rel: str, tmp_path: pathlib.Path, bible_data_dir) -> None:
  """The runnable blocks of one page up to its last slow block, cheap ones included (`_page_part`), in order."""
  _run_file(rel, "slow", tmp_path, {"FLAX_XALIGN_DATA_DIR": str(bible_data_dir)})


def test_every_slow_page_runs_in_one_of_the_two_files():
  assert sorted(slow_pages(methods=True) + slow_pages(methods=False)) == sorted(_pages_with("slow"))
  assert set(METHOD_GUIDES) <= {_rel(path) for path in markdown_files()}


@pytest.mark.slow
@pytest.mark.parametrize("rel", slow_pages(methods=False))
def test_runnable_blocks_that_train(rel, tmp_path, bible_data_dir):
  run_slow_page(rel, tmp_path, bible_data_dir)
