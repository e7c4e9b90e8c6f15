"""A real S3 server on 127.0.0.1 for the s3:// tests: moto's server (the `test` extra), spoken to over HTTP by
the real clients (s3fs, hence fsspec and our storage layer), configured only through the AWS variables a
user would set (AWS_ENDPOINT_URL and the keys). Nothing here reaches beyond 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.gcs import environment


@pytest.fixture(scope="session")
def s3():
  """{"url": the server's endpoint}, its bucket `bucket` made, its variables in this process's environment."""
  server_module = pytest.importorskip("moto.server", reason="moto is not installed (make install installs it)")
  pytest.importorskip("s3fs", reason="s3fs is not installed (make install installs it)")
  server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
  server.start()
  host, port = server.get_host_and_port()
  url = f"http://{host}:{port}"
  values = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_PROFILE": None, "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
  with environment(values):
    import fsspec

    fsspec.filesystem("s3", skip_instance_cache=True).mkdir("bucket")
    try:
      yield {"url": url}
    finally:
      server.stop()
