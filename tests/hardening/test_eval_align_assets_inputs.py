"""`eval`, `align` and `assets` refuse bad input with C1's one error line; what they must accept, they do."""

from __future__ import annotations

import pathlib

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract  # C1 checks, in-process and cheap per case.

# --- eval ----------------------------------------------------------------------

def _on_dir(*flags, split="validation"):
  """Flags for the trained MODEL_DIR, on its validation split (it has no test split)."""
  return lambda c: [f"--gin.MODEL_DIR='{c['dir']}'", *([f"--gin.SPLIT='{split}'"] if split else []), *flags]


# (id, flags given a context {dir, tmp}, keywords, the folder that must stay as it was: 'dir', 'none' or None)
EVAL_CASES = [
    ("eval_no_flags", lambda c: [], ("MODEL_DIR",), None),
    ("eval_model_dir_missing", lambda c: [f"--gin.MODEL_DIR='{c['tmp'] / 'typo'}'"], ("no checkpoint", "typo"),
     "typo"),
    ("eval_model_dir_empty_folder", lambda c: [f"--gin.MODEL_DIR='{c['empty']}'"], ("no checkpoint",), "empty"),
    ("eval_model_dir_only_config", lambda c: [f"--gin.MODEL_DIR='{c['config_only']}'"], ("no checkpoint",),
     "config_only"),
    ("eval_model_dir_is_a_file", lambda c: [f"--gin.MODEL_DIR='{c['file']}'"], ("afile",), "file"),
    ("eval_model_dir_empty_string", lambda c: ["--gin.MODEL_DIR=''"], ("MODEL_DIR",), None),
    ("eval_unknown_split", _on_dir("--gin.SPLIT='nosuch'", split=None), ("nosuch",), "dir"),
    ("eval_batch_size_zero", _on_dir("--gin.BATCH_SIZE=0"), ("BATCH_SIZE",), "dir"),
    ("eval_batch_size_string", _on_dir("--gin.BATCH_SIZE='8'"), ("BATCH_SIZE",),
     "dir"),
    ("eval_max_batches_negative", lambda c: [f"--gin.MODEL_DIR='{c['dir']}'", "--gin.SPLIT='validation'",
                                                 "--gin.BATCH_SIZE=6", "--gin.evaluate.max_batches=-1"],
     ("max_batches",), "dir"),
    ("eval_unknown_param_with_suggestion", _on_dir("--gin.evaluate.batchsize=2"),
     ("batchsize", "batch_size"), "dir"),
    ("eval_misspelt_macro", _on_dir("--gin.SPLT='validation'"), ("SPLT", "SPLIT"),
     "dir"),
    ("eval_gin_syntax_error", lambda c: [f"--gin.MODEL_DIR='{c['dir']}'", "--gin.SPLIT='validation"], ("SPLIT",), "dir"),
    ("eval_unknown_task", _on_dir("--gin.evaluate.mixture_or_task_name='nosuch_task'"),
     ("nosuch_task",), "dir"),
]


