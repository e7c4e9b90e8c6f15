"""`xalign cache` in-process (the contract tier): a split written, and one `error:` line for bad
input, from the command and from `train` pointed at a cache that does not fit the run (MODEL_DIR untouched).
The format and reader are tested in tests/data/test_packed.py; training from a cache without TensorFlow and
its exact resume in tests/training/test_train_from_cache.py."""

import json
import os
import shutil

import pytest

from flax_xalign.data.packed import format as format_lib
from tests import testlib
from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def cache(tiny_corpus, tmp_path_factory):
  root = tmp_path_factory.mktemp("cache_cli") / "cache"
  from flax_xalign.cli import cache as cache_cli

  assert cache_cli.main(["--task=tiny_mix", f"--output={root}", "--length=19", "--examples=24"]) == 0
  return root


def test_writes_a_split_with_its_manifest_and_vocabulary(cache, tiny_corpus, tmp_path, capfd):
  outcome = harness.run_main(capfd, "cache", ["--task=tiny_de_en", "--split=validation", f"--output={tmp_path}",
                                              "--length=23", "--epochs=2"])
  assert outcome.code == 0, outcome.err[-2000:]
  assert "wrote" in outcome.out and "rows of 23 tokens" in outcome.out
  packed = format_lib.open_split(str(tmp_path), "validation")
  assert packed.manifest.order == {"shuffled": False, "epochs": 2} and packed.manifest.language_pairs == (("de", "en"),)
  with open(tiny_corpus["vocab"], "rb") as f:
    assert open(packed.vocabulary_path, "rb").read() == f.read()
  assert sorted(os.listdir(tmp_path)) == ["validation"]  # No temporary folder left behind.


def test_a_gin_run_names_the_task_its_definitions_and_the_row_length(tiny_corpus, tmp_path, capfd):
  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="cc")
  outcome = harness.run_main(capfd, "cache", [f"--gin_file={gin_file}", f"--output={tmp_path / 'c'}",
                                              "--examples=12"])
  assert outcome.code == 0, outcome.err[-2000:]
  manifest = format_lib.open_split(str(tmp_path / "c"), "train").manifest
  assert manifest.task == "cc_mix" and manifest.length == 19 and manifest.examples == 12
  assert [d["args"]["name"] for d in manifest.task_definitions] == ["cc_en", "cc_de_en", "cc_mix"]


def test_an_existing_split_is_kept_unless_overwrite(cache, capfd):
  before = harness.tree_digest(cache)
  outcome = harness.run_main(capfd, "cache", ["--task=tiny_mix", f"--output={cache}", "--length=19",
                                              "--examples=24"])
  harness.assert_user_error(outcome, "already exists", "--overwrite")
  assert harness.tree_digest(cache) == before


@pytest.mark.parametrize("flags, keywords", [
    (["--task=no_such_task"], ("no_such_task",)),
    (["--task=tiny_mix", "--examples=3", "--epochs=2"], ("--epochs", "--examples")),
    (["--task=tiny_mix", "--length=0"], ("--length=0",)),
    (["--task=tiny_mix", "--split=test"], ("no 'test' split", "--split")),
    (["--output={file}", "--task=tiny_mix"], ("is a file",)),
    ([], ("--task",)),
    (["--task=tiny_mix", "--bogus=1"], ("--bogus",)),
], ids=["unknown_task", "examples_and_epochs", "zero_length", "missing_split", "output_is_a_file", "no_task",
        "unknown_flag"])
def test_refuses_bad_input(flags, keywords, tiny_corpus, tmp_path, capfd):
  (tmp_path / "file").write_text("x")
  argv = [f.format(file=tmp_path / "file") for f in flags]
  if not any(f.startswith("--output") for f in argv):
    argv.append(f"--output={tmp_path / 'out'}")
  outcome = harness.run_main(capfd, "cache", argv)
  harness.assert_user_error(outcome, *keywords)
  assert not (tmp_path / "out").exists()


