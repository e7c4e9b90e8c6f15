"""Flags that only a local path can serve refuse a URL in one line, before any work (docs/buckets.md)."""

import pytest

from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.mark.parametrize("entry,flags,flag", [
    ("import_hf", ["--source=gs://bucket/hf", "--output=OUT"], "--source"),
    ("e5_small", ["--data_dir=gs://bucket/wheels", "--output=OUT"], "--data_dir"),
    ("e5_small", ["--from_trimmed_source=gs://bucket/e5.npz", "--output=OUT"], "--from_trimmed_source"),
])
def test_a_url_where_only_a_local_path_serves_is_one_line(tmp_path, capfd, entry, flags, flag):
  out = harness.run_main(capfd, entry, [f.replace("OUT", str(tmp_path / "out")) for f in flags])
  harness.assert_user_error(out, f"{flag}=gs://bucket", "local path only")
  assert not (tmp_path / "out").exists() and not list(tmp_path.glob("gs*"))
