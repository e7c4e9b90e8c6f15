"""Sentence retrieval (Tatoeba style, as XTREME and XLM-Align report it).

Each sentence of a parallel set is represented by the mean of its token
states at one layer (0 = the embedding output, L = the last layer), taken
over the sentence body: every position between `<s>` and `</s>`, so padding
and the frame tokens never count. For row i of the source set, retrieval
is correct when its nearest target (cosine, or CSLS with K = 10 as XTREME's
and MUSE's `csls_knn_10`: `2 cos(x, y) - r_K(x) - r_K(y)`) is row i of the
target set; accuracy is reported in both directions. The nearest neighbours
come from the blockwise kernels of `ops.csls`, so the full similarity matrix
is never formed.

Duplicates: a parallel set may hold the same target sentence twice (short
Tatoeba lines, repeated Bible formulae); index-based scoring would count the
retrieval of the other copy as a miss, an arbitrary tie break. `keys` name
the equivalence classes (identical text, identical key): a retrieval is
correct when it lands on a row with the gold row's key.

    run = Run.open("runs/demo")                  # from flax_xalign.runs import Run
    model, params, vocabulary = run.model, run.params(), run.vocabulary()
    src = sentence_embeddings(model, params, vocabulary, greek, layers=(0, 4), language=1)
    tgt = sentence_embeddings(model, params, vocabulary, english, layers=(0, 4), language=2)
    retrieval_accuracy(src[4], tgt[4], method="csls")
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.data.vocab.specials import SpecialTokens, special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.ops import csls

METHODS = ("cosine", "csls")
DEFAULT_CSLS_K = 10  # XTREME / MUSE `csls_knn_10`.
_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def _check_method(method: str) -> str:
  if method not in METHODS:
    raise UserError(f"retrieval method {method!r} is unknown; use one of {', '.join(METHODS)}.")
  return method


def nearest(queries: np.ndarray, targets: np.ndarray, *, method: str = "cosine",
            csls_k: int = DEFAULT_CSLS_K) -> np.ndarray:
  """[q] int32: the row of `targets` [t, d] nearest each row of `queries` [q, d].

  Ties go to the lower target row. Zero rows (empty sentences) have cosine 0
  with everything.
  """
  _check_method(method)
  if not len(queries):
    return np.zeros(0, np.int32)
  if not len(targets):
    raise UserError("no target sentences to retrieve from.")
  queries, targets = np.asarray(queries, np.float32), np.asarray(targets, np.float32)
  if method == "cosine":
    top = csls.cosine_topk(queries, targets, k=1)
  else:
    top = csls.csls_topk(queries, targets, k=1, knn=int(csls_k))
  return np.asarray(top.indices)[:, 0]


def retrieval_accuracy(src: Any, tgt: Any, *, method: str = "cosine", csls_k: int = DEFAULT_CSLS_K,
                       src_keys: Sequence[int] | np.ndarray | None = None,
                       tgt_keys: Sequence[int] | np.ndarray | None = None) -> dict[str, Any]:
  """Retrieval accuracy of a parallel set in both directions.

  Args:
    src: [n, d] source sentence vectors; row i translates row i of `tgt`.
    tgt: [n, d] target sentence vectors.
    method: "cosine" (nearest neighbour) or "csls" (K = `csls_k`).
    csls_k: K of the CSLS radii (min(K, n) neighbours are averaged).
    src_keys, tgt_keys: optional [n] ints naming duplicate rows of each side
      (equal key = identical sentence); a retrieval is correct when the
      retrieved row's key is the gold row's. Default: every row distinct.

  Returns:
    {"src_to_tgt", "tgt_to_src" (fractions correct), "mean" (of the two),
     "pairs" (n)}.

  Raises:
    UserError: no pairs, sides of different sizes, or an unknown method.
  """
  src, tgt = np.asarray(src, np.float32), np.asarray(tgt, np.float32)
  if src.ndim != 2 or tgt.ndim != 2 or src.shape != tgt.shape:
    raise UserError(f"retrieval needs two [pairs, dim] arrays of one shape, got {src.shape} and {tgt.shape}; "
                    "row i of the source must translate row i of the target.")
  n = src.shape[0]
  if n == 0:
    raise UserError("no sentence pairs to retrieve; give at least one src<TAB>tgt line.")
  keys = []
  for name, given in (("src_keys", src_keys), ("tgt_keys", tgt_keys)):
    value = np.arange(n) if given is None else np.asarray(given)
    if value.shape != (n,):
      raise UserError(f"{name} must hold one key per pair ({n}), got shape {value.shape}.")
    keys.append(value)
  src_keys, tgt_keys = keys
  forward = nearest(src, tgt, method=method, csls_k=csls_k)
  backward = nearest(tgt, src, method=method, csls_k=csls_k)
  src_to_tgt = float(np.mean(tgt_keys[forward] == tgt_keys))
  tgt_to_src = float(np.mean(src_keys[backward] == src_keys))
  return {"src_to_tgt": src_to_tgt, "tgt_to_src": tgt_to_src, "mean": (src_to_tgt + tgt_to_src) / 2,
          "pairs": n}


def duplicate_keys(texts: Sequence[str]) -> np.ndarray:
  """[n] int32: the first index of each text's identical copy (its own index when unique)."""
  first: dict[str, int] = {}
  return np.asarray([first.setdefault(t, i) for i, t in enumerate(texts)], np.int32)


