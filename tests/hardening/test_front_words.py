"""The words of the front and of the readers (issue 47): each case one `error:` line (C1) that names what to
pass, or a file left as it was. Cases of the 2026-12-01 reliability review, by id.

Expectations are written out here (the flag names, the run's asset file names, the folders left), not read
from the code under test. Most cases refuse before any heavy import; those that parse gin through the
configurables import the library once (the contract tier).
"""

from __future__ import annotations

import json
import os
import types

import pytest

from flax_xalign import fileio
from flax_xalign.errors import UserError
from tests.hardening import harness

# The files a run's writers put directly into MODEL_DIR besides checkpoints/ and config.gin: the assets'
# (assets/*.py `files`), an import's model.gin and its origin.json and NOTICE.
RUN_ASSET_FILES = ("vocabulary.model", "vocabulary.txt", "dictionary.tsv", "induced_dictionary.tsv", "cooc.npz",
                   "cooc.json", "lang_vocab.tsv", "token_map.npz", "word_starts.npz", "model.gin", "origin.json",
                   "NOTICE", "metrics.jsonl", "tensorboard", ".lock", "checkpoints_damaged")


def _run(folder):
  (folder / "checkpoints" / "2").mkdir(parents=True)
  (folder / "vocabulary.model").write_bytes(b"the run's tokenizer")
  return folder


# --- E15 / E19b: a run's own asset files are the run's ---------------------------------------------------------


@pytest.mark.parametrize("name", RUN_ASSET_FILES)
def test_an_output_onto_a_file_the_run_wrote_is_refused(name, tmp_path):
  from flax_xalign.cli import common

  run = _run(tmp_path / "run")
  with pytest.raises(UserError, match=f"is {name} of the run --model_dir"):
    common.check_outside_run(str(run / name), str(run))


def test_a_new_file_beside_the_runs_own_is_fine(tmp_path):
  from flax_xalign.cli import common

  run = _run(tmp_path / "run")
  for name in ("links.txt", "vocabulary.model.links", "aer/links.txt"):
    common.check_outside_run(str(run / name), str(run))


@pytest.mark.contract
@pytest.mark.parametrize("entry, argv", [
    ("align", lambda run, inp: ["--model_dir", run, "--input", inp, "--output", f"{run}/vocabulary.model"]),
    ("bli", lambda run, inp: ["--model_dir", run, "--src=de", "--tgt=en", "--output", f"{run}/vocabulary.model"]),
], ids=["align", "bli"])
def test_align_and_bli_never_replace_the_runs_vocabulary(entry, argv, tmp_path, capfd):
  run = _run(tmp_path / "run")
  inp = tmp_path / "pairs.tsv"
  inp.write_text("a b\tc d\n", encoding="utf-8")
  before = harness.tree_digest(run)
  outcome = harness.run_main(capfd, entry, argv(str(run), str(inp)))
  harness.assert_user_error(outcome, "vocabulary.model of the run --model_dir", model_dir=run, before=before)


# --- U_gin / U2_cache: an unknown flag names the command's own --help -------------------------------------------


@pytest.mark.parametrize("entry, extra", [
    ("eval", []), ("assets", []), ("cache", ["--output=OUT", "--gin_file=runs/pretrain.gin"]),
    ("train", []),
])
def test_an_unknown_flag_of_a_gin_command_names_its_own_help(entry, extra, tmp_path, capfd):
  argv = [a.replace("OUT", str(tmp_path / "out")) for a in extra] + ["--no_such_flag=1"]
  outcome = harness.run_main(capfd, entry, argv)
  harness.assert_user_error(outcome, "--no_such_flag", f"see xalign {entry} --help")
  assert "see xalign --help" not in outcome.err
  assert not (tmp_path / "out").exists()


# --- U_train_noflags / U3_train, U3_eval / E01: what to pass, in the user's words --------------------------------


@pytest.mark.contract
@pytest.mark.parametrize("entry", ["train", "assets"])
def test_train_and_assets_with_no_flags_name_what_to_pass(entry, tmp_path, capfd, monkeypatch):
  monkeypatch.chdir(tmp_path)  # (nothing may be written where it runs)
  outcome = harness.run_main(capfd, entry, [])
  harness.assert_user_error(outcome, "--gin_file=", "MODEL_DIR", f"xalign {entry} --help")
  assert "TypeError" not in outcome.err and "keyword-only" not in outcome.err
  assert os.listdir(tmp_path) == []


