"""Code-switching by a bilingual dictionary (flax_xalign.data.transforms.code_switch): reader, reference, tf map."""

import random
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from flax_xalign import errors
from flax_xalign.data.transforms import code_switch as cs  # Source words in several spellings (case, accents, punctuation) and their translations; a
# source may have several translations, and "Hund" / "hund" pool theirs under the lowercase key.
DICTIONARY = {
    "der": ("the",), "die": ("the",), "hund": ("dog", "hound"), "Hund": ("canine",),
    "sieht": ("sees", "watches", "spots"), "läuft": ("runs",), "λόγος": ("word",),
    "ἀρχῇ": ("beginning",), "u.s.": ("usa",), "baum": ("tree",),
}
WORDS = ["der", "Der", "DER", "die", "hund", "Hund", "HUND", "sieht", "läuft", "LÄUFT", "λόγος",
         "Λόγος", "ΛΌΓΟΣ", "ἀρχῇ", "u.s.", "baum", "katze", "ein", "rot", "ἐν", "ἦν", "x"]
AFFIXES = ["", "", "", ",", ".", "«", "»,", "(", ")", "·", "—", "$", "'", "\"", "?!"]
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\u00a0"]


class Replay:
  """`rng.random()` that returns given draws in order (the tf map's, to replay them)."""

  def __init__(self, draws):
    self._draws = iter(np.asarray(draws, np.float32).reshape(-1).tolist())

  def random(self):
    return next(self._draws)


def _sentence(rng):
  text = ""
  for i in range(rng.randint(0, 14)):
    word = rng.choice(AFFIXES) + rng.choice(WORDS) + rng.choice(AFFIXES)
    text += (rng.choice(SPACES) if i else rng.choice(["", " "])) + word
  return text + rng.choice(["", " ", "\n"])


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
  return str(path)


# ------------------------------------------------------------------ reader


def test_reads_muse_with_comments_and_several_translations(tmp_path):
  path = _write(tmp_path, "de-en.txt", "# a MUSE lexicon\n\nhund dog\nhund hound\n  # indented comment\n#\n"
                "haus\thouse\nhund dog\nbaum   tree\r\n")
  logged = []
  assert cs.read_bilingual_dictionary(path, log=logged.append) == {
      "hund": ("dog", "hound"), "haus": ("house",), "baum": ("tree",)}
  assert logged == [f"dictionary {path}: 4 pairs over 3 source words"]


def test_reads_bli_output_and_skips_word_internal_pieces(tmp_path):
  lines = ["src\ttgt\tscore", "# induced by csls", "▁λόγος\t▁word\t0.71", "▁ἀρχῇ\t▁beginning\t-0.25",
           "ους\t▁the\t0.5", "▁καὶ\tand\t0.4", "▁\t▁the\t0.3", "▁λόγος\t▁speech\t1e-3", "ing\ted\t0.2"]
  path = _write(tmp_path, "induced.tsv", "\n".join(lines) + "\n")
  logged = []
  assert cs.read_bilingual_dictionary(path, log=logged.append) == {
      "λόγος": ("word", "speech"), "ἀρχῇ": ("beginning",)}
  assert logged == [(f"dictionary {path}: 3 pairs over 2 source words; skipped 4 word-internal piece "
                     "pairs (no leading '▁')")]


def test_reads_bli_output_of_a_wordpiece_vocabulary(tmp_path):
  path = _write(tmp_path, "wp.tsv", "haus\thouse\t0.9\n##es\tthe\t0.5\nhund\t##s\t0.4\nbaum\ttree\t0.3\n")
  logged = []
  assert cs.read_bilingual_dictionary(path, log=logged.append) == {"haus": ("house",), "baum": ("tree",)}
  assert logged == [(f"dictionary {path}: 2 pairs over 2 source words; skipped 2 word-internal piece pairs "
                     "('##' continuations)")]


@pytest.mark.parametrize("content,message", [
    ("a b\nthree words here\n", r"x.txt:2: expected 'source target' .* found 3 fields"),
    ("a b\nlonely\n", r"x.txt:2: expected .* found 1 fields"),
    ("# c\n\n▁a\t▁b\tnot-a-score\n", r"x.txt:3: the third column 'not-a-score' is not a score"),
    ("a\tb\tc\td\n", r"x.txt:1: expected .* found 4 fields"),
    ("a\t \n", r"x.txt:1: the target column is empty"),
    ("# only comments\n\n", r"x.txt is empty: it holds no entry"),
    ("ing\t▁b\t0.1\n▁a\tb\t0.2\n", r"x.txt is empty: all 2 entries are word-internal pieces"),
    (b"a b\n\xff c\n", r"x.txt:2: not valid UTF-8"),
])
def test_malformed_dictionaries_name_file_and_line(tmp_path, content, message):
  path = _write(tmp_path, "x.txt", content)
  with pytest.raises(errors.UserError, match=message):
    cs.read_bilingual_dictionary(path, log=lambda _: None)


