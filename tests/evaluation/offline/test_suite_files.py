"""The suite's file layer without a model: ragged rows, the suite checks, the MLM language remap, empty fields."""

import json

import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.offline import suite_files as sf


def test_ragged_rows_round_trip_with_empty_and_single_rows(tmp_path):
  rows = [[5, 6, 7], [], [9], list(range(40, 52))]
  sf.save_ragged(str(tmp_path / "r.npz"), rows)
  back = sf.load_ragged(str(tmp_path / "r.npz"))
  assert [r.tolist() for r in back] == rows
  sf.save_ragged(str(tmp_path / "none.npz"), [])
  assert sf.load_ragged(str(tmp_path / "none.npz")) == []


def test_a_folder_without_suite_json_or_of_another_format_is_refused(tmp_path):
  with pytest.raises(UserError, match="not an evaluation suite"):
    sf.Suite(str(tmp_path))
  (tmp_path / sf.SUITE_JSON).write_text(json.dumps({"format": "other", "version": 1}))
  with pytest.raises(UserError, match="not a version-1"):
    sf.Suite(str(tmp_path))
  (tmp_path / sf.SUITE_JSON).write_text("{")
  with pytest.raises(UserError, match="not valid JSON"):
    sf.Suite(str(tmp_path))


def test_a_file_the_suite_names_but_lacks_is_named(tmp_path):
  (tmp_path / sf.SUITE_JSON).write_text(json.dumps({"format": sf.FORMAT, "version": sf.VERSION,
                                                    "tokens": sf.TOKENS_JSON}))
  suite = sf.Suite(str(tmp_path))
  with pytest.raises(UserError, match="tokens.json is missing"):
    suite.tokens(sf.WORDS)


def test_the_recorder_keeps_what_it_was_asked_and_the_table_answers_it():
  calls = []
  recorder = sf.Recorder(lambda text: calls.append(text) or [len(text), 3])
  assert recorder.encode("haus") == [4, 3] and recorder.encode("haus") == [4, 3] and calls == ["haus"]
  table = sf.TokenTable(recorder.table, name="words")
  assert table.encode("haus") == [4, 3]
  with pytest.raises(UserError, match="no entry for 'maus'"):
    table.encode("maus")


def test_mlm_rows_move_onto_the_scored_runs_language_ids():
  from flax_xalign.evaluation.offline.scoring import remap_language_ids

  # Written for [de, en] (ids 1, 2), scored by a run of [en, fr, de] (en 1, fr 2, de 3).
  arrays = {"lang_ids": np.array([[1, 2, 0], [2, 2, 1]], np.int32), "top_token": np.array([0, 17, 23])}
  top = remap_language_ids(arrays, ["de", "en"], ["en", "fr", "de"])
  assert arrays["lang_ids"].tolist() == [[3, 1, 0], [1, 1, 3]] and arrays["lang_ids"].dtype == np.int32
  assert top.tolist() == [0, 23, 0, 17] and "top_token" not in arrays
  with pytest.raises(UserError, match=r"\['de'\], which"):
    remap_language_ids({"lang_ids": np.zeros((1, 1), np.int32), "top_token": np.zeros(2)}, ["de"], ["en"])


def test_an_unfilled_field_is_a_user_error_naming_it():
  from flax_xalign.evaluation.offline.scoring import _check_filled

  _check_filled({"a": [1, {"b": 0.5}], "c": float("nan")}, "score")
  with pytest.raises(UserError, match=r"score\.a\[1\]\.b could not be computed"):
    _check_filled({"a": [1, {"b": None}]}, "score")
