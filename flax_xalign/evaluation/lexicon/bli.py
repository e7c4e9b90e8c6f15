"""Bilingual lexicon induction (BLI) from a checkpoint's token representations.

Lu, Lu & Zhang 2023, §2.2: between the language-specific vocabularies of two
languages (`assets.lang_vocab`, §2.1), every source token's translation is its
nearest target token by CSLS (Eq. 1-2, K = 10) or plain cosine ("nn"); Hit@k
against a gold lexicon measures the induced dictionary (Table 1).

Token representations, per layer l:

* l = 0: the rows of the input token-embedding table
  (`embedding_table(params, config)`), as in the paper's Table 1;
* l > 0: the contextual states of layer l, averaged over every occurrence of
  the token in its language's monolingual text (the `split`, train by
  default, of the task's monolingual member tasks; at most `max_sentences`
  sentences per language), each sentence encoded alone as `<s> text </s>`.
  One encoder pass gives every requested layer (`return_all_hidden`). A token
  that never occurs in the sentences read has no representation there and is
  masked out.

Gold lexicons (MUSE: `{source word: [translations]}`) are mapped to token ids
the way the run tokenises text: the task's text normaliser
(`data.normalize`, e.g. nfd_strip_marks for the e5 runs), then the run's
vocabulary. A word counts only when it is one token of the vocabulary (with
SentencePiece's word-start marker, as a word at the start of a text is
encoded) and that token is in its side's language-specific vocabulary. Every
other source word, and every source whose translations are all out, is OUT OF
COVERAGE: counted per reason (`Gold.out_of_coverage`), never dropped
silently. Source words that normalise to one token merge their translations
into one query. Hit@k (MUSE's convention): a query is a hit when any of its
gold translations is among its k best targets. A synthetic run's gold is its
token map instead (`gold_from_token_pairs`: natural id i <-> derived id).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign import ops
from flax_xalign.errors import UserError

METHODS = ("csls", "nn")
KS = (1, 5)
DEFAULT_KNN = 10
_EXAMPLES = 5  # Out-of-coverage words listed per reason.

# Reasons a lexicon entry is out of coverage (counted over source words / over (source, translation) pairs).
SOURCE_NOT_ONE_TOKEN = "source_not_one_token"
SOURCE_NOT_LANGUAGE_SPECIFIC = "source_not_in_language_vocab"
NO_TRANSLATION_COVERED = "no_translation_covered"
TRANSLATION_NOT_ONE_TOKEN = "translation_not_one_token"
TRANSLATION_NOT_LANGUAGE_SPECIFIC = "translation_not_in_language_vocab"
SOURCE_REASONS = (SOURCE_NOT_ONE_TOKEN, SOURCE_NOT_LANGUAGE_SPECIFIC, NO_TRANSLATION_COVERED)
PAIR_REASONS = (TRANSLATION_NOT_ONE_TOKEN, TRANSLATION_NOT_LANGUAGE_SPECIFIC)


# ------------------------------------------------------------ representations


def embedding_table(params: Mapping[str, Any], config: Any) -> jax.Array:
  """[vocab, embed] input token embeddings of an encoder's (or PretrainingModel's) params.

  Only the real rows (`config.vocab_size`, or an int): a padded vocabulary's
  padding rows are no word and must never be a neighbour.
  """
  from flax_xalign.models.encoder import token_embedding_table

  return token_embedding_table(params, config)


def sentence_rows(sentences: Sequence[Sequence[int]], *, bos: int, eos: int, pad: int, lang_id: int,
                  length: int) -> dict[str, np.ndarray]:
  """Sentences as model rows `<s> ids </s>` (trimmed to length - 2 ids), one sentence per row.

  Returns:
    int32 [n, length] `tokens, lang_ids, positions, segment_ids` (segment 1 on
    the sentence, 0 on padding).
  """
  if length < 3:
    raise ValueError(f"length={length} leaves no room for a token between <s> and </s>")
  n = len(sentences)
  rows = {"tokens": np.full((n, length), pad, np.int32), "lang_ids": np.zeros((n, length), np.int32),
          "positions": np.zeros((n, length), np.int32), "segment_ids": np.zeros((n, length), np.int32)}
  for r, ids in enumerate(sentences):
    ids = np.asarray(ids, np.int32)[:length - 2]
    span = len(ids) + 2
    rows["tokens"][r, :span] = np.concatenate([[bos], ids, [eos]])
    rows["lang_ids"][r, :span] = lang_id
    rows["positions"][r, :span] = np.arange(span)
    rows["segment_ids"][r, :span] = 1
  return rows


def _accumulate(params: Any, batch: Mapping[str, jax.Array], slot_of_token: jax.Array, sums: jax.Array,
                counts: jax.Array, *, encoder: Any, layers: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """Adds one batch's states of `layers` to per-slot sums.

  Args:
    params: encoder parameters.
    batch: int32 [b, n] `tokens, lang_ids, positions, segment_ids`; bool [b, n] `collect` (False on
      padding and on the filler rows of a last, short batch).
    slot_of_token: int32 [vocab]: the row of a token id in `sums`, -1 when it is not collected.
    sums: float32 [C + 1, len(layers), embed]; row C collects everything not wanted.
    counts: float32 [C + 1] occurrences per slot.
  """
  out = encoder.apply({"params": params}, batch["tokens"], lang_ids=batch["lang_ids"],
                      positions=batch["positions"], segment_ids=batch["segment_ids"], deterministic=True,
                      return_all_hidden=True)
  hidden = jnp.stack([out.all_hidden[layer] for layer in layers], axis=2).astype(jnp.float32)  # [b, n, k, e]
  dropped = sums.shape[0] - 1
  slots = jnp.where(batch["collect"], slot_of_token[batch["tokens"]], -1)
  slots = jnp.where(slots < 0, dropped, slots).reshape(-1)
  sums = sums + jax.ops.segment_sum(hidden.reshape(slots.shape[0], *hidden.shape[2:]), slots,
                                    num_segments=dropped + 1)
  counts = counts + jax.ops.segment_sum(jnp.ones(slots.shape, jnp.float32), slots, num_segments=dropped + 1)
  return sums, counts


@functools.lru_cache(maxsize=16)
def _jitted_accumulate(encoder: Any, layers: tuple[int, ...]) -> Callable:
  return jax.jit(functools.partial(_accumulate, encoder=encoder, layers=layers), donate_argnums=(3, 4))


def contextual_means(encoder: Any, params: Any, rows: Mapping[str, np.ndarray], *, vocab_ids: np.ndarray,
                     layers: Sequence[int], batch_size: int = 32, vocab_size: int | None = None,
                     progress: Callable[[str], Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Mean contextual state of each token of `vocab_ids` over its occurrences in `rows`.

  Args:
    encoder: the Flax Encoder (`model.encoder`).
    params: its parameters.
    rows: int32 [n, length] `tokens, lang_ids, positions, segment_ids` (`sentence_rows`).
    vocab_ids: [C] token ids to collect (distinct).
    layers: hidden-state indices, 1..num_layers (0 would be the embedded input, not the table).
    batch_size: rows per encoder call (the last batch is padded with one-token rows).
    vocab_size: the model's embedding rows (default: `encoder.config.vocab_size`).
    progress: called with a line after each batch of many.

  Returns:
    (float32 [len(layers), C, embed] means, zero where a token never occurs;
     int64 [C] occurrences).
  """
  layers = tuple(int(layer) for layer in layers)
  vocab_size = int(vocab_size or encoder.config.vocab_size)
  vocab_ids = np.asarray(vocab_ids, np.int64)
  slot_of_token = np.full(vocab_size, -1, np.int32)
  slot_of_token[vocab_ids] = np.arange(len(vocab_ids), dtype=np.int32)
  n = len(rows["tokens"])
  embed = encoder.config.embed_dim
  sums = jnp.zeros((len(vocab_ids) + 1, len(layers), embed), jnp.float32)
  counts = jnp.zeros((len(vocab_ids) + 1,), jnp.float32)
  step = _jitted_accumulate(encoder, layers)
  slot_table = jnp.asarray(slot_of_token)
  for start in range(0, n, batch_size):
    batch = {k: v[start:start + batch_size] for k, v in rows.items()}
    batch["collect"] = batch["segment_ids"] > 0
    short = batch_size - len(batch["tokens"])
    if short:  # Copies of the first row, never collected, keep every call the same shape.
      filler = {k: np.repeat(v[:1], short, axis=0) for k, v in batch.items()}
      filler["collect"][:] = False
      batch = {k: np.concatenate([v, filler[k]]) for k, v in batch.items()}
    sums, counts = step(params, {k: jnp.asarray(v) for k, v in batch.items()}, slot_table, sums, counts)
    if progress is not None and (start // batch_size) % 50 == 49:
      progress(f"  encoded {min(start + batch_size, n):,} of {n:,} sentences")
  sums, counts = np.asarray(sums)[:-1], np.asarray(counts)[:-1]
  means = np.where(counts[:, None, None] > 0, sums / np.maximum(counts, 1)[:, None, None], 0.0)
  return means.transpose(1, 0, 2).astype(np.float32), counts.astype(np.int64)


# ------------------------------------------------------------ the run's text


def _member_tasks(task_name: str, code: str, split: str) -> list[Any]:
  """The monolingual member tasks of `task_name` that may hold `code` text in `split`."""
  from flax_xalign import tasks
  from flax_xalign.data import pipeline

  members = []
  for task in pipeline.tasks_of(tasks.get_provider(task_name)):
    if split not in task.splits:
      continue
    ours = tasks.registry.text_loader(task.name) is not None  # Languages known without reading.
    if ours and (tasks.registry.language_pairs(task.name) or code not in tasks.languages_of(task.name)):
      continue
    members.append(task)
  return members


def task_normalizer(task_name: str, code: str) -> str:
  """The text normaliser the monolingual tasks of `code` apply before tokenising ("" if none).

  Read from the task's `tokenize_and_tag` preprocessor (`tasks.registry`);
  UserError when two member tasks of `code` disagree.
  """
  from flax_xalign.tasks import registry

  found = set()
  for task in _member_tasks(task_name, code, "train") or _member_tasks(task_name, code, "validation"):
    for preprocessor in task.preprocessors:
      if getattr(preprocessor, "func", None) is registry.tokenize_and_tag:
        found.add(preprocessor.keywords.get("normalize", ""))
  if len(found) > 1:
    raise UserError(f"the {code!r} tasks of {task_name!r} normalise text differently ({sorted(found)}); BLI maps "
                    "the gold lexicon with one normaliser: pass --normalize.")
  return found.pop() if found else ""


def monolingual_sentences(task_name: str, code: str, *, split: str = "train",
                          max_sentences: int | None = None) -> list[np.ndarray]:
  """Token ids (no specials; normalised and id-mapped as the task does) of `code`'s monolingual examples.

  Member tasks are read in the mixture's listed order, unshuffled, until
  `max_sentences` examples are read.

  Raises:
    UserError: no monolingual example of `code` in `split` of `task_name`.
  """
  from flax_xalign.data import task_reads

  sentences: list[np.ndarray] = []
  for task in _member_tasks(task_name, code, split):
    left = None if max_sentences is None else max_sentences - len(sentences)
    if left is not None and left <= 0:
      break
    sentences.extend(task_reads.monolingual_tokens(task, code, split=split, limit=left))
  if not sentences:
    raise UserError(f"{task_name!r} has no monolingual {code!r} text in its {split!r} split, so layer > 0 "
                    "representations cannot be averaged; use --layer=0 or a task with that language's text.")
  return sentences


# ------------------------------------------------------------ induction


def induce(src: Any, tgt: Any, *, method: str = "csls", k: int = 5, knn: int = DEFAULT_KNN,
           src_mask: Any = None, tgt_mask: Any = None) -> Any:
  """The k best targets of every source row: `ops.TopK` (values, indices into `tgt` rows).

  Args:
    src: [s, embed] source representations.
    tgt: [t, embed] target representations.
    method: "csls" (Eq. 1, r_K over the K = `knn` nearest) or "nn" (cosine).
    k: targets per source.
    knn: K of CSLS.
    src_mask: bool [s] (False: padding, never a query); tgt_mask: bool [t] (never returned).
  """
  if method == "csls":
    return ops.csls_topk(src, tgt, k=k, knn=knn, source_mask=src_mask, target_mask=tgt_mask)
  if method == "nn":
    return ops.cosine_topk(src, tgt, k=k, query_mask=src_mask, target_mask=tgt_mask)
  raise UserError(f"unknown BLI method {method!r}; use one of {', '.join(METHODS)}.")


# ------------------------------------------------------------ gold


@dataclasses.dataclass(frozen=True)
class Gold:
  """A gold lexicon on two vocabulary sides.

  Attributes:
    sources: int32 [q] rows of the source side (one query per distinct token).
    targets: int32 [q, g] rows of the target side, -1 padded (a hit is any of them).
    entries: source words (or token pairs' distinct sources) of the lexicon.
    covered: entries in coverage (source and at least one translation in).
    gold_pairs: in-coverage (query, translation) pairs, `(targets >= 0).sum()`.
    out_of_coverage: reason -> count (`SOURCE_REASONS` count source words,
      `PAIR_REASONS` count (source, translation) pairs).
    examples: reason -> a few of its words, for messages.
  """
  sources: np.ndarray
  targets: np.ndarray
  entries: int
  covered: int
  out_of_coverage: Mapping[str, int]
  examples: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  @property
  def coverage(self) -> float:
    return self.covered / self.entries if self.entries else 0.0

  @property
  def queries(self) -> int:
    return len(self.sources)

  @property
  def gold_pairs(self) -> int:
    return int((self.targets >= 0).sum())

  def first_pairs(self) -> tuple[np.ndarray, np.ndarray]:
    """(source rows, the first gold translation's row) per query: the translation pairs of RSIM."""
    return self.sources, self.targets[:, 0]

  def restricted(self, src_valid: np.ndarray, tgt_valid: np.ndarray) -> Gold:
    """The queries whose source row and at least one target row are valid (e.g. occur in the text read)."""
    targets = np.where((self.targets >= 0) & tgt_valid[np.maximum(self.targets, 0)], self.targets, -1)
    keep = src_valid[self.sources] & (targets >= 0).any(axis=1)
    targets = _left_pack(targets[keep])
    return dataclasses.replace(self, sources=self.sources[keep], targets=targets)


def _left_pack(targets: Sequence[Sequence[int]]) -> np.ndarray:
  """int32 [rows, width]: each row's valid (>= 0) entries first, order kept, -1 after; width >= 1."""
  rows = [[int(t) for t in row if t >= 0] for row in targets]
  width = max([len(r) for r in rows] + [1])
  out = np.full((len(rows), width), -1, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def _rows_of(ids: np.ndarray, mask: np.ndarray) -> dict[int, int]:
  return {int(i): r for r, (i, m) in enumerate(zip(np.asarray(ids), np.asarray(mask, bool))) if m}


def gold_from_lexicon(lexicon: Mapping[str, Sequence[str]], *, encode: Callable[[str], Sequence[int]],
                      src_ids: np.ndarray, src_mask: np.ndarray, tgt_ids: np.ndarray, tgt_mask: np.ndarray,
                      normalize: Callable[[str], str] = lambda word: word) -> Gold:
  """Maps a word lexicon onto the rows of two language-specific vocabularies.

  Args:
    lexicon: {source word: [translations]} (`data.sources.lexicon.read_lexicon`).
    encode: text -> token ids (the run's vocabulary; a word alone gets its word-start marker).
    src_ids, src_mask: [C] token ids of the source side's rows and which rows are real.
    tgt_ids, tgt_mask: the same for the target side.
    normalize: the run's text normaliser, applied to every word before `encode`.

  Returns:
    The `Gold`; out-of-coverage reasons as in the module docstring.
  """
  src_rows, tgt_rows = _rows_of(src_ids, src_mask), _rows_of(tgt_ids, tgt_mask)
  reasons = {reason: 0 for reason in SOURCE_REASONS + PAIR_REASONS}
  examples: dict[str, list[str]] = {reason: [] for reason in reasons}

  def out(reason: str, word: str) -> None:
    reasons[reason] += 1
    if len(examples[reason]) < _EXAMPLES:
      examples[reason].append(word)

  def row_of(word: str, rows: Mapping[int, int], not_one: str, not_specific: str) -> int | None:
    ids = list(encode(normalize(word)))
    if len(ids) != 1:
      out(not_one, word)
      return None
    if int(ids[0]) not in rows:
      out(not_specific, word)
      return None
    return rows[int(ids[0])]

  queries: dict[int, list[int]] = {}
  covered = 0
  for source, translations in lexicon.items():
    src_row = row_of(source, src_rows, SOURCE_NOT_ONE_TOKEN, SOURCE_NOT_LANGUAGE_SPECIFIC)
    if src_row is None:
      continue
    rows = [r for r in (row_of(t, tgt_rows, TRANSLATION_NOT_ONE_TOKEN, TRANSLATION_NOT_LANGUAGE_SPECIFIC)
                        for t in translations) if r is not None]
    if not rows:
      out(NO_TRANSLATION_COVERED, source)
      continue
    covered += 1
    merged = queries.setdefault(src_row, [])
    merged.extend(r for r in rows if r not in merged)
  return _gold(queries, entries=len(lexicon), covered=covered, reasons=reasons,
               examples={k: tuple(v) for k, v in examples.items() if v})


def gold_from_token_pairs(pairs: np.ndarray, *, src_ids: np.ndarray, src_mask: np.ndarray, tgt_ids: np.ndarray,
                          tgt_mask: np.ndarray) -> Gold:
  """Gold from (source token id, target token id) pairs, e.g. a synthetic run's natural i <-> derived i + V.

  A source id absent from the source side (or with no target id on the
  target side) is out of coverage, counted like a word's.
  """
  src_rows, tgt_rows = _rows_of(src_ids, src_mask), _rows_of(tgt_ids, tgt_mask)
  by_source: dict[int, list[int]] = {}
  for s, t in np.asarray(pairs, np.int64).reshape(-1, 2):
    by_source.setdefault(int(s), []).append(int(t))
  reasons = {reason: 0 for reason in SOURCE_REASONS + PAIR_REASONS}
  queries: dict[int, list[int]] = {}
  for source, targets in by_source.items():
    if source not in src_rows:
      reasons[SOURCE_NOT_LANGUAGE_SPECIFIC] += 1
      continue
    rows = []
    for t in targets:
      if t in tgt_rows:
        rows.append(tgt_rows[t])
      else:
        reasons[TRANSLATION_NOT_LANGUAGE_SPECIFIC] += 1
    if not rows:
      reasons[NO_TRANSLATION_COVERED] += 1
      continue
    queries[src_rows[source]] = list(dict.fromkeys(rows))
  return _gold(queries, entries=len(by_source), covered=len(queries), reasons=reasons, examples={})


def _gold(queries: Mapping[int, Sequence[int]], *, entries: int, covered: int, reasons: Mapping[str, int],
          examples: Mapping[str, tuple[str, ...]]) -> Gold:
  sources = np.asarray(list(queries), np.int32)
  targets = _left_pack(list(queries.values()))
  return Gold(sources=sources, targets=targets, entries=entries, covered=covered, out_of_coverage=dict(reasons),
              examples=dict(examples))


# ------------------------------------------------------------ scoring


def hits_at_k(top_indices: np.ndarray, gold_targets: np.ndarray, ks: Iterable[int] = KS) -> dict[str, float]:
  """Hit@k per k: the fraction of queries with a gold translation among their k best.

  Args:
    top_indices: int [q, K] ranked target rows (-1: no target), K >= max(ks).
    gold_targets: int [q, g] gold target rows, -1 padded.

  Returns:
    {"hit@k": fraction} (NaN when there is no query).
  """
  top = np.asarray(top_indices)
  gold = np.asarray(gold_targets)
  out = {}
  for k in ks:
    if k > top.shape[1]:
      raise ValueError(f"Hit@{k} needs at least {k} ranked targets, got {top.shape[1]}")
    found = (top[:, :k, None] == gold[:, None, :]) & (gold[:, None, :] >= 0)
    out[f"hit@{k}"] = float(found.any(axis=(1, 2)).mean()) if len(top) else float("nan")
  return out


def score(src: Any, tgt: Any, gold: Gold, *, src_mask: Any = None, tgt_mask: Any = None,
          methods: Sequence[str] = METHODS, ks: Sequence[int] = KS, knn: int = DEFAULT_KNN) -> dict[str, dict]:
  """Hit@k of every method on the gold queries: {method: {"hit@1": ..., "hit@5": ...}}.

  CSLS's r_K(y) is over every valid source row (not only the queries), as
  when the whole dictionary is induced.
  """
  out = {}
  for method in methods:
    top = induce(src, tgt, method=method, k=max(ks), knn=knn, src_mask=src_mask, tgt_mask=tgt_mask)
    out[method] = hits_at_k(np.asarray(top.indices)[gold.sources], gold.targets, ks)
  return out


def layer_curves(src_layers: Mapping[int, Any], tgt_layers: Mapping[int, Any], *, pairs: tuple[np.ndarray, np.ndarray],
                 src_mask: Any = None, tgt_mask: Any = None, gold: Gold | None = None,
                 knn: int = DEFAULT_KNN) -> dict[str, list]:
  """Per layer: Hit@1 (NN, CSLS; with `gold`), mean cosine and RSIM of translation pairs (Fig. 3), and RSIM's
  two controls: `rsim_centred`, each side's mean vector over the pairs subtracted first (an anisotropic layer,
  every vector near one direction, can score a high RSIM from that direction alone), and `rsim_shuffled`, the
  target side's pairs permuted (a fixed draw): the value with the translations' correspondence taken away.

  Args:
    src_layers, tgt_layers: {layer: [C, embed] representations} of the two sides.
    pairs: (source rows, target rows) [s] of the translation pairs RSIM and the mean cosine are taken over.
    src_mask, tgt_mask: bool [C] rows that exist at every layer.
    gold: scored for Hit@1 when given.
    knn: K of CSLS.

  Returns:
    {"layers", "mean_cosine", "rsim", "rsim_centred", "rsim_shuffled"} and, with gold, {"hit@1_nn",
    "hit@1_csls"}: lists over layers.
  """
  from flax_xalign.evaluation.lexicon import rsim
  layers = sorted(src_layers)
  out: dict[str, list] = {"layers": layers, "mean_cosine": [], "rsim": [], "rsim_centred": [], "rsim_shuffled": []}
  if gold is not None:
    out.update({f"hit@1_{method}": [] for method in METHODS})
  src_rows, tgt_rows = (np.asarray(p) for p in pairs)
  shuffle = np.random.default_rng(0).permutation(len(tgt_rows))
  for layer in layers:
    x, y = np.asarray(src_layers[layer])[src_rows], np.asarray(tgt_layers[layer])[tgt_rows]
    out["mean_cosine"].append(float(rsim.mean_pair_cosine(x, y)))
    out["rsim"].append(float(rsim.rsim(x, y)))
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    out["rsim_centred"].append(float(rsim.rsim(x64 - x64.mean(0), y64 - y64.mean(0))))
    out["rsim_shuffled"].append(float(rsim.rsim(x, y[shuffle])))
    if gold is not None:
      scores = score(src_layers[layer], tgt_layers[layer], gold, src_mask=src_mask, tgt_mask=tgt_mask,
                     ks=(1,), knn=knn)
      for method in METHODS:
        out[f"hit@1_{method}"].append(scores[method]["hit@1"])
  return out
