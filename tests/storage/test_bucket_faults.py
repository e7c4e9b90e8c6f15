"""Faults of a run in a bucket, in child processes against a GCS server of this module's own (tests/gcs.py).

SIGKILL mid-run then a rerun reproduces an uninterrupted local run's losses exactly; a second writer on the
same gs:// MODEL_DIR is refused in one line naming the holder; the store going away in the middle of an
asynchronous save is one error line, and once it is back a rerun resumes from the last complete step with
the uninterrupted losses. The children train from a local packed cache (no TensorFlow in them): the subject
is the run's files in the bucket, not the input pipeline.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.gcs import GcsServer
from tests.hardening import harness

pytestmark = pytest.mark.subprocess

STEPS = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory):
  server = GcsServer(tmp_path_factory.mktemp("gcs_faults")).start()
  yield server
  server.stop()


@pytest.fixture(scope="module")
def env(server):
  # Two retries of a failed GCS request (TensorStore), so an outage ends a save in seconds, not a quarter hour.
  return harness.child_env(**server.env(), TENSORSTORE_GCS_HTTP_URL=None, GOOGLE_AUTH_TOKEN_FOR_TESTING=None,
                           FLAX_XALIGN_STORE_RETRIES="2")


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_corpus):
  """A local packed cache, its run's gin file (a checkpoint every step), and the uninterrupted local losses."""
  root = tmp_path_factory.mktemp("bucket_faults")
  cache = harness.build_cache(harness.write_run_gin(root / "seqio.gin", tiny_corpus, tag="bkf", checkpoint_every=1),
                              root / "cache")
  gin_file = harness.write_cache_run_gin(root / "run.gin", cache, task="bkf_mix", checkpoint_every=1)
  outcome = harness.run_child("train", harness.train_argv(gin_file, root / "local", f"--gin.TRAIN_STEPS={STEPS}"),
                              timeout=300)
  assert outcome.code == 0, outcome.out[-3000:]
  losses = {step: values[0] for step, values in harness.metrics_losses(root / "local").items()}
  assert sorted(losses) == list(range(1, STEPS + 1)), losses
  return {"gin": gin_file, "losses": losses}


def _bucket_losses(server, name):
  rows = [json.loads(line) for line in server.read("bucket", f"{name}/metrics.jsonl").decode().splitlines()]
  out = {}
  for row in rows:
    if "loss" in row:
      out.setdefault(row["step"], []).append(row["loss"])
  return out


def _committed_steps(server, name):
  return sorted(int(n.split("/")[2]) for n in server.objects("bucket", f"{name}/checkpoints/")
                if n.endswith("/commit_success.txt") and n.count("/") == 3)  # (the step's marker, not an item's)


def test_sigkill_then_rerun_resumes_exactly_and_a_second_writer_is_refused(server, env, setup):
  url = "gs://bucket/killed"
  argv = harness.train_argv(setup["gin"], url, f"--gin.TRAIN_STEPS={STEPS}")
  first = harness.Child("train", argv, env=env)
  try:
    assert first.wait_for(r"step 1/", timeout=240), first.output[-3000:]
    first.proc.send_signal(__import__("signal").SIGSTOP)  # Held mid-run (its lease still good) while refused.
    # The same TRAIN_STEPS as the holder (checkpoints past STEPS exist by now); without a lock it would train
    # on until the timeout.
    second = harness.run_child("train", harness.train_argv(setup["gin"], url, "--gin.TRAIN_STEPS=100000"),
                               timeout=200, env=env)
    problems = harness.user_error_problems(second, ("in use", str(first.proc.pid)))
    assert not problems, "; ".join(problems) + " -- " + second.out[-2000:]
  finally:
    first.kill()  # SIGKILL, however far it got (a stopped process dies of it too).
  rerun = harness.run_child("train", argv, timeout=300, env=env)
  assert rerun.code == 0, rerun.out[-3000:]
  assert "taking the lock over" in rerun.out  # Its holder died on this host: no wait for the lease.
  losses = _bucket_losses(server, "killed")
  assert sorted(losses) == list(range(1, STEPS + 1)), losses
  assert {s: v[0] for s, v in losses.items()} == setup["losses"] and all(len(v) == 1 for v in losses.values())
  assert STEPS in _committed_steps(server, "killed")


def test_the_store_gone_mid_save_is_one_line_and_a_rerun_resumes_from_the_last_complete_step(server, env, setup):
  url = "gs://bucket/outage"
  child = harness.Child("train", harness.train_argv(setup["gin"], url, "--gin.TRAIN_STEPS=100000"), env=env)
  try:
    assert child.wait_for(r"step 3/", timeout=240), child.output[-3000:]
    server.stop()
    code = child.finish(300)
  finally:
    child.kill()
    if server.process is None:
      server.start()
  out = child.output
  assert code not in (0, None), out[-3000:]
  errors = [line for line in out.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
  assert "could not be reached" in errors[0] and "rerun the same command" in errors[0], errors
  committed = _committed_steps(server, "outage")
  assert committed, server.objects("bucket", "outage/")
  rerun = harness.run_child("train", harness.train_argv(setup["gin"], url, f"--gin.TRAIN_STEPS={STEPS}"),
                            timeout=300, env=env)
  assert rerun.code == 0, rerun.out[-3000:]
  assert "resum" in rerun.out.lower() and "damaged" not in rerun.out.lower(), rerun.out[-2000:]
  losses = _bucket_losses(server, "outage")
  assert {s: v[-1] for s, v in losses.items()} == setup["losses"], losses
