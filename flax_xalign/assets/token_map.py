"""The `token_map` asset: the gold natural -> derived token map of a synthetic language.

The map the ALIGN-MLM alignment score is measured against: `queries` (natural
ids with a distinct counterpart), `targets` (their counterparts) and
`candidates` (the derived vocabulary), saved as `token_map.npz`. Available
for transliterated synthetic languages only, like the `dictionary`.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

import numpy as np

from flax_xalign import storage
from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.assets.dictionary import transliterated_language
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage
  from flax_xalign.run_spec import RunSpec

TOKEN_MAP_FILE = "token_map.npz"


def token_map_of(id_map: np.ndarray, first_regular: int) -> Value:
  """The `token_map` value of a natural -> derived id map (ids below `first_regular` are special)."""
  id_map = np.asarray(id_map)
  ids = np.arange(len(id_map))
  regular = ids >= first_regular
  queries = ids[regular & (id_map != ids)]
  return {"queries": queries.astype(np.int32), "targets": id_map[queries].astype(np.int32),
          "candidates": np.unique(id_map[regular]).astype(np.int32)}


class TokenMap(Asset):
  """`token_map`: the gold natural -> derived token map of a synthetic language."""

  name = "token_map"
  files = (TOKEN_MAP_FILE,)

  def __init__(self, language: "SyntheticLanguage", first_regular: int):
    self.language = language
    self.first_regular = int(first_regular)

  def build(self, run: "RunSpec") -> Value:
    return token_map_of(self.language.id_map(), self.first_regular)

  def save(self, directory: str, value: Value) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in value.items()})
    write_atomically(os.path.join(directory, TOKEN_MAP_FILE), buffer.getvalue())

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, TOKEN_MAP_FILE)
    try:
      with np.load(storage.open_file(path, "rb")) as data:
        value = {k: np.asarray(data[k], np.int32) for k in ("queries", "targets", "candidates")}
    except (OSError, KeyError, ValueError) as e:
      raise UserError(f"{path} is not a token map written by flax_xalign ({e}).") from e
    return value

  def check(self, value: Value, run: "RunSpec") -> None:
    expected = self.build(run)
    if any(not np.array_equal(value[k], expected[k]) for k in expected):
      raise UserError(f"{TOKEN_MAP_FILE} does not match this run's synthetic language; use a new MODEL_DIR.")

  def describe(self, value: Value) -> str:
    return (f"token_map: {len(value['queries']):,} natural tokens with a derived counterpart, "
            f"{len(value['candidates']):,} derived candidates")


@registry.register("token_map")
def _token_map(run: "RunSpec") -> Asset:
  return TokenMap(transliterated_language(run), run.vocabulary.specials.first_regular)
