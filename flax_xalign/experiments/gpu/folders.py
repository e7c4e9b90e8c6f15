"""Where a bundle's build writes (`xalign gpu_bundle`), each folder checked before any work (the 2026-12-01
review's G22-G26).

The bundle (`--output`) is assembled in a staging folder beside it and replaces it only when whole
(`staged`); `--overwrite` replaces only a marked bundle holding nothing its bundle.json does not list.
`--work` and `--host_work` are this command's own folders (`fileio.write_mark`), apart from the inputs and
from each other; the default host work folder is one per bundle (`default_host_work`). A work product kept
for a rebuild is reused only when the fingerprint written when it was made matches (`made_for`).
Local folders only: the bundle is renamed into place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flax_xalign import errors
from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu.bundle import BUNDLE_FILE, listed_files
from flax_xalign.experiments.gpu.children import SCORE_FILE

if TYPE_CHECKING:
  from flax_xalign.experiments.gpu.grids import Grid

MARKER = ".xalign_gpu_bundle"  # Written first: --overwrite removes a folder only when it holds this.
BUNDLE_JSON = BUNDLE_FILE  # Written last, listing every file: --overwrite removes no file it does not list.
# The marks (fileio.write_mark) of the folders a build makes besides the bundle: only those are written into.
WORK_COMMAND, HOST_WORK_COMMAND, HOST_START_COMMAND = ("xalign gpu_bundle --work", "xalign gpu_bundle --host_work",
                                                       "xalign gpu_bundle (the host's start weights)")
INPUTS_SUFFIX = ".inputs.json"  # Beside a work product kept for a rebuild: the fingerprint of what it was made of.
# What `xalign gpu_run` adds to HOST_WORK/start when it runs there (the bundle's `work`): the start row's scores
# (children.RowRun.score). A rebuild may replace it with the folder: gpu_run removes it itself before it
# scores the start again. (gpu_run's runs/, logs/ and jax_cache/ lie beside start/, in the marked --host_work.)
GPU_RUN_START_FILES = (SCORE_FILE,)


def check_output(path: str, *, overwrite: bool, inputs: Mapping[str, str]) -> str:
  """The bundle folder's absolute path, checked before any work and changing nothing (UserError): not one of
  the inputs nor holding one, writable, and new, empty, or (with --overwrite) a bundle this command wrote."""
  from flax_xalign.fileio import check_output_folder, writable_folder

  folder = check_output_folder(path, inputs={k: v for k, v in inputs.items() if v},
                               owned=lambda f: os.path.exists(os.path.join(f, MARKER)) and overwrite,
                               what="a GPU bundle written by xalign gpu_bundle (pass --overwrite to replace it)")
  if os.path.isdir(folder) and os.listdir(folder):  # A bundle --overwrite replaces: only what the bundle holds.
    _refuse_foreign_files(folder, path)
    if not writable_folder(os.path.dirname(folder)):
      raise UserError(f"--output {path} cannot be replaced: {os.path.dirname(folder)} is not writable (the new "
                      "bundle is renamed into place there); fix its permissions or choose another --output")
  return folder


def _refuse_foreign_files(folder: str, text: str) -> None:
  """Refuses (UserError) a marked bundle folder holding a file its bundle.json does not list (a user's notes).

  A marked folder without bundle.json is a build of an earlier version that stopped (the marker came first,
  the parts after it, bundle.json never): --overwrite replaces it whole, as those versions did.
  """
  listing = os.path.join(folder, BUNDLE_JSON)
  if not os.path.lexists(listing):
    return
  try:
    own = {*listed_files(folder), MARKER, BUNDLE_JSON}
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f"--output {text} is a GPU bundle whose {BUNDLE_JSON} cannot be read ({type(e).__name__}), so "
                    "--overwrite cannot tell its files from others; remove it yourself or choose another "
                    "--output (nothing was touched)") from None
  foreign = []
  for where, folders, names in os.walk(folder):
    for name in [*names, *(d for d in folders if os.path.islink(os.path.join(where, d)))]:
      rel = os.path.relpath(os.path.join(where, name), folder)
      if rel not in own or os.path.islink(os.path.join(where, name)):
        foreign.append(rel)
  if foreign:
    raise UserError(f"--output {text} holds {', '.join(sorted(foreign)[:3])}{' ...' if len(foreign) > 3 else ''}, "
                    f"which the bundle's {BUNDLE_JSON} does not list, so --overwrite will not remove the folder; "
                    f"move {'them' if len(foreign) > 1 else 'it'} out or choose another --output (nothing was "
                    "touched)")


def prepare_output(folder: str) -> str:
  """The checked bundle folder (`check_output`), emptied and marked as this command's."""
  if os.path.isdir(folder) and os.listdir(folder):
    if not os.path.exists(os.path.join(folder, MARKER)):  # check_output let it through: it must be ours.
      raise UserError(f"--output {folder} is not a GPU bundle written by xalign gpu_bundle; choose another folder")
    _refuse_foreign_files(folder, folder)
    shutil.rmtree(folder)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, MARKER), "w", encoding="utf-8") as f:
    f.write("written by xalign gpu_bundle; --overwrite may remove this folder\n")
  return folder


