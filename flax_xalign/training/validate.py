"""The run settings a user types, checked before anything runs.

gin passes values through as the user wrote them, so `--gin.BATCH_SIZE="32"`
arrives as a string and `--gin.TASK_FEATURE_LENGTHS="{'token': 128}"` as a
dict with the wrong key; both used to fail deep inside the run (a TF or
KeyError traceback), and `CHECKPOINT_EVERY=0` / `LOG_EVERY=0` only after a
step had run. `check_settings` raises one UserError naming the setting, what
it must be, and an example, before MODEL_DIR is touched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flax_xalign.errors import UserError

# (setting, its gin name, smallest allowed value): a zero interval used to crash after a step had run
# and CheckpointConfig.keep=0 deleted every checkpoint.
_COUNTS = (("train_steps", "TRAIN_STEPS", 1), ("batch_size", "BATCH_SIZE", 1), ("log_every", "LOG_EVERY", 1),
           ("eval_every", "EVAL_EVERY", 0), ("eval_batches", "train.eval_batches", 1),
           ("every_steps", "CHECKPOINT_EVERY", 1), ("keep", "CheckpointConfig.keep", 1),
           ("replicate_limit_bytes", "train.replicate_limit_bytes", 0), ("num_partitions", "NUM_PARTITIONS", 1),
           ("seed", "SEED", 0))
_EXAMPLES = {"replicate_limit_bytes": 67108864, "train_steps": 1000, "batch_size": 32}

# (field, test, what it must be, example) of OptimizerConfig and MaskingConfig.
_OPTIMIZER = (("learning_rate", lambda v: v > 0, "a number > 0", "5e-4"),
              ("warmup_steps", lambda v: v >= 0 and float(v).is_integer(), "an integer >= 0", "100"),
              ("end_learning_rate_ratio", lambda v: v >= 0, "a number >= 0", "0.0"),
              ("weight_decay", lambda v: v >= 0, "a number >= 0", "0.01"),
              ("b1", lambda v: 0 <= v < 1, "a number in [0, 1)", "0.9"),
              ("b2", lambda v: 0 <= v < 1, "a number in [0, 1)", "0.98"),
              ("eps", lambda v: v >= 0, "a number >= 0", "1e-6"),
              ("clip_norm", lambda v: v > 0, "a number > 0", "1.0"))
_MASKING = (("mask_rate", lambda v: 0 < v < 1, "a number in (0, 1)", "0.15"),
            ("replace_with_mask_rate", lambda v: 0 <= v <= 1, "a number in [0, 1]", "0.8"),
            ("replace_with_random_rate", lambda v: 0 <= v <= 1, "a number in [0, 1]", "0.1"))


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _quoted_hint(value: Any) -> str:
  return " (a quoted value is a string: drop the quotes)" if isinstance(value, str) else ""


def check_counts(*, checkpoint: Any, **values: Any) -> None:
  """One UserError for a count or interval that is not an integer at least its minimum.

  `values` holds the `_COUNTS` settings by name (those absent are not
  checked); `checkpoint` is the CheckpointConfig (`every_steps`, `keep`).
  """
  values.update(every_steps=checkpoint.every_steps, keep=checkpoint.keep)
  for name, setting, least in _COUNTS:
    if name not in values:
      continue
    check_integer(values[name], setting, least=least, example=_EXAMPLES.get(name, max(least, 1)),
                  hint=" (0 turns evaluation off)" if name == "eval_every" else "")


def check_task_feature_lengths(lengths: Any) -> None:
  """TASK_FEATURE_LENGTHS must be {'tokens': row length}, the length an integer >= 2 (<s> and </s>)."""
  example = "--gin.TASK_FEATURE_LENGTHS=\"{'tokens': 128}\""
  if not isinstance(lengths, Mapping):
    raise UserError(f"TASK_FEATURE_LENGTHS={lengths!r} is not allowed: it must be a dict with the one key "
                    f"'tokens' (the row length); e.g. {example}.")
  wrong = [key for key in lengths if key != "tokens"]
  if wrong or "tokens" not in lengths:
    what = f"has the key(s) {', '.join(map(repr, wrong))}" if wrong else "lacks the key 'tokens'"
    raise UserError(f"TASK_FEATURE_LENGTHS={dict(lengths)!r} {what}: the only key allowed is 'tokens' "
                    f"(the row length); e.g. {example}.")
  value = lengths["tokens"]
  if not _is_int(value) or value < 2:
    raise UserError(f"TASK_FEATURE_LENGTHS['tokens']={value!r} is not allowed: it must be an integer >= 2"
                    f"{_quoted_hint(value)}; e.g. {example}.")


def check_objectives(objectives: Any) -> None:
  """Objective weights: a dict of name -> finite number >= 0, at least one > 0."""
  from flax_xalign.objectives import names  # What the example names comes from the registry.

  known = sorted(names())
  example = "--gin.train.objectives=\"{'<name>': 1.0, ...}\"" + (f" with names from {', '.join(known)}" if known else "")
  if not isinstance(objectives, Mapping) or not objectives:
    raise UserError(f"train.objectives={objectives!r} is not allowed: it must be a non-empty dict of objective "
                    f"name -> loss weight; e.g. {example}.")
  for name, weight in objectives.items():
    if not isinstance(name, str):
      raise UserError(f"train.objectives has the key {name!r}: keys are objective names (strings); e.g. {example}.")
    if not _is_number(weight) or weight < 0:
      raise UserError(f"the weight of objective {name!r} is {weight!r}: it must be a number >= 0"
                      f"{_quoted_hint(weight)}; e.g. {example}.")
  if not any(weight > 0 for weight in objectives.values()):
    raise UserError(f"every objective weight in {dict(objectives)!r} is 0, so nothing would be trained; give at "
                    f"least one a weight > 0, e.g. {example}.")


def _check_fields(config: Any, prefix: str, fields: tuple) -> None:
  for field, test, must, example in fields:
    if not hasattr(config, field):
      continue
    value = getattr(config, field)
    if not _is_number(value) or not test(value):
      raise UserError(f"{prefix}.{field}={value!r} is not allowed: it must be {must}{_quoted_hint(value)}; "
                      f"e.g. --gin.{prefix}.{field}={example}.")


def check_settings(*, train_steps: Any, batch_size: Any, log_every: Any, eval_every: Any, eval_batches: Any,
                   checkpoint: Any, replicate_limit_bytes: Any, task_feature_lengths: Any = ...,
                   objectives: Any = ..., optimizer: Any = ..., masking: Any = ..., seed: Any = 0,
                   num_partitions: Any = 1, data_shards: Any = None) -> None:
  """Checks `pretrain`'s settings (its keyword arguments of the same names); the first problem is a UserError.

  Counts and intervals are integers at least their minimum (`check_counts`);
  TASK_FEATURE_LENGTHS is `{'tokens': int >= 2}`; objective weights are
  numbers >= 0, one of them > 0; OptimizerConfig and MaskingConfig fields are
  numbers in their ranges; `data_shards` is None or an integer >= 1. Reads
  nothing from disk.
  """
  check_counts(train_steps=train_steps, batch_size=batch_size, log_every=log_every, eval_every=eval_every,
               eval_batches=eval_batches, checkpoint=checkpoint, replicate_limit_bytes=replicate_limit_bytes,
               seed=seed, num_partitions=num_partitions)
  if data_shards is not None and (not _is_int(data_shards) or data_shards < 1):
    raise UserError(f"train.data_shards={data_shards!r} is not allowed: it must be None (one shard per process) "
                    f"or an integer >= 1{_quoted_hint(data_shards)}; e.g. --gin.train.data_shards=4.")
  if task_feature_lengths is not ...:  # ... (the default): not given, not checked.
    check_task_feature_lengths(task_feature_lengths)
  if objectives is not ...:  # ... (the default): not given, not checked.
    check_objectives(objectives)
  if optimizer is not ...:  # ... (the default): not given, not checked.
    _check_fields(optimizer, "OptimizerConfig", _OPTIMIZER)
  if masking is not ...:  # ... (the default): not given, not checked.
    _check_fields(masking, "MaskingConfig", _MASKING)


def check_integer(value: Any, setting: str, *, least: int, example: int, hint: str = "") -> None:
  """UserError unless `value` is an integer >= `least` (named as the gin `setting`; `hint` follows the bound)."""
  if not _is_int(value) or value < least:
    raise UserError(f"{setting}={value!r} is not allowed: it must be an integer >= {least}{hint}"
                    f"{_quoted_hint(value)}; e.g. --gin.{setting}={example}.")
