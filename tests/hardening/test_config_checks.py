"""Configuration checked before work, and the ugly outcomes of the probe (issue 39, parts 5 and 7).

* Every evaluator option's type and value (layers, methods, files) for EVALS (`eval`) and TRAIN_EVALS
  (`train`): one error line naming the option and the fix; `eval` leaves MODEL_DIR as it was, `train` never
  creates it.
* An objective whose labels can never arrive (DWA / SO reading given word links of a task that has none) is
  refused at assembly, before MODEL_DIR, instead of training at loss 0.
* A MODEL_DIR that is not a run is told so; eval.json is never replaced by the other layout; experiment
  drivers name themselves as typed (`xalign <cmd>`) and add no second error line; the long-line warning
  counts lines, in one line.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract  # C1 checks, in-process and cheap per case: no training.


@pytest.fixture
def context(trained, trained_copy, tmp_path):
  lines = pathlib.Path(trained["corpus"]["files"][("de_en", "validation")]).read_text().splitlines()[:4]
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("\n".join(lines) + "\n")
  gold = tmp_path / "gold.txt"
  gold.write_text("0-0\n" * 4)
  return {"dir": trained_copy, "gin": trained["gin"], "pairs": str(pairs), "gold": str(gold),
          "missing": str(tmp_path / "nogold.txt"), "new": tmp_path / "new_run"}


def _wa(c, **more) -> dict:
  return {"input": c["pairs"], "gold": c["gold"], "layers": [1], "methods": ["argmax"], **more}


# (id, EVALS, EVAL_OPTIONS given the context, keywords the one error line must hold)
EVAL_CASES = [
    ("layers_a_string", ["word_align"], lambda c: {"word_align": _wa(c, layers="12")},
     ("'layers'", "string", "list")),
    ("layers_one_number", ["word_align"], lambda c: {"word_align": _wa(c, layers=1)}, ("'layers'", "[1]")),
    ("similarity_unknown", ["word_align"], lambda c: {"word_align": _wa(c, similarity="l2")},
     ("similarity", "cosine")),
    ("layers_outside_the_model", ["word_align"], lambda c: {"word_align": _wa(c, layers=[9])},
     ("'layers'", "0..2")),
    ("layers_negative", ["word_align"], lambda c: {"word_align": _wa(c, layers=[-1])}, ("'layers'", "-1")),
    ("methods_a_string", ["word_align"], lambda c: {"word_align": _wa(c, methods="argmax")},
     ("'methods'", "string", "list")),
    ("methods_unknown", ["word_align"], lambda c: {"word_align": _wa(c, methods=["nosuch"])},
     ("nosuch", "argmax")),
    ("gold_missing_after_another_evaluator", ["mlm", "word_align"],
     lambda c: {"mlm": {"split": "validation"}, "word_align": _wa(c, gold=c["missing"])}, ("'gold'", "nogold")),
    # mlm's default split is 'test', which the shared run's tasks lack: refused before word_align runs.
    ("mlm_split_the_task_lacks_after_another_evaluator", ["word_align", "mlm"], lambda c: {"word_align": _wa(c)},
     ("'mlm'", "'test'", "EVAL_OPTIONS")),
    ("input_is_a_folder", ["word_align"], lambda c: {"word_align": _wa(c, input=str(c["dir"]))},
     ("'input'", "folder")),
    ("gold_format_unknown", ["word_align"], lambda c: {"word_align": _wa(c, gold_format="xml")},
     ("gold_format", "pharaoh")),
    ("bible_gold_unknown_split", ["word_align"], lambda c: {"word_align": {"bible_gold": "tset"}},
     ("bible_gold", "test")),
    ("batch_size_a_string", ["word_align"], lambda c: {"word_align": _wa(c, batch_size="8")},
     ("batch_size", "integer")),
    ("solver_value", ["word_align"], lambda c: {"word_align": _wa(c, sinkhorn_iters=0)}, ("sinkhorn_iters",)),
    ("mlm_batch_size_a_string", ["mlm"], lambda c: {"mlm": {"split": "validation", "batch_size": "8"}},
     ("batch_size", "integer")),
    ("bli_layer_not_a_number", ["bli"], lambda c: {"bli": {"src": "de", "tgt": "en", "layer": "x"}},
     ("'layer'",)),
    ("rsim_layers_outside_the_model", ["rsim"], lambda c: {"rsim": {"src": "de", "tgt": "en", "layers": 7}},
     ("'layers'", "0..2")),
    ("bli_gold_missing", ["bli"], lambda c: {"bli": {"src": "de", "tgt": "en", "gold": c["missing"]}},
     ("'gold'", "nogold")),
    ("bli_knn_a_string", ["bli"], lambda c: {"bli": {"src": "de", "tgt": "en", "knn": "10"}}, ("knn",)),
    ("retrieval_tsv_missing", ["retrieval"], lambda c: {"retrieval": {"tsv": c["missing"]}}, ("'tsv'", "nogold")),
    ("retrieval_method_unknown", ["retrieval"], lambda c: {"retrieval": {"tsv": c["pairs"], "method": "knn"}},
     ("method",)),
    ("transfer_train_missing", ["transfer"],
     lambda c: {"transfer": {"task": "xnli", "train": c["missing"], "test": c["pairs"]}}, ("'train'", "nogold")),
    ("evals_a_string", "mlm", lambda c: {}, ("EVALS", "['mlm']")),
    ("options_not_a_dict", ["mlm"], lambda c: ["mlm"], ("EVAL_OPTIONS", "dict")),
]


@pytest.mark.parametrize("case_id, evals, options, keywords", EVAL_CASES, ids=[c[0] for c in EVAL_CASES])
def test_eval_refuses_a_bad_evaluator_option_before_work(case_id, evals, options, keywords, context, capfd):
  del case_id
  before = harness.tree_digest(context["dir"])
  argv = [f"--gin.MODEL_DIR='{context['dir']}'", f"--gin.EVALS={evals!r}",
          f"--gin.EVAL_OPTIONS={options(context)!r}"]
  outcome = harness.run_main(capfd, "eval", argv)
  harness.assert_user_error(outcome, *keywords, model_dir=context["dir"], before=before)
  assert "evaluator " not in outcome.out, "an evaluator ran before the refusal"


TRAIN_CASES = [
    ("train_evals_gold_missing", lambda c: ["--gin.TRAIN_EVALS=['word_align']", "--gin.TRAIN_EVALS_EVERY=2",
                                            f"--gin.TRAIN_EVAL_OPTIONS={{'word_align': {_wa(c, gold=c['missing'])!r}}}"],
     ("TRAIN_EVAL_OPTIONS", "'gold'", "nogold")),
    ("train_evals_layers_outside_the_model", lambda c: [
        "--gin.TRAIN_EVALS=['word_align']", "--gin.TRAIN_EVALS_EVERY=2",
        f"--gin.TRAIN_EVAL_OPTIONS={{'word_align': {_wa(c, layers=[5])!r}}}"], ("TRAIN_EVAL_OPTIONS", "0..2")),
    ("train_evals_methods_a_string", lambda c: [
        "--gin.TRAIN_EVALS=['word_align']", "--gin.TRAIN_EVALS_EVERY=2",
        f"--gin.TRAIN_EVAL_OPTIONS={{'word_align': {_wa(c, methods='itermax')!r}}}"], ("'methods'", "list")),
    ("train_evals_a_string", lambda c: ["--gin.TRAIN_EVALS='mlm'", "--gin.TRAIN_EVALS_EVERY=2"],
     ("TRAIN_EVALS", "['mlm']")),
    # mlm's default split is 'test', which the shared run's tasks lack: it used to train, then stop at step 2.
    ("train_evals_split_the_task_lacks", lambda c: ["--gin.TRAIN_EVALS=['mlm']", "--gin.TRAIN_EVALS_EVERY=2"],
     ("'mlm'", "'test' split", "TRAIN_EVAL_OPTIONS")),
    ("dwa_links_on_a_task_without_links", lambda c: [
        "--gin.train.objectives={'mlm': 1.0, 'dwa': 1.0}", "--gin.train.objective_options={'dwa': @DwaConfig()}",
        "--gin.DwaConfig.label_source='links'"], ("DwaConfig.label_source", "links", "loss 0")),
    ("so_union_on_a_task_without_links", lambda c: [
        "--gin.train.objectives={'mlm': 1.0, 'so': 1.0}", "--gin.train.objective_options={'so': @SoConfig()}",
        "--gin.SoConfig.label_source='union'"], ("SoConfig.label_source", "links")),
]


@pytest.mark.parametrize("case_id, flags, keywords", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_refuses_bad_configuration_before_model_dir_exists(case_id, flags, keywords, context, capfd):
  del case_id
  argv = harness.train_argv(context["gin"], context["new"], "--gin.TRAIN_STEPS=2", *flags(context))
  outcome = harness.run_main(capfd, "train", argv)
  harness.assert_user_error(outcome, *keywords, model_dir=context["new"], before=None)


# --- part 7: the ugly outcomes -----------------------------------------------------------------


@pytest.mark.parametrize("entry", ["eval", "align", "bli", "retrieval"])
def test_a_folder_that_is_not_a_run_is_told_so(entry, context, tmp_path, capfd):
  folder = tmp_path / "holiday"
  (folder / "photos").mkdir(parents=True)
  (folder / "notes.txt").write_text("x\n")
  before = harness.tree_digest(folder)
  argv = {"eval": [f"--gin.MODEL_DIR='{folder}'"],
          "align": [f"--model_dir={folder}", f"--input={context['pairs']}", f"--output={tmp_path / 'a.txt'}"],
          "bli": [f"--model_dir={folder}", "--src=de", "--tgt=en"],
          "retrieval": [f"--model_dir={folder}", f"--tsv={context['pairs']}"]}[entry]
  outcome = harness.run_main(capfd, entry, argv)
  harness.assert_user_error(outcome, "not a flax_xalign run", "notes.txt", model_dir=folder, before=before)
  assert "train first" not in outcome.err


def test_eval_json_is_never_replaced_by_the_other_layout(context, capfd):
  model_dir = context["dir"]
  options = {"word_align": _wa(context)}
  done = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVALS=['word_align']",
                                          f"--gin.EVAL_OPTIONS={options!r}"])
  assert done.code == 0, harness.summary(done)
  before = harness.tree_digest(model_dir)
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{model_dir}'", "--gin.SPLIT='validation'",
                                             "--gin.BATCH_SIZE=6"])
  harness.assert_user_error(outcome, "eval.json", "evaluate.output", model_dir=model_dir, before=before)
  beside = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{model_dir}'", "--gin.SPLIT='validation'",
                                            "--gin.BATCH_SIZE=6", "--gin.evaluate.output='eval_mlm.json'"])
  assert beside.code == 0, harness.summary(beside)
  assert set(json.loads((model_dir / "eval.json").read_text())) == {"word_align"}
  assert json.loads((model_dir / "eval_mlm.json").read_text())["step"] == 4
  # And the other way round: the evaluators do not replace a masked-token accuracy file.
  (model_dir / "eval.json").write_text((model_dir / "eval_mlm.json").read_text())
  before = harness.tree_digest(model_dir)
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{model_dir}'", "--gin.EVALS=['word_align']",
                                             f"--gin.EVAL_OPTIONS={options!r}"])
  harness.assert_user_error(outcome, "eval.json", "evaluators.output", model_dir=model_dir, before=before)


@pytest.mark.parametrize("driver", ["align_mlm_grid", "code_switch", "mlm_gc", "bli_table"])
def test_an_experiment_driver_names_itself_as_typed(driver, capfd):
  outcome = harness.run_main(capfd, driver, ["--no_such_flag"])
  harness.assert_user_error(outcome, f"xalign {driver} --help")
  assert ".py" not in harness.error_message(outcome.err) and "flax_xalign.cli" not in outcome.err


def test_a_long_tsv_line_is_one_line_in_one_warning(tmp_path, trained, capsys):
  from flax_xalign.tasks import user
  from flax_xalign.tasks.registry import get_provider

  tsv = tmp_path / "long.tsv"
  tsv.write_text("a b\tc d\n" + "x " * 40 + "\t" + "y " * 40 + "\n")
  user.TsvBitextTask(name="cfg39_long_pair", files={"train": str(tsv)}, lang_a="de", lang_b="en",
                     vocabulary_path=trained["corpus"]["vocab"], max_line_chars=30).register()
  capsys.readouterr()
  list(get_provider("cfg39_long_pair").get_dataset(None, split="train", shuffle=False, num_epochs=1)
       .as_numpy_iterator())
  warnings = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning: ")]
  assert len(warnings) == 1, warnings
  assert ": 1 line of " in warnings[0] and "is longer than 30 characters" in warnings[0], warnings


def test_a_warning_of_ours_is_one_warning_line_not_a_path_and_a_class():
  import os
  import warnings

  from flax_xalign.cli import setup_process
  from flax_xalign.evaluation.word_alignment import word_align

  setup_process()
  text = warnings.formatwarning("5 of 6 sentence pairs exceed the budget", UserWarning, word_align.__file__, 215)
  assert text == "warning: 5 of 6 sentence pairs exceed the budget\n"
  other = warnings.formatwarning("deprecated", UserWarning, os.__file__, 1)  # Another package's keeps its form.
  assert other.startswith(os.__file__) and "UserWarning" in other
