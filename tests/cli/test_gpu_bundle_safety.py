"""`xalign gpu_bundle` writes only where it may (issue 47; the 2026-12-01 review's G22-G26, G23b): every folder
is checked before any work and before anything is removed, --overwrite replaces only a whole bundle of its own
files once the new one is whole and within --max_mib, the work folders are per bundle and this command's, and
work kept there is reused only when made from the same inputs. The heavy parts (the start weights, eflomal,
`xalign cache`) are replaced by small fakes: what is checked is where the build writes, not what it writes."""

import hashlib
import json
import os
import shutil
import types

import pytest

from flax_xalign import errors, fileio
from flax_xalign.cli import gpu_bundle
from flax_xalign.evaluation.word_alignment import bible_links as bible_links_lib
from flax_xalign.experiments.gpu import builder, parts
from flax_xalign.experiments.gpu import bundle as bundle_lib
from flax_xalign.experiments.gpu import folders as gpu_folders
from flax_xalign.experiments.gpu import grids as gpu_grids
from flax_xalign.training import cache_job
from tests.hardening import harness

DEBIAN_TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "docs", "examples", "debian_tiny")


def _tree(root):
  """{relative path: bytes} of every file under `root` (symlinks as their target), to compare before/after."""
  return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
          for d, _, names in os.walk(root) for f in names}


def _old_bundle(folder):
  """A bundle as an earlier build leaves it: the marker, its parts, bundle.json listing every file."""
  (folder / "caches" / "c").mkdir(parents=True)
  (folder / "caches" / "c" / "shard").write_bytes(b"old rows")
  (folder / "run.sh").write_text("#!/bin/sh\n")
  (folder / gpu_folders.MARKER).write_text("written by xalign gpu_bundle\n")
  files = {"caches/c/shard": 8, "run.sh": 10}
  (folder / "bundle.json").write_text(json.dumps({"files": files}))
  return folder


def _links(folder):
  """A folder shaped like `xalign eflomal --bible`'s output (what the build's checks and tasks.gin read)."""
  folder.mkdir(parents=True, exist_ok=True)
  for split in ("train", "validation", "test"):
    (folder / f"{split}.tsv").write_text("a b\tc d\n", encoding="utf-8")
    (folder / f"{split}.links").write_text("0-0 1-1\n", encoding="utf-8")
  return folder


def _run_dir(folder):
  """A folder shaped like a MODEL_DIR (checkpoints/), enough for --start_dir's check and a copy."""
  (folder / "checkpoints").mkdir(parents=True)
  (folder / "config.gin").write_text("# a run\n")
  return folder


def _failed(*args, **kwargs):
  raise errors.UserError("failed")


@pytest.fixture
def fakes(monkeypatch):
  """The heavy steps replaced: no TensorFlow import for the languages, a start of `start_bytes` bytes, and
  eflomal's links (`write_bible_links`) / the cache (`cache_job.write_cache`) that record their calls and do
  what `state["cache"]` does (default: fail)."""
  state = {"start_bytes": 100, "calls": [], "cache": _failed}
  monkeypatch.setattr(builder, "languages_of", lambda options, debian_data: ["de"])

  def start_weights(start_dir, grid, out, host_start, **kwargs):
    os.makedirs(os.path.join(out, "start"))
    with open(os.path.join(out, "start", "weights"), "wb") as f:
      f.write(b"w" * state["start_bytes"])
    return bundle_lib.Start(kind="model_dir", path="start/model")

  monkeypatch.setattr(parts, "start_weights", start_weights)
  monkeypatch.setattr(bible_links_lib, "write_bible_links",
                      lambda output_dir, **kwargs: state["calls"].append(("eflomal", output_dir)) or _failed())
  monkeypatch.setattr(cache_job, "write_cache",
                      lambda job, **kwargs: state["calls"].append(("cache", job)) or state["cache"](job))
  return state


def _flags(tmp_path, *extra, output="bundle"):
  return ["--grid=tiny", f"--output={tmp_path / output}", f"--debian_data={DEBIAN_TINY}", "--wheels=none",
          f"--host_work={tmp_path / 'host'}", *extra]


# ---------------------------------------------------------------------------- G22: --overwrite and --max_mib


@pytest.mark.contract
@pytest.mark.parametrize("where", ["notes.txt", "caches/notes.txt"])
def test_overwrite_refuses_a_bundle_that_also_holds_a_users_file(tmp_path, capfd, fakes, where):
  bundle = _old_bundle(tmp_path / "bundle")
  (bundle / where).write_text("my notes")
  before = _tree(bundle)
  links = _links(tmp_path / "links")
  outcome = harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, "--overwrite", "--max_mib=0.01",
                                                         f"--bible_links={links}"))
  harness.assert_user_error(outcome, where, "bundle.json does not list", "--overwrite")
  assert _tree(bundle) == before
  assert sorted(os.listdir(tmp_path)) == ["bundle", "links"] and fakes["calls"] == []


