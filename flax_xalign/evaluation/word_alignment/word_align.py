"""Word alignment from an encoder's hidden states (SimAlign / XLM-Align style).

A pair of word-tokenised sentences is encoded the way the run's training laid
out translation pairs (`pair_layout`, `data.specials.PAIR_LAYOUTS`): "restart"
is `<s> a </s> <s> b </s>` with positions restarting on side b, "continuous"
the released XLM-Align code's `<s> a </s> b </s>` with positions running on;
one language id per side. Each word is tokenised on its own, so every subword
knows its word. For a layer ℓ the similarity of side-a subword i and side-b
subword j is `h_i · h_j` ("dot", as XLM-Align's aligner) or their cosine;
special tokens are left out. A method turns the similarity into subword links
(`ops.AlignmentSolver.links`):

* `argmax`: mutual argmax (a link where i's best j has i as its best);
* `itermax`: SimAlign's iterative mutual argmax (alpha 0.9, 2 rounds) on
  `(cos + 1) / 2` for cosine, as SimAlign; dot products are shifted by each
  pair's minimum (a variant);
* `sinkhorn`: XLM-Align's optimal-transport aligner (Chi et al. 2021, §3.1,
  Eq. 7): a few Sinkhorn iterations on the similarity, then the mutual argmax
  of the transport plan (ties broken by the similarity). The settings
  (similarity, kernel, order, mu, iterations, extraction, Itermax alpha and
  rounds) are one `ops.AlignmentSolver`, the same record DWA's self-labelling
  uses, with the paper's defaults: kernel `max(eps, sim)^(1/mu)`, rows first.
  `sinkhorn_order="columns_first", sinkhorn_extraction="pi_xi"` is the
  released aligner (`xlmalign-ot-aligner.py`);
* `sinkhorn_itermax`: the paper's full §3.1 procedure, which its Table 2
  scores ("Optimal Transport (Section 3.1)"): the Sinkhorn plan, then
  Itermax on it (Eq. 7-9), i.e. exactly DWA's self-labels
  (`AlignmentSolver.self_labels`). Sweeps run the first three unless asked
  (`SWEEP_METHODS`), so earlier tables and files keep their rows.

Two words align if any of their subwords do. A word that yields no subword
can never align. Pairs longer than the budget keep a prefix of whole words per
side (shared like the feature converter's `pair_budget`); the dropped words
cannot align, and one warning reports how many pairs were cut.

`encoding` says how the two sides meet the encoder: "joint" (XLM-Align's
aligner: one attention segment over the pair, so each side sees the other) or
"separate" (SimAlign, awesome-align: the sides are two segments of the row,
so each is encoded as if alone; this needs the "restart" layout). A model trained with
TLM-style pairs suits "joint"; a sentence encoder such as multilingual-e5
aligns far better with "separate".

`normalize` names a text normaliser (`flax_xalign.data.vocab.normalize`, e.g.
"nfd_strip_marks" for polytonic Greek) applied to each word before it is
tokenised; use the one the model's training text went through. Word indices
always refer to the words as given.

`WordAligner` encodes each batch once and derives every requested layer and
method from the same forward pass, so a full per-layer `sweep` costs one
encoder pass over the data. Pairs are taken in order of length and their
attention segments packed into rows of one length (`packing`), so jit compiles
one encoder shape and the rows are nearly free of padding; the encoder stops
at the deepest layer asked.

    run = Run.open("runs/demo")                  # from flax_xalign.runs import Run
    aligner = WordAligner(run.model, run.params(), run.vocabulary(),
                          languages=run.spec.languages, src_lang="grc", tgt_lang="en")
    links = aligner.align([("λόγος ἦν".split(), "was the word".split())], layer=3)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from flax_xalign import ops
from flax_xalign import storage
from flax_xalign.data.vocab import normalize as normalize_lib
from flax_xalign.data.vocab.specials import SpecialTokens, check_pair_layout, special_tokens_of
from flax_xalign.errors import UserError
from flax_xalign.evaluation.word_alignment import aer, packing
# The pair layout and the jitted link kernels live in `layout`; their names stay importable from here.
from flax_xalign.evaluation.word_alignment.layout import (  # noqa: F401
    _PAIR_SPECIALS,
    EncodedPair,
    _buckets,
    _jitted_links,
    _jitted_state_links,
    _jitted_states,
    layout_pair,
    word_links,
)
from flax_xalign.run_spec import RunSpec

METHODS = ops.align_solver.METHODS
# What a sweep scores by default: the methods of every table published so far (aer.json, the
# demo, the notebook, `align --sweep`); "sinkhorn_itermax" is opt-in there.
SWEEP_METHODS = ("argmax", "itermax", "sinkhorn")
ENCODINGS = ("joint", "separate")
SIMILARITIES = ops.align_solver.SIMILARITIES
SINKHORN_KERNELS = ops.align_solver.SINKHORN_KERNELS
SINKHORN_ORDERS = ops.align_solver.SINKHORN_ORDERS
SINKHORN_EXTRACTIONS = ops.align_solver.SINKHORN_EXTRACTIONS
Pair = tuple[Sequence[str], Sequence[str]]


class WordAligner:
  """Aligns word-tokenised sentence pairs with an encoder checkpoint.

  Args:
    model: a `PretrainingModel` (a `runs.Run`'s `model`) or an Encoder.
    params: the encoder parameters.
    vocabulary: the SentencePiece vocabulary the model was trained with.
    languages: the run's sorted language codes (`RunSpec.languages`);
      language id = index + 1.
    src_lang, tgt_lang: codes of side a (source) and side b (target). With
      language embeddings (`config.num_languages > 0`) they must be among
      `languages`. A model without them (`num_languages == 0`, e.g. an
      imported BERT, XLM-R or e5) ignores language ids, so any code is
      accepted: a listed one keeps its id, any other gets id 0.
    max_length: row length budget of one pair (both sides + 4 specials).
    batch_size: pairs per forward pass.
    options: the AlignmentSolver (similarity, method hyperparameters).
    specials: the vocabulary's special ids; by default read from `vocabulary`.
    normalize: the text normaliser applied to each word before tokenising
      (`flax_xalign.data.vocab.normalize.NORMALIZERS`; "" for none).
    encoding: "joint" (one attention segment per pair) or "separate" (each
      side its own segment); see the module docstring.
    pair_layout: "restart" (`<s> a </s> <s> b </s>`) or "continuous"
      (`<s> a </s> b </s>`, positions running on); use the layout the model
      was trained with (`RunSpec.pair_layout`, which `load_aligner` reads).
    packed: pack the attention segments (a side with "separate", a pair
      with "joint") several to a row of one length, `batch_size` rows per
      encoder call (`packing`), and stop the encoder at the deepest layer
      asked; False: one pair per row, rows padded to a length bucket, one
      compile per bucket (the reference the packed path is tested against).
  """

  def __init__(self, model: Any, params: Any, vocabulary: Any, *, languages: Sequence[str], src_lang: str,
               tgt_lang: str, max_length: int = 256, batch_size: int = 32,
               options: ops.AlignmentSolver = ops.AlignmentSolver(), specials: SpecialTokens | None = None,
               normalize: str = "", encoding: str = "joint", pair_layout: str = "restart",
               packed: bool = True):
    if encoding not in ENCODINGS:
      raise UserError(f"unknown encoding {encoding!r}; use one of {', '.join(ENCODINGS)}.")
    self.pair_layout = check_pair_layout(pair_layout)
    if encoding == "separate" and pair_layout != "restart":
      raise UserError("encoding='separate' encodes each side as if alone, which needs the 'restart' pair "
                      "layout (side b with its own <s> and positions from 0); pass pair_layout='restart' "
                      "(--pair_layout=restart) or encoding='joint'.")
    self.encoding = encoding
    self.encoder = getattr(model, "encoder", model)
    self.config = self.encoder.config
    self.params = params
    self.vocabulary = vocabulary
    self.normalize = normalize_lib.check_normalizer(normalize)
    self.languages = list(languages)
    self.src_lang, self.tgt_lang = src_lang, tgt_lang
    self.src_lang_id, self.tgt_lang_id = (self._lang_id(src_lang), self._lang_id(tgt_lang))
    shortest = _PAIR_SPECIALS[pair_layout] + 2
    if max_length < shortest:
      raise UserError(f"max_length={max_length} is too short: a pair needs at least {shortest} positions.")
    if batch_size < 1:
      raise UserError(f"batch_size={batch_size} must be at least 1.")
    self.max_length = int(max_length)
    self.batch_size = int(batch_size)
    self.options = options
    self.specials = specials if specials is not None else special_tokens_of(vocabulary)
    self.packed = bool(packed)
    self.last_run: dict[str, float] = {}
    self._pieces: dict[str, list[int]] = {}
    # What load_aligner chose from the model (model_defaults.AlignerDefaults); None when built directly.
    self.settings: Any = None

  @property
  def num_layers(self) -> int:
    return self.config.num_layers

  def _lang_id(self, code: str) -> int:
    if code not in self.languages:
      if not self.config.num_languages:
        return 0  # The encoder reads lang_ids only to index its language embeddings.
      raise UserError(f"language {code!r} is not one of the checkpoint's languages {self.languages}; "
                      "pick the source and target languages from that list.")
    return self.languages.index(code) + 1

  # ---------------------------------------------------------------- encoding

  def word_pieces(self, words: Sequence[str]) -> list[list[int]]:
    """Subword ids of each word (normalised, then tokenised alone; cached)."""
    missing = [w for w in dict.fromkeys(words) if w not in self._pieces]
    if missing:
      texts = [normalize_lib.normalize_text(w, self.normalize) for w in missing]
      processor = getattr(self.vocabulary, "tokenizer", None)
      if processor is not None:
        encoded = processor.encode(texts)
      else:
        encoded = [self.vocabulary.encode(w) for w in texts]
      self._pieces.update((w, [int(t) for t in ids]) for w, ids in zip(missing, encoded))
    return [self._pieces[w] for w in words]

  def encode(self, pairs: Sequence[Pair]) -> list[EncodedPair]:
    """Lays out every pair (see `layout_pair`); warns once if any was cut."""
    max_length, max_side = self.max_length, self.config.num_positions - 2
    # One tokeniser call for every new word: a call per pair costs more than its words.
    self.word_pieces([w for a, b in pairs for side in (a, b) for w in side])
    if self.pair_layout == "continuous":  # Positions run across the row: all of it must fit the table.
      max_length = min(max_length, self.config.num_positions)
      max_side = max_length
    encoded = [layout_pair(self.word_pieces(a), self.word_pieces(b), src_lang_id=self.src_lang_id,
                           tgt_lang_id=self.tgt_lang_id, max_length=max_length, max_side=max_side,
                           specials=self.specials, pair_layout=self.pair_layout)
               for a, b in pairs]
    cut = sum(e.truncated for e in encoded)
    if cut:
      warnings.warn(f"{cut} of {len(encoded)} sentence pairs exceed the budget of a row, so their trailing "
                    f"words were dropped and are left unaligned. A row holds {self._budget_words()}.", stacklevel=2)
    return encoded

  def _budget_words(self) -> str:
    """The two limits on a pair's row, each named: max_length (a setting) and the model's positions."""
    positions = self.config.num_positions
    if self.pair_layout == "continuous":  # One position table for the whole row.
      limit = (f"max_length={self.max_length} tokens per pair, and the continuous layout's whole row must fit "
               f"the {positions} positions of the model")
      more = (f"raise max_length (up to {positions}) to keep more" if self.max_length < positions else
              "the model's positions are the limit, so a larger max_length keeps no more")
      return f"{limit}; {more}"
    side, whole = positions - 2, 2 * (positions - 2) + 4  # Each side restarts at 0 with its own <s> and </s>.
    limit = (f"max_length={self.max_length} tokens per pair (both sides and their 4 specials), and at most {side} "
             f"subwords per side (the model's {positions} positions less <s> and </s>)")
    more = (f"raise max_length (up to {whole}) to keep more" if self.max_length < whole else
            "the model's positions are the limit, so a larger max_length keeps no more")
    return f"{limit}; {more}"

  def _batch(self, encoded: Sequence[EncodedPair], rows: int, length: int) -> dict[str, np.ndarray]:
    batch = {k: np.zeros((rows, length), np.int32) for k in ("tokens", "lang_ids", "positions", "segment_ids")}
    for k in ("tgt_start", "num_src", "num_tgt"):
      batch[k] = np.zeros((rows,), np.int32)
    for r, e in enumerate(encoded):
      n = len(e.tokens)
      batch["tokens"][r, :n] = e.tokens
      batch["lang_ids"][r, :n] = e.lang_ids
      batch["positions"][r, :n] = e.positions
      batch["segment_ids"][r, :n] = 1
      if self.encoding == "separate":  # Side b (after <s> a </s>) is its own attention segment.
        batch["segment_ids"][r, len(e.src_words) + 2:n] = 2
      batch["num_src"][r], batch["num_tgt"][r] = len(e.src_words), len(e.tgt_words)
      batch["tgt_start"][r] = len(e.src_words) + (3 if self.pair_layout == "restart" else 2)
    return batch

  # ---------------------------------------------------------------- running

  def validate(self, layers: Iterable[int], methods: Iterable[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(layers, methods) as tuples; UserError for a layer or method this model lacks."""
    layers, methods = tuple(int(l) for l in layers), tuple(methods)
    for layer in layers:
      if not 0 <= layer <= self.num_layers:
        raise UserError(f"layer {layer} is outside 0..{self.num_layers} (0 = embeddings, "
                        f"{self.num_layers} = last layer of this model).")
    for method in methods:
      if method not in METHODS:
        raise UserError(f"unknown alignment method {method!r}; use one of {', '.join(METHODS)}.")
    if not layers or not methods:
      raise UserError("name at least one layer and one method.")
    return layers, methods

  def run(self, pairs: Sequence[Pair], *, layers: Iterable[int], methods: Iterable[str],
          verbose: bool = False, progress_every: int = 10) -> dict[tuple[str, int], list[frozenset]]:
    """Word links of every pair for each (method, layer), from one encoder pass.

    Returns:
      {(method, layer): [frozenset of (i, j) per pair, in input order]}.
    """
    layers, methods = self.validate(layers, methods)
    start = time.perf_counter()
    encoded = self.encode(pairs)
    result = {(m, l): [frozenset()] * len(pairs) for m in methods for l in layers}
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].tokens))
    steps = (self._packed_steps if self.packed else self._row_steps)(encoded, order, layers, methods, result)
    stats: dict[str, Any] = {}
    for c, (done, last) in enumerate(steps):
      if verbose and ((c + 1) % progress_every == 0 or last):
        print(f"  aligned {done}/{len(pairs)} pairs ({time.perf_counter() - start:.1f} s)", flush=True)
      stats = last or stats
    seconds = time.perf_counter() - start
    self.last_run = {"pairs": len(pairs), "truncated": sum(e.truncated for e in encoded), "seconds": seconds,
                     "seconds_per_1000_pairs": 1000 * seconds / max(len(pairs), 1), **stats}
    return result

  def _store(self, result: dict, index: int, e: EncodedPair, links: Mapping[str, np.ndarray],
             layers: tuple[int, ...]) -> None:
    """Word links of pair `index` from its subword links ({method: [layers, >= n_a, >= n_b]})."""
    na, nb = len(e.src_words), len(e.tgt_words)
    for method, per_layer in links.items():
      for k, layer in enumerate(layers):
        sub = per_layer[k, :na, :nb]
        if method in ops.align_solver.HOST_METHODS:
          sub = ops.align_solver.HOST_METHODS[method](sub)
        result[(method, layer)][index] = word_links(sub, e.src_words, e.tgt_words)

  def _row_steps(self, encoded, order, layers, methods, result) -> Iterable[tuple[int, dict]]:
    """One pair per row, rows padded to a length bucket (one compile per bucket); yields (pairs done, stats)."""
    buckets = _buckets(self.max_length)
    rows = min(self.batch_size, 1 << max(len(order) - 1, 0).bit_length())
    fn = _jitted_links(self.encoder, layers, methods, self.options)
    chunks = [order[i:i + rows] for i in range(0, len(order), rows)]
    lengths = set()
    for c, chunk in enumerate(chunks):
      longest = max(len(encoded[i].tokens) for i in chunk)
      length = next(b for b in buckets if b >= longest)
      lengths.add(length)
      links = jax.device_get(fn(self.params, self._batch([encoded[i] for i in chunk], rows, length)))
      for r, index in enumerate(chunk):
        self._store(result, index, encoded[index], {m: links[m][:, r] for m in methods}, layers)
      last = c + 1 == len(chunks)
      yield (c * rows + len(chunk), {"encoder_shapes": len(lengths)} if last else {})

  def _packed_steps(self, encoded, order, layers, methods, result) -> Iterable[tuple[int, dict]]:
    """Segments packed into rows of one length (`packing`), the encoder run up to the deepest layer asked,
    links computed per group of finished pairs; yields (pairs done, stats) after each encoder batch."""
    segments, slots = packing.segments_of(encoded, separate=self.encoding == "separate",
                                          restart=self.pair_layout == "restart")
    lengths = [len(s.tokens) for s in segments]
    if not segments:
      yield 0, {}
      return
    buckets = _buckets(self.max_length)
    length = next(b for b in buckets if b >= max(lengths))  # the one row length of the run
    longest_side = max(max(s.num_src, s.num_tgt) for s in slots)
    width = next(b for b in buckets if b >= longest_side)  # every link group's side length
    needed = -(-sum(lengths) // length)
    rows = min(self.batch_size, 1 << max(needed - 1, 0).bit_length())
    owner = {}  # segment -> pairs whose side a or b it holds
    for index in order:
      for side, segment in ((0, slots[index].src), (1, slots[index].tgt)):
        owner.setdefault(segment, []).append((index, side))
    # Longest and shortest pairs alternate, so that every window has short segments to fill the gaps
    # its long ones leave (in order of length, the last windows would hold only long ones, half empty).
    mixed = [order[k // 2] if k % 2 else order[-1 - k // 2] for k in range(len(order))]
    segment_order = list(dict.fromkeys(s for i in mixed for s in (slots[i].src, slots[i].tgt)))
    encode = _jitted_states(self.encoder, layers)
    link_fn = _jitted_state_links(methods, self.options)
    states: dict[int, list] = {}  # pair -> [side a states, side b states] ([layers, n, embed])
    ready: list[int] = []
    done = batches = 0
    windows = packing.pack_windows(lengths, segment_order, row_length=length, rows=rows)
    for packed in windows:
      batch = packing.row_batch(segments, packed, rows=rows, length=length)
      hidden = np.asarray(jax.device_get(encode(self.params, batch.features)))  # [k, rows, length, e]
      batches += 1
      for segment, (r, column) in batch.offsets.items():
        for index, side in owner[segment]:
          slot = slots[index]
          first, n = (slot.src_start, slot.num_src) if side == 0 else (slot.tgt_start, slot.num_tgt)
          pair_states = states.setdefault(index, [None, None])
          pair_states[side] = hidden[:, r, column + first:column + first + n]
          if pair_states[0] is not None and pair_states[1] is not None:
            ready.append(index)
      finished = len(ready) + done == len(order)
      while len(ready) >= self.batch_size or (finished and ready):
        group, ready = ready[:self.batch_size], ready[self.batch_size:]
        self._link_group(group, encoded, states, link_fn, layers, result, width)
        done += len(group)
      stats = {"encoder_shapes": 1, "encoder_batches": batches, "rows": rows, "row_length": length,
               "fill": sum(lengths) / (batches * rows * length)} if finished else {}
      yield done, stats

  def _link_group(self, group, encoded, states, link_fn, layers, result, side) -> None:
    """Links of `group` (finished pairs) from their states, padded to batch_size pairs of `side` subwords.

    One padded shape for the whole run: the link step costs far less than a compile per side length.
    """
    k, embed = len(layers), states[group[0]][0].shape[-1]
    src = np.zeros((k, self.batch_size, side, embed), np.float32)
    tgt = np.zeros_like(src)
    num = np.zeros((2, self.batch_size), np.int32)
    for r, index in enumerate(group):
      a, b = states.pop(index)
      src[:, r, :a.shape[1]], tgt[:, r, :b.shape[1]] = a, b
      num[:, r] = a.shape[1], b.shape[1]
    links = jax.device_get(link_fn(src, tgt, num[0], num[1]))
    for r, index in enumerate(group):
      self._store(result, index, encoded[index], {m: links[m][:, r] for m in links}, layers)

  def align(self, pairs: Sequence[Pair], *, layer: int, method: str = "sinkhorn") -> list[frozenset]:
    """Word links `{(i, j)}` (0-indexed, source-target) of each pair."""
    return self.run(pairs, layers=(layer,), methods=(method,))[(method, layer)]

  def sweep(self, pairs: Sequence[Pair], sure: Sequence[Iterable[aer.Link]],
            possible: Sequence[Iterable[aer.Link]] | None = None, *, layers: Iterable[int] | None = None,
            methods: Iterable[str] = SWEEP_METHODS, verbose: bool = False) -> dict[tuple[str, int], aer.AlignmentScores]:
    """Scores every (method, layer) against gold; one encoder pass per batch.

    Args:
      pairs: (source words, target words) per pair.
      sure, possible: gold links per pair (see `aer.score`).
      layers: hidden-state indices; default all, 0..num_layers.
      methods: subset of METHODS (default SWEEP_METHODS).
      verbose: print a progress line every few batches.

    Returns:
      {(method, layer): AlignmentScores}.
    """
    if len(sure) != len(pairs) or (possible is not None and len(possible) != len(pairs)):
      raise UserError(f"gold alignments for {len(sure)} pairs but {len(pairs)} sentence pairs to align; "
                      "the gold file must have one entry per input pair.")
    layers = range(self.num_layers + 1) if layers is None else layers
    links = self.run(pairs, layers=layers, methods=methods, verbose=verbose)
    return {key: aer.score(predicted, sure, possible) for key, predicted in links.items()}


# -------------------------------------------------------------- checkpoints


def checkpoint_language_pair(run: RunSpec) -> tuple[str, str] | None:
  """(side a, side b) of the run's bitext task, or None if not unique."""
  pairs = set(map(tuple, run.language_pairs))
  return pairs.pop() if len(pairs) == 1 else None


def load_aligner(run: Any, *, src_lang: str | None = None, tgt_lang: str | None = None,
                 vocabulary_path: str | None = None, pair_layout: str | None = None,
                 options: ops.AlignmentSolver | None = None, similarity: str | None = None,
                 normalize: str | None = None, encoding: str | None = None, vocabulary: Any = None,
                 **kwargs: Any) -> tuple[WordAligner, RunSpec, int]:
  """(WordAligner, run manifest, step) of `run` (a `runs.Run`) at the step it was opened at.

  The language pair defaults to the run's bitext task (side a -> side b);
  with two languages, naming one side picks the other. The pair layout
  defaults to the run's (`RunSpec.pair_layout`). `encoding`, `similarity`
  and `normalize` left as None follow the model (`model_defaults.resolve`:
  what it was trained for, its vocabulary's normaliser); `similarity`
  replaces `options.similarity`. The aligner's `settings` records what was
  chosen and why. `vocabulary` (anything with `encode(text) -> ids`) replaces the run's, e.g. the words
  tokenised beforehand (`evaluation.offline`). `kwargs` go to WordAligner (max_length, batch_size).
  """
  from flax_xalign.evaluation.word_alignment import model_defaults

  spec, step = run.spec, run.step
  pair_layout = pair_layout or spec.pair_layout
  settings = model_defaults.resolve(run, normalize=normalize, encoding=encoding, similarity=similarity,
                                    pair_layout=pair_layout)
  options = dataclasses.replace(options or ops.AlignmentSolver(), similarity=settings.similarity)
  languages = list(spec.languages)
  if src_lang is None or tgt_lang is None:
    if (src_lang or tgt_lang) and len(languages) == 2:
      named = src_lang or tgt_lang
      other = [l for l in languages if l != named]
      src_lang, tgt_lang = (named, other[-1]) if src_lang else (other[-1], named)
    else:
      pair = checkpoint_language_pair(spec)
      if pair is None:
        raise UserError(f"cannot tell the source and target language of {run.path} (languages "
                        f"{languages}); pass --src_lang and --tgt_lang.")
      src_lang, tgt_lang = pair
  if vocabulary is None:
    vocabulary = run.vocabulary(path=vocabulary_path)
  aligner = WordAligner(run.model, run.params(), vocabulary, languages=languages, src_lang=src_lang,
                        tgt_lang=tgt_lang, specials=spec.vocabulary.specials,
                        pair_layout=pair_layout, options=options,
                        normalize=settings.normalize, encoding=settings.encoding, **kwargs)
  aligner.settings = settings
  return aligner, spec, step


# -------------------------------------------------------------- Bible gold


def bible_gold(split: str = "test", *, max_pairs: int | None = None,
               data_dir: str | None = None) -> tuple[list[Pair], list[frozenset]]:
  """(pairs, sure links) of the embedded Greek-English gold alignments.

  Greek is side a (source), English side b, as in the `bible_grc_en_tlm` task.
  """
  from flax_xalign.data.sources import bible
  gold = bible.gold_alignments(split, data_dir=data_dir)[:max_pairs]
  return [(g.greek, g.english) for g in gold], [frozenset(g.sure) for g in gold]


def export_bible_gold(split: str, directory: str, *, data_dir: str | None = None) -> tuple[str, str]:
  """Writes the embedded Greek-English gold of a split as files any aligner reads.

  Returns (`grc_en.<split>.tsv`: `greek words<TAB>english words` per verse,
  `grc_en.<split>.pharaoh`: the sure links `i-j` per line), with the corpus's
  licence notice beside them (`grc_en.NOTICE`).
  """
  from flax_xalign.data.sources import bible
  pairs, sure = bible_gold(split, data_dir=data_dir)
  tsv = storage.join(directory, f"grc_en.{split}.tsv")
  gold = storage.join(directory, f"grc_en.{split}.pharaoh")
  files = {tsv: "".join(f"{' '.join(a)}\t{' '.join(b)}\n" for a, b in pairs),
           gold: "".join(aer.format_links(links) + "\n" for links in sure),
           storage.join(directory, "grc_en.NOTICE"): bible.LICENSE_NOTICE}
  for path, text in files.items():  # Checked first: a file of that name that is not this gold is the user's.
    if storage.exists(path) and _read_text(path) != text:
      raise UserError(f"{path} exists and is not the embedded {split} gold; the aligner writes the gold files "
                      "beside --output: move that file, or write --output into another folder.")
  for path, text in files.items():
    aer.write_atomically(path, text)
  return tsv, gold


def _read_text(path: str) -> str | None:
  try:
    with storage.open_file(path, encoding="utf-8") as f:
      return f.read()
  except (OSError, UnicodeDecodeError):
    return None


def score_tables(table: Mapping[tuple[str, int], aer.AlignmentScores]) -> tuple[dict, dict]:
  """({method: {layer (str): scores}}, {method: {"layer": best layer, **its scores}}) of a sweep."""
  scores: dict[str, dict[str, dict]] = {}
  for (method, layer), s in sorted(table.items()):
    scores.setdefault(method, {})[str(layer)] = s.as_dict()
  best = {method: {"layer": layer, **s.as_dict()}
          for (_, method), (layer, s) in aer.best_layers(table).items()}
  return scores, best


def evaluate_alignment(run: Any, *, split: str = "test", layers: Iterable[int] | None = None,
                       methods: Sequence[str] = SWEEP_METHODS, output_dir: str | None = None,
                       max_pairs: int | None = None, batch_size: int = 32, max_length: int = 256,
                       options: ops.AlignmentSolver | None = None, similarity: str | None = None,
                       normalize: str | None = None, encoding: str | None = None,
                       pair_layout: str | None = None, verbose: bool = True) -> dict[str, Any]:
  """AER/P/R/F1 per method and layer on the Bible gold alignments (Greek -> English) of `run` at its step.

  `run` is a `runs.Run`. Writes `aer.json` (the returned dict), `aer.md`
  (markdown table) and `aer_layers.png` (AER against layer) into
  `output_dir` (default the run's MODEL_DIR).

  `pair_layout` defaults to the run's; `similarity`, `normalize` and
  `encoding` left as None follow the model (see `load_aligner`).

  Returns:
    {"model_dir", "step", "task", "split", "pairs", "src_lang", "tgt_lang",
     every AlignmentSolver field ("similarity", "sinkhorn_kernel",
     "sinkhorn_order", "mu", "relative_mu", "clamp_epsilon", "sinkhorn_iters",
     "sinkhorn_extraction", "itermax_alpha", "itermax_rounds", "softmax_threshold"), "normalize",
     "encoding", "pair_layout", "layers", "methods",
     "scores": {method: {layer (str): {precision, recall, f1, aer, num_*}}},
     "best": {method: {"layer", precision, recall, f1, aer, ...}},
     "diagonal_baseline": scores of linking word i to word round(i * m / n),
     "seconds", "seconds_per_1000_pairs", "truncated_pairs", "files"}.
  """
  languages = list(run.spec.languages)
  if run.spec.model.num_languages and not {"grc", "en"} <= set(languages):
    raise UserError(f"{run.path} was trained on {languages}; the Bible gold alignments are Greek-English "
                    "(grc, en). Use xalign align with your own gold file instead.")
  aligner, spec, step = load_aligner(run, src_lang="grc", tgt_lang="en", max_length=max_length,
                                    batch_size=batch_size, options=options, similarity=similarity,
                                    normalize=normalize, encoding=encoding, pair_layout=pair_layout)
  options, settings = aligner.options, aligner.settings
  pairs, sure = bible_gold(split, max_pairs=max_pairs)
  if verbose:
    print(settings.describe(), flush=True)
    print(f"word alignment: {len(pairs)} Greek-English verses ({split}), layers 0..{aligner.num_layers}, "
          f"methods {', '.join(methods)}", flush=True)
  table = aligner.sweep(pairs, sure, layers=layers, methods=methods, verbose=verbose)
  scores, best = score_tables(table)
  # Reference point: link each source word to the target word at the same relative position.
  diagonal = [{(i, min(len(b) - 1, round(i * len(b) / len(a)))) for i in range(len(a))} if a and b else set()
              for a, b in pairs]
  output_dir = output_dir or run.path
  files = {"json": os.path.join(output_dir, "aer.json"), "markdown": os.path.join(output_dir, "aer.md"),
           "plot": os.path.join(output_dir, "aer_layers.png")}
  results = {
      "model_dir": run.path, "step": int(step), "task": spec.task, "split": split,
      "pairs": len(pairs), "src_lang": "grc", "tgt_lang": "en", **dataclasses.asdict(options),
      "normalize": settings.normalize, "encoding": settings.encoding, "pair_layout": aligner.pair_layout,
      "settings_from": dict(settings.sources),
      "layers": sorted({l for _, l in table}),
      "methods": list(dict.fromkeys(m for m, _ in table)), "scores": scores, "best": best,
      "diagonal_baseline": aer.score(diagonal, sure).as_dict(),
      "seconds": aligner.last_run["seconds"], "seconds_per_1000_pairs": aligner.last_run["seconds_per_1000_pairs"],
      "truncated_pairs": aligner.last_run["truncated"], "files": files,
  }
  title = f"Greek-English word alignment, {split} split, step {step}"
  aer.write_atomically(files["markdown"], aer.format_table(table, title=title) + "\n")
  aer.plot_layer_curve(table, files["plot"], title=title)
  aer.write_atomically(files["json"], json.dumps(results, indent=2) + "\n")
  return results


def format_best(results: Mapping[str, Any]) -> str:
  """One line per method: its best layer and scores (for the demo's summary)."""
  lines = [(f"word alignment ({results['src_lang']}->{results['tgt_lang']}, {results['split']}, "
            f"{results['pairs']} pairs): best layer per method")]
  rows = [(f"{method:<9} layer {b['layer']}", b) for method, b in results["best"].items()]
  rows.append(("diagonal baseline", results["diagonal_baseline"]))
  for name, b in rows:
    lines.append(f"  {name:<18} AER {100 * b['aer']:5.1f}  P {100 * b['precision']:5.1f}  "
                 f"R {100 * b['recall']:5.1f}  F1 {100 * b['f1']:5.1f}")
  return "\n".join(lines)