@pytest.mark.contract
def test_eval_with_no_flags_names_the_flag_of_model_dir(tmp_path, capfd, monkeypatch):
  monkeypatch.chdir(tmp_path)
  outcome = harness.run_main(capfd, "eval", [])
  harness.assert_user_error(outcome, "--gin.MODEL_DIR=", "xalign eval --help")
  assert "gin.REQUIRED" not in outcome.err and "macro.value" not in outcome.err
  assert os.listdir(tmp_path) == []


@pytest.mark.contract
def test_eval_of_a_training_gin_file_says_that_it_replaced_runs_eval_gin(tmp_path, capfd):
  run = _run(tmp_path / "run")
  before = harness.tree_digest(run)
  outcome = harness.run_main(capfd, "eval", [f"--gin_file={harness.REPO / 'docs/examples/tiny.gin'}",
                                             f"--gin.MODEL_DIR='{run}'"])
  harness.assert_user_error(outcome, "nothing to evaluate", "--gin_file=runs/eval.gin", model_dir=run,
                            before=before)
  assert "setting(s) job" not in outcome.err


# --- E13b: a model setting on eval is refused, the run's saved config wins -----------------------------------------


@pytest.mark.contract
@pytest.mark.parametrize("binding", ["--gin.EncoderConfig.num_layers=4", "--gin.OptimizerConfig.learning_rate=0.1",
                                     "--gin.train.batch_size=3"])
def test_eval_refuses_a_binding_that_the_runs_saved_config_overrides(binding, tmp_path, capfd):
  run = _run(tmp_path / "run")
  before = harness.tree_digest(run)
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{run}'", binding])
  name = binding.split("=")[0].removeprefix("--gin.").split(".")[0]
  harness.assert_user_error(outcome, binding, "saved config", name, model_dir=run, before=before)


# --- M15: a gin file that is not UTF-8 is named ------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["eval", "train", "assets"])
def test_a_gin_file_that_is_not_utf8_is_named(entry, tmp_path, capfd):
  gin_file = tmp_path / "latin1.gin"
  gin_file.write_bytes("MODEL_DIR = 'caf\u00e9'\n".encode("latin-1"))
  outcome = harness.run_main(capfd, entry, [f"--gin_file={gin_file}"])
  harness.assert_user_error(outcome, str(gin_file), "UTF-8")


# --- E11: a missing --model_dir does not exist ----------------------------------------------------------------


def test_export_of_a_missing_run_says_it_does_not_exist(tmp_path, capfd):
  outcome = harness.run_main(capfd, "export_hf", [f"--model_dir={tmp_path / 'nope'}", f"--output={tmp_path / 'hf'}",
                                                  "--layout=bert"])
  harness.assert_user_error(outcome, "does not exist", model_dir=tmp_path / "hf", before=None)
  assert "no checkpoint" not in outcome.err


# --- C17: vocab --output=x.model writes x.model ------------------------------------------------------------------


