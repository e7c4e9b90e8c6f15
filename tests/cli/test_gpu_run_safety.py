"""gpu_run's safety (the 2026-12-01 reliability review, R04-R26): a damaged bundle.json, a bad flag or variable
and misplaced --out/--work folders are one `error:` line before anything is made; WORK/start is used only when it
was made from this bundle's start; a SIGTERM or SIGINT to the driver alone leaves no child running.

The bundles here are fakes of the tiny grid's shape (no caches that load): every refusal happens before a child
starts, and the signal tests run children through `--launcher` that only sleep."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from flax_xalign.cli import gpu_run
from flax_xalign.experiments.gpu import builder, runner, start
from flax_xalign.experiments.gpu import bundle as bundle_lib
from flax_xalign.experiments.gpu import grids as gpu_grids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIABLES = ("OUT", "WORK", "BUDGET_S", "PARALLEL", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_CLIENT_MEM_FRACTION",
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")


def _fake_bundle(folder, *, weights="start weights A", **changes):
  """A bundle folder of the tiny grid's shape, its bundle.json as gpu_bundle writes it (`changes` replace the
  Bundle's fields); the Bundle."""
  grid = gpu_grids.TINY
  (folder / "start" / "model" / "checkpoints").mkdir(parents=True)
  (folder / "start" / "model" / "model.gin").write_text("EncoderConfig.num_layers = 4\n")
  (folder / "start" / "model" / "checkpoints" / "weights").write_text(weights)
  for name in grid.caches:
    (folder / "caches" / name).mkdir(parents=True)
    (folder / "caches" / name / "train.shard").write_bytes(b"rows of " + name.encode())
  bundle = builder.plan_bundle(
      grid, start=bundle_lib.Start(kind="model_dir", path="start/model"),
      caches={n: bundle_lib.Cache(task=c.task, length=c.length, rows=c.rows, eval_rows=c.eval_rows, links=c.links,
                                  path=f"caches/{n}") for n, c in grid.caches.items()},
      work=str(folder.parent / "default_work"), languages=["de"], host_start="/host/start",
      created="2026-12-01T00:00:00+00:00")
  files = {os.path.relpath(os.path.join(d, f), folder): os.path.getsize(os.path.join(d, f))
           for d, _, names in os.walk(folder) for f in names}
  bundle = dataclasses.replace(bundle, parts={"start": 1}, bytes=1, files=files, **changes)
  bundle_lib.write_bundle(str(folder), bundle)
  return bundle


def _tree(folder):
  """Every file under `folder` with its bytes (what a refusal must leave as it was)."""
  return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
          for d, _, names in os.walk(folder) for f in names}


@pytest.fixture
def host(tmp_path, monkeypatch):
  """(bundle folder, out, work) with none of gpu_run's variables set."""
  for name in VARIABLES:
    monkeypatch.delenv(name, raising=False)
  _fake_bundle(tmp_path / "b")
  return tmp_path / "b", tmp_path / "out", tmp_path / "work"


def _refused(capsys, argv):
  """The one `error:` line of `xalign gpu_run argv` (exit 2, nothing else on stderr)."""
  try:
    code = gpu_run.main([str(a) for a in argv])
  except SystemExit as e:  # (argparse's errors leave through sys.exit, as from the command line)
    code = e.code
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err)
  return err[0]


