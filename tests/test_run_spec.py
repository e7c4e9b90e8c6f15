"""The run manifest: JSON round trip, and one clear error for what it cannot read."""

import json

import pytest

from flax_xalign import run_spec
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from tests.testlib import tiny_encoder_config


def _spec(**changes):
  vocabulary = run_spec.VocabularySpec(
      file="vocabulary.model", sha256="ab" * 32, size=250002, pieces=250002,
      specials=SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=250001, first_regular=4, end_regular=250001))
  spec = run_spec.RunSpec(
      task="my_mix", languages=("de", "en"), language_pairs=(("de", "en"),), task_feature_lengths={"tokens": 19},
      task_definitions=({"kind": "TextTask", "args": {"name": "my_en"}},), vocabulary=vocabulary,
      model=tiny_encoder_config(vocab_size=250002, pointer_head=True), objectives={"mlm": 1.0, "dwa": 0.5},
      objective_options={"dwa": {"self_label_layer": 1, "solver": {"mu": 0.5}}}, monitors=("align",),
      asset_options={"dictionary": {"rate": 0.5}},
      assets={"vocabulary": {"version": 1, "sha256": "cd" * 32}}, seed=3, init_from_checkpoint="runs/cold")
  return spec.replace(**changes)


def test_json_round_trip_is_exact():
  spec = _spec()
  data = spec.to_json()
  assert json.loads(json.dumps(data)) == data  # Plain JSON, as the meta item stores it.
  assert run_spec.RunSpec.from_json(data) == spec
  assert run_spec.RunSpec.from_json(json.loads(json.dumps(data))) == spec
  assert run_spec.from_meta({"run": data, "assets": {}}, where="x") == spec
  plain = _spec(task_definitions=None, language_pairs=(), monitors=())
  assert run_spec.RunSpec.from_json(plain.to_json()) == plain
  assert spec.language_id("en") == 2 and spec.language_id("fr") == 0


def test_vocabulary_fingerprint_names_what_must_match():
  spec = _spec()
  assert spec.vocabulary.fingerprint()["specials"]["mask"] == 250001
  other = _spec().vocabulary.__class__(**{**spec.vocabulary.__dict__, "factor": 2})
  assert other.fingerprint() != spec.vocabulary.fingerprint()


def test_old_or_newer_manifests_are_one_clear_error():
  with pytest.raises(UserError, match="before run manifests"):
    run_spec.from_meta({"model": {}, "languages": ["en"], "task": "t"}, where="runs/old")
  data = _spec().to_json()
  data["version"] = run_spec.VERSION + 1
  with pytest.raises(UserError, match="manifest version"):
    run_spec.RunSpec.from_json(data)


def test_manifest_written_before_task_definitions_still_loads():
  data = _spec().to_json()
  del data["task_definitions"]
  assert run_spec.RunSpec.from_json(data).task_definitions == ()
  recorded = _spec(task_definitions=({"kind": "PythonModule", "args": {"module": "my_tasks"}},))
  assert run_spec.RunSpec.from_json(recorded.to_json()) == recorded
