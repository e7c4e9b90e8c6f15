"""Every command that writes × every way its output can endanger a user's file (issue 27, classes 1 and 3).

The cases, each checked by C1 (exit 2, one `error:` line, no traceback) and by the file at risk being
byte-identical afterwards:

* output_is_input: the output names one of the command's inputs (a folder output: holds it);
* output_inside_input: the output lies inside an input folder (a bundle, a data folder; not a run, which may
  hold a new entry beside its own files);
* output_in_foreign_folder: a folder output is a user's non-empty folder (notes.txt), not the command's own;
* output_in_read_only_folder: the output would be created in a read-only folder;
* output_under_file: the output's path runs through an existing file;
* unreadable_input: the input file cannot be read (chmod 000; root reads anything, so for root a child
  process without the two file-privilege capabilities runs it);
* input_is_fifo / input_is_symlink_loop: the input file is a named pipe (reading it would block, and a
  command may read twice) or a loop of symbolic links.

A refusal comes from the command's own check right after its flags are parsed (`fileio.check_output_*`),
before any work: a command that did not refuse would compute (train, align) before failing. A new
command must get a row in WRITERS or a reason in NOT_WRITERS (`test_every_command_is_in_the_matrix`).
In-process and cheap per case (the contract tier: about 0.1 s a case once the library is imported).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import threading
from collections.abc import Callable

import pytest

from tests.cli.test_contract_files import commands
from tests.hardening import harness

pytestmark = pytest.mark.contract


@dataclasses.dataclass(frozen=True)
class Writer:
  """A command that writes `out`: its flags, the kind of its output and of the input it reads."""

  entry: str  # harness.ENTRY_POINTS key
  argv: Callable[[str, str, dict], list[str]]  # (output, input, context) -> flags
  output: str  # "file" or "folder"
  input: str | None = None  # "file", "folder" or None: what `argv`'s input is
  input_flag: str = ""  # the flag the output_is_input error names
  input_name: str = "input.txt"
  output_name: str = "out.txt"
  gin: bool = False  # parses a training gin file (needs the tiny corpus)
  inside_ok: bool = False  # its input is a run, which may hold a new output (check_outside_run guards its own)


def _tsv(path: str) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.write("a b\tc d\n")


def _train_argv(out, inp, ctx):
  del inp
  return harness.train_argv(ctx["gin"], out)


WRITERS = {
    "align": Writer("align", lambda out, inp, ctx: ["--model_dir", ctx["no_run"], "--input", inp, "--output", out],
                    "file", "file", "--input"),
    "bli": Writer("bli", lambda out, inp, ctx: ["--model_dir", ctx["no_run"], "--src=grc", "--tgt=en",
                                                 "--gold", inp, "--output", out], "file", "file", "--gold"),
    "retrieval": Writer("retrieval", lambda out, inp, ctx: ["--model_dir", ctx["no_run"], "--tsv", inp,
                                                             "--output", out], "file", "file", "--tsv"),
    "eflomal": Writer("eflomal", lambda out, inp, ctx: ["--input", inp, "--output", out], "file", "file", "--input"),
    "vocab": Writer("vocab", lambda out, inp, ctx: ["--input", inp, "--vocab_size=50",
                                                     "--output", out.removesuffix(".model")],
                    "file", "file", "--input", input_name="input.model", output_name="out.model"),
    "lexicon": Writer("lexicon", lambda out, inp, ctx: ["--output", out], "file"),
    "compile_check": Writer("compile_check", lambda out, inp, ctx: ["--topology=v4:2x2x1", "--output", out], "file"),
    "export_hf": Writer("export_hf", lambda out, inp, ctx: ["--model_dir", inp, "--output", out, "--layout=bert"],
                        "folder", "folder", "--model_dir", inside_ok=True),
    "trim": Writer("trim", lambda out, inp, ctx: ["--model_dir", inp, "--task=tiny_en", "--output", out],
                   "folder", "folder", "--model_dir", inside_ok=True),
    "import_hf": Writer("import_hf", lambda out, inp, ctx: ["--source", inp, "--output", out],
                        "folder", "folder", "--source"),
    "e5_small": Writer("e5_small", lambda out, inp, ctx: ["--output", out, "--data_dir", inp],
                       "folder", "folder", "--data_dir"),
    "cooc": Writer("cooc", lambda out, inp, ctx: ["--text", f"{inp}:en", "--vocabulary", ctx["no_run"],
                                                   "--output", out], "folder", "file", "--text"),
    "cache": Writer("cache", lambda out, inp, ctx: ["--task=tiny_en", "--output", out], "folder"),
    "eflomal_bible": Writer("eflomal", lambda out, inp, ctx: ["--bible", "--output_dir", out], "folder"),
    "debian_data": Writer("debian_data", lambda out, inp, ctx: ["--output", out, f"--root={ctx['tmp']}"], "folder"),
    "gpu_bundle": Writer("gpu_bundle", lambda out, inp, ctx: ["--grid=tiny", "--output", out, f"--debian_data={inp}",
                                                              "--wheels=none"], "folder", "folder", "--debian_data"),
    "gpu_bundle_work": Writer("gpu_bundle", lambda out, inp, ctx: [
        "--grid=tiny", "--output", os.path.join(ctx["tmp"], "bundle"), "--work", out, f"--debian_data={inp}",
        "--wheels=none"], "folder", "folder", "--debian_data"),
    "gpu_bundle_host_work": Writer("gpu_bundle", lambda out, inp, ctx: [
        "--grid=tiny", "--output", os.path.join(ctx["tmp"], "bundle"), "--host_work", out,
        f"--debian_data={inp}", "--wheels=none"], "folder", "folder", "--debian_data"),
    "gpu_run": Writer("gpu_run", lambda out, inp, ctx: [inp, "--out", out], "folder", "folder", "bundle"),
    "gpu_run_work": Writer("gpu_run", lambda out, inp, ctx: [inp, "--out", os.path.join(ctx["tmp"], "gpu_out"),
                                                             "--work", out], "folder", "folder", "bundle"),
    "demo": Writer("demo", lambda out, inp, ctx: ["--model_dir", out, "--start=scratch", "--steps=1"], "folder"),
    "align_mlm_grid": Writer("align_mlm_grid", lambda out, inp, ctx: ["--model_dir", out], "folder"),
    "align_mlm_grid_fresh": Writer("align_mlm_grid", lambda out, inp, ctx: ["--model_dir", out, "--fresh"], "folder"),
    "train": Writer("train", _train_argv, "folder", gin=True),
    "assets": Writer("assets", _train_argv, "folder", gin=True),
}

# Commands with no output path of their own to check here, and why.
NOT_WRITERS = {
    "eval": "writes eval.json into the run it evaluates (a run: refused unless it holds checkpoints)",
    "cache_beam": "a Beam pipeline (.venv-beam); its local --output gets cache's checks (write.check_output, "
                  "write.staged): tests/data/test_cache_beam.py",
    "cooc_beam": "a Beam pipeline (.venv-beam); its local --output gets cooc's checks: tests/data/test_cooc_beam.py",
    "experiments/bli_table": "driver; its --output checks in tests/cli/test_bli_table_cli.py",
    "experiments/code_switch": "driver; its --model_dir and --fresh are experiments.harness.Results' (tested below)",
    "experiments/mlm_gc": "driver; its --model_dir and --fresh are experiments.harness.Results' (tested below)",
    "xalign": "the console script: it runs another command (whose row is above) with the flags after its name",
}
# A command module's name in cli/ -> its row(s) above.
MODULE_ROWS = {"align": ["align"], "bli": ["bli"], "retrieval": ["retrieval"], "eflomal": ["eflomal", "eflomal_bible"],
               "vocab": ["vocab"], "lexicon": ["lexicon"], "compile_check": ["compile_check"],
               "export_hf": ["export_hf"], "trim": ["trim"], "import_hf": ["import_hf"], "e5_small": ["e5_small"],
               "cooc": ["cooc"], "cache": ["cache"], "debian_data": ["debian_data"], "demo": ["demo"],
               "train": ["train"], "assets": ["assets"], "gpu_bundle": ["gpu_bundle", "gpu_bundle_work", "gpu_bundle_host_work"],
               "gpu_run": ["gpu_run", "gpu_run_work"],
               "experiments/align_mlm_grid": ["align_mlm_grid", "align_mlm_grid_fresh"]}

CASES = ("output_is_input", "output_inside_input", "output_in_foreign_folder", "output_in_read_only_folder", "output_under_file",
         "unreadable_input", "input_is_fifo", "input_is_symlink_loop")
KEYWORDS = {"output_in_foreign_folder": ("non-empty folder",), "output_in_read_only_folder": ("not writable",),
            "output_under_file": ("file",), "unreadable_input": (("permission denied", "cannot be read"),),
            "input_is_fifo": ("named pipe",), "input_is_symlink_loop": ("loop of symbolic links",)}


def _applies(writer: Writer, case: str) -> bool:
  if case == "output_is_input":
    return writer.input is not None
  if case == "output_inside_input":  # (issue 47: gpu_run --out=BUNDLE/out wrote into its bundle)
    return writer.input == "folder" and not writer.inside_ok
  if case == "output_in_foreign_folder":
    return writer.output == "folder"
  if case in ("unreadable_input", "input_is_fifo", "input_is_symlink_loop"):
    return writer.input == "file"
  return True


GRID = [pytest.param(name, case, id=f"{name}-{case}")
        for name in WRITERS for case in CASES if _applies(WRITERS[name], case)]


def test_every_command_is_in_the_matrix():
  listed = set(MODULE_ROWS) | set(NOT_WRITERS)
  missing = sorted(set(commands()) - listed)
  assert not missing, (f"commands in neither WRITERS nor NOT_WRITERS of {__file__}: {missing}; give each a row "
                       "(its flags with an output and an input) or the reason it writes no output path")
  for rows in MODULE_ROWS.values():
    assert set(rows) <= set(WRITERS)
  assert all(w.entry in harness.ENTRY_POINTS for w in WRITERS.values())



def _make_input(writer: Writer, root) -> str:
  """The input the command reads, in a folder of its own (a folder output 'is' that folder)."""
  if writer.input is None:
    return str(root / "no_input")
  folder = root / "in"
  folder.mkdir()
  if writer.input == "folder" and writer.entry == "gpu_run":  # (a bundle: gpu_run reads its bundle.json first)
    from tests.cli.test_gpu_run_safety import _fake_bundle

    folder.rmdir()
    _fake_bundle(folder)
    return str(folder)
  if writer.input == "folder":
    (folder / "config.json").write_text("{}\n")
    return str(folder)
  path = folder / writer.input_name
  _tsv(str(path))
  return str(path)


def _context(writer: Writer, root, request) -> dict:
  """What a writer's argv template may name: the tmp folder, a path with no run, and its gin file."""
  ctx = {"tmp": str(root), "no_run": str(root / "no_run")}
  if writer.gin:
    ctx["gin"] = harness.write_run_gin(root / "run.gin", request.getfixturevalue("tiny_corpus"), tag="outp")
  return ctx