def test_missing_dictionary_file(tmp_path):
  with pytest.raises(errors.UserError, match=r"nope.txt does not exist.*MUSE format"):
    cs.read_bilingual_dictionary(str(tmp_path / "nope.txt"))
  with pytest.raises(errors.UserError, match="nope.txt does not exist"):
    cs.cached_dictionary(str(tmp_path / "nope.txt"))


# --------------------------------------------------------- matching rules


def test_word_splitting_matches_tf_strings_split():
  rng = random.Random(0)
  texts = [_sentence(rng) for _ in range(200)] + ["", " ", "\t\n", "a\x0bb\x0cc\rd", "a\u2009b\u3000c"]
  tf_words = tf.strings.split(tf.constant(texts)).to_list()
  for text, words in zip(texts, tf_words):
    assert cs.split_words(text) == [w.decode("utf-8") for w in words], text


def test_affixes_and_keys_by_hand():
  assert cs.split_affixes("«λόγος»,") == ("«", "λόγος", "»,")
  assert cs.split_affixes("u.s.") == ("", "u.s", ".")
  assert cs.split_affixes("...") == ("...", "", "")
  assert cs.split_affixes("$5") == ("$", "5", "")
  assert cs.lookup_key("ΛΌΓΟΣ,") == "λόγος"  # Final sigma, as str.lower gives it.
  assert cs.lookup_key("ΛΌΓΟΣ,", lowercase=False) == "ΛΌΓΟΣ"
  assert cs.lookup_key("Ἀρχῇ", normalize="nfd_strip_marks") == "αρχη"
  assert cs.keyed_dictionary({"Hund": ("canine",), "hund": ("dog", "canine"), "...": ("x",)}) == {
      "hund": ("canine", "dog")}


def test_switches_by_hand_at_rate_one():
  tables = cs.build_tables(DICTIONARY)
  text = "Der Hund,  «λόγος» ist\tim u.s. katze"
  out = cs.switch_text_tf(tf.constant(text), tables, rate=1.0, seed=0).numpy().decode("utf-8")
  words = out.split(" ")
  # Single translations are exact; "Hund" picks one of its pooled three (hund + Hund).
  assert words[0] == "the" and words[2:] == ["«word»", "ist", "im", "usa.", "katze"]
  assert words[1] in ("dog,", "hound,", "canine,")
  unchanged = "ist im katze"
  assert cs.switch_text_tf(tf.constant(unchanged), tables, rate=1.0, seed=0).numpy().decode() == unchanged


# ------------------------------------------------- tf map vs the reference


def _switcher(tables, **options):
  """`switch_text_tf` traced once (as the preprocessor's map runs it): eager, each text would run op by op."""
  switch = tf.function(lambda text: cs.switch_text_tf(text, tables, **options))
  return lambda text: switch(tf.constant(text)).numpy().decode("utf-8")


def _tf_and_reference(texts, dictionary, *, rate, seed, lowercase=True, normalize=""):
  tables = cs.build_tables(dictionary, lowercase=lowercase, normalize=normalize)
  switch = _switcher(tables, rate=rate, seed=seed, lowercase=lowercase, normalize=normalize)
  uniforms = tf.function(lambda text, n: cs.example_uniforms(text, seed, n))
  for text in texts:
    out = switch(text)
    words = cs.split_words(text)
    draws = uniforms(tf.constant(text), tf.constant(len(words))).numpy()
    assert draws.shape == (len(words), 2)
    expected = cs.switch_words(words, dictionary, rate, Replay(draws), lowercase=lowercase,
                               normalize=normalize)
    yield text, out, words, expected


@pytest.mark.parametrize("rate,seed,lowercase,normalize", [
    (0.3, 0, True, ""), (0.7, 5, True, ""), (0.5, 1, False, ""), (0.6, 2, True, "nfd_strip_marks"),
])
def test_tf_map_agrees_with_the_reference_word_for_word(rate, seed, lowercase, normalize):
  rng = random.Random(seed)
  texts = [_sentence(rng) for _ in range(150)]
  switched = 0
  for text, out, words, expected in _tf_and_reference(texts, DICTIONARY, rate=rate, seed=seed,
                                                       lowercase=lowercase, normalize=normalize):
    if expected == words:
      assert out == text  # Nothing switched: byte for byte, whitespace included.
    else:
      assert out == " ".join(expected), text
      switched += sum(a != b for a, b in zip(expected, words))
  assert switched > 100  # The comparison exercised switching, not only identity.


