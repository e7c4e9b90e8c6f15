"""Reading a seqio task's raw (unconverted) examples for counts and analyses, as NumPy.

Besides the training pipeline (`pipeline.py`) and the co-occurrence counter
(`cooc/sources.py`), the one place where tf.data is iterated: the
language-specific vocabulary's token counts (`assets.lang_vocab`) and BLI's
monolingual sentences (`evaluation.lexicon.bli`) read a task's split once,
unshuffled, through these functions.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from flax_xalign.errors import UserError

_BATCH = 1024  # Examples per host transfer of a counting pass.


def monolingual_tokens(task: Any, code: str, *, split: str, limit: int | None = None) -> Iterator[np.ndarray]:
  """The int32 `tokens` of `task`'s examples in language `code` (not bitext), in order, at most `limit`.

  A task without a `lang` feature yields nothing.
  """
  ds = task.get_dataset(None, split=split, shuffle=False, num_epochs=1, trim_output_features=False)
  if "lang" not in ds.element_spec:
    return iter(())
  has_b = "lang_b" in ds.element_spec
  ds = ds.filter(lambda ex: (ex["lang"] == code) & ((ex["lang_b"] == "") if has_b else True))
  if limit is not None:
    ds = ds.take(limit)
  return (np.asarray(ex["tokens"], np.int32) for ex in ds.as_numpy_iterator())


def language_key_batches(task: Any, languages: Sequence[str], vocab_size: int, split: str, max_examples: int | None):
  """One task's split as batches of flat keys `language index * vocab_size + id` (-1: not counted).

  Each batch (of up to 1,024 examples) is a dict of NumPy values: `keys` (int64, flat), `bad` (ids outside
  [0, vocab_size)), `tokens` and `examples`. Reads `tokens` for `lang` and `tokens_b` for `lang_b`.
  """
  import tensorflow as tf

  ds = task.get_dataset(None, split=split, shuffle=False, num_epochs=1, trim_output_features=False)
  spec = ds.element_spec
  if "tokens" not in spec:
    raise UserError(f"task {task.name!r} has no 'tokens' feature (it has {sorted(spec)}); the language-specific "
                    "vocabulary counts the token ids of 'tokens' (and 'tokens_b').")
  if "lang" not in spec:
    raise UserError(f"task {task.name!r} has no 'lang' feature, so its tokens cannot be counted for a language; "
                    "with two languages every example needs 'lang' (a tf.string scalar), see docs/INTERFACES.md.")
  if max_examples is not None:
    ds = ds.take(int(max_examples))
  known = tf.constant(list(languages))
  index_of = tf.range(len(languages), dtype=tf.int64)

  def side_keys(ids, lang):
    ids = tf.cast(tf.reshape(ids, [-1]), tf.int64)
    index = tf.reduce_sum(tf.where(tf.equal(known, lang), index_of + 1, 0)) - 1  # -1: not counted.
    bad = tf.reduce_sum(tf.cast((ids < 0) | (ids >= vocab_size), tf.int64))
    keys = tf.where(index >= 0, index * vocab_size + ids, -1)
    return keys, bad, tf.size(ids, out_type=tf.int64)

  def keys_of(ex):
    keys, bad, n = side_keys(ex["tokens"], ex["lang"])
    if "tokens_b" in ex and "lang_b" in ex:
      keys_b, bad_b, n_b = side_keys(ex["tokens_b"], ex["lang_b"])
      keys, bad, n = tf.concat([keys, keys_b], 0), bad + bad_b, n + n_b
    return {"keys": keys, "bad": bad, "tokens": n}

  ds = ds.map(keys_of, num_parallel_calls=tf.data.AUTOTUNE).ragged_batch(_BATCH)
  ds = ds.map(lambda b: {"keys": b["keys"].flat_values, "bad": tf.reduce_sum(b["bad"]),
                         "tokens": tf.reduce_sum(b["tokens"]), "examples": tf.size(b["bad"], out_type=tf.int64)})
  options = tf.data.Options()
  options.deterministic = True
  return ds.with_options(options).as_numpy_iterator()