@pytest.mark.contract
def test_an_overwrite_over_the_size_limit_keeps_the_old_bundle(tmp_path, capfd, fakes):
  """The tiny grid has no estimate: the bundle is assembled beside the old one and measured there."""
  bundle = _old_bundle(tmp_path / "bundle")
  before = _tree(bundle)
  fakes["start_bytes"] = 30_000  # 0.029 MiB, over 0.01 MiB (10,485 bytes)
  links = _links(tmp_path / "links")
  outcome = harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, "--overwrite", "--max_mib=0.01",
                                                         f"--bible_links={links}"))
  harness.assert_user_error(outcome, "over --max_mib=0.01;", "biggest part is start (0.029 MiB)")
  assert _tree(bundle) == before
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], os.listdir(tmp_path)  # No staging left.


def test_the_limit_is_printed_as_given(tmp_path, capsys):
  (tmp_path / "start").mkdir()
  (tmp_path / "start" / "w").write_bytes(b"x" * 20_000)
  budget = builder.Budget(str(tmp_path), limit_mib=0.01)
  with pytest.raises(errors.UserError, match=r"would be 0\.019 MiB, over --max_mib=0\.01; its biggest part is "
                                             r"start \(0\.019 MiB\)"):
    budget.add("start")
  assert "of 0.01)" in capsys.readouterr().out


@pytest.mark.contract
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_limit_that_is_no_size_is_refused(tmp_path, capfd, fakes, value):
  harness.assert_user_error(harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, f"--max_mib={value}")),
                            "--max_mib", value)
  assert os.listdir(tmp_path) == []


def test_a_staged_bundle_replaces_the_old_one_only_when_whole(tmp_path):
  bundle = _old_bundle(tmp_path / "bundle")
  before = _tree(bundle)
  with pytest.raises(RuntimeError):
    with gpu_folders.staged(str(bundle)) as staging:
      (tmp_path / os.path.basename(staging) / "part").write_text("half")
      raise RuntimeError("a failed part")
  assert _tree(bundle) == before and sorted(os.listdir(tmp_path)) == ["bundle"]
  with gpu_folders.staged(str(bundle)) as staging:
    assert os.path.dirname(staging) == str(tmp_path) and staging != str(bundle)
    with open(os.path.join(staging, "bundle.json"), "w") as f:
      f.write(json.dumps({"files": {}}))
    assert _tree(bundle) == before  # Still the old one while the new one is assembled.
  assert sorted(_tree(bundle)) == [gpu_folders.MARKER, "bundle.json"] and sorted(os.listdir(tmp_path)) == ["bundle"]


# ---------------------------------------------------------------------------- G23b: Ctrl-C in the nested cache


@pytest.mark.contract
def test_ctrl_c_in_the_nested_cache_is_one_line_and_leaves_no_bundle(tmp_path, capfd, fakes):
  bundle = _old_bundle(tmp_path / "bundle")
  before = _tree(bundle)
  def ctrl_c(job):  # What the cache's writer does at a Ctrl-C: the command says it in one line, 130.
    raise KeyboardInterrupt

  fakes["cache"] = ctrl_c
  links = _links(tmp_path / "links")
  outcome = harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, "--overwrite", f"--bible_links={links}"))
  assert outcome.code == 130, harness.summary(outcome)
  assert [l for l in outcome.err.splitlines() if l.strip()] == [errors.INTERRUPTED], outcome.err
  assert [c[0] for c in fakes["calls"]] == ["cache"]
  assert _tree(bundle) == before
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".")], os.listdir(tmp_path)


# ---------------------------------------------------------------------------- G23: --host_work


@pytest.mark.contract
def test_a_users_host_work_folder_is_refused_and_kept(tmp_path, capfd, fakes):
  host = tmp_path / "host"
  (host / "start").mkdir(parents=True)
  (host / "start" / "mine.txt").write_text("mine")
  start_dir, links = _run_dir(tmp_path / "run"), _links(tmp_path / "links")
  fakes["cache"] = _failed
  outcome = harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, f"--start_dir={start_dir}",
                                                         f"--bible_links={links}"))
  harness.assert_user_error(outcome, "--host_work", str(host))
  assert _tree(host) == {"start/mine.txt": b"mine"}
  assert sorted(os.listdir(tmp_path)) == ["host", "links", "run"]


