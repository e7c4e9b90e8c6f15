"""`xalign gpu_bundle` and `xalign gpu_run` in-process (the contract tier): one `error:` line for what cannot be
built or run, nothing written or removed by a refused build. Their smoke run, end to end in Pythons without
TensorFlow, is tests/cli/test_gpu_bundle_run.py (subprocess tier)."""

import json
import os

import pytest

from flax_xalign.experiments.gpu import bundle as bundle_lib
from tests.hardening import harness

pytestmark = pytest.mark.contract

DEBIAN_TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "docs", "examples", "debian_tiny")


@pytest.mark.parametrize("flags, keywords", [
    (["--grid=huge", "--output=OUT", f"--debian_data={DEBIAN_TINY}"], ("--grid", "huge", "science", "tiny")),
    (["--grid=tiny", "--output=OUT", "--debian_data=NOWHERE"], ("--debian_data", "not an `xalign debian_data` output")),
    (["--grid=tiny", "--output=OUT", f"--debian_data={DEBIAN_TINY}", "--languages=fr"],
     ("no help text for ['fr']", "de")),
    (["--grid=science", "--output=OUT", f"--debian_data={DEBIAN_TINY}", "--languages=de", "--max_mib=10"],
     ("would be about", "--max_mib=10", "biggest part is")),
    (["--grid=tiny", "--output=USER", f"--debian_data={DEBIAN_TINY}"], ("GPU bundle written by xalign gpu_bundle",)),
], ids=["unknown_grid", "not_a_debian_build", "language_not_built", "over_the_size_limit", "a_users_folder"])
def test_bad_builds_are_one_error_and_write_nothing(tmp_path, capfd, flags, keywords):
  user = tmp_path / "user"
  user.mkdir()
  (user / "notes.txt").write_text("mine")
  flags = [f.replace("OUT", str(tmp_path / "bundle")).replace("USER", str(user))
           .replace("NOWHERE", str(tmp_path / "nowhere")) for f in flags]
  harness.assert_user_error(harness.run_main(capfd, "gpu_bundle", flags), *keywords)
  assert not (tmp_path / "bundle").exists()
  assert os.listdir(user) == ["notes.txt"] and (user / "notes.txt").read_text() == "mine"


def test_the_host_refuses_what_is_not_a_whole_bundle(tmp_path, capfd):
  harness.assert_user_error(harness.run_main(capfd, "gpu_run", [str(tmp_path)]), "is not a GPU bundle",
                            "xalign gpu_bundle")
  (tmp_path / "caches").mkdir()
  (tmp_path / "caches" / "shard").write_bytes(b"123")
  (tmp_path / "bundle.json").write_text(json.dumps({"format": bundle_lib.FORMAT, "version": bundle_lib.VERSION,
                                                     "files": {"caches/shard": 5}}))
  harness.assert_user_error(harness.run_main(capfd, "gpu_run", [str(tmp_path), f"--out={tmp_path / 'out'}"]),
                            "caches/shard is damaged", "3 bytes", "carry the whole bundle again")
  assert not (tmp_path / "out").exists()


def test_the_host_refuses_a_work_folder_with_an_earlier_grids_runs(tmp_path, capfd):
  """A second call on the same machine: its rows would resume from the first call's checkpoints (a smoke run
  here once reported 4.5-s rows that had trained nothing), so the host names the folder instead."""
  from tests.cli.test_gpu_run_safety import _fake_bundle

  bundle, work = tmp_path / "bundle", tmp_path / "work"
  _fake_bundle(bundle, work=str(work))
  (work / "runs" / "tiny_mlm").mkdir(parents=True)
  harness.assert_user_error(harness.run_main(capfd, "gpu_run", [str(bundle), f"--out={tmp_path / 'out'}"]),
                            "holds the runs of an earlier gpu_run", str(work / "runs"), "--work")
  assert os.listdir(work / "runs") == ["tiny_mlm"] and not (tmp_path / "out").exists()