@contextlib.contextmanager
def staged(folder: str):
  """Yields a new marked folder beside `folder` (checked by `check_output`) that replaces it when the block
  ends normally; removed whole when the block raises or is interrupted, `folder` untouched. Local only (renames)."""
  staging = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.tmp-{os.getpid()}")
  if os.path.lexists(staging):  # (a killed build's, of the same pid: ours only if marked)
    if os.path.islink(staging) or not os.path.exists(os.path.join(staging, MARKER)):
      raise UserError(f"{staging} is in the way of the bundle's staging folder and is not one; move it away")
    shutil.rmtree(staging)
  try:
    yield prepare_output(staging)
    with errors.interrupts_held():  # The two renames are not stopped half way.
      _replace(folder, staging)
  except BaseException:
    with errors.interrupts_held(deliver=False):
      shutil.rmtree(staging, ignore_errors=True)
    raise


def _replace(folder: str, staging: str) -> None:
  """Puts the whole bundle `staging` in the place of `folder` (absent, empty, or a bundle, checked again)."""
  old = ""
  if os.path.isdir(folder) and os.listdir(folder):
    if not os.path.exists(os.path.join(folder, MARKER)):
      raise UserError(f"--output {folder} is no longer a GPU bundle (its {MARKER} went during the build); the new "
                      "bundle was not put in its place: choose another --output")
    _refuse_foreign_files(folder, folder)  # (again: a build takes minutes)
    old = os.path.join(os.path.dirname(folder), f".{os.path.basename(folder)}.old-{os.getpid()}")
    os.rename(folder, old)
  elif os.path.isdir(folder):
    os.rmdir(folder)
  try:
    os.rename(staging, folder)
  except BaseException:
    if old:
      os.rename(old, folder)
    raise
  if old:
    shutil.rmtree(old)


def check_work_folder(path: str, *, setting: str, command: str, inputs: Mapping[str, str]) -> str:
  """The absolute path of --work or --host_work, checked before any work and changing nothing (UserError): not
  one of the inputs, inside one or holding one, writable, and new, empty or marked as made by `command`."""
  from flax_xalign.fileio import MARK, check_output_folder, read_mark

  return check_output_folder(path, setting=setting, inputs={k: v for k, v in inputs.items() if v},
                             owned=lambda f: (read_mark(f) or {}).get("command") == command,
                             what=f"a folder xalign gpu_bundle made for {setting} (its {MARK} says so)")


def nesting(path: str, other: str) -> str:
  """How `path` stands to `other`: "is", "lies inside", "holds", or "" (apart); symlinks followed."""
  from flax_xalign.fileio import lies_in

  inside, holds = lies_in(path, other), lies_in(other, path)
  return "is" if inside and holds else "lies inside" if inside else "holds" if holds else ""


def check_apart(folders: Mapping[str, str]) -> None:
  """Refuses (UserError) two of the folders a build writes (flag -> absolute path) that are one or nest."""
  named = list(folders.items())
  for i, (flag, path) in enumerate(named):
    for other, where in named[i + 1:]:
      relation = nesting(path, where)
      if relation:
        raise UserError(f"{flag} {path} {relation} the {other} {where}; the bundle, its work and the host's work "
                        "must be apart (one would be replaced or carried with the other): name another folder")


def check_host_start(host_start: str) -> None:
  """Refuses (UserError) HOST_WORK/start unless this command made it and it holds only what it made, or what
  gpu_run writes there (GPU_RUN_START_FILES, plain files): a build replaces it."""
  from flax_xalign.fileio import MARK, read_mark

  if not os.path.lexists(host_start):
    return
  mark = None if os.path.islink(host_start) or not os.path.isdir(host_start) else read_mark(host_start)
  if mark is None or mark["command"] != HOST_START_COMMAND:
    raise UserError(f"--host_work holds {host_start}, which xalign gpu_bundle did not make (no {MARK} of its), "
                    "and a build replaces that folder with the start weights; move it out or choose another "
                    "--host_work (nothing was touched)")
  gpu_runs = {name for name in GPU_RUN_START_FILES if os.path.isfile(os.path.join(host_start, name))
              and not os.path.islink(os.path.join(host_start, name))}
  foreign = sorted(set(os.listdir(host_start)) - set(mark["files"]) - {MARK} - gpu_runs)
  if foreign:
    raise UserError(f"{host_start} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which "
                    "xalign gpu_bundle did not write there, and a build replaces that folder; move "
                    f"{'them' if len(foreign) > 1 else 'it'} out or choose another --host_work (nothing was touched)")


