"""Shared machinery of the seqio tasks: in-memory sources, tokenising, metadata.

Every task registered here reads its text through a *loader*, a picklable
callable `loader(split) -> {"text": [...]}` (plus `"text_b"` for bitext) that
runs when a dataset is built, never at import time, so bad files fail with a
clear `UserError` only when they are used. The loader's lists become a
`tf.data.Dataset.range(n)` that is shuffled over the whole split (seeded,
reshuffled each epoch) and mapped through `tf.gather` on constant tensors:
pure tf.data, so the trainer can checkpoint the iterator. A loader may also
define `num_examples(split) -> int`, a cheaper count than `len(loader(split))`.

Task outputs follow docs/INTERFACES.md: `tokens`, `tokens_b` (int32 [n], no
specials), `lang`, `lang_b` (tf.string scalars, `lang_b == ""` when
monolingual).

Names are looked up here first and then in seqio's own registries, so a plain
`seqio.Task` or `seqio.Mixture` that a user registered directly with seqio
works too; `resolve(name, languages)` gives the trainer the provider, the
sorted language list and the vocabulary in one call. Plain tasks do not know
their languages: the run names them (`languages_of(name, override)`).

Mixtures built here sample task i with rate n_i ** alpha, n_i = number of
training examples of task i (XLM's alpha-sampling; alpha = 0.7 by default),
counted by the cheapest source that knows it (`num_train_examples`) or given
explicitly (`sizes=`).

`describe(name)` writes the user-defined tasks and mixtures behind a name as
JSON-serialisable definitions; `register_described` registers them again in
another process (the run manifest uses the pair).
"""

import dataclasses
import difflib
import functools
import importlib
import re
import sys
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data import normalize as normalize_lib
from flax_xalign.data import pipeline

# seqio's own rule for task names, applied before seqio sees the name.
_VALID_NAME = re.compile(r"^[\w\d\.\:_]+$")
Loader = Callable[[str], Mapping[str, Sequence[str]]]
Provider = Union[seqio.Task, seqio.Mixture]
DEFAULT_ALPHA = 0.7
# Kinds of describable definitions -> the module (in this package) defining them.
_KINDS = {"TextTask": "user", "TsvBitextTask": "user", "AlphaMixture": "user",
          "SyntheticTasks": "synthetic", "BibleTasks": "bible", "CodeSwitchedTask": "code_switch",
          "TfdsTasks": "tfds", "DebianTasks": "debian", "PythonModule": "registry"}
_LISTED_PLAIN_NAMES = 20
# Longest text (one side of a pair) tokenised whole; longer ones are cut first. A row keeps at most
# L - 2 tokens and a SentencePiece piece spans at most 16 characters (its max_piece_length), so the
# first 20,000 characters hold every token a row of L <= 1,024 keeps (barring long whitespace runs,
# which SentencePiece collapses); and tokenising them takes ~15 ms.
DEFAULT_MAX_LINE_CHARS = 20_000


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
_WARNED_CUT: set = set()  # (task, split) whose cut lines were reported.


# ----------------------------------------------------------------- features


def output_features(vocabulary: seqio.Vocabulary) -> Dict[str, seqio.Feature]:
  """The four task output features, sharing one token vocabulary."""
  tokens = seqio.Feature(vocabulary=vocabulary, add_eos=False)
  lang = seqio.Feature(vocabulary=seqio.PassThroughVocabulary(size=0),
                       add_eos=False, dtype=tf.string, rank=0)
  return {"tokens": tokens, "tokens_b": tokens, "lang": lang, "lang_b": lang}


def _where(loader: Loader, split: str) -> str:
  """The files behind a split, for messages (a loader may say through `paths(split)`)."""
  paths = getattr(loader, "paths", None)
  return ", ".join(paths(split)) if callable(paths) else "its source"


def cut_long_lines(task: str, split: str, columns: Mapping[str, Sequence[str]], *,
                   max_line_chars: Optional[int], where: str = "its source"
                   ) -> Dict[str, List[str]]:
  """Each text (each side of a pair) cut to its first `max_line_chars` characters.

  The cut bounds what one line costs: seqio fills its shuffle buffer by
  repeating a small split, so a 1 MB line was tokenised ~1,000 times before
  the first step. Rows keep only their first L - 2 tokens, so the default
  (`DEFAULT_MAX_LINE_CHARS`) drops nothing a row of up to 1,024 tokens keeps.
  Cut lines are counted and reported by one `warning:` line per task and
  split (per process). None keeps every line whole.
  """
  if max_line_chars is None:
    return {k: list(v) for k, v in columns.items()}
  cut = {}
  count = 0
  for key, texts in columns.items():
    cut[key] = [t[:max_line_chars] for t in texts]
    count += sum(len(t) > max_line_chars for t in texts)
  if count and (task, split) not in _WARNED_CUT:
    _WARNED_CUT.add((task, split))
    print(f"warning: task {task!r}, split {split!r}: {count} line(s) of {where} are longer than "
          f"{max_line_chars} characters and were cut to their first {max_line_chars} (a row keeps only "
          "its first tokens); raise the task's max_line_chars to keep more.", file=sys.stderr, flush=True)
  return cut