@pytest.fixture
def eval_context(trained_copy, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  config_only = tmp_path / "config_only"
  config_only.mkdir()
  (config_only / "config.gin").write_text("TRAIN_STEPS = 4\n")
  afile = tmp_path / "afile"
  afile.write_text("x\n")
  return {"dir": trained_copy, "tmp": tmp_path, "empty": empty, "config_only": config_only, "file": afile,
          "typo": tmp_path / "typo"}


@pytest.mark.parametrize("case_id, flags, keywords, watched", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_eval_refuses_bad_input(case_id, flags, keywords, watched, eval_context, capfd):
  del case_id
  path = eval_context[watched] if watched else None
  before = harness.tree_digest(path) if path else None
  outcome = harness.run_main(capfd, "eval", flags(eval_context))
  if path:
    harness.assert_user_error(outcome, *keywords, model_dir=path, before=before)
  else:
    harness.assert_user_error(outcome, *keywords)


@pytest.mark.subprocess
def test_eval_in_a_new_process_knows_the_users_tasks(trained_copy):
  """Item 6: the tasks of a model trained on the user's own files come from the run manifest."""
  outcome = harness.run_child("eval", [f"--gin.MODEL_DIR='{trained_copy}'", "--gin.SPLIT='validation'",
                                       "--gin.BATCH_SIZE=6", "--gin.evaluate.baseline_batches=2"], timeout=240)
  assert outcome.code == 0, outcome.out[-2000:]
  assert (trained_copy / "eval.json").exists()


# --- align ---------------------------------------------------------------------

GOOD_PAIRS = "das haus\tthe house\nder hund sieht\tthe dog sees\n"


def _align_files(tmp: pathlib.Path) -> dict:
  files = {}
  for name, content in {"good.tsv": GOOD_PAIRS, "empty.tsv": "", "one_col.tsv": "das haus the house\n",
                        "three_col.tsv": "das haus\tthe house\textra\n", "gold1.txt": "0-0\n"}.items():
    files[name] = tmp / name
    files[name].write_text(content, encoding="utf-8")
  files["latin1.tsv"] = tmp / "latin1.tsv"
  files["latin1.tsv"].write_bytes("gro\xdf\tbig\n".encode("latin-1"))
  files["adir"] = tmp / "adir"
  files["adir"].mkdir()
  (tmp / "empty_ckpt").mkdir()
  files["empty_ckpt"] = tmp / "empty_ckpt"
  return files


def _align(c, *flags, checkpoint=None, input_name="good.tsv", output=None):
  argv = [f"--checkpoint={checkpoint or c['dir']}", f"--output={output or c['tmp'] / 'out.txt'}"]
  if input_name:
    argv.append(f"--input={c['files'][input_name] if input_name in c['files'] else c['tmp'] / input_name}")
  return argv + list(flags)


ALIGN_CASES = [
    ("align_no_flags", lambda c: [], ("--checkpoint",)),
    ("align_checkpoint_missing", lambda c: _align(c, checkpoint=c["tmp"] / "typo"), ("typo",)),
    ("align_checkpoint_empty_folder", lambda c: _align(c, checkpoint=c["files"]["empty_ckpt"]),
     ("no checkpoint",)),
    ("align_no_input", lambda c: _align(c, input_name=None), ("--input",)),
    ("align_input_missing", lambda c: _align(c, input_name="nope.tsv"), ("nope.tsv",)),
    ("align_input_empty", lambda c: _align(c, input_name="empty.tsv"), ("empty.tsv",)),
    ("align_input_one_column", lambda c: _align(c, input_name="one_col.tsv"), ("one_col.tsv:1",)),
    ("align_input_three_columns", lambda c: _align(c, input_name="three_col.tsv"), ("three_col.tsv:1",)),
    ("align_input_bad_utf8", lambda c: _align(c, input_name="latin1.tsv"), ("latin1.tsv",)),
    ("align_input_is_a_directory", lambda c: _align(c, input_name="adir"), ("adir",)),
    ("align_layer_too_deep", lambda c: _align(c, "--layer=99"), ("layer",)),
    ("align_layer_negative", lambda c: _align(c, "--layer=-1"), ("layer",)),
    ("align_layer_not_a_number", lambda c: _align(c, "--layer=top"), ("layer",)),
    ("align_unknown_method", lambda c: _align(c, "--method=magic"), ("method",)),
    ("align_batch_size_zero", lambda c: _align(c, "--batch_size=0"), ("batch_size",)),
    ("align_max_length_zero", lambda c: _align(c, "--max_length=0"), ("max_length",)),
    ("align_unknown_source_language", lambda c: _align(c, "--src_lang=xx"), ("xx",)),
    ("align_gold_count_mismatch", lambda c: _align(c, f"--gold={c['files']['gold1.txt']}"), ("gold1.txt",)),
    ("align_sweep_without_gold", lambda c: _align(c, "--sweep"), ("--gold",)),
    ("align_negative_sinkhorn_iterations", lambda c: _align(c, "--sinkhorn_iters=-1"), ("sinkhorn_iters",)),
    ("align_output_is_a_directory", lambda c: _align(c, output=c["files"]["adir"]), ("adir",)),
    ("align_vocabulary_missing", lambda c: _align(c, f"--vocabulary={c['tmp'] / 'none.model'}"), ("none.model",)),
]


@pytest.fixture
def align_context(trained, tmp_path):
  return {"dir": trained["dir"], "tmp": tmp_path, "files": _align_files(tmp_path)}


@pytest.mark.parametrize("case_id, flags, keywords", ALIGN_CASES, ids=[c[0] for c in ALIGN_CASES])
def test_align_refuses_bad_input(case_id, flags, keywords, align_context, capfd):
  del case_id
  before = harness.tree_digest(align_context["dir"])
  outcome = harness.run_main(capfd, "align", flags(align_context))
  harness.assert_user_error(outcome, *keywords, model_dir=align_context["dir"], before=before)
  assert not (align_context["tmp"] / "out.txt").exists()


@pytest.mark.parametrize("text", [GOOD_PAIRS + "\n", "a <mask> b\t<s> the </s> dog\n"],
                         ids=["align_accepts_a_trailing_blank_line", "align_literal_special_tokens_in_text"])
def test_align_accepts(text, align_context, capfd):
  """Item 12: the trailing blank line the trainer accepts; literal `<mask>` is text, not the mask id."""
  path = align_context["tmp"] / "input.tsv"
  path.write_text(text, encoding="utf-8")
  out = align_context["tmp"] / "links.txt"
  outcome = harness.run_main(capfd, "align", [f"--checkpoint={align_context['dir']}", f"--input={path}",
                                              f"--output={out}", "--batch_size=4"])
  assert outcome.code == 0, harness.summary(outcome)
  pairs = [l for l in text.splitlines() if l.strip()]
  assert len(out.read_text().splitlines()) == len(pairs)


# --- assets --------------------------------------------------------------------


ASSETS_CASES = [
    ("assets_missing_model_dir", lambda c: [], ("MODEL_DIR",), None),
    ("assets_gin_typo", lambda c: [f"--gin.MODEL_DIR='{c['tmp'] / 'm'}'", "--gin.train.batch_sise=3"],
     ("batch_sise",), "m"),
    ("assets_model_dir_is_a_file", lambda c: [f"--gin.MODEL_DIR='{c['tmp'] / 'afile'}'"], ("afile",), "afile"),
    ("assets_misspelt_macro", lambda c: [f"--gin.MODEL_DIR='{c['tmp'] / 'm'}'", "--gin.TRAIN_STEP=3"],
     ("TRAIN_STEPS",), "m"),
    ("assets_bad_count", lambda c: [f"--gin.MODEL_DIR='{c['tmp'] / 'm'}'", "--gin.BATCH_SIZE=0"], ("BATCH_SIZE",), "m"),
]


@pytest.mark.parametrize("case_id, flags, keywords, watched", ASSETS_CASES, ids=[c[0] for c in ASSETS_CASES])
def test_assets_refuse_bad_input(case_id, flags, keywords, watched, trained, tmp_path, capfd):
  """`xalign assets` takes train's flags: the same refusals, MODEL_DIR untouched."""
  del case_id
  (tmp_path / "afile").write_text("x\n")
  path = tmp_path / watched if watched else None
  before = harness.tree_digest(path) if path else None
  outcome = harness.run_main(capfd, "assets", [f"--gin_file={trained['gin']}", *flags({"tmp": tmp_path})])
  if path:
    harness.assert_user_error(outcome, *keywords, model_dir=path, before=before)
  else:
    harness.assert_user_error(outcome, *keywords)
