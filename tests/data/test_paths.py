"""Tests for flax_xalign.data.sources.paths."""

import pathlib

from flax_xalign.data.sources import paths
def test_explicit_dir_wins(monkeypatch, tmp_path):
  monkeypatch.setenv("FLAX_XALIGN_DATA_DIR", str(tmp_path / "d"))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
  assert paths.data_dir() == tmp_path / "d"


def test_xdg_then_home(monkeypatch, tmp_path):
  monkeypatch.delenv("FLAX_XALIGN_DATA_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert paths.data_dir() == tmp_path / "flax_xalign"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert paths.data_dir() == pathlib.Path(tmp_path / "home/.cache/flax_xalign")
