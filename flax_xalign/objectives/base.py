"""What every objective sees and returns, and the registry that composes them.

An objective is a callable `(StepContext) -> LossTerm` that declares what it
needs (`requires`: asset names, looked up in `ctx.assets`) and may hook into
the step at four places, all optional:

* `check(run)` — configuration errors, raised before MODEL_DIR is touched;
* `adapt_encoder(config) -> config` — network pieces it needs (DWA's pointer
  head), so no objective name appears in the trainer;
* `corrupt(ctx: CorruptionContext) -> CorruptionContext` — changes the shared
  corruption before the one forward pass (DICT-MLM's dictionary swaps; SCS-MLM
  sets `input_embeddings`);
* `monitor(params, assets) -> {metric: scalar}` — evaluation-only metrics of
  the parameters (ALIGN-MLM's alignment score); `monitor_requires` names the
  assets it reads, built when the run can have them.

The pretraining model corrupts a batch once, runs the encoder once and hands
every objective the same context; objectives that need more (a second pass, a
no-grad forward) run it themselves through `ctx.apply`. New objectives plug in
with `@register(name)` and are then named from gin
(`train.objectives = {'mlm': 1.0, 'tlm': 1.0}`).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.objectives.masking import MaskedTokens

if TYPE_CHECKING:
  from flax_xalign.models.config import EncoderConfig
  from flax_xalign.run_spec import RunSpec

Batch = Mapping[str, jax.Array]
Assets = Mapping[str, Mapping[str, jax.Array]]


class LossTerm(NamedTuple):
  """One objective's contribution: an unweighted scalar loss and its metrics.

  Metrics are scalars whose keys are prefixed with the objective's name by the
  model (`accuracy` becomes `mlm_accuracy`). A token-level term also returns
  its unnormalised parts, `loss == loss_sum / max(count, 1)`, so that the
  model can pool several terms into one mean (`loss_normalization="pooled"`);
  a term without them (ALIGN's mean cosine) always enters as `loss`.
  """

  loss: jax.Array
  metrics: Mapping[str, jax.Array]
  loss_sum: jax.Array | None = None
  count: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class CorruptionContext:
  """What a `corrupt` hook may read and change before the shared forward pass.

  Attributes:
    params: the encoder's parameters (differentiated).
    assets: the step's asset arguments, `{name: {key: array}}`.
    rng: a key for this objective's corruption.
    batch: the uncorrupted batch (`tokens, lang_ids, segment_ids, positions,
      pair_side`, each [batch, length]).
    masked: the shared masking; `masked.inputs` is what the encoder reads.
    lang_ids: [batch, length] language ids the encoder reads.
    input_embeddings: None, or [batch, length, embed] that replace the token
      embedding lookup of `masked.inputs` (positions and language embeddings
      are still added).
    specials: the vocabulary's special ids.
    vocab_size: the model's embedding rows.
    train: True in training.
    vocab_copies: 1, or 2 for the synthetic languages' doubled vocabulary
      (ids [c * vocab_size / copies, (c + 1) * vocab_size / copies) are copy
      c; `masking.copy_ranges`).
  """

  params: Any
  assets: Assets
  rng: jax.Array
  batch: Batch
  masked: MaskedTokens
  lang_ids: jax.Array
  input_embeddings: jax.Array | None
  specials: SpecialTokens
  vocab_size: int
  train: bool
  vocab_copies: int = 1

  def replace(self, **changes: Any) -> "CorruptionContext":
    return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class StepContext:
  """Everything an objective may read in one train or eval step.

  Attributes:
    params: the encoder's parameters (differentiated).
    apply: `apply(params, *args, method=None, **kwargs)` on the encoder module.
    batch: the uncorrupted batch (`tokens, lang_ids, segment_ids, positions,
      pair_side`, each [batch, length]).
    masked: the shared masking of `batch['tokens']` (after `corrupt` hooks).
    hidden: [batch, length, embed] last-layer states of the masked input.
    all_hidden: per-layer states (embeddings first) when an objective asked.
    logits: [batch, predictions, vocab] MLM logits at `masked.positions`.
    rng: a key reserved for objectives (fold in your own constant).
    train: True in training (dropout on), False in evaluation.
    assets: the step's asset arguments, `{name: {key: array}}`.
    specials: the vocabulary's special ids.
    num_layers: the encoder's depth (None: unknown, e.g. a stubbed context).
    vocab_size: the vocabulary's ids (None: unknown). With a padded
      vocabulary (`EncoderConfig.vocab_pad_multiple`) the logits and the
      token table have more columns/rows than this; ids >= vocab_size are
      padding, their logits masked.
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
  assets: Assets = dataclasses.field(default_factory=dict)
  specials: SpecialTokens = SpecialTokens()
  num_layers: int | None = None
  vocab_size: int | None = None

  def at_predictions(self, feature: str) -> jax.Array:
    """[batch, predictions] values of a batch feature at the masked slots."""
    return jax.numpy.take_along_axis(self.batch[feature], self.masked.positions, axis=1)


class Objective(Protocol):
  """A loss term; see the module docstring for the optional hooks."""

  requires: tuple[str, ...]
  needs_all_hidden: bool

  def __call__(self, ctx: StepContext) -> LossTerm:
    ...


class ObjectiveBase:
  """Defaults for the optional parts of the protocol (subclass it, or not)."""

  requires: tuple[str, ...] = ()
  monitor_requires: tuple[str, ...] = ()
  needs_all_hidden: bool = False
  # Optional batch features the objective reads besides the five every batch has
  # ("link_groups": the tasks' given word links, `flax_xalign.data.feature_converter`).
  batch_features: tuple[str, ...] = ()

  def check(self, run: "RunSpec") -> None:
    """Raise UserError for settings this objective cannot train with."""

  def adapt_encoder(self, config: "EncoderConfig") -> "EncoderConfig":
    return config


def require_bitext(objective: str, run: "RunSpec", *, what: str) -> None:
  """UserError when `run`'s data has no translation pairs, which `objective` (`what` it does) needs.

  Without pairs such a term sees no slot and logs 0.0 for the whole run. A
  plain seqio task (registered directly with seqio) may carry pairs the
  registry cannot see, so a run with one is let through.
  """
  if run.language_pairs or not _sides_known(run.task):
    return
  others = {k: v for k, v in run.objectives.items() if k != objective}
  drop = f"train.objectives = {others}" if others else "another objective"
  raise UserError(
      f"the {objective!r} objective {what}, but {run.task!r} has no bitext (translation-pair) task, so it "
      f"would log {objective} 0.0 for the whole run. Add a bitext task (a TsvBitextTask in an AlphaMixture "
      f"with your data), or drop the objective ({drop}).")


def _sides_known(task: str) -> bool:
  """True when every task of `task` is registered through flax_xalign (their pair sides are known)."""
  from flax_xalign import tasks

  try:
    return all(tasks.registry.text_loader(name) is not None for name in tasks.task_names(task))
  except UserError:
    return False


def requires_of(objective: Any) -> tuple[str, ...]:
  return tuple(getattr(objective, "requires", ()))


def monitor_requires_of(objective: Any) -> tuple[str, ...]:
  return tuple(getattr(objective, "monitor_requires", ())) if hasattr(objective, "monitor") else ()


def id_table(ids: jax.Array, values: jax.Array, valid: jax.Array, size: int, fill: int) -> jax.Array:
  """[size] int32 with table[ids[i]] = values[i] where valid[i], `fill` elsewhere.

  The dense id -> value lookup that dictionary-reading objectives (ALIGN,
  DICT-MLM, TCS, SCS) build from a capacity-padded list of pairs.
  """
  index = jnp.where(valid, ids, size)  # Out of range: dropped.
  return jnp.full((size,), fill, jnp.int32).at[index].set(values.astype(jnp.int32), mode="drop")


def adapt_encoder(config: "EncoderConfig", objectives: Iterable[Any]) -> "EncoderConfig":
  """The encoder config with every objective's `adapt_encoder` applied."""
  for objective in objectives:
    hook = getattr(objective, "adapt_encoder", None)
    if hook is not None:
      config = hook(config)
  return config


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


def build(names_: Iterable[str], options: Mapping[str, Any] | None = None) -> dict[str, Objective]:
  """{name: objective} built with its options (kwargs mapping, or a config dataclass as `config=`)."""
  options = dict(options or {})
  built = {}
  for name in names_:
    value = options.get(name, {})
    kwargs = dict(value) if isinstance(value, Mapping) else {"config": value}
    built[name] = get(name, **kwargs)
  return built


def describe_options(value: Any) -> Any:
  """JSON-friendly record of an objective's options (for the run manifest)."""
  if dataclasses.is_dataclass(value):
    return dataclasses.asdict(value)
  return dict(value)
