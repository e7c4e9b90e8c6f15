"""Shared machinery of the seqio tasks: in-memory sources, tokenising, metadata.

Every task registered here reads its text through a *loader*, a picklable
callable `loader(split) -> {"text": [...]}` (plus `"text_b"` for bitext) that
runs when a dataset is built, never at import time, so bad files fail with a
clear `UserError` only when they are used. The loader's lists become a
`tf.data.Dataset.range(n)` that is shuffled over the whole split (seeded,
reshuffled each epoch) and mapped through `tf.gather` on constant tensors:
pure tf.data, so the trainer can checkpoint the iterator.

Task outputs follow docs/INTERFACES.md: `tokens`, `tokens_b` (int32 [n], no
specials), `lang`, `lang_b` (tf.string scalars, `lang_b == ""` when
monolingual).

Mixtures built here sample task i with rate n_i ** alpha, n_i = number of
training examples of task i (XLM's alpha-sampling; alpha = 0.7 by default).
"""

import dataclasses
import difflib
import functools
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import seqio
import tensorflow as tf

from flax_xalign import errors

# seqio's own rule for task names, applied before seqio sees the name.
_VALID_NAME = re.compile(r"^[\w\d\.\:_]+$")
Loader = Callable[[str], Mapping[str, Sequence[str]]]
DEFAULT_ALPHA = 0.7


@dataclasses.dataclass(frozen=True)
class TaskInfo:
  """What the trainer needs to know about a task beyond seqio's view."""
  languages: Tuple[str, ...]
  loader: Loader
  definition: Any  # Whatever registered it; equal definitions re-register.


_TASKS: Dict[str, TaskInfo] = {}
_MIXTURES: Dict[str, Tuple[Tuple[str, ...], float, Any]] = {}


# ----------------------------------------------------------------- features


def output_features(vocabulary: seqio.Vocabulary) -> Dict[str, seqio.Feature]:
  """The four task output features, sharing one token vocabulary."""
  tokens = seqio.Feature(vocabulary=vocabulary, add_eos=False)
  lang = seqio.Feature(vocabulary=seqio.PassThroughVocabulary(size=0),
                       add_eos=False, dtype=tf.string, rank=0)
  return {"tokens": tokens, "tokens_b": tokens, "lang": lang, "lang_b": lang}


def in_memory_dataset(split: str, shuffle_files: bool,
                      seed: Optional[int] = None, *,
                      loader: Loader) -> tf.data.Dataset:
  """A seqio dataset_fn over the loader's lists (whole-split shuffle)."""
  columns = loader(split)
  size = len(columns["text"])
  ds = tf.data.Dataset.range(size)
  if shuffle_files:
    ds = ds.shuffle(size, seed=seed, reshuffle_each_iteration=True)
  tables = {k: tf.constant(list(v), tf.string) for k, v in columns.items()}
  return ds.map(lambda i: {k: tf.gather(t, i) for k, t in tables.items()})


def tokenize_and_tag(dataset: tf.data.Dataset,
                     output_features: Mapping[str, seqio.Feature], *,
                     lang: str, lang_b: str = "",
                     id_maps: Tuple[Any, Any] = (None, None)) -> tf.data.Dataset:
  """Preprocessor: text (and text_b) -> tokens, tokens_b, lang, lang_b.

  `id_maps` optionally re-map each side's token ids (a [V] int table, e.g. a
  synthetic language's transliteration id -> id + V) after tokenisation.
  """
  vocabulary = output_features["tokens"].vocabulary
  tables = [None if m is None else tf.constant(list(m), tf.int32) for m in id_maps]

  def encode(text, table):
    ids = tf.cast(vocabulary.encode_tf(text), tf.int32)
    return ids if table is None else tf.gather(table, ids)

  def fn(ex):
    tokens = encode(ex["text"], tables[0])
    if "text_b" in ex:
      tokens_b = encode(ex["text_b"], tables[1])
    else:
      tokens_b = tf.zeros([0], tf.int32)
    return {"tokens": tokens, "tokens_b": tokens_b,
            "lang": tf.constant(lang), "lang_b": tf.constant(lang_b)}

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------- registry


def _already(name: str, definition: Any) -> bool:
  """True if `name` has an equal definition already; error if different."""
  info = _TASKS.get(name)
  mixture = _MIXTURES.get(name)
  existing = info.definition if info else (mixture[2] if mixture else None)
  if existing is None:
    if name in seqio.TaskRegistry.names() or name in (
        seqio.MixtureRegistry.names()):
      raise errors.UserError(
          f"{name!r} is already registered by other code; choose another name.")
    return False
  if existing == definition:
    return True
  raise errors.UserError(
      f"{name!r} is already registered with a different definition "
      f"({existing!r}); give the new one another name.")