def check_tokens(task: str, split: str, columns: Mapping[str, Sequence[str]], *,
                 vocabulary: seqio.Vocabulary, normalize: str = "",
                 where: str = "its source") -> None:
  """UserError unless some example of the split tokenises to at least one token.

  The feature converter drops token-less examples after seqio's `repeat()`,
  so a split without a single token would be searched forever: training hung
  with no output on a corpus of control characters. Stops at the first
  example that yields a token (one encode for ordinary text).
  """
  sides = [columns[k] for k in ("text", "text_b") if k in columns]
  for texts in zip(*sides):
    if any(vocabulary.encode(normalize_lib.normalize_text(t, normalize)) for t in texts):
      return
  shown = next((t for texts in zip(*sides) for t in texts if t), "")
  example = f"; e.g. {shown[:40]!r}" if shown else ""
  raise errors.UserError(
      f"Task {task!r}, split {split!r}: no line of {where} yields a single token "
      f"({len(sides[0]) if sides else 0} line(s){example}), so there is nothing to train "
      "on; they hold only characters the vocabulary drops (control characters, lone marks). "
      "Check the file's encoding and contents, or give the task text.")


def in_memory_dataset(split: str, shuffle_files: bool,
                      seed: Optional[int] = None, *,
                      loader: Loader, task: str = "",
                      vocabulary: Optional[seqio.Vocabulary] = None,
                      normalize: str = "",
                      max_line_chars: Optional[int] = None) -> tf.data.Dataset:
  """A seqio dataset_fn over the loader's lists (whole-split shuffle).

  Long texts are cut (`cut_long_lines`) and, given the task's `vocabulary`,
  a split that yields no token is refused (`check_tokens`) when the dataset
  is built, i.e. before training starts.
  """
  where = _where(loader, split) if task else "its source"
  columns = cut_long_lines(task, split, loader(split), max_line_chars=max_line_chars, where=where)
  if vocabulary is not None:
    check_tokens(task, split, columns, vocabulary=vocabulary, normalize=normalize, where=where)
  size = len(columns["text"])
  ds = tf.data.Dataset.range(size)
  if shuffle_files:
    ds = ds.shuffle(size, seed=seed, reshuffle_each_iteration=True)
  tables = {k: tf.constant(list(v), tf.string) for k, v in columns.items()}
  return ds.map(lambda i: {k: tf.gather(t, i) for k, t in tables.items()})


def tokenize_and_tag(dataset: tf.data.Dataset,
                     output_features: Mapping[str, seqio.Feature], *,
                     lang: str, lang_b: str = "",
                     id_maps: Tuple[Any, Any] = (None, None),
                     normalize: str = "") -> tf.data.Dataset:
  """Preprocessor: text (and text_b) -> tokens, tokens_b, lang, lang_b.

  `normalize` names a text normaliser (`flax_xalign.data.normalize`) applied
  to both sides before tokenisation; "" leaves the text as it is. `id_maps`
  optionally re-map each side's token ids (a [V] int table, e.g. a synthetic
  language's transliteration id -> id + V) after tokenisation.
  """
  vocabulary = output_features["tokens"].vocabulary
  tables = [None if m is None else tf.constant(list(m), tf.int32) for m in id_maps]
  normalize_lib.check_normalizer(normalize)

  def encode(text, table):
    text = normalize_lib.normalize_tf(text, normalize)
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


# ------------------------------------------------------------ mixture rates


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


# ------------------------------------------------------ describe / rebuild


