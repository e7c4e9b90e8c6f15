"""`python -m flax_xalign.train` in-process (the contract tier): the smoke run, resume and bad input.

The smoke run is the session's shared MODEL_DIR (tests/shared_run.py); resuming takes a copy. Each bad
input must end with exit status 2, one `error:` line naming the problem, and an untouched (or never
created) MODEL_DIR. The full refusal matrix is tests/hardening/test_train_inputs.py.
"""

import json
import os

import pytest


from flax_xalign import train as train_main

from tests.testlib import tiny_encoder_gin, tree_snapshot, user_mixture_gin

pytestmark = pytest.mark.contract

TINY_MODEL = tiny_encoder_gin()


def _gin_file(tmp_path, corpus, *, en_files=None, tsv_files=None, extra=""):
  # Task names are global in a process and a name cannot be redefined, so
  # each test gets its own names.
  tag = tmp_path.name.replace("-", "_")
  files = corpus["files"]
  en = en_files or {"train": files[("en", "train")], "validation": files[("en", "validation")]}
  tsv = tsv_files or {"train": files[("de_en", "train")], "validation": files[("de_en", "validation")]}
  user_tasks = user_mixture_gin(
      scope="cli", en_name=f"{tag}_en", pair_name=f"{tag}_de_en", mixture_name=f"{tag}_mix",
      en_files=en, tsv_files=tsv, vocab=corpus["vocab"])
  text = f"""
include 'runs/pretrain.gin'
{TINY_MODEL}
{user_tasks}
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 2
CHECKPOINT_EVERY = 2
EVAL_EVERY = 4
train.eval_batches = 2
{extra}
"""
  path = tmp_path / "run.gin"
  path.write_text(text)
  return str(path)


def _train(gin_file, model_dir, *extra):
  return train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", *extra])


def test_train_smoke_on_the_shared_run(shared_run):
  """The session's shared MODEL_DIR is `flax_xalign.train` run 4 steps (tests/shared_run.py): what it wrote."""
  model_dir = shared_run["dir"]
  out = shared_run["stdout"]
  assert "step 4/4" in out and "tok/s" in out
  for name in ("config.gin", "metrics.jsonl", "tensorboard", "checkpoints"):
    assert (model_dir / name).exists(), name
  umask = os.umask(0o022)
  os.umask(umask)
  modes = {str(p.relative_to(model_dir)): p.stat().st_mode & 0o777 for p in model_dir.rglob("*") if p.is_file()}
  assert modes and all(mode == 0o666 & ~umask for mode in modes.values()), modes  # Never mkstemp's 0600.
  assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
  config = (model_dir / "config.gin").read_text()
  assert "TRAIN_STEPS = 4" in config and "EncoderConfig.embed_dim = 24" in config
  rows = [json.loads(l) for l in open(model_dir / "metrics.jsonl")]
  train_rows = [r for r in rows if "loss" in r]
  assert [r["step"] for r in train_rows] == [1, 2, 3, 4]  # LOG_EVERY = 1
  for key in ("loss", "mlm", "tlm", "learning_rate", "tokens_per_sec", "mlm_accuracy"):
    assert key in train_rows[-1], key
  assert [r["step"] for r in rows if "eval_loss" in r] == [4]  # EVAL_EVERY = 4


def test_same_command_with_more_steps_resumes(shared_run, shared_run_copy, capsys):
  assert _train(shared_run["gin"], shared_run_copy, "--gin.TRAIN_STEPS=6") == 0
  assert "resumed from" in capsys.readouterr().out
  assert sorted(os.listdir(shared_run_copy / "checkpoints"))[-1] == "6"
  rows = [json.loads(l) for l in open(shared_run_copy / "metrics.jsonl")]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]


def _expect_error(capsys, code, *needles):
  """Exit status 2 and exactly one `error:` line, free of gin's, absl's and autograph's additions."""
  assert code == 2
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, err[-2000:]
  for noise in ("Traceback", "In call to configurable", "ERROR:absl", "in user code"):
    assert noise not in err, (noise, err[-2000:])
  for needle in needles:  # The message may go on in indented lines (e.g. a checkpoint-vs-run comparison).
    assert needle in err, (needle, err[-2000:])


def test_gin_typo(tmp_path, tiny_corpus, capsys):
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", "--gin.train.batch_sise=3")
  _expect_error(capsys, code, "batch_sise", "in the binding `train.batch_sise = 3`", "Did you mean batch_size?")
  assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("line, needles", [
    ("EncoderConfg.embed_dim = 24", ["No configurable matching 'EncoderConfg'", "Did you mean EncoderConfig"]),
    ("EncoderConfig.embed_dimm = 24", ["doesn't have a parameter named 'embed_dimm'", "Did you mean embed_dim"]),
    ("train.masking = @MaskingConfg()", ["'@MaskingConfg()'", "Did you mean MaskingConfig?"]),
    ("train.seed = %SEEDD", ["%SEEDD is used but never set", "Did you mean SEED?"]),
    ("TRAIN_STEPS = 2 2", ["gin syntax error", "Expected newline"]),
])
def test_gin_mistakes_in_a_file_and_a_binding_name_the_place_and_a_close_match(tmp_path, tiny_corpus, capsys,
                                                                                line, needles):
  gin_file = _gin_file(tmp_path, tiny_corpus)
  extra = tmp_path / "extra.gin"
  extra.write_text(f"include '{gin_file}'\n\n{line}\n")
  code = train_main.main([f"--gin_file={extra}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"])
  _expect_error(capsys, code, f"{extra}:3", *needles)
  name, value = (part.strip() for part in line.split("=", 1))
  _expect_error(capsys, _train(gin_file, tmp_path / "m", f"--gin.{name}={value}"),
                f"in the binding `{name} = {value}`", *needles)
  assert not (tmp_path / "m").exists()