# ------------------------------------------------------------ sentence vectors


def _mean_states(params: Any, batch: Mapping[str, jax.Array], *, encoder: Any, layers: tuple[int, ...]
                 ) -> jax.Array:
  """[len(layers), b, embed] float32 means of each row's states where `body` is True (0 if none)."""
  out = encoder.apply({"params": params}, batch["tokens"], lang_ids=batch["lang_ids"],
                      positions=batch["positions"], segment_ids=batch["segment_ids"], deterministic=True,
                      return_all_hidden=True)
  hidden = jnp.stack([out.all_hidden[layer] for layer in layers]).astype(jnp.float32)  # [k, b, n, e]
  body = batch["body"].astype(jnp.float32)  # [b, n]
  sums = jnp.einsum("kbne,bn->kbe", hidden, body, precision=jax.lax.Precision.HIGHEST)
  return sums / jnp.maximum(body.sum(axis=1), 1.0)[None, :, None]


@functools.lru_cache(maxsize=16)
def _jitted_means(encoder: Any, layers: tuple[int, ...]) -> Callable:
  return jax.jit(functools.partial(_mean_states, encoder=encoder, layers=layers))


def bucket_length(longest: int, cap: int) -> int:
  """The padded row length for a batch whose longest row is `longest` tokens (<= cap)."""
  return min(cap, next((b for b in _BUCKETS if b >= longest), cap))


def sentence_rows(ids: Sequence[Sequence[int]], *, specials: SpecialTokens, language: int, length: int
                  ) -> dict[str, np.ndarray]:
  """Sentences as `<s> ids </s>` rows cut to `length`.

  Returns:
    int32 [n, length] `tokens, lang_ids, positions, segment_ids` (segment 1
    on the sentence, 0 on padding) and bool `body` (the positions between
    `<s>` and `</s>`).
  """
  n = len(ids)
  rows = {name: np.zeros((n, length), np.int32) for name in ("tokens", "lang_ids", "positions", "segment_ids")}
  rows["tokens"][:] = specials.pad
  rows["body"] = np.zeros((n, length), bool)
  for r, sentence in enumerate(ids):
    body = np.asarray(sentence, np.int32)[:length - 2]
    span = body.size + 2
    rows["tokens"][r, :span] = np.concatenate([[specials.bos], body, [specials.eos]])
    rows["lang_ids"][r, :span] = language
    rows["positions"][r, :span] = np.arange(span)
    rows["segment_ids"][r, :span] = 1
    rows["body"][r, 1:span - 1] = True
  return rows


