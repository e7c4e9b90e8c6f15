"""Task features -> the encoder's batch features (docs/INTERFACES.md).

Input (every task in `tasks/`): `tokens` and `tokens_b` (int32 [n], no special
tokens; `tokens_b` empty for monolingual text), `lang` and `lang_b` (tf.string
scalars; `lang_b == ""` marks a monolingual example). A plain seqio task may
output `tokens` alone: a missing `tokens_b` is empty (monolingual), and a
missing `lang` (`lang_b`) is the converter's language when it has exactly one.

Output (int32 [L] each, L = `task_feature_lengths["tokens"]`):

* `tokens`: `<s> a </s>` for a monolingual example; a pair is laid out as
  `pair_layout` says (`specials.PAIR_LAYOUTS`): `<s> a </s> <s> b </s>`
  ("restart", the XLM/TLM paper layout and the default) or `<s> a </s> b </s>`
  ("continuous", the released XLM-Align code's `tools/para2bin.py`, XLM-R
  style). Padding is the vocabulary's `<pad>` id (`specials.pad`: 0 for our
  own layout, 1 for an imported XLM-R vocabulary).
* `lang_ids`: index of the language in the sorted language list + 1.
* `segment_ids`: 1..k for the k examples packed into the row; 0 on padding.
* `positions`: 0.. within each example; "restart" starts again at 0 on the
  second side of a pair, "continuous" runs on across it. Either way no
  position reaches L, so a model with `num_positions >= L` reads every row.
* `pair_side`: 0 monolingual / padding, 1 first side, 2 second side. The
  first side is `<s> a </s>`; the second is `<s> b </s>` ("restart") or
  `b </s>` ("continuous").
* `link_groups` (only with `links=True`, for the alignment objectives that
  learn from given word links): each subword's link group within its pair
  (`tasks.links`: source i and target j are linked when equal and non-zero),
  0 on special tokens, padding and monolingual text.

Trimming: a monolingual text keeps at most L - 2 tokens. A pair keeps at most
L - 4 ("restart") or L - 3 ("continuous") tokens in all: each side is
guaranteed half of that budget (the first side gets the smaller half when it
is odd) and a short side gives its unused share to the other.

`both_directions=True` also emits every pair swapped, (b, a) with its
languages, right after (a, b), as the released XLM-Align code stores its
bitext (src-tgt and tgt-src). Since packing fills rows from consecutive
examples, the two directions usually share a row (as separate segments, so
they never attend to each other).

Packing is seqio's greedy packer (`trim_and_pack_dataset`), which fills rows
from windows of L consecutive examples. Its packer (and its padder, unpacked)
pads with 0 and finds an example's length by counting non-zero entries, while
0 is a real id in `positions`, `pair_side` and, in an XLM-R vocabulary
(`<s>` = 0), in `tokens`. So these three travel through it shifted by +1;
afterwards they are shifted back and padding becomes `specials.pad` in
`tokens` and 0 elsewhere. With our own layout (`<pad>` = 0, no real token 0)
the batches are the same as packing the ids unshifted. Everything is plain
tf.data and tf ops (no py_function), so iterators can be saved with
`tf.train.Checkpoint`.
"""

from typing import Dict, Mapping, Sequence, Tuple

import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data.vocab.specials import check_pair_layout
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.data.vocab.specials import SpecialTokens

MODEL_FEATURE_KEYS = ("tokens", "lang_ids", "segment_ids", "positions",
                      "pair_side")
_LAYOUT_KEYS = ("tokens", "lang_ids", "positions", "pair_side")
# Keys where 0 is a real value: shifted by +1 through seqio's packer and padder.
_SHIFTED_KEYS = ("tokens", "positions", "pair_side", "link_groups")
_INPUTS = {"tokens": (tf.int32, 1), "tokens_b": (tf.int32, 1),
           "lang": (tf.string, 0), "lang_b": (tf.string, 0),
           "link_groups": (tf.int32, 1), "link_groups_b": (tf.int32, 1)}