@pytest.mark.contract
def test_vocab_output_ending_in_model_is_the_file_itself(tmp_path, capfd):
  from tests.conftest import tiny_sentences

  text = tmp_path / "in.txt"
  text.write_text("\n".join(tiny_sentences("en", 200)), encoding="utf-8")
  outcome = harness.run_main(capfd, "vocab", [f"--input={text}", "--vocab_size=45", "--model_type=bpe",
                                              f"--output={tmp_path / 'x.model'}"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert sorted(os.listdir(tmp_path)) == ["in.txt", "x.model"]


# --- C18: a lock leaves no folder it made --------------------------------------------------------------------


def test_the_lock_removes_every_folder_it_made_and_only_those(tmp_path):
  (tmp_path / "c").mkdir()
  with pytest.raises(RuntimeError):
    with fileio.output_lock(tmp_path / "c" / "n1" / "n2" / "n3"):
      assert (tmp_path / "c" / "n1" / "n2" / "n3").is_dir()
      raise RuntimeError("the work failed")
  assert os.listdir(tmp_path / "c") == []  # n1 and n2 too; c was there before.
  with fileio.output_lock(tmp_path / "c" / "n1" / "n2" / "n3"):
    (tmp_path / "c" / "n1" / "n2" / "kept.txt").write_text("written\n")
  assert sorted(os.listdir(tmp_path / "c" / "n1" / "n2")) == ["kept.txt"]  # n3 went; n2 holds a file: kept.


@pytest.mark.contract
def test_cache_of_an_unknown_task_leaves_no_folder(tmp_path, capfd):
  (tmp_path / "c").mkdir()
  outcome = harness.run_main(capfd, "cache", ["--task=nosuch_task_47", f"--output={tmp_path / 'c/n1/n2/n3'}",
                                              "--examples=4"])
  harness.assert_user_error(outcome, "nosuch_task_47")
  assert os.listdir(tmp_path / "c") == []


# --- M03: the long-line warning names max_length and the model's positions ------------------------------------------


@pytest.mark.parametrize("layout, max_length, expected", [
    ("restart", 256, ("max_length=256", "at most 30 subwords per side", "32 positions", "keeps no more")),
    ("restart", 40, ("max_length=40", "at most 30 subwords per side", "raise max_length (up to 64)")),
    ("continuous", 256, ("max_length=256", "32 positions", "keeps no more")),
    ("continuous", 20, ("max_length=20", "raise max_length (up to 32)")),
])
def test_the_cut_pairs_warning_names_both_limits(layout, max_length, expected):
  from flax_xalign.evaluation.word_alignment.word_align import WordAligner

  aligner = types.SimpleNamespace(config=types.SimpleNamespace(num_positions=32), pair_layout=layout,
                                  max_length=max_length)
  words = WordAligner._budget_words(aligner)
  for part in expected:
    assert part in words, words
  assert "budget of 256 positions per pair" not in words


# --- M11c: eval asks only where it writes to be writable -------------------------------------------------------


def test_eval_of_a_read_only_run_into_a_file_elsewhere_is_not_refused_for_the_run(read_only_dir, tmp_path):
  from flax_xalign.evaluation import mlm_eval
  from flax_xalign.run_dir import RunDir

  run = types.SimpleNamespace(path=str(read_only_dir), dir=RunDir(str(read_only_dir)))
  # batch_size=0 is refused right after the output check: the check got past the read-only run.
  with pytest.raises(UserError, match="evaluate.batch_size"):
    mlm_eval.evaluate(run, split="validation", batch_size=0, output=str(tmp_path / "elsewhere" / "eval.json"))
  with pytest.raises(UserError, match="not writable"):  # Into the run itself: refused as before.
    mlm_eval.evaluate(run, split="validation", batch_size=0)


# --- eflomal --bible: a user's folder of train.tsv / validation.tsv is refused --------------------------------------


def test_eflomal_bible_refuses_a_users_folder_of_the_same_names(tmp_path, capfd, monkeypatch):
  from flax_xalign.evaluation.word_alignment import bible_links

  called = []
  monkeypatch.setattr(bible_links, "write_bible_links", lambda folder, **kw: called.append(folder) or (None, {}))
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "train.tsv").write_text("my own sentences\tmeine Saetze\n", encoding="utf-8")
  (mine / "validation.tsv").write_text("held out\tzurueck\n", encoding="utf-8")
  before = harness.tree_digest(mine)
  outcome = harness.run_main(capfd, "eflomal", ["--bible", f"--output_dir={mine}"])
  harness.assert_user_error(outcome, "--output_dir", "non-empty folder", model_dir=mine, before=before)
  assert called == []  # Refused before eflomal ran.


def test_eflomal_bible_writes_again_into_a_folder_it_marked(tmp_path, monkeypatch):
  from flax_xalign.cli import eflomal
  from flax_xalign.evaluation.word_alignment import bible_links

  ours = tmp_path / "links"
  ours.mkdir()
  (ours / "train.tsv").write_text("a\tb\n", encoding="utf-8")
  (ours / "NOTICE").write_text("licence\n", encoding="utf-8")
  (ours / fileio.MARK).write_text(json.dumps({"command": "xalign eflomal --bible", "files": ["train.tsv", "NOTICE"],
                                              "pid": 1, "host": "h"}))
  called = []
  args = types.SimpleNamespace(input=None, bible=True, output_dir=str(ours), symmetrize="grow-diag-final-and")
  monkeypatch.setattr(bible_links, "write_bible_links", lambda folder, **kw: called.append(folder) or (
      types.SimpleNamespace(version="stub", seconds=0.0), {}))
  eflomal.run(args)
  assert called == [str(ours)]
