"""Objectives that need translation pairs refuse monolingual-only data before training."""

import pytest

from flax_xalign.errors import UserError
from flax_xalign.training.pretrain import TrainConfig, assemble


def _assemble(task, objectives, encoder):
  # assemble reads neither MODEL_DIR nor the batch size or schedule.
  return assemble(TrainConfig(model_dir="unused", mixture_or_task_name=task, task_feature_lengths={"tokens": 19},
                              batch_size=1, train_steps=1, encoder=encoder, objectives=objectives))


@pytest.mark.parametrize("objective, what", [("tlm", "translation pairs"), ("dwa", "translation pairs")])
def test_bitext_objective_on_monolingual_data_is_refused(tiny_corpus, tiny_encoder, objective, what):
  with pytest.raises(UserError) as e:
    _assemble("tiny_en", {"mlm": 1.0, objective: 1.0}, tiny_encoder)
  message = str(e.value)
  assert f"the {objective!r} objective" in message and what in message and "'tiny_en' has no bitext" in message
  assert "Add a bitext task" in message and "train.objectives = {'mlm': 1.0}" in message


def test_bitext_objectives_train_on_a_mixture_with_pairs(tiny_corpus, tiny_encoder):
  assert _assemble("tiny_mix", {"mlm": 1.0, "tlm": 1.0}, tiny_encoder).run.language_pairs == (("de", "en"),)
  assert _assemble("tiny_en", {"mlm": 1.0}, tiny_encoder).run.objectives == {"mlm": 1.0}