LINK_FEATURE = "link_groups"
# Shortest row that holds a pair with one token per side, per pair layout.
MIN_LENGTH = {"restart": 6, "continuous": 5}
# Special tokens a pair adds to its two sides, per pair layout.
PAIR_SPECIALS = {"restart": 4, "continuous": 3}


def pair_budget(len_a: tf.Tensor, len_b: tf.Tensor,
                budget: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """How many tokens of each side of a pair to keep.

  Args:
    len_a: int32 scalar, length of the first side.
    len_b: int32 scalar, length of the second side.
    budget: tokens available for both sides together (L - 4, or L - 3 for
      the continuous layout).

  Returns:
    (keep_a, keep_b) with keep_a + keep_b <= budget, each side getting at least
    min(its length, budget // 2 or its complement).
  """
  keep_a = tf.minimum(len_a, tf.maximum(budget // 2, budget - len_b))
  keep_b = tf.minimum(len_b, budget - keep_a)
  return keep_a, keep_b


class XAlignFeatureConverter(seqio.FeatureConverter):
  """Lays out MLM / TLM examples for the encoder and packs them into rows.

  Attributes:
    languages: the sorted, distinct language codes; id = index + 1.
    specials: the vocabulary's special ids; `<s>` and `</s>` frame each side
      and `<pad>` fills `tokens` after the last example of a row (any id:
      see the module docstring).
    pair_layout: "restart" or "continuous" (see the module docstring).
    both_directions: also emit each pair swapped, (b, a).
    links: also emit `link_groups` (a task without links gives zeros).
  """

  TASK_FEATURES = {"tokens": seqio.FeatureConverter.FeatureSpec(tf.int32)}
  MODEL_FEATURES = {
      k: seqio.FeatureConverter.FeatureSpec(tf.int32)
      for k in MODEL_FEATURE_KEYS}
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, languages: Sequence[str], pack: bool = True,
               specials: SpecialTokens = PROJECT, pair_layout: str = "restart",
               both_directions: bool = False, links: bool = False):
    if isinstance(languages, str) or not languages:
      raise errors.UserError(
          f"XAlignFeatureConverter needs a list of language codes, got "
          f"{languages!r}; pass e.g. languages_of(MIXTURE_OR_TASK_NAME).")
    if any(not isinstance(l, str) or not l for l in languages):
      raise errors.UserError(
          f"Language codes must be non-empty strings, got {list(languages)!r}.")
    self.languages = tuple(sorted(set(languages)))
    if not isinstance(specials, SpecialTokens):
      raise errors.UserError(
          f"specials must be a flax_xalign.data.vocab.specials.SpecialTokens, got "
          f"{specials!r}.")
    self.specials = specials
    check_pair_layout(pair_layout, where="train.pair_layout")
    self.pair_layout = pair_layout
    self.both_directions = bool(both_directions)
    self.links = bool(links)
    self.output_keys = MODEL_FEATURE_KEYS + ((LINK_FEATURE,) if self.links else ())
    if self.links:
      self.MODEL_FEATURES = {k: seqio.FeatureConverter.FeatureSpec(tf.int32) for k in self.output_keys}
    # Lengths are enforced by our own trimming; seqio's length assertions
    # would only reject over-long raw inputs that we trim anyway.
    super().__init__(pack=pack, apply_length_check=False)

  def get_model_feature_lengths(
      self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
    length = task_feature_lengths["tokens"]
    return {k: length for k in self.output_keys}

  def _lang_id(self, lang: tf.Tensor) -> tf.Tensor:
    """Language id of a tf.string scalar; asserts that it is known."""
    known = tf.constant(self.languages)
    hits = tf.cast(tf.equal(known, lang), tf.int32)
    lang_id = tf.reduce_sum(hits * tf.range(1, len(self.languages) + 1))
    check = tf.debugging.Assert(
        lang_id > 0,
        ["Unknown language in a task example:", lang,
         f"- the feature converter was built for {list(self.languages)}; build "
         "it with the task's languages (languages_of(name))."])
    with tf.control_dependencies([check]):
      return tf.identity(lang_id)

  def _layout(self, ex: Mapping[str, tf.Tensor],
              length: int) -> Dict[str, tf.Tensor]:
    """One example laid out as `<s> a </s> [<s> b </s> | b </s>]`, unpadded."""
    a = tf.cast(ex["tokens"], tf.int32)
    b = tf.cast(ex["tokens_b"], tf.int32)
    is_pair = tf.not_equal(ex["lang_b"], "")
    restart = self.pair_layout == "restart"
    pair_a, pair_b = pair_budget(tf.size(a), tf.size(b),
                                 length - PAIR_SPECIALS[self.pair_layout])
    keep_a = tf.where(is_pair, pair_a, tf.minimum(tf.size(a), length - 2))
    keep_b = tf.where(is_pair, pair_b, 0)
    span_a = keep_a + 2
    opens_b = 1 if restart else 0  # Side b's own <s>.
    span_b = tf.where(is_pair, keep_b + 1 + opens_b, 0)
    bos, eos = [self.specials.bos], [self.specials.eos]
    side_b = tf.concat([bos[:opens_b], b[:keep_b], eos], 0)[:span_b]
    positions_b = (tf.range(span_b) if restart else
                   tf.range(span_a, span_a + span_b))
    lang_a = self._lang_id(ex["lang"])
    lang_b = tf.cond(is_pair, lambda: self._lang_id(ex["lang_b"]),
                     lambda: tf.constant(0, tf.int32))
    side_a_code = tf.where(is_pair, 1, 0)
    laid_out = {}
    if self.links:
      none = [0]
      groups_b = tf.concat([none[:opens_b], ex["link_groups_b"][:keep_b], none], 0)[:span_b]
      laid_out[LINK_FEATURE] = tf.concat([none, ex["link_groups"][:keep_a], none, groups_b], 0)
      laid_out[LINK_FEATURE] *= tf.cast(is_pair, tf.int32)
    return {
        **laid_out,
        "tokens": tf.concat([bos, a[:keep_a], eos, side_b], 0),
        "lang_ids": tf.concat([tf.fill([span_a], lang_a),
                               tf.fill([span_b], lang_b)], 0),
        "positions": tf.concat([tf.range(span_a), positions_b], 0),
        "pair_side": tf.concat([tf.fill([span_a], side_a_code),
                                tf.fill([span_b], 2)], 0),
    }

  def _check_inputs(self, ds: tf.data.Dataset) -> None:
    spec = ds.element_spec
    for key, (dtype, rank) in _INPUTS.items():
      if key not in spec:
        continue
      if spec[key].dtype != dtype or spec[key].shape.rank != rank:
        raise errors.UserError(
            f"Task feature {key!r} is {spec[key].dtype.name} of rank "
            f"{spec[key].shape.rank}; expected {dtype.name} of rank {rank}.")
    if len(self.languages) == 1:
      return
    for key, side in (("lang", "an example"), ("lang_b", "a pair's second side")):
      if key not in spec and (key == "lang" or "tokens_b" in spec):
        raise errors.UserError(
            f"The task dataset lacks the feature {key!r} (has {sorted(spec)}), "
            f"which names the language of {side}; with several languages "
            f"({', '.join(self.languages)}) the task must output {key!r} "
            "(a tf.string scalar; lang_b is '' for monolingual examples), "
            "e.g. from a preprocessor, or the run must have one language "
            "(docs/INTERFACES.md).")

  def _complete_inputs(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Adds the optional features a plain seqio task may leave out."""
    spec = ds.element_spec
    if all(key in spec for key in _INPUTS):
      return ds  # Our tasks: the dataset is used as it is.
    only = self.languages[0] if len(self.languages) == 1 else ""

    def fill(ex):
      ex = dict(ex)
      if "tokens_b" not in ex:
        ex["tokens_b"] = tf.zeros([0], tf.int32)
      if "lang" not in ex:
        ex["lang"] = tf.constant(only)
      if "lang_b" not in ex:
        ex["lang_b"] = tf.where(tf.size(ex["tokens_b"]) > 0, only, "")
      for key, side in (("link_groups", "tokens"), ("link_groups_b", "tokens_b")):
        if key not in ex:
          ex[key] = tf.zeros_like(ex[side], tf.int32)
      return ex

    return ds.map(fill, num_parallel_calls=tf.data.AUTOTUNE)

  def _add_reverse_pairs(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Every pair (a, b) followed by (b, a); monolingual examples once."""

    def both(ex):
      swapped = dict(ex, tokens=ex["tokens_b"], tokens_b=ex["tokens"],
                     lang=ex["lang_b"], lang_b=ex["lang"],
                     link_groups=ex["link_groups_b"], link_groups_b=ex["link_groups"])
      copies = tf.cast(tf.not_equal(ex["lang_b"], ""), tf.int64)
      return tf.data.Dataset.from_tensors(ex).concatenate(
          tf.data.Dataset.from_tensors(swapped).take(copies))

    return ds.flat_map(both)

  def _convert_features(self, ds: tf.data.Dataset,
                        task_feature_lengths: Mapping[str, int]
                        ) -> tf.data.Dataset:
    length = int(task_feature_lengths["tokens"])
    shortest = MIN_LENGTH[self.pair_layout]
    if length < shortest:
      layout = ("<s> a </s> <s> b </s>" if self.pair_layout == "restart"
                else "<s> a </s> b </s>")
      raise errors.UserError(
          f"TASK_FEATURE_LENGTHS['tokens']={length} is too short: a row needs "
          f"at least {shortest} positions ({layout}).")
    self._check_inputs(ds)
    ds = self._complete_inputs(ds)
    ds = ds.filter(lambda ex: tf.size(ex["tokens"]) + tf.size(ex["tokens_b"])
                   > 0)
    if self.both_directions:
      ds = self._add_reverse_pairs(ds)
    ds = ds.map(lambda ex: self._layout(ex, length),
                num_parallel_calls=tf.data.AUTOTUNE)
    lengths = {k: length for k in _LAYOUT_KEYS + ((LINK_FEATURE,) if self.links else ())}
    ds = ds.map(_shift_up, num_parallel_calls=tf.data.AUTOTUNE)
    if self.pack:
      ds = seqio.utils.trim_and_pack_dataset(ds, lengths)
    else:
      ds = seqio.utils.trim_and_pad_dataset(ds, lengths)
    pad = self.specials.pad
    ds = ds.map(lambda ex: _shift_down(ex, pad),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.map(lambda ex: _set_shapes(ex, length, self.output_keys))



def _shift_up(ex: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """+1 on the keys where 0 is a real value, so that 0 means padding."""
  return {k: v + 1 if k in _SHIFTED_KEYS else v for k, v in ex.items()}


def _shift_down(ex: Mapping[str, tf.Tensor], pad: int) -> Dict[str, tf.Tensor]:
  """Undoes `_shift_up` after packing or padding; padding -> `pad` / 0.

  Packed rows keep seqio's segment ids (1..k); an unpacked row is segment 1.
  """
  occupied = tf.not_equal(ex["tokens"], 0)
  as_int = tf.cast(occupied, tf.int32)
  segment_ids = ex.get("tokens_segment_ids", as_int)
  groups = {LINK_FEATURE: (ex[LINK_FEATURE] - 1) * as_int} if LINK_FEATURE in ex else {}
  return {
      **groups,
      "tokens": tf.where(occupied, ex["tokens"] - 1, pad),
      "lang_ids": ex["lang_ids"],
      "segment_ids": segment_ids,
      "positions": (ex["positions"] - 1) * as_int,
      "pair_side": (ex["pair_side"] - 1) * as_int,
  }


def _set_shapes(ex: Mapping[str, tf.Tensor], length: int,
                keys: Sequence[str] = MODEL_FEATURE_KEYS) -> Dict[str, tf.Tensor]:
  return {k: tf.ensure_shape(tf.cast(ex[k], tf.int32), [length])
          for k in keys}