# --- train from a cache that does not fit: refused before MODEL_DIR is touched --------------------------


def _train_gin(tmp_path, cache, extra=""):
  path = tmp_path / "run.gin"
  path.write_text(f"include 'runs/pretrain.gin'\n{testlib.tiny_encoder_gin()}\nMIXTURE_OR_TASK_NAME = 'tiny_mix'\n"
                  f"TASK_FEATURE_LENGTHS = {{'tokens': 19}}\nBATCH_SIZE = 6\nTRAIN_STEPS = 2\nEVAL_EVERY = 0\n"
                  f"train.data = 'cache:{cache}'\n{extra}\n")
  return str(path)


def _damage_shard(root):
  path = os.path.join(root, "train", format_lib.shard_name(0))
  with open(path, "r+b") as f:
    f.seek(50)
    byte = f.read(1)
    f.seek(50)
    f.write(bytes([byte[0] ^ 0xFF]))


def _other_vocabulary(root):
  path = os.path.join(root, "train", format_lib.MANIFEST)
  manifest = json.load(open(path))
  manifest["vocabulary"]["sha256"] = "0" * 64
  json.dump(manifest, open(path, "w"))


@pytest.mark.parametrize("bindings, damage, keywords", [
    (["--gin.MIXTURE_OR_TASK_NAME='tiny_en'"], None, ("tiny_mix", "MIXTURE_OR_TASK_NAME")),
    (["--gin.TASK_FEATURE_LENGTHS={'tokens': 17}"], None, ("row length 19", "TASK_FEATURE_LENGTHS")),
    (["--gin.BATCH_SIZE=30"], None, ("fewer than one global batch", "BATCH_SIZE")),
    (["--gin.train.pair_layout='continuous'"], None, ("pair layout", "train.pair_layout")),
    ([], _damage_shard, ("sha256", "rebuild")),
    ([], _other_vocabulary, ("vocabulary", "sha256")),
    (["--gin.train.data='cache:{cache}-nowhere'"], None, ("does not exist", "xalign cache")),
    (["--gin.train.data='grain:{cache}'"], None, ("not a data source", "cache:DIR")),
    (["--gin.train.objectives={'mlm': 1.0, 'so': 1.0}", "--gin.train.objective_options={'so': @SoConfig()}",
      "--gin.SoConfig.label_source='union'"], None, ("link_groups", "written without them", "--links")),
], ids=["other_task", "other_length", "batch_larger_than_cache", "other_pair_layout", "damaged_shard",
        "vocabulary_file_not_the_manifests", "no_cache", "bad_scheme", "links_needed_not_cached"])
def test_train_refuses_a_cache_that_does_not_fit(bindings, damage, keywords, cache, tmp_path, capfd):
  copy = tmp_path / "cache"
  shutil.copytree(cache, copy)
  if damage:
    damage(str(copy))
  model_dir = tmp_path / "model"
  argv = harness.train_argv(_train_gin(tmp_path, copy), model_dir, *[b.replace("{cache}", str(copy)) for b in bindings])
  outcome = harness.run_main(capfd, "train", argv)
  harness.assert_user_error(outcome, *keywords)
  assert not model_dir.exists()


def test_train_without_a_cached_eval_split_warns_and_trains(cache, tmp_path, capfd):
  """The module's cache has no validation split: one warning naming the command that builds it."""
  model_dir = tmp_path / "model"
  argv = harness.train_argv(_train_gin(tmp_path, cache), model_dir, "--gin.EVAL_EVERY=2", "--gin.CHECKPOINT_EVERY=2")
  outcome = harness.run_main(capfd, "train", argv)
  assert outcome.code == 0, outcome.err[-2000:]
  warnings = harness.warning_lines(outcome.err)
  assert len(warnings) == 1 and f"packed cache {cache} has no 'validation' split" in warnings[0], warnings
  assert "--split=validation" in warnings[0] and "eval: loss" not in outcome.out
  assert (model_dir / "checkpoints" / "2" / "data_iterator_cache").is_dir()


