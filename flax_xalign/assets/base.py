"""The asset protocol: run-scoped arrays that objectives need.

An asset is what a run needs besides parameters and data: the vocabulary, a
bilingual dictionary, a self-induced dictionary, a co-occurrence table. Each
one is

* **built** by an explicit step from the run manifest (`build(run)`, also
  `xalign assets`), or loaded from files a user built before;
* optionally **refreshed** from the parameters every `refresh_every` steps by
  a jitted function whose output has the input's shapes (tables are padded to
  a fixed capacity), so the train step never recompiles;
* **saved** as inspectable files (TSV, npz, a SentencePiece model) into
  MODEL_DIR and into every checkpoint step (`checkpoints/<step>/assets/`);
* **fingerprinted** (content hash + version) in the run manifest, so a
  resumed run, or a file edited by hand, is checked rather than trusted;
* **sharded** by logical axis names, through the same rules table as the
  parameters (replicated by default).

A value is a dict of numpy arrays on the host. Device values (`on_device`) are
passed to the train step as arguments, `train_step(state, batch, rng,
assets)`, never closed over as constants: a refresh changes an argument, and
an AOT compile for a pod sees them as abstract inputs.
"""

from __future__ import annotations

import abc
import hashlib
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

Value = dict[str, Any]  # name -> numpy (host) or jax (device) array


def content_hash(value: Mapping[str, Any]) -> str:
  """sha256 over every array's key, dtype, shape and bytes (sorted keys)."""
  digest = hashlib.sha256()
  for key in sorted(value):
    array = np.ascontiguousarray(np.asarray(value[key]))
    digest.update(f"{key}|{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


class Asset(abc.ABC):
  """One kind of run-scoped array data; see the module docstring.

  Subclasses set `name` (the key objectives use in `requires` and in
  `ctx.assets`), `version` (bump when the meaning of the files changes) and
  `files` (the file names `save` writes; they must not clash with other
  assets' because all of a run's asset files share one directory).
  """

  name: str = ""
  version: int = 1
  files: tuple[str, ...] = ()
  refresh_every: int = 0
  on_device: bool = True
  # A MODEL_DIR whose parameters `build` needs (the induced dictionary's source), else None. Assets never
  # open checkpoints: the assembler (training/asset_setup.py) opens it and calls `build(run, source=...)`
  # with a handle that has `.spec` (its RunSpec) and `.params()`.
  source: str | None = None

  @abc.abstractmethod
  def build(self, run: "RunSpec") -> Value:
    """The asset's value for `run` (deterministic given the run's seed)."""

  def refresh(self, params: Any, value: Value, run: "RunSpec") -> Value:
    """A new value from the parameters: jitted, same shapes and dtypes as `value`."""
    raise NotImplementedError(f"asset {self.name!r} has refresh_every={self.refresh_every} but no refresh()")

  @abc.abstractmethod
  def save(self, directory: str, value: Value) -> None:
    """Writes `files` into `directory` (atomically, through fileio)."""

  @abc.abstractmethod
  def load(self, directory: str) -> Value:
    """Reads the value `save` wrote; UserError naming the file if malformed."""

  def check(self, value: Value, run: "RunSpec") -> None:
    """Refuses a loaded value that does not belong to `run` (UserError)."""

  def fingerprint(self, value: Value) -> dict[str, Any]:
    """Identity of a value: recorded in the manifest, compared on resume."""
    return {"version": self.version, "sha256": content_hash(value)}

  def logical_axes(self, value: Value) -> dict[str, tuple[str | None, ...]]:
    """Logical axis names per array (None entries: replicated dimensions)."""
    return {key: (None,) * np.ndim(array) for key, array in value.items()}

  def describe(self, value: Value) -> str:
    """One human line for progress output."""
    sizes = ", ".join(f"{k} {tuple(np.shape(v))}" for k, v in sorted(value.items()))
    return f"{self.name}: {sizes}"

  def exists_in(self, directory: str) -> bool:
    import os

    return all(storage.exists(os.path.join(directory, f)) for f in self.files)


def check_fingerprint(asset: Asset, value: Value, expected: Mapping[str, Any] | None, *, where: str) -> None:
  """UserError if `value` is not the one `expected` describes (a file edited by hand, say)."""
  if expected is None:
    return
  found = asset.fingerprint(value)
  if dict(found) != dict(expected):
    raise UserError(
        f"asset {asset.name!r} in {where} ({', '.join(asset.files)}) is not the one the run manifest "
        f"records: found {found}, expected {dict(expected)}. It was changed after the run wrote it. "
        "Restore the file (every checkpoint step keeps a copy under checkpoints/<step>/assets/), or start "
        "a new MODEL_DIR if the change was intended.")
