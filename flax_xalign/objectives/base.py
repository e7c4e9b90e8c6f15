"""What every objective sees and returns, and the registry that composes them.

An objective is a callable `(StepContext) -> LossTerm`. The pretraining model
corrupts a batch once, runs the encoder once and hands every objective the same
context; objectives that need more (a second pass, a no-grad forward) run it
themselves through `ctx.apply`. New objectives plug in with `@register(name)`
and are then named from gin (`train.objectives = {'mlm': 1.0, 'tlm': 1.0}`).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Mapping, NamedTuple, Protocol

import jax

from flax_xalign.errors import UserError
from flax_xalign.objectives.masking import MaskedTokens

Batch = Mapping[str, jax.Array]


class LossTerm(NamedTuple):
  """One objective's contribution: an unweighted scalar loss and its metrics.

  Metrics are scalars whose keys are prefixed with the objective's name by the
  model (`accuracy` becomes `mlm_accuracy`).
  """

  loss: jax.Array
  metrics: Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class StepContext:
  """Everything an objective may read in one train or eval step.

  Attributes:
    params: the encoder's parameters (differentiated).
    apply: `apply(params, *args, method=None, **kwargs)` on the encoder module.
    batch: the uncorrupted batch (`tokens, lang_ids, segment_ids, positions,
      pair_side`, each [batch, length]).
    masked: the shared masking of `batch['tokens']`.
    hidden: [batch, length, embed] last-layer states of the masked input.
    all_hidden: per-layer states (embeddings first) when an objective asked.
    logits: [batch, predictions, vocab] MLM logits at `masked.positions`.
    rng: a key reserved for objectives (fold in your own constant).
    train: True in training (dropout on), False in evaluation.
  """

  params: Any
  apply: Callable[..., Any]
  batch: Batch
  masked: MaskedTokens
  hidden: jax.Array
  all_hidden: tuple[jax.Array, ...] | None
  logits: jax.Array
  rng: jax.Array
  train: bool

  def at_predictions(self, feature: str) -> jax.Array:
    """[batch, predictions] values of a batch feature at the masked slots."""
    return jax.numpy.take_along_axis(self.batch[feature], self.masked.positions, axis=1)


class Objective(Protocol):
  """A loss term. `needs_all_hidden` asks the model for every layer's states."""

  needs_all_hidden: bool

  def __call__(self, ctx: StepContext) -> LossTerm:
    ...


_REGISTRY: dict[str, Callable[..., Objective]] = {}


def register(name: str) -> Callable[[Callable[..., Objective]], Callable[..., Objective]]:
  """Class or factory decorator adding an objective under `name`."""

  def wrap(factory: Callable[..., Objective]) -> Callable[..., Objective]:
    if name in _REGISTRY and _REGISTRY[name] is not factory:
      raise ValueError(f"objective {name!r} is registered twice")
    _REGISTRY[name] = factory
    return factory

  return wrap


def names() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def get(name: str, **kwargs: Any) -> Objective:
  """Builds the registered objective `name`; unknown names fail with a hint."""
  if name not in _REGISTRY:
    close = difflib.get_close_matches(name, _REGISTRY, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise UserError(
        f"Unknown objective {name!r}.{hint} Known objectives: {', '.join(names())}. "
        "Set them in gin, e.g. train.objectives = {'mlm': 1.0, 'tlm': 1.0}."
    )
  return _REGISTRY[name](**kwargs)