@pytest.mark.subprocess  # Two spawned worker processes.
def test_workers_write_the_union_of_the_seqio_shard_streams(tiny_corpus, tmp_path, capfd):
  import collections

  import numpy as np

  from flax_xalign.data import pipeline
  from flax_xalign.data.packed import read
  from flax_xalign.training.data import resolve_task

  outcome = harness.run_main(capfd, "cache", ["--task=tiny_mix", "--split=validation", f"--output={tmp_path}",
                                              "--length=19", "--workers=2", "--shard_mb=1"])
  assert outcome.code == 0, outcome.err[-3000:]
  packed = format_lib.open_split(str(tmp_path), "validation")
  assert packed.manifest.order == {"shuffled": False, "epochs": 1, "workers": 2}
  assert sorted(os.listdir(tmp_path / "validation")) == [".xalign_written_by.json", "manifest.json",  # (its mark)
                                                         "shard-00000.array_record", "shard-00001.array_record",
                                                         "vocabulary.model"]
  names = format_lib.FEATURES

  def keys(batch):
    return [tuple(np.concatenate([batch[n][i] for n in names]).tolist()) for i in range(len(batch["tokens"]))]

  cached = [k for b in read.PackedBatches(packed, batch_size=1, seed=None, shuffle=False, num_epochs=1)
            for k in keys(b)]
  data = resolve_task("tiny_mix")
  reference = []
  for shard in range(2):
    for row in pipeline.converted_rows(data.provider, languages=data.languages, split="validation",
                                       feature_lengths={"tokens": 19}, seed=0, shuffle=False,
                                       specials=data.vocabulary_spec.specials, num_epochs=1, shard_id=shard,
                                       num_shards=2):
      reference += keys({n: row[n][None] for n in names})
  assert cached == reference  # Worker 0's rows (shard 0), then worker 1's.
  assert collections.Counter(cached) == collections.Counter(reference) and len(cached) == packed.manifest.examples


@pytest.mark.subprocess  # `xalign cache --workers=2` in a child, SIGTERMed while its spawned workers run.
def test_sigterm_to_the_parent_stops_its_workers_and_leaves_no_staging_folder(tiny_corpus, tmp_path):
  """Issue 47 (drivers own their children): a scheduler's SIGTERM, sent to the parent's pid alone, killed the
  parent at once and left its daemon workers running as orphans, and their staging folder behind."""
  import signal
  import subprocess
  import sys
  import time

  import psutil

  gin_file = harness.write_run_gin(tmp_path / "run.gin", tiny_corpus, tag="sigt")
  out = tmp_path / "cache"
  with open(tmp_path / "stderr", "wb") as stderr:
    proc = subprocess.Popen([sys.executable, "-m", "flax_xalign.cli.cache", f"--gin_file={gin_file}",
                             f"--output={out}", "--split=validation", "--workers=2", "--shard_mb=1"],
                            cwd=harness.REPO, env=harness.child_env(), stdout=subprocess.DEVNULL, stderr=stderr)
  try:
    deadline, workers = time.monotonic() + 120, []
    while proc.poll() is None and time.monotonic() < deadline and len(workers) < 2:
      time.sleep(0.05)
      workers = [p for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]
    assert len(workers) == 2, (tmp_path / "stderr").read_text()[-2000:]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 143, (tmp_path / "stderr").read_text()[-2000:]
  finally:
    if proc.poll() is None:
      proc.kill()
  gone, alive = psutil.wait_procs(workers, timeout=10)
  assert not alive, f"workers outlived their parent: {[p.pid for p in alive]}"
  err = (tmp_path / "stderr").read_text().strip().splitlines()
  assert err[-1:] == ["terminated (SIGTERM); nothing was left half-written"] and "Traceback" not in "\n".join(err)
  assert not [n for n in (os.listdir(out) if out.exists() else []) if ".tmp" in n], os.listdir(out)
