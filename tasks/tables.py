"""The registry's own tables: what flax_xalign registered, `register_task`, and the lookups by name.

Names are looked up here first and then in seqio's own registries, so a plain
`seqio.Task` or `seqio.Mixture` that a user registered directly with seqio
works too; `resolve(name, languages)` gives the trainer the provider, the
sorted language list and the vocabulary in one call. `registry` is the public
face of this module (and of `loaders`, `mixtures` and `describe`).
"""

import dataclasses
import difflib
import functools
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import seqio

from flax_xalign import errors
from flax_xalign.data.vocab import normalize as normalize_lib
from flax_xalign.data import pipeline

from .loaders import DEFAULT_MAX_LINE_CHARS, Loader, in_memory_dataset, output_features, tokenize_and_tag

# seqio's own rule for task names, applied before seqio sees the name.
_VALID_NAME = re.compile(r"^[\w\d\.\:_]+$")
Provider = Union[seqio.Task, seqio.Mixture]
_LISTED_PLAIN_NAMES = 20


@dataclasses.dataclass(frozen=True)
class TaskInfo:
  """What the trainer needs to know about a task beyond seqio's view.

  Attributes:
    languages: sorted language codes of its examples.
    loader: reads a split (see the module docstring).
    definition: whatever registered it; equal definitions re-register.
    spec: the frozen dataclass (one of `_KINDS`) whose `register()` rebuilds
      it in another process; None when importing this package registers it.
    pair: (side a, side b) languages of a bitext task; None if monolingual.
  """
  languages: Tuple[str, ...]
  loader: Loader
  definition: Any
  spec: Any = None
  pair: Optional[Tuple[str, str]] = None


@dataclasses.dataclass(frozen=True)
class MixtureInfo:
  """An alpha-sampled mixture of tasks (listed order) and its rate inputs."""
  tasks: Tuple[str, ...]
  alpha: float
  sizes: Tuple[Tuple[str, int], ...]
  definition: Any
  spec: Any = None


_TASKS: Dict[str, TaskInfo] = {}
_MIXTURES: Dict[str, MixtureInfo] = {}


# ----------------------------------------------------------------- registry


def _already(name: str, definition: Any) -> bool:
  """True if `name` has an equal definition already; error if different."""
  info = _TASKS.get(name) or _MIXTURES.get(name)
  if info is None:
    if name in seqio.TaskRegistry.names() or name in (
        seqio.MixtureRegistry.names()):
      raise errors.UserError(
          f"{name!r} is already registered by other code; choose another name.")
    return False
  if info.definition == definition:
    return True
  raise errors.UserError(
      f"{name!r} is already registered with a different definition "
      f"({info.definition!r}); give the new one another name.")