@pytest.mark.parametrize("name, case", GRID)
def test_a_dangerous_output_is_refused_before_any_work(name, case, tmp_path, capfd, request):
  writer = WRITERS[name]
  if case == "unreadable_input" and os.geteuid() == 0:
    pytest.skip("running as root: file modes do not stop root; "
                "test_an_unreadable_input_is_refused_by_root_without_file_privileges runs this case")
  ctx, inp = _context(writer, tmp_path, request), _make_input(writer, tmp_path)
  keywords = KEYWORDS.get(case, ())
  if case == "output_is_input":
    out = inp if writer.output == writer.input else os.path.dirname(inp)
    at_risk, keywords = inp, (writer.input_flag,)
  elif case == "output_inside_input":
    out, at_risk, keywords = os.path.join(inp, "sub", writer.output_name), inp, (writer.input_flag, "inside")
  elif case == "output_in_foreign_folder":
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    (mine / "config.gin").write_text("# my settings\n")
    out = at_risk = str(mine)
  elif case == "output_in_read_only_folder":
    folder = request.getfixturevalue("read_only_dir")
    out, at_risk = str(folder / writer.output_name), str(folder)
  elif case == "output_under_file":
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    out, at_risk = str(afile / writer.output_name), str(afile)
  elif case == "input_is_fifo":
    os.remove(inp)
    os.mkfifo(inp)
    out = at_risk = str(tmp_path / writer.output_name)  # (a digest of the folder would open the pipe)
    # A command that reads the pipe instead of refusing it would block for ever: after 30 s, write its end.
    unblock = threading.Timer(30, lambda: open(inp, "w").close())
    unblock.daemon = True
    unblock.start()
    request.addfinalizer(unblock.cancel)
  elif case == "input_is_symlink_loop":
    os.remove(inp)
    os.symlink(inp, inp)
    out = at_risk = str(tmp_path / writer.output_name)
  else:
    out, at_risk = str(tmp_path / writer.output_name), inp
    os.chmod(inp, 0)
  before = harness.tree_digest(at_risk)
  try:
    outcome = harness.run_main(capfd, writer.entry, writer.argv(out, inp, ctx))
  finally:
    if case == "unreadable_input":
      os.chmod(inp, stat.S_IRUSR | stat.S_IWUSR)
  harness.assert_user_error(outcome, *keywords, model_dir=at_risk, before=before)