def _cut(b):
  text = (b / "bundle.json").read_text()
  (b / "bundle.json").write_text(text[:len(text) // 2])


def _edit(**fields):
  def edit(b):
    bundle = json.loads((b / "bundle.json").read_text())
    for path, value in fields.items():
      *parents, last = path.split("__")
      target = bundle
      for key in parents:
        target = target[int(key) if isinstance(target, list) else key]
      if value is KeyError:
        del target[last]
      else:
        target[int(last) if isinstance(target, list) else last] = value
    (b / "bundle.json").write_text(json.dumps(bundle))
  return edit


@pytest.mark.contract
@pytest.mark.parametrize("damage, expected", [
    (_cut, r"bundle.json is not a whole JSON file \(.*\): the copy is cut short"),
    (_edit(files=KeyError), "damaged or from another version: files is missing"),
    (_edit(files=["start/model/model.gin"]), "files is a list, not an object"),
    (_edit(experiments__1__bindings=5), r"experiments\[1\].bindings is a whole number, not a list"),
    (_edit(caches__debian__length="24"), "caches.debian.length is a text, not a whole number"),
    (_edit(start=KeyError), "start is missing"),
    (_edit(budget_s=-5), "budget_s is -5, not a number of seconds above 0"),
    (_edit(warmup__family="nowhere"), "experiment 'warmup' names the unknown family 'nowhere'"),
    (_edit(start__path="../elsewhere"), "start.path '../elsewhere' is not in the bundle"),
], ids=["cut", "no_files", "files_list", "bindings_number", "length_text", "no_start", "budget", "family", "path"])
def test_a_damaged_bundle_json_is_one_line_before_anything_is_made(host, capsys, damage, expected):  # R04/R05
  import re

  bundle, out, work = host
  damage(bundle)
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}"])
  assert re.search(expected, line), line
  assert "bundle.json" in line and ("carry the whole bundle again" in line or "rebuild" in line)
  assert not out.exists() and not work.exists()


@pytest.mark.contract
def test_an_edited_grid_names_bundle_jsons_field_not_a_flag(host, capsys):  # R06
  bundle, out, work = host
  _edit(grid="nosuch")(bundle)
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}"])
  assert "bundle.json's grid 'nosuch' is not a grid of this checkout (it has science, science2, tiny)" in line
  assert "--grid" not in line.split(";")[0]


@pytest.mark.contract
def test_an_unknown_start_kind_is_refused_before_out_and_the_logs_exist(host, capsys):  # R09
  bundle, out, work = host
  _edit(start__kind="q8_zip")(bundle)
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}"])
  assert "start kind 'q8_zip' is unknown to this checkout" in line
  assert not out.exists() and not (work / "logs").exists()


@pytest.mark.contract
@pytest.mark.parametrize("name, value", [
    ("BUDGET_S", "abc"), ("BUDGET_S", "-5"), ("BUDGET_S", "0"), ("BUDGET_S", "nan"), ("PARALLEL", "abc"),
    ("PARALLEL", "0"), ("PARALLEL", "2.5"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5"),
    ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "soon")])
def test_a_bad_environment_variable_is_one_line_naming_it(host, capsys, monkeypatch, name, value):  # R10/R11/R18
  bundle, out, work = host
  monkeypatch.setenv(name, value)
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}"])
  assert line.startswith(f"error: the environment variable {name}: {value!r} is not ") and "unset it" in line
  assert not out.exists() and not work.exists()


@pytest.mark.contract
@pytest.mark.parametrize("flag", ["--parallel=0", "--parallel=-2", "--budget_s=0", "--budget_s=-1",
                                  "--budget_s=inf"])
def test_a_parallel_or_budget_out_of_range_is_one_line(host, capsys, flag):  # R12
  bundle, out, work = host
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}", flag])
  assert line.startswith(f"error: argument {flag.split('=')[0]}: ") and "above 0" in line
  assert not out.exists() and not work.exists()


@pytest.mark.contract
@pytest.mark.parametrize("out_at, work_at, expected", [
    ("b/out", "work", "--out {b}/out lies inside the bundle {b}"),  # R13
    ("out", "b", "--work {b} is the bundle {b}"),  # R17
    ("out", "b/work", "--work {b}/work lies inside the bundle {b}"),
    ("out", ".", "--work {t} holds the bundle {b}"),
    ("work/out", "work", "--out {t}/work/out lies inside --work {t}/work"),
    ("out", "out/work", "--out {t}/out holds --work {t}/out/work"),
])
def test_out_and_work_apart_from_the_bundle_and_each_other(host, capsys, out_at, work_at, expected):  # R13/R17
  bundle, _, _ = host
  top = bundle.parent
  before, top_before = _tree(bundle), sorted(os.listdir(top))
  line = _refused(capsys, [bundle, f"--out={top / out_at}", f"--work={top / work_at}"])
  assert expected.format(b=bundle, t=top) in line and "nothing was made" in line, line
  assert _tree(bundle) == before and sorted(os.listdir(top)) == top_before  # Nothing made, in the bundle or beside.


