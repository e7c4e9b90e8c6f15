"""`python -m flax_xalign.train` refuses every bad input with C1's one error line and an untouched MODEL_DIR.

Each case builds a tiny run (tests.testlib's tiny encoder, the session's tiny corpus), breaks one thing,
runs `flax_xalign.train.main` in-process and checks exit status 2, one `error:` line naming the problem
(and, where the contract says so, the fix), no traceback or log noise, and a MODEL_DIR that is
byte-identical (or still absent).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable

import pytest

from tests import testlib
from tests.hardening import harness

pytestmark = pytest.mark.contract  # C1 checks, in-process and cheap per case.


@dataclasses.dataclass
class Ctx:
  tmp: pathlib.Path
  corpus: dict
  tag: str
  undo: list = dataclasses.field(default_factory=list)  # what a case set up and must take down

  def file(self, name: str, content: bytes | str) -> str:
    path = self.tmp / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)

  def en(self, train: str) -> dict:
    return {"en": {"train": train, "validation": self.corpus["files"][("en", "validation")]}}

  def tsv(self, train: str) -> dict:
    return {"tsv": {"train": train, "validation": self.corpus["files"][("de_en", "validation")]}}


@dataclasses.dataclass(frozen=True)
class Case:
  id: str
  keywords: tuple = ()
  argv: tuple | Callable[[Ctx], list] = ()   # extra flags
  gin: Callable[[Ctx], dict] | None = None   # write_run_gin overrides
  model_dir: Callable[[Ctx], str] | None = None   # MODEL_DIR (default: tmp/m, absent)

  def flags(self, ctx: Ctx) -> list:
    return list(self.argv(ctx) if callable(self.argv) else self.argv)


def _count(setting: str, value: str, *keywords) -> Case:
  flag = setting
  shown = value.replace("'", "str_").replace("-", "minus").replace(".", "p")
  return Case(f"{setting.replace('.', '_')}_is_{shown}", (setting.split(".")[-1] if "." in setting else setting,
                                                        *keywords), (f"--gin.{flag}={value}",))


def _lengths(case_id: str, value: str, *keywords) -> Case:
  return Case(f"task_feature_lengths_{case_id}", ("TASK_FEATURE_LENGTHS", *keywords),
              (f"--gin.TASK_FEATURE_LENGTHS={value}",))


def _read_only(ctx: Ctx, name: str) -> str:
  """A folder train cannot write (for root, which ignores modes, a read-only tmpfs); undone after the case."""
  folder = ctx.tmp / name
  undo = testlib.read_only_folder(folder)
  if undo is None:
    pytest.skip("running as root and cannot mount a read-only tmpfs")
  ctx.undo.append(undo)
  return str(folder)


def _readonly_parent(ctx: Ctx) -> str:
  return os.path.join(_read_only(ctx, "ro"), "m")


def _readonly_dir(ctx: Ctx) -> str:
  return _read_only(ctx, "ro_dir")


def _file(ctx: Ctx) -> str:
  return ctx.file("model_dir_is_a_file", "not a folder\n")


def _tsv_rows(ctx: Ctx, rows: str) -> dict:
  return ctx.tsv(ctx.file("bad.tsv", "ein haus\ta house\n" + rows))


GIN_CASES = [
    Case("gin_syntax_unclosed_dict_on_command_line", ("TASK_FEATURE_LENGTHS",),
         ("--gin.TASK_FEATURE_LENGTHS={'tokens': 19",)),
    Case("gin_syntax_double_equals_in_file", ("run.gin",), gin=lambda c: {"extra": "train.seed = = 3"}),
    Case("gin_unquoted_model_dir_path", ("MODEL_DIR",), ("--gin.MODEL_DIR=runs/x",), model_dir=lambda c: None),
    Case("gin_unknown_configurable", ("Trainerr",), ("--gin.Trainerr.steps=3",)),
    Case("gin_unknown_param_of_train_with_suggestion", ("batch_sise", "batch_size"), ("--gin.train.batch_sise=3",)),
    Case("gin_unknown_param_of_encoder_with_suggestion", ("embed_dims", "embed_dim"),
         ("--gin.EncoderConfig.embed_dims=24",)),
    Case("gin_unknown_param_of_optimizer_with_suggestion", ("learning_rte", "learning_rate"),
         ("--gin.OptimizerConfig.learning_rte=0.1",)),
    Case("gin_unknown_configurable_reference_with_suggestion", ("OptimizerConfg", "OptimizerConfig"),
         ("--gin.train.optimizer=@OptimizerConfg()",)),
    Case("gin_undefined_macro_reference", ("TRAIN_STEPZ",), ("--gin.train.train_steps=%TRAIN_STEPZ",)),
    Case("gin_missing_extra_gin_file", ("no/such.gin",), ("--gin_file=no/such.gin",)),
    Case("gin_missing_include", ("missing.gin",), gin=lambda c: {"extra": "include 'nope/missing.gin'"}),
    Case("macro_misspelt_TRAIN_STEP", ("TRAIN_STEP", "TRAIN_STEPS"), ("--gin.TRAIN_STEP=3",)),
    Case("macro_misspelt_BATCHSIZE", ("BATCHSIZE", "BATCH_SIZE"), ("--gin.BATCHSIZE=4",)),
    Case("macro_misspelt_CHECKPOINT_EVRY", ("CHECKPOINT_EVRY", "CHECKPOINT_EVERY"), ("--gin.CHECKPOINT_EVRY=1",)),
    Case("macro_lowercase_train_steps", ("train_steps",), ("--gin.train_steps=3",)),
    Case("unknown_flag", ("--no_such_flag",), ("--no_such_flag=1",)),
    Case("binding_without_value", ("TRAIN_STEPS",), ("--gin.TRAIN_STEPS=",)),
]

COUNT_CASES = [
    _count("TRAIN_STEPS", "'ten'"), _count("TRAIN_STEPS", "0"), _count("TRAIN_STEPS", "-5"),
    _count("TRAIN_STEPS", "2.5"), _count("TRAIN_STEPS", "None"), _count("TRAIN_STEPS", "True"),
    _count("BATCH_SIZE", "'6'"), _count("BATCH_SIZE", "0"), _count("BATCH_SIZE", "-1"), _count("BATCH_SIZE", "2.5"),
    _count("LOG_EVERY", "0"), _count("LOG_EVERY", "-1"), _count("LOG_EVERY", "'2'"),
    _count("CHECKPOINT_EVERY", "0"), _count("CHECKPOINT_EVERY", "-2"), _count("CHECKPOINT_EVERY", "1.5"),
    _count("EVAL_EVERY", "-1"), _count("EVAL_EVERY", "'4'"), _count("EVAL_EVERY", "0.5"),
    _count("train.eval_batches", "0"),
    _count("CheckpointConfig.keep", "0"), _count("CheckpointConfig.keep", "-1"), _count("CheckpointConfig.keep", "'all'"),
    _count("CheckpointConfig.async_save", "'yes'"),
    _count("CheckpointConfig.on_damaged", "'maybe'", ("fallback", "error")),
    _count("SEED", "'abc'"), _count("NUM_PARTITIONS", "0"),
    _count("OptimizerConfig.learning_rate", "'fast'"), _count("OptimizerConfig.warmup_steps", "-1"),
    _count("EncoderConfig.num_layers", "0"), _count("EncoderConfig.embed_dim", "'24'"),
]

LENGTH_CASES = [
    _lengths("key_token", "{'token': 19}", "tokens"),
    _lengths("zero", "{'tokens': 0}"),
    _lengths("negative", "{'tokens': -3}"),
    _lengths("string", "{'tokens': 'long'}"),
    _lengths("fractional", "{'tokens': 19.5}"),
    _lengths("empty_dict", "{}", "tokens"),
    _lengths("extra_key", "{'tokens': 19, 'targets': 5}", "targets"),
    _lengths("not_a_dict", "19", "tokens"),
    _lengths("none", "None"),
    _lengths("longer_than_positions", "{'tokens': 1000}", "max_positions"),
]

MODEL_DIR_CASES = [
    Case("model_dir_missing", ("MODEL_DIR",), model_dir=lambda c: None),
    Case("model_dir_empty_string", ("MODEL_DIR",), model_dir=lambda c: ""),
    Case("model_dir_blank", ("MODEL_DIR",), model_dir=lambda c: "   "),
    Case("model_dir_is_a_file", ("model_dir_is_a_file",), model_dir=_file),
    Case("model_dir_below_a_file", ("model_dir_is_a_file",), model_dir=lambda c: os.path.join(_file(c), "sub")),
    Case("model_dir_in_read_only_folder", ("ro",), model_dir=_readonly_parent),
    Case("model_dir_read_only", ("ro_dir",), model_dir=_readonly_dir),
    Case("model_dir_not_a_string", ("MODEL_DIR",), ("--gin.MODEL_DIR=5",), model_dir=lambda c: None),
]

DATA_CASES = [
    Case("corpus_missing", ("nope.txt",), gin=lambda c: c.en(str(c.tmp / "nope.txt"))),
    Case("corpus_zero_bytes", ("empty.txt",), gin=lambda c: c.en(c.file("empty.txt", ""))),
    Case("corpus_blank_lines_only", ("blank.txt",), gin=lambda c: c.en(c.file("blank.txt", "\n \n\t\n"))),
    Case("corpus_bad_utf8", ("latin1.txt",), gin=lambda c: c.en(c.file("latin1.txt", "the house\ngro\xdf\n".encode("latin-1")))),
    Case("corpus_is_a_directory", ("adir",), gin=lambda c: (c.tmp / "adir").mkdir() or c.en(str(c.tmp / "adir"))),
    Case("corpus_glob_matches_nothing", ("*.nothing",), gin=lambda c: c.en(str(c.tmp / "*.nothing"))),
    Case("tsv_one_column", ("bad.tsv:2",), gin=lambda c: _tsv_rows(c, "der hund the dog\n")),
    Case("tsv_three_columns", ("bad.tsv:2",), gin=lambda c: _tsv_rows(c, "der hund\tthe dog\textra\n")),
    Case("tsv_empty_side", ("bad.tsv:2",), gin=lambda c: _tsv_rows(c, "der hund\t \n")),
    Case("tsv_bad_utf8", ("bad.tsv",), gin=lambda c: c.tsv(c.file("bad.tsv", b"ein haus\ta house\n\xff\xfe\tx\n"))),
    Case("tsv_zero_bytes", ("empty.tsv",), gin=lambda c: c.tsv(c.file("empty.tsv", ""))),
    Case("vocabulary_missing", ("no_such.model",), gin=lambda c: {"vocab": str(c.tmp / "no_such.model")}),
    Case("vocabulary_not_a_sentencepiece_model", ("garbage.model",),
         gin=lambda c: {"vocab": c.file("garbage.model", b"\x00\x01 this is not a model")}),
    Case("task_unknown_with_suggestion", ("_mixx", "_mix"), lambda c: [f"--gin.MIXTURE_OR_TASK_NAME='{c.tag}_mixx'"]),
    Case("mixture_with_unknown_subtask", ("_enn",), gin=lambda c: {"tasks": [f"{c.tag}_enn", f"{c.tag}_de_en"]}),
    Case("task_name_clashes_with_another_definition", ("tiny_en",),
         gin=lambda c: {"extra": f"h_en/TextTask.name = 'tiny_en'\nh_mix/AlphaMixture.tasks = ['tiny_en', '{c.tag}_de_en']",
                        "en": {"train": c.corpus["files"][("en", "validation")]}}),
    Case("text_task_unknown_normaliser", ("normalize",), gin=lambda c: {"extra": "h_en/TextTask.normalize = 'nope'"}),
    Case("train_split_missing", ("train",),
         gin=lambda c: {"en": {"validation": c.corpus["files"][("en", "validation")]}}),
]

ALL_CASES = GIN_CASES + COUNT_CASES + LENGTH_CASES + MODEL_DIR_CASES + DATA_CASES


@pytest.mark.parametrize("case", ALL_CASES, ids=lambda c: c.id)
def test_train_refuses_bad_input(case, tmp_path, tiny_corpus, capfd, monkeypatch):
  monkeypatch.chdir(tmp_path)  # A relative MODEL_DIR that is wrongly accepted lands here, not in the checkout.
  ctx = Ctx(tmp_path, tiny_corpus, tag=tmp_path.name.replace("-", "_").lower()[-40:])
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag=ctx.tag,
                                   **(case.gin(ctx) if case.gin else {}))
  model_dir = case.model_dir(ctx) if case.model_dir else str(tmp_path / "m")
  argv = [f"--gin_file={gin_file}", "--gin.TRAIN_STEPS=2"] if "TRAIN_STEPS" not in case.id else [f"--gin_file={gin_file}"]
  if model_dir is not None:
    argv.append(f"--gin.MODEL_DIR='{model_dir}'")
  argv += case.flags(ctx)
  watched = model_dir if model_dir and model_dir.strip() else None
  before = harness.tree_digest(watched) if watched else None
  cwd_checkpoints = os.path.exists("checkpoints")
  try:
    outcome = harness.run_main(capfd, "train", argv)
  finally:
    for undo in ctx.undo:
      undo()
  if watched:
    harness.assert_user_error(outcome, *case.keywords, model_dir=watched, before=before)
  else:
    harness.assert_user_error(outcome, *case.keywords)
  assert os.path.exists("checkpoints") == cwd_checkpoints, "a ./checkpoints folder appeared in the cwd"


@pytest.mark.subprocess
def test_corpus_of_control_characters_only_is_refused_up_front(tmp_path, tiny_corpus):
  """C9: lines that all tokenise to nothing used to loop forever; a child process bounds the wait."""
  tag = "ctrl_only"
  control = tmp_path / "control.txt"
  control.write_text("\x01\x02\x03\n\x07\x08\n" * 50, encoding="utf-8")
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag=tag,
                                   en={"train": str(control),
                                       "validation": tiny_corpus["files"][("en", "validation")]},
                                   tasks=[f"{tag}_en", f"{tag}_de_en"])
  model_dir = tmp_path / "m"
  outcome = harness.run_child("train", harness.train_argv(gin_file, model_dir, "--gin.TRAIN_STEPS=2"), timeout=150)
  harness.assert_user_error(outcome, "control.txt", f"{tag}_en", "train", model_dir=model_dir, before=None)