# Root reads a file of mode 000 through two capabilities; without them in its bounding set, the child
# (still uid 0, the owner of everything the test makes) meets file modes like any user.
WITHOUT_FILE_PRIVILEGES = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--")


@pytest.mark.subprocess
@pytest.mark.parametrize("name", [n for n in WRITERS if _applies(WRITERS[n], "unreadable_input")])
def test_an_unreadable_input_is_refused_by_root_without_file_privileges(name, tmp_path, request):
  if os.geteuid() != 0:
    pytest.skip("not root: test_a_dangerous_output_is_refused_before_any_work runs this case in-process")
  if shutil.which("setpriv") is None:
    pytest.skip("running as root without setpriv (util-linux), so a file cannot be made unreadable")
  writer = WRITERS[name]
  ctx, inp = _context(writer, tmp_path, request), _make_input(writer, tmp_path)
  out = str(tmp_path / writer.output_name)
  os.chmod(inp, 0)
  before = harness.tree_digest(inp)  # (this process is root: it reads the file)
  outcome = harness.run_child(writer.entry, writer.argv(out, inp, ctx), timeout=300,
                              prefix=WITHOUT_FILE_PRIVILEGES)
  harness.assert_user_error(outcome, *KEYWORDS["unreadable_input"], model_dir=inp, before=before)
  assert not os.path.exists(out), f"{name} wrote {out} although it could not read its input"