def register_task(name: str, *, loader: Loader,
                  vocabulary: seqio.Vocabulary, lang: str,
                  lang_b: Optional[str] = None,
                  splits: Sequence[str] = ("train", "validation", "test"),
                  definition: Any = None,
                  id_maps: Tuple[Any, Any] = (None, None)) -> seqio.Task:
  """Registers a monolingual (MLM) or, with `lang_b`, a bitext (TLM) task.

  Idempotent: registering the same `definition` again returns the task.
  """
  definition = definition if definition is not None else (name, loader)
  if _already(name, definition):
    return seqio.TaskRegistry.get(name)
  _check_name(name)
  for code in (lang, lang_b or "x"):
    if not isinstance(code, str) or not code or "\t" in code:
      raise errors.UserError(
          f"Task {name!r}: language code {code!r} must be a non-empty string.")
  task = seqio.Task(
      name,
      source=seqio.FunctionDataSource(
          functools.partial(in_memory_dataset, loader=loader),
          splits=tuple(splits), caching_permitted=False),
      output_features=output_features(vocabulary),
      preprocessors=[functools.partial(tokenize_and_tag, lang=lang,
                                       lang_b=lang_b or "", id_maps=tuple(id_maps))])
  seqio.TaskRegistry.add_provider(name, task)
  languages = tuple(sorted({lang, lang_b} - {None}))
  _TASKS[name] = TaskInfo(languages=languages, loader=loader,
                          definition=definition)
  return task


def _check_name(name: str) -> None:
  if not isinstance(name, str) or not _VALID_NAME.match(name):
    raise errors.UserError(
        f"{name!r} is not a valid task or mixture name; use letters, digits, "
        "'_', '.' and ':' only.")


@functools.lru_cache(maxsize=None)
def _num_train_examples(name: str) -> int:
  return len(_TASKS[name].loader("train")["text"])


def alpha_rate(task: seqio.Task, *, alpha: float) -> float:
  """Mixing rate n ** alpha, n = number of training examples of `task`."""
  return float(_num_train_examples(task.name)) ** alpha


def register_mixture(name: str, tasks: Sequence[str], *,
                     alpha: float = DEFAULT_ALPHA,
                     definition: Any = None) -> seqio.Mixture:
  """Registers an alpha-sampled mixture of registered tasks (idempotent)."""
  tasks = tuple(tasks)
  definition = definition if definition is not None else (name, tasks, alpha)
  if _already(name, definition):
    return seqio.MixtureRegistry.get(name)
  _check_name(name)
  if not tasks:
    raise errors.UserError(
        f"Mixture {name!r} lists no tasks; name at least one.")
  if not alpha > 0:
    raise errors.UserError(
        f"Mixture {name!r}: alpha={alpha} must be > 0 (0.7 is XLM's value).")
  for task in tasks:
    if task not in _TASKS:
      raise unknown_name_error(task, what="task of mixture " + repr(name))
  vocabularies = [get_vocabulary(t) for t in tasks]
  if any(v != vocabularies[0] for v in vocabularies[1:]):
    raise errors.UserError(
        f"Mixture {name!r} mixes tasks with different vocabularies "
        f"({', '.join(map(str, vocabularies))}); give all its tasks the same "
        "vocabulary_path.")
  rate = functools.partial(alpha_rate, alpha=float(alpha))
  mixture = seqio.Mixture(name, [(t, rate) for t in tasks])
  seqio.MixtureRegistry.add_provider(name, mixture)
  _MIXTURES[name] = (tasks, float(alpha), definition)
  return mixture


def registered_names() -> List[str]:
  """All task and mixture names known to flax_xalign."""
  return sorted(set(_TASKS) | set(_MIXTURES))


def unknown_name_error(name: str, *, what: str = "task or mixture"
                       ) -> errors.UserError:
  close = difflib.get_close_matches(str(name), registered_names(), n=4,
                                    cutoff=0.5)
  hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
  return errors.UserError(
      f"Unknown {what} {name!r}.{hint} Registered: "
      f"{', '.join(registered_names()) or '(none)'}. Register your own "
      "from gin with flax_xalign.tasks.user.TextTask / TsvBitextTask / AlphaMixture "
      "(call .register()) or in Python with a module under tasks/.")


def get_provider(name: str) -> seqio.DatasetProviderBase:
  """The seqio Task or Mixture called `name` (UserError if unknown)."""
  if name in _TASKS:
    return seqio.TaskRegistry.get(name)
  if name in _MIXTURES:
    return seqio.MixtureRegistry.get(name)
  raise unknown_name_error(name)


def task_names(name: str) -> Tuple[str, ...]:
  """The tasks of a mixture (or the task itself)."""
  if name in _MIXTURES:
    return _MIXTURES[name][0]
  get_provider(name)
  return (name,)


def languages_of(name: str) -> Tuple[str, ...]:
  """Sorted language codes of a task or mixture (the converter's list)."""
  return tuple(sorted({lang for task in task_names(name)
                       for lang in _TASKS[task].languages}))


def get_vocabulary(name: str) -> seqio.Vocabulary:
  """The token vocabulary of a task or mixture."""
  first = task_names(name)[0]
  return seqio.TaskRegistry.get(first).output_features["tokens"].vocabulary
