"""The gin edge of the evaluations: `model_dir` opened once into a Run, the evaluation's own options kept."""

import inspect

import pytest

from flax_xalign.runs.by_folder import taking_model_dir
from flax_xalign.errors import UserError
from flax_xalign.evaluation import mlm_eval
from flax_xalign.evaluation.transfer import transfer
from flax_xalign.runs import Run


@pytest.mark.parametrize("evaluation", [mlm_eval.evaluate, transfer.pair_transfer_from_files])
def test_the_gin_signature_is_the_evaluations_with_model_dir_for_run(evaluation):
  own = list(inspect.signature(evaluation).parameters.values())
  edge = list(inspect.signature(taking_model_dir(evaluation)).parameters.values())
  assert own[0].name == "run" and "model_dir" not in [p.name for p in own]
  assert edge[0].name == "model_dir" and edge[0].kind == inspect.Parameter.KEYWORD_ONLY
  assert edge[0].default is inspect.Parameter.empty  # Required, as gin reports it when unbound.
  assert edge[1:] == own[1:]


def test_the_folder_is_opened_once_and_the_run_passed_down(tmp_path, monkeypatch):
  opened = []
  monkeypatch.setattr(Run, "open", classmethod(lambda cls, path, step=None: opened.append((path, step)) or "RUN"))

  def evaluation(run, *, split="test"):
    return run, split

  edge = taking_model_dir(evaluation)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert edge(model_dir="~/runs/x", split="validation") == ("RUN", "validation")
  ((path, step),) = opened
  assert str(path) == str(tmp_path / "runs" / "x") and step is None  # `~` expanded, the latest step.
  with pytest.raises(UserError, match="MODEL_DIR"):
    edge(model_dir="")
  with pytest.raises(TypeError, match="does not take a run first"):
    taking_model_dir(lambda model_dir: None)