# --- commands that delete or replace a folder (--overwrite, --fresh; issue 39: class 4) ----------------------

# Each removes only a folder its own mark proves it wrote (fileio.write_mark; gpu_bundle's MARKER), never one
# recognised by the names inside; the test that shows it.
DELETERS = {
    "cache": "tests/hardening/test_writers.py::test_overwrite_replaces_only_a_split_this_command_wrote",
    "gpu_bundle": "tests/cli/test_gpu_bundle.py (check_output: --overwrite only with its MARKER)",
    "demo": "tests/hardening/test_writers.py::test_demo_fresh_deletes_only_a_folder_the_demo_created",
    "experiments/align_mlm_grid": "test_a_driver_writes_into_and_fresh_deletes_only_its_own_folder (below)",
    "experiments/code_switch": "test_a_driver_writes_into_and_fresh_deletes_only_its_own_folder (below)",
    "experiments/mlm_gc": "test_a_driver_writes_into_and_fresh_deletes_only_its_own_folder (below)",
}


def _help_of(name: str) -> str:
  """What `xalign NAME --help` prints (its flags, wherever the command's parser is built)."""
  import contextlib
  import importlib
  import io

  module = importlib.import_module("flax_xalign.cli." + name.replace("/", "."))
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), contextlib.suppress(SystemExit):
    module.main(["--help"])
  return out.getvalue()


