"""In-memory sources and tokenising of the tasks registered here (see `registry` for the whole picture).

A *loader* is a picklable callable `loader(split) -> {"text": [...]}` (plus
`"text_b"` for bitext) that runs when a dataset is built, never at import
time. Its lists become a `tf.data.Dataset.range(n)` shuffled over the whole
split (seeded, reshuffled each epoch) and mapped through `tf.gather` on
constant tensors (`in_memory_dataset`), then `tokenize_and_tag` normalises,
tokenises and attaches the language features (docs/INTERFACES.md).
"""

import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data.vocab import normalize as normalize_lib
from . import links as links_lib

Loader = Callable[[str], Mapping[str, Sequence[str]]]
# Longest text (one side of a pair) tokenised whole; longer ones are cut first. A row keeps at most
# L - 2 tokens and a SentencePiece piece spans at most 16 characters (its max_piece_length), so the
# first 20,000 characters hold every token a row of L <= 1,024 keeps (barring long whitespace runs,
# which SentencePiece collapses); and tokenising them takes ~15 ms.
DEFAULT_MAX_LINE_CHARS = 20_000
_WARNED_CUT: set = set()  # (task, split) whose cut lines were reported.
_TEXT_COLUMNS = ("text", "text_b")


def output_features(vocabulary: seqio.Vocabulary) -> Dict[str, seqio.Feature]:
  """The task output features: tokens of both sides (one vocabulary), languages, link groups.

  `link_groups`/`link_groups_b` (int32, one per token, 0 = no link; `tasks.links`) are all
  zeros unless the task's loader gives word links; every task has them so that tasks with and
  without links mix (seqio mixtures need equal features).
  """
  tokens = seqio.Feature(vocabulary=vocabulary, add_eos=False)
  lang = seqio.Feature(vocabulary=seqio.PassThroughVocabulary(size=0),
                       add_eos=False, dtype=tf.string, rank=0)
  groups = seqio.Feature(vocabulary=seqio.PassThroughVocabulary(size=0), add_eos=False,
                         dtype=tf.int32, rank=1)
  return {"tokens": tokens, "tokens_b": tokens, "lang": lang, "lang_b": lang,
          "link_groups": groups, "link_groups_b": groups}


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
  long_lines = set()  # Line numbers: both sides of one long TSV line are one line.
  for key, texts in columns.items():
    if key not in _TEXT_COLUMNS:  # Word link groups: a cut text simply keeps none (tasks.links).
      cut[key] = list(texts)
      continue
    cut[key] = [t[:max_line_chars] for t in texts]
    long_lines.update(i for i, t in enumerate(texts) if len(t) > max_line_chars)
  if long_lines and (task, split) not in _WARNED_CUT:
    _WARNED_CUT.add((task, split))
    count = len(long_lines)
    lines = "1 line" if count == 1 else f"{count} lines"
    print(f"warning: task {task!r}, split {split!r}: {lines} of {where} {'is' if count == 1 else 'are'} longer "
          f"than {max_line_chars} characters, kept to the first {max_line_chars} (a row keeps only its first "
          "tokens); set the task's max_line_chars higher to keep more.", file=sys.stderr, flush=True)
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

  `normalize` names a text normaliser (`flax_xalign.data.vocab.normalize`) applied
  to both sides before tokenisation; "" leaves the text as it is. `id_maps`
  optionally re-map each side's token ids (a [V] int table, e.g. a synthetic
  language's transliteration id -> id + V) after tokenisation. Word link
  groups (`groups`, `groups_b` columns: one number per word, `tasks.links`)
  become one per subword (`link_groups`, `link_groups_b`); without them both
  are zeros.
  """
  vocabulary = output_features["tokens"].vocabulary
  tables = [None if m is None else tf.constant(list(m), tf.int32) for m in id_maps]
  normalize_lib.check_normalizer(normalize)

  def encode_raw(text):
    return tf.cast(vocabulary.encode_tf(normalize_lib.normalize_tf(text, normalize)), tf.int32)

  def remap(ids, table):
    return ids if table is None else tf.gather(table, ids)

  starts = []  # The word-start table, built once and only for a task with links.

  def groups_of(ids, key, ex):
    if key not in ex:
      return tf.zeros_like(ids)
    if not starts:
      starts.append(tf.constant(links_lib.word_start_table(vocabulary)))
    return links_lib.subword_groups_tf(ids, ex[key], starts[0])

  def fn(ex):
    raw = encode_raw(ex["text"])
    raw_b = encode_raw(ex["text_b"]) if "text_b" in ex else tf.zeros([0], tf.int32)
    return {"tokens": remap(raw, tables[0]), "tokens_b": remap(raw_b, tables[1]) if "text_b" in ex else raw_b,
            "lang": tf.constant(lang), "lang_b": tf.constant(lang_b),
            "link_groups": groups_of(raw, "groups", ex), "link_groups_b": groups_of(raw_b, "groups_b", ex)}

  return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