def register_task(name: str, *, loader: Loader,
                  vocabulary: seqio.Vocabulary, lang: str,
                  lang_b: Optional[str] = None,
                  splits: Sequence[str] = ("train", "validation", "test"),
                  definition: Any = None,
                  id_maps: Tuple[Any, Any] = (None, None),
                  spec: Any = None, normalize: str = "",
                  text_preprocessors: Sequence[Callable[..., Any]] = (),
                  source: Optional[seqio.DataSource] = None,
                  max_line_chars: Optional[int] = DEFAULT_MAX_LINE_CHARS) -> seqio.Task:
  """Registers a monolingual (MLM) or, with `lang_b`, a bitext (TLM) task.

  Idempotent: registering the same `definition` again returns the task.
  `spec` is what `describe` reports (see `TaskInfo`); `normalize` names the
  text normaliser applied before tokenising (`tokenize_and_tag`), which
  `definition` and `spec` should record; `text_preprocessors` run on the
  text before it (e.g. code-switching, or turning a TFDS record into text).
  `source` streams the examples instead of `loader`'s in-memory dataset (a
  TFDS split); `loader` still serves the raw text (vocabulary trimming).
  With the in-memory dataset, texts longer than `max_line_chars` are cut
  (`cut_long_lines`; None: never) and a split whose texts yield no token is
  refused when its dataset is built (`check_tokens`).
  """
  definition = definition if definition is not None else (name, loader)
  if _already(name, definition):
    return seqio.TaskRegistry.get(name)
  _check_name(name)
  for code in (lang, lang_b or "x"):
    if not isinstance(code, str) or not code or "\t" in code:
      raise errors.UserError(
          f"Task {name!r}: language code {code!r} must be a non-empty string.")
  normalize_lib.check_normalizer(normalize, where=f"Task {name!r}: normalize")
  if source is None:
    # Text preprocessors change the text before it is tokenised: the token check would test other text.
    dataset_fn = functools.partial(in_memory_dataset, loader=loader, task=name, normalize=normalize,
                                   vocabulary=None if text_preprocessors else vocabulary,
                                   max_line_chars=_check_max_line_chars(name, max_line_chars))
    source = seqio.FunctionDataSource(dataset_fn, splits=tuple(splits), caching_permitted=False)
  task = seqio.Task(
      name,
      source=source,
      output_features=output_features(vocabulary),
      preprocessors=[*text_preprocessors, functools.partial(tokenize_and_tag, lang=lang,
                                       lang_b=lang_b or "", id_maps=tuple(id_maps),
                                       normalize=normalize)])
  seqio.TaskRegistry.add_provider(name, task)
  languages = tuple(sorted({lang, lang_b} - {None}))
  _TASKS[name] = TaskInfo(languages=languages, loader=loader,
                          definition=definition, spec=spec,
                          pair=(lang, lang_b) if lang_b else None)
  return task


def _check_max_line_chars(name: str, value: Any) -> Optional[int]:
  if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
    raise errors.UserError(
        f"Task {name!r}: max_line_chars={value!r} must be a positive number of characters (default "
        f"{DEFAULT_MAX_LINE_CHARS}), or None to never cut a line.")
  return value


def _check_name(name: str) -> None:
  if not isinstance(name, str) or not _VALID_NAME.match(name):
    raise errors.UserError(
        f"{name!r} is not a valid task or mixture name; use letters, digits, "
        "'_', '.' and ':' only.")


# ------------------------------------------------------------------ lookups


def registered_names() -> List[str]:
  """All task and mixture names registered through flax_xalign."""
  return sorted(set(_TASKS) | set(_MIXTURES))


def _plain_names() -> List[str]:
  """Names registered directly with seqio (not through flax_xalign)."""
  seqio_names = set(seqio.TaskRegistry.names()) | set(
      seqio.MixtureRegistry.names())
  return sorted(seqio_names - set(registered_names()))


def unknown_name_error(name: str, *, what: str = "task or mixture"
                       ) -> errors.UserError:
  ours, plain = registered_names(), _plain_names()
  close = difflib.get_close_matches(str(name), ours + plain, n=4, cutoff=0.5)
  hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
  listed = ", ".join(plain[:_LISTED_PLAIN_NAMES])
  if len(plain) > _LISTED_PLAIN_NAMES:
    listed += f" and {len(plain) - _LISTED_PLAIN_NAMES} more"
  also = f" Registered directly with seqio: {listed}." if plain else ""
  return errors.UserError(
      f"Unknown {what} {name!r}.{hint} Registered: "
      f"{', '.join(ours) or '(none)'}.{also} Register your own "
      "from gin with flax_xalign.tasks.user.TextTask / TsvBitextTask / AlphaMixture "
      "(call .register()), in Python with a module under tasks/, or directly "
      "with seqio.TaskRegistry.add / seqio.MixtureRegistry.add.")


def get_provider(name: str) -> Provider:
  """The seqio Task or Mixture called `name`: ours, else a plain seqio one.

  Raises:
    UserError: unknown name (with close matches).
  """
  if name in _TASKS:
    return seqio.TaskRegistry.get(name)
  if name in _MIXTURES:
    return seqio.MixtureRegistry.get(name)
  if isinstance(name, str) and (name in seqio.MixtureRegistry.names()
                                or name in seqio.TaskRegistry.names()):
    return seqio.get_mixture_or_task(name)
  raise unknown_name_error(name)