def test_every_command_that_deletes_is_listed_with_its_test():
  flags = ("--overwrite", "--fresh")
  deleting = {name for name in commands() if any(f in _help_of(name) for f in flags)}
  assert deleting == set(DELETERS), (f"commands with --overwrite or --fresh: {sorted(deleting)}; DELETERS lists "
                                     f"{sorted(DELETERS)}: give a new one a mark and a test that an unmarked folder "
                                     "is refused")


# --- the experiment drivers' folder (experiments/harness.py; align_mlm_grid above runs it end to end) --------


def test_a_driver_writes_into_and_fresh_deletes_only_its_own_folder(tmp_path):
  from flax_xalign.experiments import harness as driver
  from flax_xalign.errors import UserError

  from flax_xalign import fileio

  args = type("Args", (), {})()
  ours = tmp_path / "ours"
  driver.Results(str(ours), args)  # Created by the driver: marked.
  (ours / "bible" / "mlm" / "checkpoints" / "2").mkdir(parents=True)
  (ours / "bible" / "dictionary.tsv").write_text("a\tb\n")
  (ours / "rsim_bible.png").write_bytes(b"png")
  (ours / "gold").mkdir()
  (ours / "gold" / "de-en.provisional.txt").write_text("a b\n")
  driver.Results(str(ours), args, fresh=True)
  assert sorted(os.listdir(ours)) == [fileio.MARK, "results.json"]  # The driver's mark, written first.
  unmarked = tmp_path / "unmarked"  # What a driver leaves looks like, but not made by one (or by an older one).
  shutil.copytree(ours, unmarked)
  os.remove(unmarked / fileio.MARK)
  (unmarked / "bible").mkdir()
  (unmarked / "bible" / "data.tsv").write_text("mine\n")
  before = harness.tree_digest(unmarked)
  with pytest.raises(UserError, match="holds no mark of an experiment driver"):
    driver.Results(str(unmarked), args, fresh=True)
  assert harness.tree_digest(unmarked) == before
  driver.Results(str(unmarked), args)  # Without --fresh it is written into, as before marks.
  (ours / "synthetic").mkdir()  # A setting's data before its first run: the folder is still the driver's.
  (ours / "synthetic" / "corpus.txt").write_text("a b\n")
  driver.Results(str(ours), args)
  for name, make in [("notes", lambda d: (d / "notes.txt").write_text("mine\n")),
                     ("trained_run", lambda d: ((d / "checkpoints" / "4").mkdir(parents=True),
                                                (d / "config.gin").write_text("# run\n"))),
                     ("results_and_notes", lambda d: ((d / "results.json").write_text("{}"),
                                                      (d / "notes.md").write_text("mine\n")))]:
    folder = tmp_path / name
    folder.mkdir()
    make(folder)
    before = harness.tree_digest(folder)
    for fresh in (False, True):
      with pytest.raises(UserError, match="non-empty folder that is not a driver's output"):
        driver.Results(str(folder), args, fresh=fresh)
    assert harness.tree_digest(folder) == before
  runs = tmp_path / "runs"  # A user's folder of runs: written into, never deleted.
  (runs / "demo" / "checkpoints" / "2").mkdir(parents=True)
  before = harness.tree_digest(runs)
  with pytest.raises(UserError, match="holds runs but no driver's results.json"):
    driver.Results(str(runs), args, fresh=True)
  assert harness.tree_digest(runs) == before
  with pytest.raises(UserError, match="--model_dir is empty"):
    driver.Results("", args)