def encode_sentences(vocabulary: Any, sentences: Sequence[str]) -> list[list[int]]:
  """Subword ids of each sentence (a batch call when the vocabulary has a SentencePiece processor)."""
  processor = getattr(vocabulary, "tokenizer", None)
  if processor is not None and hasattr(processor, "encode"):
    return [[int(t) for t in ids] for ids in processor.encode(list(sentences))]
  return [[int(t) for t in vocabulary.encode(s)] for s in sentences]


def sentence_embeddings(model: Any, params: Any, vocabulary: Any, sentences: Sequence[str], *,
                        layers: Sequence[int], language: int = 0, batch_size: int = 32, max_length: int = 128,
                        specials: SpecialTokens | None = None, stats: dict | None = None
                        ) -> dict[int, np.ndarray]:
  """Mean-pooled sentence vectors per layer.

  Sentences are tokenised whole (`vocabulary.encode`), laid out as
  `<s> ids </s>` (ids cut to `max_length - 2`) and encoded alone; a
  sentence's vector at layer l is the mean of its body states (between `<s>`
  and `</s>`: no special frame, no padding); an empty sentence gets zeros.
  Rows are sorted by length and batched at a few bucketed lengths, so jit
  compiles few shapes; the last batch is filled with empty rows.

  Args:
    model: a `PretrainingModel` (a `runs.Run`'s `model`) or an Encoder.
    params: its parameters (boxed or plain; heads are ignored).
    vocabulary: the model's vocabulary (`encode(str) -> ids`).
    sentences: the texts.
    layers: hidden-state indices, 0 (embedding output) .. num_layers.
    language: the language id of every token (ignored by models without
      language embeddings).
    batch_size: sentences per encoder call.
    max_length: the longest row, `<s>` and `</s>` included.
    specials: the vocabulary's special ids (default: read from its model).
    stats: if given, receives "truncated" (sentences cut to max_length).

  Returns:
    {layer: float32 [len(sentences), embed]}.
  """
  from flax_xalign.evaluation.transfer.finetune import encoder_params

  encoder = getattr(model, "encoder", model)
  config = encoder.config
  layers = tuple(sorted({int(layer) for layer in layers}))
  bad = [layer for layer in layers if not 0 <= layer <= config.num_layers]
  if bad or not layers:
    raise UserError(f"layer(s) {bad or 'none'} outside 0..{config.num_layers} (0 = embedding output, "
                    f"{config.num_layers} = last layer).")
  if batch_size < 1:
    raise UserError(f"batch_size={batch_size} must be at least 1.")
  cap = min(int(max_length), config.num_positions)
  if cap < 3:
    raise UserError(f"max_length={max_length} leaves no room for a token between <s> and </s>.")
  specials = specials if specials is not None else special_tokens_of(vocabulary)
  ids = encode_sentences(vocabulary, sentences)
  if stats is not None:
    stats["truncated"] = sum(len(s) > cap - 2 for s in ids)
  n = len(ids)
  out = {layer: np.zeros((n, config.embed_dim), np.float32) for layer in layers}
  if not n:
    return out
  rows = sentence_rows(ids, specials=specials, language=int(language), length=cap)
  lengths = rows["segment_ids"].sum(axis=1)
  order = np.argsort(lengths, kind="stable")
  means = _jitted_means(encoder, layers)
  plain = encoder_params(params)
  pending = []
  for first in range(0, n, batch_size):
    chosen = order[first:first + batch_size]
    length = bucket_length(int(lengths[chosen].max()), cap)
    batch = {}
    for name, value in rows.items():
      block = np.zeros((batch_size, length), value.dtype)
      block[:len(chosen)] = value[chosen, :length]
      batch[name] = block
    pending.append((chosen, means(plain, batch)))
  for chosen, result in jax.device_get(pending):
    for i, layer in enumerate(layers):
      out[layer][chosen] = result[i, :len(chosen)]
  return out


