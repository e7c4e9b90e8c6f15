"""AdamW with linear warmup and linear decay, clipping and a decay mask.

Weight decay skips LayerNorm scales and every bias: the BERT/XLM-R convention,
since decaying a scale toward zero fights normalisation. The mask goes by
parameter name, not rank, because scanned layers stack a LayerNorm scale into a
[layers, embed] matrix.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Hyperparameters (defaults: XLM-R/RoBERTa pretraining, scaled for small runs)."""

  learning_rate: float = 5e-4
  warmup_steps: int = 100
  end_learning_rate_ratio: float = 0.0
  weight_decay: float = 0.01
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-6
  clip_norm: float = 1.0
  # Parameter-path prefixes that train ('mlm_head' = every parameter under mlm_head/); () = all of them. The
  # others get no update and no weight decay, and their Adam moments stay 0: e.g. a warm-up of a fresh MLM
  # head on an imported encoder that never had one (e5-small), with the encoder frozen.
  trainable: tuple[str, ...] = ()
  # AdamW's first moment stored in this dtype ('bfloat16' halves its memory and traffic); None: the
  # parameters' dtype. optax's `mu_dtype`; the second moment stays in the parameters' dtype.
  mu_dtype: str | None = None

  def __post_init__(self):
    from flax_xalign.errors import UserError

    if self.mu_dtype not in (None, "bfloat16", "float32"):
      raise UserError(f"OptimizerConfig.mu_dtype must be None, 'bfloat16' or 'float32', got {self.mu_dtype!r}")
    # A bare string would be read as a tuple of letters; anything but strings fails later, deep in a step.
    trainable = (self.trainable,) if isinstance(self.trainable, str) else self.trainable
    if not isinstance(trainable, (list, tuple)) or not all(isinstance(p, str) and p.strip("/") for p in trainable):
      raise UserError(f"OptimizerConfig.trainable={self.trainable!r} must be a list of parameter-path prefixes "
                      "(non-empty strings), e.g. --gin.OptimizerConfig.trainable=\"['mlm_head']\", or [] to train "
                      "every parameter.")
    object.__setattr__(self, "trainable", tuple(trainable))


def state_settings(record: Mapping[str, Any], *, param_dtype: str) -> dict[str, Any]:
  """What of an optimiser record (`dataclasses.asdict(OptimizerConfig)`) shapes the optimiser state's arrays.

  A non-empty `trainable` wraps the chain in the freeze transform, which adds
  entries to the state (which parameters train changes none); `mu_dtype` is
  the first moment's dtype (None: the parameters', `param_dtype`). A saved
  state restores only into a run whose settings give the same; the other
  fields (learning rate, betas, ...) may change on resume. A record from
  before a field was recorded holds its default.
  """
  return {"trainable": bool(record.get("trainable")), "mu_dtype": record.get("mu_dtype") or param_dtype}


def learning_rate_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
  """0 -> peak over `warmup_steps`, then linear to `peak * end_learning_rate_ratio`."""
  warmup = max(0, min(config.warmup_steps, total_steps))
  peak = config.learning_rate
  decay = optax.linear_schedule(peak, peak * config.end_learning_rate_ratio, max(1, total_steps - warmup))
  if warmup == 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


_DECAYED_NAMES = ("kernel", "embedding")


def decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay (dense kernels and embeddings)."""

  def decayed(path, _):
    last = path[-1]
    name = getattr(last, "key", getattr(last, "name", str(last)))
    return str(name) in _DECAYED_NAMES

  return jax.tree_util.tree_map_with_path(decayed, params)


def _path_name(path: Any) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def trainable_labels(params: Any, prefixes: tuple[str, ...]) -> Any:
  """'train' for the parameters under one of `prefixes` (a path like 'mlm_head/norm/scale'), else 'frozen'.

  Raises UserError when a prefix names no parameter (a typo would otherwise freeze the whole model).
  """
  from flax_xalign.errors import UserError

  names = [_path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

  def under(name: str, prefix: str) -> bool:
    prefix = prefix.strip("/")
    return name == prefix or name.startswith(prefix + "/")

  unmatched = [p for p in prefixes if not any(under(n, p) for n in names)]
  if unmatched:
    tops = sorted({n.split("/")[0] for n in names})
    raise UserError(f"OptimizerConfig.trainable names no parameter: {unmatched} (the model's top-level "
                    f"parameters are {tops}); give path prefixes such as 'mlm_head', or () to train all")
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "train" if any(under(_path_name(path), p) for p in prefixes) else "frozen", params)


def _zero_frozen(prefixes: tuple[str, ...]) -> optax.GradientTransformation:
  """Zeroes the updates of every parameter outside `prefixes` (`trainable_labels`); checks them at init."""

  def init(params: Any) -> optax.EmptyState:
    trainable_labels(params, prefixes)  # A prefix naming no parameter is an error before the first step.
    return optax.EmptyState()

  def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
    del params
    labels = trainable_labels(updates, prefixes)
    return jax.tree.map(lambda u, label: u if label == "train" else jax.numpy.zeros_like(u), updates, labels), state

  return optax.GradientTransformation(init, update)


def make_optimizer(config: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  schedule = learning_rate_schedule(config, total_steps)
  tx = optax.chain(
      optax.clip_by_global_norm(config.clip_norm),
      optax.adamw(
          schedule, b1=config.b1, b2=config.b2, eps=config.eps,
          weight_decay=config.weight_decay, mask=decay_mask, mu_dtype=config.mu_dtype,
      ),
  )
  if config.trainable:
    # Frozen gradients are zeroed first (so the clip's global norm counts only the trained parameters and
    # their Adam moments stay 0) and frozen updates last (AdamW's weight decay would move them). The state
    # keeps the full tree's structure: a masked state's placeholders would need shardings and checkpoints
    # of their own.
    freeze = _zero_frozen(tuple(config.trainable))
    tx = optax.chain(freeze, tx, freeze)
  return tx, schedule