def test_the_hosts_start_is_replaced_only_when_this_command_made_it_and_nothing_was_added(tmp_path):
  start = tmp_path / "host" / "start"
  start.mkdir(parents=True)
  (start / "mine.txt").write_text("mine")
  with pytest.raises(errors.UserError, match="did not make"):
    gpu_folders.check_host_start(str(start))
  (start / "mine.txt").unlink()
  (start / "config.gin").write_text("# made by the build\n")
  fileio.write_mark(start, gpu_folders.HOST_START_COMMAND, ["config.gin"])
  gpu_folders.check_host_start(str(start))  # Its own: a build may replace it.
  (start / "mine.txt").write_text("mine")
  with pytest.raises(errors.UserError, match="holds mine.txt, which xalign gpu_bundle did not write"):
    gpu_folders.check_host_start(str(start))


def test_a_host_work_folder_gpu_run_ran_in_may_be_rebuilt(tmp_path):
  """docs/gpu_bundle.md's example: `gpu_bundle --host_work=DIR`, then `gpu_run` with DIR as its work folder
  (bundle.json's `work`), then a rebuild with --overwrite. gpu_run adds runs/, logs/ and jax_cache/ beside
  start/ and the start row's scores.json inside it; the rebuild was refused over that scores.json."""
  host = tmp_path / "host"
  fileio.mark_new_folder(host, gpu_folders.HOST_WORK_COMMAND, setting="--host_work")  # What a build leaves:
  (host / "start").mkdir()
  (host / "start" / "config.gin").write_text("# made by the build\n")
  (host / "start" / "gpu_run_start.json").write_text("{}")
  fileio.write_mark(host / "start", gpu_folders.HOST_START_COMMAND, ["config.gin", "gpu_run_start.json"])
  for folder in ("runs/tiny_mlm/checkpoints", "logs", "jax_cache"):  # ... and what gpu_run adds there.
    (host / folder).mkdir(parents=True)
  (host / "logs" / "start.log").write_text("scoring\n")
  (host / "start" / "scores.json").write_text('{"metrics": ["bli"]}')
  before = _tree(host)
  args = gpu_bundle.build_options(gpu_bundle.parse_args([
      "--grid=tiny", f"--output={tmp_path / 'bundle'}", f"--debian_data={DEBIAN_TINY}", f"--host_work={host}",
      "--overwrite"]))

  assert gpu_folders.check_paths(args, gpu_grids.grid_named("tiny")).host_work == str(host)
  assert _tree(host) == before and sorted(os.listdir(tmp_path)) == ["host"]  # Checked, nothing touched.
  (host / "start" / "scores.json").unlink()
  (host / "start" / "scores.json").mkdir()  # Not the file gpu_run writes: someone else's.
  with pytest.raises(errors.UserError, match="holds scores.json, which xalign gpu_bundle did not write"):
    gpu_folders.check_host_start(str(host / "start"))
  (host / "start" / "scores.json").rmdir()
  (host / "start" / "notes.txt").write_text("mine")  # A user's file beside gpu_run's is still refused.
  with pytest.raises(errors.UserError, match="holds notes.txt, which xalign gpu_bundle did not write"):
    gpu_folders.check_host_start(str(host / "start"))


def test_the_default_host_work_folder_is_the_bundles_own(tmp_path):
  args = gpu_bundle.build_options(gpu_bundle.parse_args(["--grid=tiny", f"--output={tmp_path / 'a'}",
                                                          f"--debian_data={DEBIAN_TINY}"]))

  paths = gpu_folders.check_paths(args, gpu_grids.grid_named("tiny"))
  assert paths.host_work == gpu_folders.default_host_work(str(tmp_path / "a"))
  others = {gpu_folders.default_host_work(str(tmp_path / name)) for name in ("a", "b", "c/a")}
  assert len(others) == 3 and "/tmp/xalign_gpu" not in others
  assert gpu_folders.default_host_work(str(tmp_path / "a")) == gpu_folders.default_host_work(str(tmp_path / "a"))
  assert paths.work == str(tmp_path / "a.work") and not os.listdir(tmp_path)  # Checked, nothing made.


# ---------------------------------------------------------------------------- G24, G25: --work


def _debian_copy(tmp_path):
  return shutil.copytree(DEBIAN_TINY, tmp_path / "debian")


@pytest.mark.contract
@pytest.mark.parametrize("case", ["is_the_debian_data", "inside_the_debian_data", "holds_the_bible_links",
                                  "a_users_folder", "inside_the_output", "the_host_work"])
