"""Asset factories by name: which asset a run gets for each name objectives require.

`@register("dictionary")` adds a factory `factory(run: RunSpec) -> Asset`; it
raises `Unavailable(reason)` when the run cannot have that asset (a token
dictionary for a task that is not a transliterated synthetic language, say).
`create(names, run)` builds the asset objects; `required_by` turns an
`Unavailable` into one error naming the objectives that need the asset.

This module is a leaf: the built-in assets register themselves when the
package is imported (`flax_xalign/assets/__init__.py`, the one list of them),
and importing this module imports the package first.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from flax_xalign.assets.base import Asset
from flax_xalign.errors import UserError

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

Factory = Callable[["RunSpec"], Asset]
_FACTORIES: dict[str, Factory] = {}


class Unavailable(Exception):
  """This run cannot have the asset; the message says why and what would."""


def register(name: str) -> Callable[[Factory], Factory]:
  def wrap(factory: Factory) -> Factory:
    if name in _FACTORIES and _FACTORIES[name] is not factory:
      raise ValueError(f"asset {name!r} is registered twice")
    _FACTORIES[name] = factory
    return factory

  return wrap


def prepared_files() -> frozenset[str]:
  """Every file name an asset reads from MODEL_DIR: a user may put these there before a run's first step.

  The built-in assets' class-level `files` (the vocabulary's two kinds included); a folder holding only
  such files is a run prepared for training, not a user's folder of other things.
  """
  from flax_xalign.assets import base, vocabulary

  found, todo = set(vocabulary.FILENAMES.values()), list(base.Asset.__subclasses__())
  while todo:
    cls = todo.pop()
    todo.extend(cls.__subclasses__())
    if isinstance(cls.__dict__.get("files"), tuple):
      found.update(cls.__dict__["files"])
  return frozenset(found)


def names() -> tuple[str, ...]:
  return tuple(sorted(_FACTORIES))


def create(name: str, run: "RunSpec") -> Asset:
  """The asset object `name` for `run`; raises Unavailable or UserError (unknown name)."""
  if name not in _FACTORIES:
    close = difflib.get_close_matches(name, _FACTORIES, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise UserError(f"unknown asset {name!r}.{hint} Known assets: {', '.join(names())}.")
  asset = _FACTORIES[name](run)
  if asset.name != name:
    raise ValueError(f"the factory of asset {name!r} made an asset named {asset.name!r}")
  return asset


def resolve(required: Mapping[str, Iterable[str]], optional: Mapping[str, Iterable[str]],
            run: "RunSpec") -> tuple[dict[str, Asset], list[str]]:
  """The assets a run needs, and notes on optional ones it cannot have.

  Args:
    required: asset name -> objectives whose loss needs it.
    optional: asset name -> objectives whose monitor would use it.
    run: the run manifest.

  Returns:
    ({name: Asset}, [one note per optional asset that is unavailable]).

  Raises:
    UserError: a required asset is unavailable for this run.
  """
  assets: dict[str, Asset] = {}
  notes: list[str] = []
  for name in sorted(set(required) | set(optional)):
    try:
      assets[name] = create(name, run)
    except Unavailable as e:
      if name in required:
        users = sorted(set(required[name]))
        raise UserError(f"Objectives {users} need the asset {name!r}: {e}") from None
      notes.append(f"monitor of {sorted(set(optional[name]))} skipped: no {name!r} for this run ({e})")
  return assets, notes
