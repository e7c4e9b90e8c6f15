"""A packed cache proves it belongs to the run before MODEL_DIR is created (issue 39, part 3).

Each case builds the cache a tiny run describes (`xalign cache`, in-process), changes one thing a run
must not accept (the vocabulary file the run's tasks name, an evaluation split's row length, languages,
task or vocabulary, a record layout, the verification mode), runs `flax_xalign.train.main` in-process and
checks C1 (tests/hardening/harness.py): exit status 2, one `error:` line naming the problem, and no
MODEL_DIR. The last case checks that the same checks pass the unchanged cache (a refusal for the right
reason, not of every cache).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from flax_xalign.data.packed import format as format_lib
from tests.hardening import harness

pytestmark = pytest.mark.contract  # C1 checks, in-process; no training.

TAG = "prov"
TASK = f"{TAG}_mix"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_corpus):
  """{gin (the run with its task definitions), vocab (the file they name), cache (train + validation),
  long (a validation split of row length 21)}."""
  root = tmp_path_factory.mktemp("provenance")
  vocab = root / "spm.model"  # The run's tasks name this file; a test rewrites it in place.
  shutil.copyfile(tiny_corpus["vocab"], vocab)
  gin_file = harness.write_run_gin(root / "run.gin", tiny_corpus, tag=TAG, vocab=str(vocab))
  cache = harness.build_cache(gin_file, root / "cache", examples=36)
  assert harness.call_main("cache", [f"--gin_file={gin_file}", "--split=validation", f"--output={cache}"]) == 0
  long = root / "long"
  assert harness.call_main("cache", [f"--gin_file={gin_file}", "--split=validation", f"--output={long}",
                                     "--length=21"]) == 0
  return {"root": root, "gin": gin_file, "vocab": str(vocab), "cache": cache, "long": str(long)}


@pytest.fixture
def cache(built, tmp_path):
  """A private copy of the cache (train + validation)."""
  target = tmp_path / "cache"
  shutil.copytree(built["cache"], target)
  return str(target)


def _edit_manifest(cache: str, split: str, change) -> None:
  path = os.path.join(cache, split, format_lib.MANIFEST)
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  change(manifest)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(manifest, f)


def _cache_only_gin(tmp_path, cache: str, *, eval_every: int = 0) -> str:
  """A run that defines no task and reads `cache` (its vocabulary is the cache's)."""
  return harness.write_cache_run_gin(tmp_path / "cache_run.gin", cache, task=TASK, eval_every=eval_every)


def _refused(capfd, tmp_path, gin_file: str, *keywords, flags=()) -> None:
  model_dir = tmp_path / "m"
  outcome = harness.run_main(capfd, "train", harness.train_argv(gin_file, model_dir, "--gin.TRAIN_STEPS=2", *flags))
  harness.assert_user_error(outcome, *keywords, model_dir=model_dir, before=None)


def test_a_vocabulary_file_changed_since_the_cache_was_built_is_refused_by_sha256(built, cache, tmp_path, capfd):
  # The run's tasks name the file the cache was built with; its bytes changed since (retrained in place, same
  # name). Task names are global in a process, so the file is changed where it is, and restored after.
  gin_file = tmp_path / "run.gin"
  gin_file.write_text(open(built["gin"], encoding="utf-8").read() + f"\ntrain.data = 'cache:{cache}'\n")
  original = open(built["vocab"], "rb").read()
  try:
    with open(built["vocab"], "wb") as f:
      f.write(original + b"\n")
    ours = hashlib.sha256(original + b"\n").hexdigest()[:12]
    _refused(capfd, tmp_path, str(gin_file), "another vocabulary", built["vocab"], ours, "rebuild the cache")
  finally:
    with open(built["vocab"], "wb") as f:
      f.write(original)


def test_an_evaluation_split_of_another_row_length_is_refused(built, cache, tmp_path, capfd):
  shutil.rmtree(os.path.join(cache, "validation"))
  shutil.copytree(os.path.join(built["long"], "validation"), os.path.join(cache, "validation"))
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache, eval_every=2),
           "validation", "row length 21", "19", "TASK_FEATURE_LENGTHS")


