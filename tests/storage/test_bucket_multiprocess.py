"""Two processes (the hosts of a pod, on CPU: docs/MULTIHOST.md) train ONE run in a bucket.

Only the chief writes the run's files (metrics, config, lock, vocabulary); every process writes its own
checkpoint shards and data position; the losses equal one process holding all four devices on a local disk.
The processes read a local packed cache (no TensorFlow in them): the subject is the bucket.
"""

import json

import numpy as np
import pytest

from tests.training import test_multiprocess as mp

pytestmark = pytest.mark.subprocess

# The two-process machinery and its fixtures, shared with tests/training/test_multiprocess.py.
run_gin, cache_run_gin, cross_process_collectives = mp.run_gin, mp.cache_run_gin, mp.cross_process_collectives


def test_two_processes_train_one_gs_run_and_match_one_local_process(tmp_path, gcs, cache_run_gin,
                                                                     cross_process_collectives):
  shards = ["--gin.train.data_shards=2"]
  argv = mp._train_argv(cache_run_gin, "gs://bucket/two_hosts", *shards, gin_name="cache.gin")
  two = mp._launch(tmp_path, argv, num_processes=2, devices=2, name="two", import_dir=cache_run_gin)
  assert [rc for rc, _, _ in two] == [0, 0], mp._tails(two)
  names = gcs.objects("bucket", "two_hosts/")
  committed = sorted(int(n.split("/")[2]) for n in names
                     if n.endswith("/commit_success.txt") and n.count("/") == 3)  # (the step's, not an item's)
  assert committed == [3, 6], names
  positions = sorted(n.rsplit("/", 1)[1] for n in names
                     if "/checkpoints/6/data_iterator_cache/process_" in n)
  assert positions == ["process_0.json", "process_1.json"], positions
  for name in ("config.gin", "vocabulary.model", ".lock", "metrics.jsonl"):
    assert f"two_hosts/{name}" in names, name
  rows = [json.loads(line) for line in gcs.read("bucket", "two_hosts/metrics.jsonl").decode().splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], "rows from the chief only, each once"

  local = tmp_path / "one"
  one = mp._launch(tmp_path, mp._train_argv(cache_run_gin, local, *shards, gin_name="cache.gin"), num_processes=1,
                   devices=4, name="one", import_dir=cache_run_gin)
  assert [rc for rc, _, _ in one] == [0], mp._tails(one)
  reference = {r["step"]: r for r in mp._rows(local)}
  for row in rows:
    for key in mp.COMPARED:
      np.testing.assert_allclose(row[key], reference[row["step"]][key], rtol=1e-5, atol=2e-6,
                                 err_msg=f"{key} at step {row['step']}")