@pytest.mark.contract
def test_a_foreign_folder_is_no_work_folder(host, capsys):
  bundle, out, work = host
  work.mkdir()
  (work / "notes.txt").write_text("a user's notes")
  line = _refused(capsys, [bundle, f"--out={out}", f"--work={work}"])
  assert "is a non-empty folder that is not a gpu_run work folder" in line
  assert os.listdir(work) == ["notes.txt"] and not out.exists()


@pytest.mark.contract
def test_a_work_folder_holding_another_bundles_start_is_never_used(tmp_path, capsys, monkeypatch):  # R26
  for name in VARIABLES:
    monkeypatch.delenv(name, raising=False)
  bundle_a, bundle_b = _fake_bundle(tmp_path / "a"), _fake_bundle(tmp_path / "b", weights="start weights B")
  work, out = tmp_path / "work", tmp_path / "out"
  start_dir = start.start_weights(str(tmp_path / "a"), bundle_a, str(work))
  assert open(os.path.join(start_dir, "checkpoints", "weights")).read() == "start weights A"
  assert start.reusable_start(str(tmp_path / "a"), bundle_a, str(work))  # A's own start: reused.

  line = _refused(capsys, [tmp_path / "b", f"--out={out}", f"--work={work}"])
  assert f"the work folder {work} holds start weights that are not this bundle's: {work}/start was made from " \
         "another bundle's start weights" in line
  assert "choose a fresh --work, or remove" in line
  assert open(os.path.join(start_dir, "checkpoints", "weights")).read() == "start weights A" and not out.exists()

  os.remove(os.path.join(start_dir, start.START_MARK))  # A start gpu_run did not make (an older one, a copy).
  line = _refused(capsys, [tmp_path / "a", f"--out={out}", f"--work={work}"])
  assert "not made by gpu_run from a bundle" in line
  # Removed as the line says, B's start is made again from B.
  import shutil

  shutil.rmtree(start_dir)
  runner.check_run(str(tmp_path / "b"), out=str(out), work=str(work), budget_s=None)
  start_dir = start.start_weights(str(tmp_path / "b"), bundle_b, str(work))
  assert open(os.path.join(start_dir, "checkpoints", "weights")).read() == "start weights B"


def test_the_host_work_folder_gpu_bundle_made_is_a_work_folder(tmp_path, monkeypatch):
  """gpu_bundle marks its --host_work (fileio.MARK) and makes WORK/start with start.make_start: the builder's
  own machine runs the bundle there (docs/gpu_bundle.md's first block)."""
  from flax_xalign import fileio

  bundle = _fake_bundle(tmp_path / "b")
  work = tmp_path / "host_work"
  fileio.mark_new_folder(work, "xalign gpu_bundle --host_work")
  start.make_start(str(tmp_path / "b" / "start" / "model"), "model_dir", str(work / "start"))
  checked_work = runner.check_run(str(tmp_path / "b"), out=str(tmp_path / "out"), work=str(work),
                                  budget_s=None).work
  assert checked_work == str(work) and start.reusable_start(str(tmp_path / "b"), bundle, str(work))


def test_bundle_json_shapes_by_hand():
  shape_problem = bundle_lib.shape_problem
  assert shape_problem({"a": [1, "x"]}, {"a": [int]}) == "a[1] is a text, not a whole number"
  assert shape_problem({"a": {"k": True}}, {"a": {str: (int, float)}}) == "a.k is true or false, not a number"
  assert shape_problem({"b": 1}, {"a?": str, "b": int}) is None
  assert shape_problem([], {"a": int}) == "the file is a list, not an object"


