"""Alpha-sampled mixtures of registered tasks: rates n_i ** alpha (XLM's sampling) and `register_mixture`.

n_i is the number of training examples of task i, counted by the cheapest
source that knows it (`num_train_examples`) or given explicitly (`sizes=`);
alpha = 0.7 by default.
"""

import functools
from typing import Any, Mapping, Optional, Sequence, Tuple

import seqio

from flax_xalign import errors

from .tables import (_MIXTURES, _TASKS, MixtureInfo, _already, _check_name, _tokens_vocabulary,
                     unknown_name_error)

DEFAULT_ALPHA = 0.7


@functools.lru_cache(maxsize=None)
def _count_our_examples(name: str) -> int:
  loader = _TASKS[name].loader
  count = getattr(loader, "num_examples", None)
  return int(count("train")) if count else len(loader("train")["text"])


def num_train_examples(task: seqio.Task) -> int:
  """Training examples of `task`, from the cheapest source that knows them.

  Our tasks ask their loader (a streaming line count for files, the cached
  corpus size for the embedded ones); a plain seqio task answers
  `num_input_examples("train")` (TFDS sources know it from dataset info).

  Raises:
    UserError: the task cannot tell; the message says to give sizes.
  """
  if task.name in _TASKS:
    return _count_our_examples(task.name)
  how = (f"give the mixture explicit sizes, e.g. AlphaMixture(..., "
         f"sizes={{{task.name!r}: N}}) with N its number of training examples")
  if "train" not in task.splits:
    raise errors.UserError(
        f"Task {task.name!r} has no 'train' split (it has "
        f"{', '.join(task.splits)}), so its mixing rate cannot be computed; "
        f"{how}.")
  try:
    count = task.num_input_examples("train")
  except Exception as e:  # TFDS raises several types when info is missing.
    raise errors.UserError(
        f"Task {task.name!r} (a plain seqio task) could not count its training "
        f"examples ({type(e).__name__}: {e}); {how}.") from e
  if count is None:
    raise errors.UserError(
        f"Task {task.name!r} (a plain seqio task) does not know its number of "
        f"training examples (its source's num_input_examples('train') is "
        f"None); {how}, or build its source with num_input_examples=.")
  return int(count)


def alpha_rate(task: seqio.Task, *, alpha: float,
               sizes: Optional[Mapping[str, int]] = None) -> float:
  """Mixing rate n ** alpha, n = `sizes[task.name]` or the task's own count."""
  sizes = dict(sizes or ())
  n = sizes[task.name] if task.name in sizes else num_train_examples(task)
  return float(n) ** alpha


def _check_sizes(name: str, tasks: Sequence[str],
                 sizes: Optional[Mapping[str, int]]
                 ) -> Tuple[Tuple[str, int], ...]:
  if sizes is None:
    return ()
  if not isinstance(sizes, Mapping):
    raise errors.UserError(
        f"Mixture {name!r}: sizes must map task names to their numbers of "
        f"training examples, e.g. {{{tasks[0]!r}: 1000}}; got {sizes!r}.")
  for task, size in sizes.items():
    if task not in tasks:
      raise errors.UserError(
          f"Mixture {name!r}: sizes names {task!r}, which is not one of its "
          f"tasks ({', '.join(tasks)}).")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise errors.UserError(
          f"Mixture {name!r}: sizes[{task!r}]={size!r} must be a positive "
          "integer (the task's number of training examples).")
  return tuple(sorted(sizes.items()))


def _member_task(mixture: str, task: str) -> seqio.Task:
  """A task a mixture may list: ours or a plain seqio task (not a mixture)."""
  if task in _TASKS:
    return seqio.TaskRegistry.get(task)
  if task in _MIXTURES or task in seqio.MixtureRegistry.names():
    raise errors.UserError(
        f"Mixture {mixture!r} lists {task!r}, which is a mixture; list its "
        "tasks instead.")
  if isinstance(task, str) and task in seqio.TaskRegistry.names():
    return seqio.TaskRegistry.get(task)
  raise unknown_name_error(task, what="task of mixture " + repr(mixture))


def register_mixture(name: str, tasks: Sequence[str], *,
                     alpha: float = DEFAULT_ALPHA,
                     sizes: Optional[Mapping[str, int]] = None,
                     definition: Any = None, spec: Any = None
                     ) -> seqio.Mixture:
  """Registers an alpha-sampled mixture of registered tasks (idempotent).

  Members are our tasks or plain seqio tasks sharing one vocabulary and the
  same output features. `sizes` overrides the number of training examples of
  some members (required for a plain task that cannot count its own).
  """
  tasks = tuple(tasks)
  size_items = _check_sizes(name, tasks, sizes) if tasks else ()
  if definition is None:
    definition = (name, tasks, alpha, size_items)
  if _already(name, definition):
    return seqio.MixtureRegistry.get(name)
  _check_name(name)
  if not tasks:
    raise errors.UserError(
        f"Mixture {name!r} lists no tasks; name at least one.")
  if not alpha > 0:
    raise errors.UserError(
        f"Mixture {name!r}: alpha={alpha} must be > 0 (0.7 is XLM's value).")
  members = [_member_task(name, task) for task in tasks]
  vocabularies = [_tokens_vocabulary(task) for task in members]
  if any(v != vocabularies[0] for v in vocabularies[1:]):
    raise errors.UserError(
        f"Mixture {name!r} mixes tasks with different vocabularies "
        f"({', '.join(map(str, vocabularies))}); give all its tasks the same "
        "vocabulary_path.")
  features = {task.name: sorted(task.output_features) for task in members}
  if len({tuple(f) for f in features.values()}) > 1:
    raise errors.UserError(
        f"Mixture {name!r} mixes tasks with different output features "
        f"({features}); seqio mixes only tasks with the same features (ours "
        "output tokens, tokens_b, lang, lang_b).")
  rate = functools.partial(alpha_rate, alpha=float(alpha), sizes=size_items)
  mixture = seqio.Mixture(name, [(t, rate) for t in tasks])
  seqio.MixtureRegistry.add_provider(name, mixture)
  _MIXTURES[name] = MixtureInfo(tasks=tasks, alpha=float(alpha),
                                sizes=size_items, definition=definition,
                                spec=spec)
  return mixture