def test_unclosed_bracket_names_the_file_or_binding(tmp_path, tiny_corpus, capsys):
  gin_file = _gin_file(tmp_path, tiny_corpus)
  extra = tmp_path / "extra.gin"
  extra.write_text(f"include '{gin_file}'\nTRAIN_STEPS = (2\n")
  code = train_main.main([f"--gin_file={extra}", f"--gin.MODEL_DIR='{tmp_path / 'm'}'"])
  _expect_error(capsys, code, f"gin syntax error in {extra}", "never closed")
  _expect_error(capsys, _train(gin_file, tmp_path / "m", "--gin.TRAIN_STEPS=(2"),
                "in the binding `TRAIN_STEPS = (2`", "never closed")


def test_misspelt_macro_is_refused_with_the_close_match(tmp_path, tiny_corpus, capsys):
  # gin itself accepts a binding of a macro nothing reads: the run would train the default 1000 steps.
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", "--gin.TRAIN_STEP=3")
  _expect_error(capsys, code, "--gin.TRAIN_STEP", "TRAIN_STEPS")
  assert not (tmp_path / "m").exists()
  # A macro no file uses and nothing resembles: the message says so.
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", "--gin.QQQ_ZZZ=1")
  _expect_error(capsys, code, "--gin.QQQ_ZZZ", "check the spelling")
  assert not (tmp_path / "m").exists()


def test_missing_gin_file(tmp_path, capsys):
  code = train_main.main(["--gin_file=no/such.gin", "--gin.MODEL_DIR='x'"])
  _expect_error(capsys, code, "no/such.gin")


def test_missing_model_dir(tmp_path, tiny_corpus, capsys):
  code = train_main.main([f"--gin_file={_gin_file(tmp_path, tiny_corpus)}"])
  _expect_error(capsys, code, "MODEL_DIR")


def test_unknown_task(tmp_path, tiny_corpus, capsys):
  tag = tmp_path.name.replace("-", "_")
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", f"--gin.MIXTURE_OR_TASK_NAME='{tag}_mixx'")
  _expect_error(capsys, code, f"{tag}_mixx", f"'{tag}_mix'")
  assert not (tmp_path / "m").exists()


def test_missing_corpus_file(tmp_path, tiny_corpus, capsys):
  gin_file = _gin_file(tmp_path, tiny_corpus, en_files={"train": str(tmp_path / "nope.txt")})
  _expect_error(capsys, _train(gin_file, tmp_path / "m"), "nope.txt")
  assert not (tmp_path / "m").exists()


def test_empty_corpus_file(tmp_path, tiny_corpus, capsys):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  gin_file = _gin_file(tmp_path, tiny_corpus, en_files={"train": str(empty)})
  _expect_error(capsys, _train(gin_file, tmp_path / "m"), "empty.txt")


def test_malformed_tsv_row_names_the_line(tmp_path, tiny_corpus, capsys):
  bad = tmp_path / "bad.tsv"
  bad.write_text("ein haus\ta house\nder hund\tthe dog\textra column\n")
  gin_file = _gin_file(tmp_path, tiny_corpus, tsv_files={"train": str(bad)})
  _expect_error(capsys, _train(gin_file, tmp_path / "m"), "bad.tsv:2")


def test_existing_dir_with_other_model_size_is_untouched(shared_run, shared_run_copy, capsys):
  before = tree_snapshot(shared_run_copy)
  code = _train(shared_run["gin"], shared_run_copy, "--gin.TRAIN_STEPS=4", "--gin.EncoderConfig.mlp_dim=48")
  _expect_error(capsys, code, "different model", "mlp_dim")
  assert tree_snapshot(shared_run_copy) == before


@pytest.mark.parametrize("binding, needle", [
    ("--gin.CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY=0"),
    ("--gin.LOG_EVERY=0", "LOG_EVERY=0"),
    ("--gin.TRAIN_STEPS=-5", "TRAIN_STEPS=-5"),
    ("--gin.BATCH_SIZE=2.5", "BATCH_SIZE=2.5"),
    ("--gin.EVAL_EVERY=-1", "EVAL_EVERY=-1"),
    ("--gin.CheckpointConfig.keep=0", "CheckpointConfig.keep=0"),
])
def test_bad_counts_are_refused_before_model_dir_exists(tmp_path, tiny_corpus, capsys, binding, needle):
  # CHECKPOINT_EVERY=0 and LOG_EVERY=0 used to crash after a step had run; keep=0 deleted every checkpoint.
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", binding)
  _expect_error(capsys, code, needle, "must be an integer >=")
  assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("binding, needles", [
    ("--gin.TASK_FEATURE_LENGTHS={'token': 19}", ["'token'", "the only key allowed is 'tokens'"]),
    ("--gin.OptimizerConfig.learning_rate='1e-3'", ["OptimizerConfig.learning_rate='1e-3'", "drop the quotes"]),
])
def test_wrong_types_and_keys_are_refused_before_model_dir_exists(tmp_path, tiny_corpus, capsys, binding, needles):
  # Needs pretrain to call training.validate.check_settings (a bad key used to end in a KeyError traceback).
  code = _train(_gin_file(tmp_path, tiny_corpus), tmp_path / "m", binding)
  _expect_error(capsys, code, *needles)
  assert not (tmp_path / "m").exists()