def _jsonable(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {str(k): _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  if value is None or isinstance(value, (str, int, float, bool)):
    return value
  raise TypeError(f"cannot describe {value!r} as JSON")


def _spec_definition(spec: Any) -> Dict[str, Any]:
  kind = type(spec).__name__
  if kind not in _KINDS or not dataclasses.is_dataclass(spec):
    raise TypeError(f"{spec!r} is not one of the describable kinds {sorted(_KINDS)}")
  args = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
  return {"kind": kind, "args": _jsonable(args)}


@dataclasses.dataclass(frozen=True)
class PythonModule:
  """Tasks registered in Python: importing `module` registers them again.

  What `describe` records for a task registered by code of the user's (a
  `register_task` call without a spec, or a plain seqio task), so that a
  fresh process (`python -m flax_xalign.eval`) can re-register it.
  """
  module: str

  def register(self) -> "PythonModule":
    if not isinstance(self.module, str) or not _MODULE_NAME.match(self.module):
      raise errors.UserError(f"PythonModule: {self.module!r} is not a Python module name.")
    try:
      importlib.import_module(self.module)
    except ImportError as e:
      raise errors.UserError(
          f"the tasks of this run were registered by the Python module {self.module!r}, which cannot be "
          f"imported here ({type(e).__name__}: {e}); run from the folder that holds it or add that folder "
          "to PYTHONPATH.") from e
    return self


_MODULE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
# Modules whose callables say nothing about who registered a task.
_LIBRARY_MODULES = ("seqio", "tensorflow", "t5", "functools", "builtins", "flax_xalign")


def _callable_module(fn: Any) -> Optional[str]:
  while isinstance(fn, functools.partial):
    fn = fn.func
  fn = getattr(fn, "__func__", fn)  # A bound method: its function.
  if isinstance(fn, (type(_check_name), type)):
    return fn.__module__
  return type(fn).__module__  # A callable object (e.g. a loader class instance).


def _defining_module(name: str) -> Optional[str]:
  """The user module whose import registers task `name`, or None if unknown.

  Read from the task's own callables (loader, dataset_fn, preprocessors):
  the first one defined outside the libraries. `__main__` cannot be
  imported by another process, so it counts as unknown.
  """
  if name in _TASKS:
    candidates = [_TASKS[name].loader]
  elif name in seqio.TaskRegistry.names():
    task = seqio.TaskRegistry.get(name)
    candidates = [getattr(task.source, "_dataset_fn", None), *task.preprocessors]
  else:
    return None
  for fn in candidates:
    module = _callable_module(fn) if fn is not None else None
    if module and not module.split(".")[0] in _LIBRARY_MODULES:
      return None if module == "__main__" else module
  return None


def _registered_on_import(info: Any) -> bool:
  """Registered by importing flax_xalign (the embedded tasks): nothing to record."""
  module = _callable_module(getattr(info, "loader", None)) or ""
  return module.split(".")[0] == "flax_xalign" or module.startswith(__package__ or "flax_xalign.tasks")


def describe(name: str) -> Optional[List[Dict[str, Any]]]:
  """JSON-serialisable definitions that re-register `name` in a new process.

  Returns:
    The definitions of every user-defined task and mixture `name` needs,
    tasks first (`{"kind": "TextTask", "args": {...}}`; kinds TextTask,
    TsvBitextTask, AlphaMixture, SyntheticTasks, ...); a task registered by
    Python code (no spec) is described by the module whose import registers
    it (`{"kind": "PythonModule", "args": {"module": "my_tasks"}}`); `[]`
    when importing flax_xalign.tasks registers everything (the embedded
    Bible tasks); None when some task's registering code is not known (a
    script's `__main__`, or a plain seqio task whose callables are all
    library functions).

  Raises:
    UserError: unknown name.
  """
  get_provider(name)  # UserError if unknown.
  members = list(task_names(name)) + ([name] if name not in _TASKS else [])
  definitions = []
  for member in members:
    info = _TASKS.get(member) or _MIXTURES.get(member)
    if info is not None and info.spec is not None:
      # A spec built on other tasks (CodeSwitchedTask's source) describes them first.
      definitions.extend(d for d in getattr(info.spec, "required_definitions", list)() if d not in definitions)
      definition = _spec_definition(info.spec)
      if definition not in definitions:
        definitions.append(definition)
      continue
    if isinstance(info, TaskInfo) and _registered_on_import(info):
      continue
    module = _defining_module(member)
    if module is None:
      if member != name or member in _TASKS:
        return None
      # A mixture registered in Python: registered on import with its tasks when they all are (the
      # embedded mixtures), else assumed to come from the module of its Python-registered tasks.
      if not definitions or any(d["kind"] == "PythonModule" for d in definitions):
        continue
      return None
    definition = {"kind": "PythonModule", "args": {"module": module}}
    if definition not in definitions:
      definitions.append(definition)
  return definitions


def register_described(definitions: Sequence[Mapping[str, Any]]) -> None:
  """Registers what `describe` returned, in order (idempotent).

  Raises:
    UserError: a malformed definition or one that conflicts with a
      registered name.
  """
  if isinstance(definitions, (str, Mapping)) or not isinstance(
      definitions, Sequence):
    raise errors.UserError(
        f"Task definitions must be a list of {{'kind': ..., 'args': {{...}}}} "
        f"entries (as describe() writes them); got {definitions!r}.")
  for definition in definitions:
    kind = definition.get("kind") if isinstance(definition, Mapping) else None
    args = definition.get("args") if isinstance(definition, Mapping) else None
    if kind not in _KINDS or not isinstance(args, Mapping):
      raise errors.UserError(
          f"Bad task definition {definition!r}: expected {{'kind': one of "
          f"{sorted(_KINDS)}, 'args': {{...}}}}.")
    module = importlib.import_module(f".{_KINDS[kind]}", __package__)
    try:
      spec = getattr(module, kind)(**args)
    except TypeError as e:
      raise errors.UserError(
          f"Bad {kind} definition {dict(args)!r}: {e}.") from e
    spec.register()