def _translations_of(word, dictionary):
  """Every prefix + translation + suffix a word may become (an independent, brute-force lookup)."""
  def strip(w):
    return "".join(c for c in w if unicodedata.category(c)[0] not in "PS")

  options = set()
  for source, targets in dictionary.items():
    if strip(source).lower() == strip(word).lower() and strip(word):
      core_start = len(word) - len(word.lstrip("«»,.()·—$'\"?!"))
      core_end = len(word.rstrip("«»,.()·—$'\"?!"))
      options |= {word[:core_start] + t + word[core_end:] for t in targets}
  return options


def test_rates_choices_and_untouched_words_with_the_real_draws():
  rng = random.Random(7)
  texts = [" ".join(rng.choice(AFFIXES) + rng.choice(WORDS) + rng.choice(AFFIXES) for _ in range(12))
           for _ in range(400)]
  tables = cs.build_tables(DICTIONARY)
  sieht = {"sees": 0, "watches": 0, "spots": 0}
  for rate in (0.15, 0.6):
    translatable = switched = 0
    switch = _switcher(tables, rate=rate, seed=11)
    for text in texts:
      out = switch(text)
      for before, after in zip(text.split(" "), out.split(" ")):
        options = _translations_of(before, DICTIONARY)
        translatable += bool(options)
        if after != before:
          assert after in options, (before, after)
          switched += 1
          core = cs.split_affixes(after)[1]
          if core in sieht:
            sieht[core] += 1
    fraction = switched / translatable
    sd = (rate * (1 - rate) / translatable) ** 0.5
    assert abs(fraction - rate) < 4 * sd, (rate, fraction, translatable)
  total = sum(sieht.values())  # Uniform among a word's translations.
  assert total > 100 and all(abs(n / total - 1 / 3) < 0.15 for n in sieht.values()), sieht


def test_rate_zero_is_identity_and_rate_one_switches_every_translatable_word():
  rng = random.Random(3)
  texts = [_sentence(rng) for _ in range(100)]
  tables = cs.build_tables(DICTIONARY)
  never, always = _switcher(tables, rate=0.0, seed=1), _switcher(tables, rate=1.0, seed=1)
  # Eagerly once: the function itself, outside any trace.
  eager = cs.switch_text_tf(tf.constant(texts[0]), tables, rate=1.0, seed=1)
  assert eager.numpy().decode("utf-8") == always(texts[0])
  for text in texts:
    assert never(text) == text
    out = always(text)
    words = cs.split_words(text)
    if any(_translations_of(w, DICTIONARY) for w in words):
      for before, after in zip(words, out.split(" ")):
        options = _translations_of(before, DICTIONARY)
        assert (after in options) if options else after == before, (before, after)
    else:
      assert out == text


def _switched_dataset(path, texts, *, seed, shuffle_seed, rate=0.5):
  ds = tf.data.Dataset.from_tensor_slices({"text": texts, "id": list(range(len(texts)))})
  ds = ds.shuffle(len(texts), seed=shuffle_seed)
  ds = cs.code_switch_preprocessor(ds, dictionary_path=path, rate=rate, seed=seed)
  return {int(ex["id"]): ex["text"].decode("utf-8") for ex in ds.as_numpy_iterator()}


def test_preprocessor_is_deterministic_across_builds_orders_and_shards(tmp_path):
  path = _write(tmp_path, "de-en.txt", "".join(f"{s} {t}\n" for s, ts in DICTIONARY.items() for t in ts))
  rng = random.Random(5)
  texts = [_sentence(rng) for _ in range(120)]
  first = _switched_dataset(path, texts, seed=3, shuffle_seed=0)
  assert _switched_dataset(path, texts, seed=3, shuffle_seed=0) == first
  assert _switched_dataset(path, texts, seed=3, shuffle_seed=9) == first  # Another order, same switches.
  shard = tf.data.Dataset.from_tensor_slices({"text": texts}).shard(3, 1)
  shard = cs.code_switch_preprocessor(shard, dictionary_path=path, rate=0.5, seed=3)
  assert [ex["text"].decode("utf-8") for ex in shard.as_numpy_iterator()] == [
      first[i] for i in range(1, len(texts), 3)]
  other = _switched_dataset(path, texts, seed=4, shuffle_seed=0)
  assert other != first and sum(a != b for a, b in zip(other.values(), first.values())) > 10
  assert sum(first[i] != texts[i] for i in first) > 30


def test_preprocessor_rejects_bad_rates(tmp_path):
  path = _write(tmp_path, "d.txt", "a b\n")
  ds = tf.data.Dataset.from_tensor_slices({"text": ["a"]})
  for rate in (-0.1, 1.5, float("nan"), "0.5", True):
    with pytest.raises(errors.UserError, match=r"rate=.* must be a number in \[0, 1\]"):
      cs.code_switch_preprocessor(ds, dictionary_path=path, rate=rate)
  with pytest.raises(errors.UserError, match="no source word is left"):
    cs.build_tables({"...": ("x",)}, where="d.txt")