def task_names(name: str) -> Tuple[str, ...]:
  """The tasks of a mixture in its listed order (or the task itself)."""
  return tuple(task.name for task in pipeline.tasks_of(get_provider(name)))


def _check_codes(name: str, codes: Any) -> Tuple[str, ...]:
  if isinstance(codes, str) or not isinstance(codes, Sequence) or not codes:
    raise errors.UserError(
        f"The languages of {name!r} must be a list of language codes, e.g. "
        f"['en', 'de']; got {codes!r}.")
  if any(not isinstance(c, str) or not c or "\t" in c for c in codes):
    raise errors.UserError(
        f"Language codes must be non-empty strings, got {list(codes)!r}.")
  return tuple(sorted(set(codes)))


def languages_of(name: str, override: Optional[Sequence[str]] = None
                 ) -> Tuple[str, ...]:
  """Sorted language codes of a task or mixture (the converter's list).

  Our tasks know their languages. `override` (the run's `languages`) replaces
  them and is required for plain seqio tasks; it must include every language
  our tasks of `name` produce.

  Raises:
    UserError: a plain seqio task without `override`, or a bad `override`.
  """
  members = task_names(name)
  known = {lang for task in members if task in _TASKS
           for lang in _TASKS[task].languages}
  if override is not None:
    codes = _check_codes(name, override)
    missing = sorted(known - set(codes))
    if missing:
      raise errors.UserError(
          f"languages={list(override)!r} lacks {missing}, which the tasks of "
          f"{name!r} produce; add them to the run's languages.")
    return codes
  plain = [task for task in members if task not in _TASKS]
  if plain:
    what = ("is a plain seqio task" if plain == [name] else
            f"contains plain seqio tasks ({', '.join(plain)})")
    raise errors.UserError(
        f"{name!r} {what}, registered directly with seqio, so flax_xalign "
        "does not know its languages. Set the run's languages, e.g. "
        "train.languages = ['en', 'de'] in gin (languages= in Python); "
        "with several languages every example also needs a 'lang' feature "
        "(tf.string) naming its language.")
  return tuple(sorted(known))


def text_loader(name: str) -> Optional[Loader]:
  """The raw-text loader (`loader(split) -> {"text": [...], "text_b": [...]}`) of one of our
  tasks, or None for a plain seqio task (which only exposes tokenised datasets)."""
  info = _TASKS.get(name)
  return None if info is None else info.loader


def language_pairs(name: str) -> Tuple[Tuple[str, str], ...]:
  """(side a, side b) of each of our bitext tasks of `name`, listed order.

  Plain seqio tasks contribute nothing (their sides are not known).
  """
  pairs = [_TASKS[task].pair for task in task_names(name)
           if task in _TASKS and _TASKS[task].pair]
  return tuple(dict.fromkeys(pairs))


def _tokens_vocabulary(provider: Provider) -> seqio.Vocabulary:
  features = provider.output_features
  if "tokens" not in features:
    raise errors.UserError(
        f"{provider.name!r} has no 'tokens' output feature (it has "
        f"{', '.join(sorted(features))}); flax_xalign reads token ids (int32, "
        "rank 1) from 'tokens': name the task's token feature 'tokens'.")
  return features["tokens"].vocabulary


def get_vocabulary(name: str) -> seqio.Vocabulary:
  """The token vocabulary of a task or mixture."""
  return _tokens_vocabulary(get_provider(name))


def resolve(name: str, languages: Optional[Sequence[str]] = None
            ) -> Tuple[Provider, Tuple[str, ...], seqio.Vocabulary]:
  """(provider, sorted languages, vocabulary) of a task or mixture.

  What `flax_xalign.data.pipeline.get_dataset` needs; `languages` is the
  run's override (see `languages_of`).
  """
  provider = get_provider(name)
  return provider, languages_of(name, languages), _tokens_vocabulary(provider)