def test_an_evaluation_split_of_other_languages_is_refused(cache, tmp_path, capfd):
  _edit_manifest(cache, "validation", lambda m: m.update(languages=["de", "fr"]))  # Same count: same bounds.
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache, eval_every=2), "validation", "languages", "'fr'")


def test_an_evaluation_split_of_another_task_is_refused(cache, tmp_path, capfd):
  _edit_manifest(cache, "validation", lambda m: m.update(task=f"{TAG}_en"))
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache, eval_every=2), "validation", "task", f"{TAG}_en")


def test_an_evaluation_split_of_another_vocabulary_is_refused(cache, tmp_path, capfd):
  other = b"another vocabulary"
  with open(os.path.join(cache, "validation", "vocabulary.model"), "wb") as f:
    f.write(other)
  _edit_manifest(cache, "validation", lambda m: m["vocabulary"].update(sha256=hashlib.sha256(other).hexdigest()))
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache, eval_every=2), "'validation' split", "vocabulary",
           "--split=validation")


def test_the_train_split_of_other_languages_is_refused(cache, tmp_path, capfd):
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache), "languages", "train.languages",
           flags=("--gin.train.languages=['en']",))


def test_records_of_another_size_than_the_manifests_layout_are_refused(cache, tmp_path, capfd):
  def widen_tokens(manifest):
    manifest["features"][0][1] = "uint32" if manifest["features"][0][1] != "uint32" else "uint16"
  _edit_manifest(cache, "train", widen_tokens)
  for verify in ("full", "size"):
    _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache), "bytes", "layout", "rebuild the cache",
             flags=(f"--gin.train.cache_verify='{verify}'",))


def test_a_verification_mode_that_does_not_exist_is_refused(cache, tmp_path, capfd):
  _refused(capfd, tmp_path, _cache_only_gin(tmp_path, cache), "train.cache_verify", "'full'", "'size'",
           flags=("--gin.train.cache_verify='sha256'",))


def test_the_unchanged_cache_passes_every_check_the_cases_above_fail(built, tiny_corpus):
  from flax_xalign.training.data import resolve_task, task_vocabulary_files
  from flax_xalign.tasks import user

  definitions = [user.TextTask(name=f"{TAG}_en", files={}, lang="en", vocabulary_path=built["vocab"]),
                 user.AlphaMixture(name=TASK, tasks=[f"{TAG}_en"])]
  files = task_vocabulary_files(definitions, TASK)
  assert files == [built["vocab"]]
  for verify in ("full", "size"):
    source = resolve_task(TASK, data=f"cache:{built['cache']}", verify=verify, vocabulary_files=files)
    source.check_splits(["train", "validation"], feature_lengths={"tokens": 19})
    assert sorted(source._opened) == ["train", "validation"]  # pylint: disable=protected-access


def test_a_train_split_refused_for_its_row_length_is_not_preceded_by_the_evaluation_warning(cache, tmp_path, capfd):
  """The 2026-11-27 probe's N1 / 2026-12-01's V08: the refusal came after a warning that the cache has no
  validation split (training without evaluation), a warning about a run that was never going to start."""
  shutil.rmtree(os.path.join(cache, "validation"))
  model_dir = tmp_path / "m"
  outcome = harness.run_main(capfd, "train", harness.train_argv(
      _cache_only_gin(tmp_path, cache, eval_every=2), model_dir, "--gin.TRAIN_STEPS=2",
      "--gin.TASK_FEATURE_LENGTHS={'tokens': 21}"))
  harness.assert_user_error(outcome, "row length", "21", model_dir=model_dir, before=None)
  assert not harness.warning_lines(outcome.err), outcome.err