# --- inputs that fail half way -------------------------------------------------------------------------------


def test_a_truncated_safetensors_file_is_one_error(tmp_path, capfd):
  import numpy as np
  import safetensors.numpy

  source = tmp_path / "hf"
  source.mkdir()
  (source / "config.json").write_text('{"model_type": "bert"}\n')
  weights = source / "model.safetensors"
  safetensors.numpy.save_file({"w": np.zeros((64, 64), np.float32)}, str(weights))
  weights.write_bytes(weights.read_bytes()[:1000])  # A download that stopped.
  outcome = harness.run_main(capfd, "import_hf", ["--source", str(source), "--output", str(tmp_path / "out")])
  harness.assert_user_error(outcome, "model.safetensors", "not a complete safetensors file",
                            model_dir=tmp_path / "out", before=None)


@pytest.mark.parametrize("entry, flags", [("align", ["--model_dir", "{tmp}/no_run", "--input", "{tmp}/in",
                                                     "--output", "{tmp}/out.txt"]),
                                          ("vocab", ["--input", "{tmp}/in", "--vocab_size=50",
                                                     "--output", "{tmp}/out"])])
def test_an_input_that_is_a_folder_is_one_error(entry, flags, tmp_path, capfd):
  """The unreadable-input case that root meets too (chmod 000 does not stop root)."""
  (tmp_path / "in").mkdir()  # (beside the output: an output inside an input folder is refused for that)
  outcome = harness.run_main(capfd, entry, [f.format(tmp=tmp_path) for f in flags])
  harness.assert_user_error(outcome, "is a folder")


# --- never into the run a command reads (issue 39: class 4) -------------------------------------------------

# Commands that read a MODEL_DIR and write elsewhere: (entry, flags for (run, input file, output)).
RUN_READERS = {
    "align": ("align", lambda run, inp, out: ["--model_dir", run, "--input", inp, "--output", out]),
    "bli": ("bli", lambda run, inp, out: ["--model_dir", run, "--src=grc", "--tgt=en", "--gold", inp,
                                          "--output", out]),
    "retrieval": ("retrieval", lambda run, inp, out: ["--model_dir", run, "--tsv", inp, "--output", out]),
    "export_hf": ("export_hf", lambda run, inp, out: ["--model_dir", run, "--output", out, "--layout=bert"]),
    "trim": ("trim", lambda run, inp, out: ["--model_dir", run, "--task=tiny_en", "--output", out]),
}


@pytest.mark.parametrize("name", list(RUN_READERS))
@pytest.mark.parametrize("target", ["config.gin", "eval.json", "checkpoints/9", "vocabulary.model",
                                    "induced_dictionary.tsv", "cooc.json"])
def test_an_output_in_the_run_it_reads_is_refused(name, target, tmp_path, capfd):
  entry, argv = RUN_READERS[name]
  run = tmp_path / "run"
  (run / "checkpoints" / "2").mkdir(parents=True)
  (run / "checkpoints" / "2" / "state").write_text("weights\n")
  (run / "config.gin").write_text("# the run's settings\n")
  (run / "metrics.jsonl").write_text('{"step": 2}\n')
  inp = tmp_path / "input.txt"
  _tsv(str(inp))
  before = harness.tree_digest(run)
  out = str(run / target)
  outcome = harness.run_main(capfd, entry, argv(str(run), str(inp), out))
  harness.assert_user_error(outcome, "of the run --model_dir", model_dir=run, before=before)