def test_a_work_folder_that_is_not_the_builds_own_is_refused_before_any_work(tmp_path, capfd, fakes, case):
  debian = _debian_copy(tmp_path)
  user = tmp_path / "user"
  user.mkdir()
  (user / "tasks.gin").write_text("# my tasks\n")
  links = _links(user / "links") if case == "holds_the_bible_links" else _links(tmp_path / "links")
  work = {"is_the_debian_data": debian, "inside_the_debian_data": debian / "help" / "w",
          "holds_the_bible_links": user, "a_users_folder": user, "inside_the_output": tmp_path / "bundle" / "w",
          "the_host_work": tmp_path / "host"}[case]
  before = {"debian": _tree(debian), "user": _tree(user)}
  flags = [f.replace(DEBIAN_TINY, str(debian)) for f in _flags(tmp_path, f"--work={work}", f"--bible_links={links}",
                                                               f"--start_dir={_run_dir(tmp_path / 'run')}")]
  harness.assert_user_error(harness.run_main(capfd, "gpu_bundle", flags), "--work", str(work))
  assert {"debian": _tree(debian), "user": _tree(user)} == before and fakes["calls"] == []
  assert sorted(os.listdir(tmp_path)) == sorted(["debian", "user", "run", *(["links"] if case != "holds_the_bible_links"
                                                                            else [])])


# ---------------------------------------------------------------------------- G26: --start_dir


@pytest.mark.contract
def test_a_start_dir_that_is_no_run_is_refused_before_eflomal_and_the_output(tmp_path, capfd, fakes):
  (tmp_path / "notarun").mkdir()
  outcome = harness.run_main(capfd, "gpu_bundle", _flags(tmp_path, f"--start_dir={tmp_path / 'notarun'}"))
  harness.assert_user_error(outcome, "--start_dir", "not a MODEL_DIR")
  assert fakes["calls"] == [] and sorted(os.listdir(tmp_path)) == ["notarun"]


# ---------------------------------------------------------------------------- work reused only when this build's


def test_the_tiny_start_is_reused_only_when_made_from_these_inputs(tmp_path, monkeypatch):
  made = []

  def make(output, **kwargs):
    made.append(output)
    os.makedirs(os.path.join(output, "checkpoints"))

  monkeypatch.setattr(parts, "_make_tiny_start", make)
  debian, links = _debian_copy(tmp_path), _links(tmp_path / "links")
  output = str(tmp_path / "work" / "tiny_start")
  (tmp_path / "work" / "tiny_start" / "checkpoints").mkdir(parents=True)  # Someone's, with no fingerprint.

  def start():
    return parts.tiny_start(output, debian_data=str(debian), languages=["de"], links=str(links))

  assert start() == output and len(made) == 1
  assert start() == output and len(made) == 1  # The same inputs: reused.
  (debian / "help" / "de.train.txt").write_text("Andere Hilfe.\n", encoding="utf-8")
  start()
  assert len(made) == 2  # Another help text: made again.
  parts.tiny_start(output, debian_data=str(debian), languages=[], links=str(links))
  assert len(made) == 3  # Other languages (English alone): made again.


def test_the_fingerprint_is_the_inputs_bytes_and_settings(tmp_path):
  (tmp_path / "a.txt").write_bytes(b"help text\n")
  fingerprint = gpu_folders.inputs_fingerprint([str(tmp_path / "a.txt")], languages=("de",), vocab_size=300)
  assert fingerprint == {"files": {str(tmp_path / "a.txt"): hashlib.sha256(b"help text\n").hexdigest()},
                         "settings": {"languages": ["de"], "vocab_size": 300}}
  assert not gpu_folders.made_for(str(tmp_path / "p"), fingerprint)
  gpu_folders.record_made_for(str(tmp_path / "p"), fingerprint)
  assert gpu_folders.made_for(str(tmp_path / "p"), fingerprint)
  assert not gpu_folders.made_for(str(tmp_path / "p"), {**fingerprint, "settings": {"vocab_size": 301}})


def test_eflomals_links_in_work_are_reused_only_when_recorded_complete(tmp_path, monkeypatch):
  calls = []

  def eflomal(output_dir, **kwargs):
    calls.append(output_dir)
    _links(tmp_path / "work" / "bible_links")
    return types.SimpleNamespace(version="2.0", seconds=1.0), {}

  monkeypatch.setattr(bible_links_lib, "write_bible_links", eflomal)
  args = gpu_bundle.build_options(gpu_bundle.parse_args(["--grid=tiny", "--output=o", "--debian_data=d"]))
  _links(tmp_path / "work" / "bible_links")  # train.links there, but no record that eflomal finished them:
  fileio.write_mark(tmp_path / "work" / "bible_links", bible_links_lib.BIBLE_COMMAND)  # an eflomal run cut short.
  target = parts.bible_links(args.bible_links, str(tmp_path / "work"))
  assert target == str(tmp_path / "work" / "bible_links") and len(calls) == 1
  parts.bible_links(args.bible_links, str(tmp_path / "work"))
  assert len(calls) == 1  # Recorded when complete: reused.