# ------------------------------------------------------------ baselines and sweeps


def bag_of_pieces(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]]
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Count vectors over the pieces the two sides use: a model-free retrieval baseline.

  Returns:
    ([n_src, U], [n_tgt, U]) float32 piece counts, U the distinct piece ids
    of both sides; cosine retrieval on them ranks by shared pieces (names,
    numbers, loanwords), what an untrained model cannot beat by much.
  """
  used = np.unique(np.concatenate([np.asarray(s, np.int64) for s in (*src_ids, *tgt_ids)] or [np.zeros(0)]))

  def counts(side: Sequence[Sequence[int]]) -> np.ndarray:
    table = np.zeros((len(side), max(used.size, 1)), np.float32)
    for r, ids in enumerate(side):
      if len(ids):
        np.add.at(table[r], np.searchsorted(used, np.asarray(ids, np.int64)), 1.0)
    return table

  return counts(src_ids), counts(tgt_ids)


def sweep(src: Mapping[int, np.ndarray], tgt: Mapping[int, np.ndarray], *, methods: Sequence[str] = METHODS,
          csls_k: int = DEFAULT_CSLS_K, src_keys: Any = None, tgt_keys: Any = None) -> dict[str, Any]:
  """Accuracy at every layer and method, and the best layer per method (by the mean of both directions).

  Returns:
    {"scores": {method: {layer (str): retrieval_accuracy dict}},
     "best": {method: {"layer", "src_to_tgt", "tgt_to_src", "mean"}}}.
  """
  scores: dict[str, dict[str, dict]] = {}
  best: dict[str, dict] = {}
  for method in methods:
    _check_method(method)
    per_layer = {}
    for layer in sorted(src):
      per_layer[str(layer)] = retrieval_accuracy(src[layer], tgt[layer], method=method, csls_k=csls_k,
                                                 src_keys=src_keys, tgt_keys=tgt_keys)
    scores[method] = per_layer
    layer, top = max(per_layer.items(), key=lambda item: (item[1]["mean"], -int(item[0])))
    best[method] = {"layer": int(layer), **top}
  return {"scores": scores, "best": best}


# ------------------------------------------------------------ a run's retrieval report

BIBLE_SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class RetrievalOptions:
  """The settings of one retrieval evaluation (`xalign retrieval`'s flags by name).

  Exactly one of `tsv` (source<TAB>target lines) and `bible` (a held-out
  split of the embedded Greek-English Bible) names the pairs; `layers` is
  'all' or a comma list, `method` a comma subset of METHODS.
  """

  tsv: str | None = None
  bible: str | None = None
  src_lang: str | None = None
  tgt_lang: str | None = None
  layers: str = "all"
  method: str = ",".join(METHODS)
  csls_k: int = DEFAULT_CSLS_K
  max_pairs: int | None = None
  normalize: str = ""
  max_length: int = 128
  batch_size: int = 32
  output: str | None = None

  def methods(self) -> list[str]:
    """The methods asked for, in order, without repeats; UserError for an unknown one."""
    methods = [m.strip() for m in self.method.split(",") if m.strip()]
    if [m for m in methods if m not in METHODS] or not methods:
      raise UserError(f"--method={self.method!r}: use a comma-separated subset of {','.join(METHODS)}.")
    return list(dict.fromkeys(methods))

  def check(self) -> "RetrievalOptions":
    """Itself, or a UserError for a value that cannot run (before the run is read)."""
    self.methods()
    for name in ("csls_k", "batch_size"):
      if getattr(self, name) < 1:
        raise UserError(f"--{name}={getattr(self, name)} must be at least 1.")
    return self


def read_pairs(path: str) -> list[tuple[str, str]]:
  """`source<TAB>target` lines of a UTF-8 file; UserError naming file:line for a malformed one."""
  from flax_xalign.data.sources.readers import numbered_lines

  pairs = []
  for number, line in numbered_lines(path):
    if not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) != 2:
      raise UserError(f"{path}:{number}: expected source<TAB>target (2 tab-separated fields), found "
                      f"{len(fields)}. Remove tabs inside sentences.")
    pairs.append((fields[0].strip(), fields[1].strip()))
  if not pairs:
    raise UserError(f"{path}: no sentence pairs (expected source<TAB>target lines).")
  return pairs


def _layers_of(spec: str, num_layers: int) -> list[int]:
  if spec == "all":
    return list(range(num_layers + 1))
  try:
    wanted = sorted({int(x) for x in spec.split(",") if x.strip()})
  except ValueError:
    raise UserError(f"--layers={spec!r}: pass 'all' or comma-separated layer numbers, e.g. 0,4,8.") from None
  bad = [layer for layer in wanted if not 0 <= layer <= num_layers]
  if bad or not wanted:
    raise UserError(f"--layers={spec!r}: layers must lie in 0..{num_layers} (0 = embedding output).")
  return wanted


def _language_ids(spec: Any, config: Any, src: str, tgt: str) -> tuple[int, int]:
  ids = []
  for code in (src, tgt):
    if code in spec.languages:
      ids.append(spec.language_id(code))
    elif config.num_languages:
      raise UserError(f"language {code!r} is not one of the checkpoint's languages {list(spec.languages)}; pick "
                      "--src_lang and --tgt_lang from that list.")
    else:
      ids.append(0)  # No language embeddings: lang_ids are never read.
  return ids[0], ids[1]


def _sides(opts: RetrievalOptions, spec: Any) -> tuple[list[tuple[str, str]], str, str, str]:
  """(pairs, source name, src code, tgt code)."""
  from flax_xalign.evaluation.word_alignment.word_align import checkpoint_language_pair

  if (opts.tsv is None) == (opts.bible is None):
    raise UserError("give exactly one of --tsv=FILE (source<TAB>target lines) and --bible=validation|test.")
  if opts.bible:
    from flax_xalign.data.sources import bible

    if opts.bible not in BIBLE_SPLITS:
      raise UserError(f"--bible={opts.bible!r}: choose from {', '.join(BIBLE_SPLITS)}.")
    pairs = [(grc, en) for _, grc, en in bible.bitext(opts.bible)]
    default = ("grc", "en")
    source = f"bible:{opts.bible}"
  else:
    pairs = read_pairs(opts.tsv)
    default = checkpoint_language_pair(spec) or (None, None)
    source = opts.tsv
  src, tgt = opts.src_lang or default[0], opts.tgt_lang or default[1]
  if src is None or tgt is None:
    raise UserError(f"cannot tell the languages of {opts.tsv} from the checkpoint (languages "
                    f"{list(spec.languages)}); pass --src_lang and --tgt_lang.")
  if opts.max_pairs is not None:
    if opts.max_pairs < 1:
      raise UserError(f"--max_pairs={opts.max_pairs} must be at least 1.")
    pairs = pairs[:opts.max_pairs]
  return pairs, source, src, tgt


def _row(label: str, scores: Mapping[str, Any], methods: Sequence[str]) -> str:
  cells = "".join(f"{100 * scores[m]['src_to_tgt']:>9.2f}{100 * scores[m]['tgt_to_src']:>9.2f}" for m in methods)
  return f"  {label:<16}{cells}"


def evaluate_retrieval(run: Any, options: RetrievalOptions, *, log: Callable[[str], None] = print,
                       vocabulary: Any = None) -> dict:
  """Retrieval accuracy of `run` (a `runs.Run`) per layer and method, with the bag-of-pieces and chance
  baselines: the JSON object `xalign retrieval` prints last (also written to `output`).

  `vocabulary` (anything with `encode(text) -> ids`) replaces the run's own, e.g. a table of texts tokenised
  beforehand (`evaluation.offline`), so a host without seqio scores the same sentences."""
  import json
  import time

  from flax_xalign.data.vocab import normalize

  start = time.perf_counter()
  opts = options.check()
  methods = opts.methods()
  model, params, spec, step = run.model, run.params(), run.spec, run.step
  config = model.encoder.config
  layers = _layers_of(opts.layers, config.num_layers)
  pairs, source, src, tgt = _sides(opts, spec)
  src_id, tgt_id = _language_ids(spec, config, src, tgt)
  vocabulary = vocabulary if vocabulary is not None else run.vocabulary()
  texts = [[normalize.normalize_text(p[side], opts.normalize) for p in pairs] for side in (0, 1)]
  log(f"sentence retrieval: {len(pairs):,} pairs {src}->{tgt} from {source}; {run.path} step {step}, "
      f"layers {layers}, {', '.join(methods)} (K={opts.csls_k}), normalize={opts.normalize or 'none'}")
  vectors, truncated = [], 0
  for side, language in ((0, src_id), (1, tgt_id)):
    stats: dict = {}
    vectors.append(sentence_embeddings(
        model, params, vocabulary, texts[side], layers=layers, language=language, batch_size=opts.batch_size,
        max_length=opts.max_length, specials=spec.vocabulary.specials, stats=stats))
    truncated += stats["truncated"]
  keys = [duplicate_keys(texts[side]) for side in (0, 1)]
  common = {"methods": methods, "csls_k": opts.csls_k, "src_keys": keys[0], "tgt_keys": keys[1]}
  table = sweep(vectors[0], vectors[1], **common)
  bag_src, bag_tgt = bag_of_pieces(*(encode_sentences(vocabulary, texts[side]) for side in (0, 1)))
  bag = sweep({0: bag_src}, {0: bag_tgt}, **common)
  baseline = {m: {k: v for k, v in bag["best"][m].items() if k != "layer"} for m in methods}
  chance = 1.0 / len(pairs)

  log(f"  {'accuracy %':<16}" + "".join(f"{m:>18}" for m in methods))
  log(f"  {'':<16}" + f"{src + '->' + tgt:>9}{tgt + '->' + src:>9}" * len(methods))
  for layer in layers:
    log(_row(f"layer {layer}", {m: table["scores"][m][str(layer)] for m in methods}, methods))
  log(_row("bag of pieces", baseline, methods))
  log(f"  {'chance':<16}{100 * chance:>9.2f}  (1 / {len(pairs)} pairs)")
  for m in methods:
    b = table["best"][m]
    log(f"  best {m}: layer {b['layer']}, {src}->{tgt} {100 * b['src_to_tgt']:.2f}%, "
        f"{tgt}->{src} {100 * b['tgt_to_src']:.2f}%")
  duplicates = [int(len(k) - np.unique(k).size) for k in keys]
  if truncated:
    log(f"  {truncated} sentences were cut to --max_length={opts.max_length} tokens")
  result = {"checkpoint": run.path, "step": int(step), "source": source, "pairs": len(pairs),
            "src_lang": src, "tgt_lang": tgt, "layers": layers, "methods": methods, "csls_k": opts.csls_k,
            "normalize": opts.normalize, "max_length": opts.max_length, "scores": table["scores"],
            "best": table["best"], "baselines": {"bag_of_pieces": baseline, "chance": chance},
            "duplicates": {"src": duplicates[0], "tgt": duplicates[1]}, "truncated": truncated,
            "seconds": round(time.perf_counter() - start, 2)}
  if opts.output:
    from flax_xalign.fileio import write_atomically

    write_atomically(opts.output, json.dumps(result, indent=2) + "\n")
  return result