def test_the_users_newer_memory_variable_is_left_alone(monkeypatch):
  """jax refuses XLA_CLIENT_MEM_FRACTION beside XLA_PYTHON_CLIENT_MEM_FRACTION: the driver must not add the latter."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.5")
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in runner.child_env(0.1)


# ---------------------------------------------------------------------------- signals (R22/R23/R24)

TOKEN = "XALIGN_GPU_RUN_TEST_TOKEN"
# Every child sleeps in a shell with a second sleep of its own; `trap '' TERM`: one that ignores SIGTERM.
SLEEPER = "sh -c '{trap}sleep 300 & sleep 301; wait' child"


def _ours(token):
  """The processes still alive that carry `token` in their environment (the driver's children inherit it)."""
  import psutil

  found = []
  for process in psutil.process_iter():
    try:
      if process.environ().get(TOKEN) == token and process.status() != psutil.STATUS_ZOMBIE:
        found.append(process)
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
      pass
  return found


@pytest.mark.subprocess  # A driver that imports jax and starts sleeping children; signalled alone (~10 s).
@pytest.mark.parametrize("signum, ignore_term", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["sigterm", "sigint_twice_children_ignore_sigterm"])
def test_a_signal_to_the_driver_alone_stops_every_child(tmp_path, signum, ignore_term):
  psutil = pytest.importorskip("psutil")
  _fake_bundle(tmp_path / "b")
  token = uuid.uuid4().hex
  env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
  env.update({TOKEN: token, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
  launcher = SLEEPER.format(trap="trap \"\" TERM; " if ignore_term else "")
  driver = subprocess.Popen([sys.executable, "-m", "flax_xalign.cli.gpu_run", str(tmp_path / "b"),
                             f"--out={tmp_path / 'out'}", f"--work={tmp_path / 'work'}", f"--launcher={launcher}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
  try:
    # The warm-up's trainer and the start row's scorer, each a shell with its two sleeps.
    end = time.monotonic() + 180
    while len(psutil.Process(driver.pid).children(recursive=True)) < 6:
      assert driver.poll() is None, driver.communicate()
      assert time.monotonic() < end, "the driver never started its children"
      time.sleep(0.2)
    children = psutil.Process(driver.pid).children(recursive=True)
    os.kill(driver.pid, signum)
    if ignore_term:  # Its children ignore SIGTERM: the second signal SIGKILLs them without waiting.
      time.sleep(1.0)
      assert driver.poll() is None and all(c.is_running() for c in children)
      os.kill(driver.pid, signum)
    stdout, stderr = driver.communicate(timeout=60)
  finally:
    if driver.poll() is None:
      os.killpg(driver.pid, signal.SIGKILL)
  assert driver.returncode == 128 + signum, (driver.returncode, stdout[-2000:], stderr[-2000:])
  assert "Traceback" not in stdout + stderr and "FAILED" not in stdout, stdout + stderr
  assert stderr.strip().splitlines()[-1].startswith(f"stopped by {signal.Signals(signum).name} after ")
  deadline = time.monotonic() + 5  # (reaped by the driver already; a grandchild by init, a moment later)
  while _ours(token) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _ours(token), [p.cmdline() for p in _ours(token)]
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["stopped_by"] == signal.Signals(signum).name
  rows = {r["name"]: r["scores"]["not_run"] for r in results["rows"]}
  assert set(rows) == {"start", "warmup", "debian_tcs_s0", "xlm_align_union", "xlm_align_self_s0"}
  assert rows["start"].startswith("not scored: stopped by") and "while it trained" in rows["warmup"]
  assert all("before it started" in rows[name] for name in ("debian_tcs_s0", "xlm_align_union", "xlm_align_self_s0"))