def default_host_work(output: str) -> str:
  """--host_work when not given: /tmp/xalign_gpu-KEY, KEY from the bundle's absolute path and this user, so two
  builds on one machine never share one (the host makes the same folder: bundle.json names it)."""
  key = hashlib.sha256(f"{os.getuid()}:{os.path.abspath(output)}".encode()).hexdigest()[:12]
  return f"/tmp/xalign_gpu-{key}"


def inputs_fingerprint(files: Sequence[str], **settings: Any) -> dict[str, Any]:
  """What a work product was made of: the sha256 of each file it read and the settings that shaped it."""
  digests = {}
  for path in files:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    digests[os.path.abspath(path)] = digest.hexdigest()
  return json.loads(json.dumps({"files": digests, "settings": settings}))  # (as read back: tuples are lists)


def made_for(product: str, fingerprint: Mapping[str, Any]) -> bool:
  """Whether the work product `product` (a path) was made from `fingerprint`'s inputs: its PRODUCT.inputs.json,
  written when it was complete, says so."""
  try:
    with open(product + INPUTS_SUFFIX, encoding="utf-8") as f:
      return json.load(f) == fingerprint
  except (OSError, ValueError):
    return False


def record_made_for(product: str, fingerprint: Mapping[str, Any]) -> None:
  from flax_xalign.fileio import write_atomically

  write_atomically(product + INPUTS_SUFFIX, json.dumps(fingerprint, indent=1, sort_keys=True))


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """What a build is asked for (`builder.build`; the command's flags, each path as given, checked by `check_paths`)."""

  grid: str
  output: str
  debian_data: str
  languages: tuple[str, ...] = ()  # the Debian languages besides English; (): the grid's that the build has
  bible_links: str = ""            # `xalign eflomal --bible` output; "": made in `work`
  start_dir: str = ""              # the tiny grid's start MODEL_DIR; "": a 4-layer model made in `work`
  work: str = ""                   # "": OUTPUT.work
  host_work: str = ""              # "": `default_host_work(output)`
  wheels: bool = True              # download the host's wheels (False: carry none)
  max_mib: float = 56.0
  overwrite: bool = False


@dataclasses.dataclass(frozen=True)
class BuildPaths:
  """Where a build reads and writes (absolute), every one checked by `check_paths` before any work."""
  output: str
  work: str
  host_work: str
  debian_data: str
  bible_links: str  # "": made in `work`
  start_dir: str  # "": the tiny grid's start made in `work`


def check_paths(options: BuildOptions, grid: Grid) -> BuildPaths:
  """Every folder a build reads or writes, checked before any work and changing nothing (UserError, one line):
  the bundle, --work and --host_work apart from each other and from the inputs, each new, empty or this
  command's; the inputs what they must be. (Each is named by its flag: `options` holds what the flags gave.)"""
  from flax_xalign import storage

  for flag in ("output", "work", "host_work", "debian_data", "bible_links", "start_dir"):
    if storage.is_url(getattr(options, flag) or ""):
      raise UserError(f"--{flag} {getattr(options, flag)} is a URL; xalign gpu_bundle reads and writes local folders "
                      "(it renames and removes them): name a local one")
  given = lambda text: os.path.abspath(os.path.expanduser(text)) if text else ""  # noqa: E731
  debian_data, links, start_dir = given(options.debian_data), given(options.bible_links), given(options.start_dir)
  inputs = {"--debian_data": debian_data, "--bible_links": links, "--start_dir": start_dir}
  out = check_output(options.output, overwrite=options.overwrite, inputs=inputs)
  work = check_work_folder(options.work or out.rstrip("/") + ".work", setting="--work", command=WORK_COMMAND,
                           inputs=inputs)
  host_work = check_work_folder(options.host_work or default_host_work(out), setting="--host_work",
                                command=HOST_WORK_COMMAND, inputs=inputs)
  check_apart({"--output": out, "--work": work, "--host_work": host_work})
  check_host_start(os.path.join(host_work, "start"))
  if not os.path.isfile(os.path.join(debian_data, "manifest.json")):
    raise UserError(f"--debian_data {options.debian_data} is not an `xalign debian_data` output (no manifest.json)")
  if start_dir and grid.start != "tiny":
    raise UserError(f"--start_dir is for --grid=tiny; --grid={grid.name} starts from {grid.start}: leave it out")
  if start_dir and not os.path.isdir(os.path.join(start_dir, "checkpoints")):
    raise UserError(f"--start_dir {options.start_dir} is not a MODEL_DIR (no checkpoints/); pass a run, or leave "
                    "--start_dir out for a 4-layer model initialised here")
  missing = [f for f in ("train.tsv", "test.tsv", "test.links") if links and not os.path.isfile(os.path.join(links, f))]
  if missing:
    raise UserError(f"--bible_links {options.bible_links} is not an `xalign eflomal --bible` output (no "
                    f"{', '.join(missing)}); make one with that command, or leave --bible_links out to make it "
                    "in --work")
  return BuildPaths(output=out, work=work, host_work=host_work, debian_data=debian_data, bible_links=links,
                    start_dir=start_dir)
