"""A dictionary the model induces from its own input embeddings: the `induced_dictionary` asset.

TCS-MLM (Lu, Lu & Zhang 2023, §3.1) code-switches with a token dictionary
"self-induced" from a multilingual model: every token of one language-specific
vocabulary (`lang_vocab`, §2.1) is translated to its CSLS nearest neighbour
(§2.2, Eq. 1-2, K = `knn`) among the other language's language-specific
tokens, on layer 0 (the token-embedding table), in both directions.

Where the embeddings come from:

* `source` (a MODEL_DIR; default: the run's `init_from_checkpoint`): induced
  once when the run starts from that checkpoint's latest parameters, as the
  paper does; the source must have the run's vocabulary. The asset opens no
  checkpoint: whoever builds it (training/asset_setup.py) opens the source and
  passes it, `build(run, source=...)`, as a handle with `.spec` (its RunSpec)
  and `.params()` (`training.run_reader.SourceRun` or `runs.Run`).
* `refresh_every` = N > 0: re-induced from the run's own parameters after
  every N-th train step (jitted, same shapes: the train step never
  recompiles); each checkpoint saves the dictionary of its step, so a resumed
  run continues with exactly it. Without a source the dictionary then starts
  empty (every `translation` -1: TCS switches nothing) until step N.
* neither: a UserError (there is nothing to induce from).
* `method='gold'` (a control, not the paper's method): no model at all; a
  transliterated synthetic language's true token map (the `token_map` asset's),
  each entry kept with probability `precision` and otherwise replaced by a
  token drawn uniformly from the partner vocabulary's others (`seed` draws
  them), so TCS can be run with a dictionary of a chosen Hit@1 (the paper's
  Table 1 self-induced dictionaries are about 50%). Entries whose true partner
  is not in the partner vocabulary stay untranslated; never refreshed.

Options (`asset_options={'induced_dictionary': {...}}`): `source`, `method`
('csls', or 'nn' for the plain cosine nearest neighbour), `knn` (10),
`refresh_every` (0), and for 'gold' `precision` (1.0) and `seed` (0); `languages`, `pivot`, `min_count` and `split` are the
`lang_vocab` options (`asset_options['lang_vocab']`), which may be
overridden here. With a pivot (many languages) every pair (X, pivot) gets its
own dictionary, both directions, between its own two vocabularies (§2.2:
one exported dictionary per X-En pair).

Value (S sides and capacity C as `lang_vocab`; side s's partner is s ^ 1):

    vocab_ids   int32   [S, C]  the lang_vocab ids (0 in padding)
    vocab_mask  bool    [S, C]
    translation int32   [S, C]  the token id (of the partner side's vocabulary) that
                                vocab_ids[s, i] translates to; -1 where masked / not yet induced
    score       float32 [S, C]  its CSLS (cosine for 'nn'); 0 where translation is -1
    lang_ids    int32   [S]

File `induced_dictionary.tsv`: `# key: value` header lines, a column line,
then one row per vocabulary entry (src_lang = the side's label), side 0 first:
`src_lang<TAB>src_id<TAB>tgt_id<TAB>src_piece<TAB>tgt_piece<TAB>score`
(tgt_id -1 and an empty tgt_piece for an entry not yet induced). Scores are
written with '%.9g', which reproduces every float32 bit for bit, so a loaded
file has the fingerprint of the value that was saved.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from flax_xalign.assets import lang_vocab as lang_vocab_lib
from flax_xalign.assets import registry
from flax_xalign.assets.base import Asset, Value
from flax_xalign.errors import UserError
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

FILENAME = "induced_dictionary.tsv"
METHODS = ("csls", "nn", "gold")
DEFAULT_METHOD = "csls"
DEFAULT_KNN = 10
OWN_OPTIONS = ("source", "method", "knn", "refresh_every", "precision", "seed")
OPTIONS = OWN_OPTIONS + lang_vocab_lib.OPTIONS
COLUMNS = ("src_lang", "src_id", "tgt_id", "src_piece", "tgt_piece", "score")
BLOCK = 1024  # Source rows per block of the similarity search (memory O(BLOCK x C)).


@functools.partial(jax.jit, static_argnames=("method", "knn", "block"))
def induce_dictionary(table: jax.Array, vocab_ids: jax.Array, vocab_mask: jax.Array, *, method: str = DEFAULT_METHOD,
                      knn: int = DEFAULT_KNN, block: int = BLOCK) -> tuple[jax.Array, jax.Array]:
  """Top-1 translations between paired token sets (side s and s ^ 1), both directions, on an embedding table.

  Args:
    table: [vocab, embed] token embeddings (any float dtype).
    vocab_ids: int32 [S, C] token ids of the S sides (S even).
    vocab_mask: bool [S, C] valid entries.
    method: "csls" (Eq. 1, r_K over the other side's valid entries) or "nn" (cosine).
    knn: K of CSLS's neighbourhood radius.
    block: source rows per block.

  Returns:
    translation int32 [S, C] (the partner side's token id; -1 where masked) and
    score float32 [S, C] (0 where masked).
  """
  from flax_xalign.ops import csls as csls_lib

  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")
  sides = vocab_ids.shape[0]
  embeddings = [jnp.take(table, vocab_ids[s], axis=0) for s in range(sides)]
  translations, scores = [], []
  for s in range(sides):
    other = s ^ 1
    source, target = embeddings[s], embeddings[other]
    if method == "csls":
      top = csls_lib.csls_topk(source, target, k=1, knn=knn, source_mask=vocab_mask[s],
                               target_mask=vocab_mask[other], block=block)
    else:
      top = csls_lib.cosine_topk(source, target, k=1, query_mask=vocab_mask[s], target_mask=vocab_mask[other],
                                 block=block)
    index = top.indices[:, 0]
    valid = vocab_mask[s] & (index >= 0)
    translations.append(jnp.where(valid, vocab_ids[other][jnp.maximum(index, 0)], -1).astype(jnp.int32))
    scores.append(jnp.where(valid, top.values[:, 0], 0.0).astype(jnp.float32))
  return jnp.stack(translations), jnp.stack(scores)


def empty_value(vocab: Value) -> Value:
  """The dictionary of a `lang_vocab` value before anything is induced (all translations -1)."""
  shape = np.shape(vocab["ids"])
  return {"vocab_ids": np.asarray(vocab["ids"], np.int32), "vocab_mask": np.asarray(vocab["mask"], bool),
          "translation": np.full(shape, -1, np.int32), "score": np.zeros(shape, np.float32),
          "lang_ids": np.asarray(vocab["lang_ids"], np.int32)}


def _embedding_table(params: Any, vocab_size: int) -> Any:
  """The real rows of the encoder's token table (a padded vocabulary's padding rows are no token)."""
  from flax_xalign.models.encoder import token_embedding_table

  try:
    table = params["token_embed"]["embedding"]
  except (KeyError, TypeError) as e:
    raise ValueError("induced_dictionary reads the encoder's params['token_embed']['embedding'] (layer 0); these "
                     f"parameters have no such entry ({e})") from e
  return token_embedding_table(params, vocab_size) if vocab_size else table


def _source_vocabulary_check(source: str, source_run: "RunSpec", run: "RunSpec") -> None:
  if source_run.vocabulary.fingerprint() != run.vocabulary.fingerprint():
    raise UserError(
        f"induced_dictionary source {source} was trained with another vocabulary ({source_run.vocabulary.file}, "
        f"sha256 {source_run.vocabulary.sha256[:12]}…, {source_run.vocabulary.size} ids; this run: "
        f"{run.vocabulary.sha256[:12]}…, {run.vocabulary.size} ids), so its embedding rows are other tokens. "
        "Induce from a model with this run's vocabulary.")


class InducedDictionary(Asset):
  """`induced_dictionary` (see the module docstring)."""

  name = "induced_dictionary"
  files = (FILENAME,)

  def __init__(self, *, vocab: lang_vocab_lib.LangVocab, source: str | None, method: str = DEFAULT_METHOD,
               knn: int = DEFAULT_KNN, refresh_every: int = 0, vocab_size: int = 0,
               piece: Callable[[int], str] | None = None, gold: Any = None, precision: float = 1.0,
               seed: int = 0):
    self.vocab = vocab
    self.gold = gold  # method 'gold': the SyntheticLanguage whose id map is the truth.
    self.precision = float(precision)
    self.seed = int(seed)
    self.source = source
    self.method = method
    self.knn = int(knn)
    self.refresh_every = int(refresh_every)
    self.vocab_size = int(vocab_size)
    self._piece = piece
    self.loaded_header: dict[str, str] | None = None

  @property
  def languages(self) -> tuple[str, ...]:
    return self.vocab.languages

  @property
  def sides(self) -> tuple[str, ...]:
    return self.vocab.sides

  def induce(self, params: Any, value: Value) -> Value:
    """`value` with translation and score induced from `params` (traceable; keeps shapes and dtypes)."""
    translation, score = induce_dictionary(_embedding_table(params, self.vocab_size), jnp.asarray(value["vocab_ids"]),
                                           jnp.asarray(value["vocab_mask"]), method=self.method, knn=self.knn)
    return {"vocab_ids": value["vocab_ids"], "vocab_mask": value["vocab_mask"], "translation": translation,
            "score": score, "lang_ids": value["lang_ids"]}

  def gold_value(self, value: Value, first_regular: int) -> Value:
    """`value` translated by the true map, each entry kept with probability `precision` (method 'gold')."""
    id_map = np.asarray(self.gold.id_map())
    inverse = np.full(max(len(id_map), int(id_map.max()) + 1), -1, np.int64)
    regular = np.arange(len(id_map)) >= first_regular
    inverse[id_map[regular]] = np.flatnonzero(regular)
    ids, mask = np.asarray(value["vocab_ids"]), np.asarray(value["vocab_mask"], bool)
    translation = np.full(ids.shape, -1, np.int32)
    rng = np.random.default_rng(self.seed)
    natural = _natural_language()
    for s in range(ids.shape[0]):
      partner = ids[s ^ 1][mask[s ^ 1]]
      in_partner = set(partner.tolist())
      truth = id_map if lang_vocab_lib.side_language(self.sides[s]) == natural else inverse
      for i in np.flatnonzero(mask[s]):
        true = int(truth[ids[s, i]]) if ids[s, i] < len(truth) else -1
        if true < 0 or true == ids[s, i] or true not in in_partner:
          continue
        others = partner[partner != true]
        translation[s, i] = true if rng.random() < self.precision or not others.size else int(rng.choice(others))
    return {**value, "translation": translation,
            "score": np.where(translation >= 0, np.float32(1), np.float32(0)).astype(np.float32)}

  def build(self, run: "RunSpec", *, source: Any = None) -> Value:
    """The dictionary induced from `source` (the opened `self.source` run), or empty until the first refresh."""
    if self.method == "gold":
      return self.gold_value(empty_value(self.vocab.build(run)), run.vocabulary.specials.first_regular)
    if self.source is None and not self.refresh_every:
      raise UserError(
          "the induced_dictionary asset needs a model to induce from: warm-start the run from one "
          "(train.init_from_checkpoint, the paper's setting), name one with asset_options="
          "{'induced_dictionary': {'source': MODEL_DIR}}, or set its 'refresh_every' to N > 0 to induce it from "
          "this run's own parameters every N steps (empty until step N).")
    value = empty_value(self.vocab.build(run))
    if self.source is None:
      return value
    if source is None:
      raise ValueError(f"induced_dictionary from {self.source}: pass the opened source run, build(run, "
                       "source=...) (assets open no checkpoint; training/asset_setup.py does).")
    _source_vocabulary_check(self.source, source.spec, run)
    params = source.params()  # Read only once the vocabulary is known to match.
    return {k: np.asarray(v) for k, v in jax.device_get(self.induce(params, value)).items()}

  def refresh(self, params: Any, value: Value, run: "RunSpec") -> Value:
    if self.method == "gold":
      return value
    return self.induce(params, value)

  # ---------------------------------------------------------------- files

  def _header(self, value: Value) -> list[str]:
    mask = np.asarray(value["vocab_mask"], bool)
    induced = (np.asarray(value["translation"]) >= 0) & mask
    sides = range(mask.shape[0])
    return [
        ("# token dictionary self-induced from input embeddings (Lu, Lu & Zhang 2023, §2.2), "
         "flax_xalign induced_dictionary asset"),
        *lang_vocab_lib.setting_lines(self.languages, self.vocab.pivot),
        f"# lang_ids: {' '.join(str(int(i)) for i in np.asarray(value['lang_ids']))}",
        f"# method: {self.method}",
        *([f"# precision: {self.precision!r}", f"# seed: {self.seed}"] if self.method == "gold" else []),
        f"# knn: {self.knn}",
        f"# source: {self.source or ''}",
        f"# refresh_every: {self.refresh_every}",
        f"# min_count: {self.vocab.min_count}",
        f"# split: {self.vocab.split}",
        f"# vocab_size: {self.vocab_size}",
        f"# capacity: {mask.shape[1]}",
        f"# sizes: {' '.join(str(int(mask[s].sum())) for s in sides)}",
        f"# induced: {' '.join(str(int(induced[s].sum())) for s in sides)}",
    ]

  def _piece_of(self, i: int) -> str:
    return lang_vocab_lib.clean_piece(self._piece(i)) if self._piece is not None and i >= 0 else ""

  def save(self, directory: str, value: Value) -> None:
    lines = self._header(value) + ["\t".join(COLUMNS)]
    arrays = {k: np.asarray(v) for k, v in value.items()}
    for s, code in enumerate(self.sides):
      keep = arrays["vocab_mask"][s].astype(bool)
      for src, tgt, score in zip(arrays["vocab_ids"][s][keep], arrays["translation"][s][keep],
                                 arrays["score"][s][keep]):
        src, tgt = int(src), int(tgt)
        lines.append(f"{code}\t{src}\t{tgt}\t{self._piece_of(src)}\t{self._piece_of(tgt)}\t"
                     f"{float(np.float32(score)):.9g}")
    write_atomically(os.path.join(directory, FILENAME), "\n".join(lines) + "\n")

  def load(self, directory: str) -> Value:
    path = os.path.join(directory, FILENAME)
    lines = lang_vocab_lib.read_lines(path)
    header, start = lang_vocab_lib.parse_header(path, lines)
    languages = lang_vocab_lib.sides_of_header(path, header)
    n = len(languages)
    try:
      lang_ids = [int(x) for x in lang_vocab_lib.header_value(path, header, "lang_ids").split()]
      capacity = int(lang_vocab_lib.header_value(path, header, "capacity"))
    except ValueError as e:
      raise UserError(f"{path}: malformed header ({e}).") from e
    if len(lang_ids) != n or capacity < 1:
      raise UserError(f"{path}: the header must name one lang_id per side ({n}) and a capacity >= 1.")
    if start >= len(lines) or lines[start].split("\t") != list(COLUMNS):
      raise UserError(f"{path}:{start + 1}: expected the column line {chr(9).join(COLUMNS)!r}.")
    rows: list[list[tuple[int, int, np.float32]]] = [[] for _ in range(n)]
    for number, line in enumerate(lines[start + 1:], start=start + 2):
      if not line.strip():
        continue
      fields = line.split("\t")
      try:
        if len(fields) != len(COLUMNS):
          raise ValueError(f"{len(fields)} columns instead of {len(COLUMNS)}")
        if fields[0] not in languages:
          raise ValueError(f"language {fields[0]!r} is not one of the header's {languages}")
        side = languages.index(fields[0])
        src, tgt, score = int(fields[1]), int(fields[2]), np.float32(float(fields[5]))
        if src < 0 or tgt < -1:
          raise ValueError("src_id must be >= 0 and tgt_id >= -1")
        if not np.isfinite(score):
          raise ValueError("the score is not finite")
        if rows[side] and src <= rows[side][-1][0]:
          raise ValueError("the src_ids of a language must be listed in increasing order")
      except ValueError as e:
        raise UserError(f"{path}:{number}: malformed row {line!r} ({e}); expected "
                        f"{'<TAB>'.join(COLUMNS)}.") from None
      rows[side].append((src, tgt, score if tgt >= 0 else np.float32(0)))
    if max(len(r) for r in rows) != capacity:
      raise UserError(f"{path}: {', '.join(str(len(r)) for r in rows)} rows per side, but the header says capacity "
                      f"{capacity}; the file was cut or edited.")
    value = {"vocab_ids": np.zeros((n, capacity), np.int32), "vocab_mask": np.zeros((n, capacity), bool),
             "translation": np.full((n, capacity), -1, np.int32), "score": np.zeros((n, capacity), np.float32),
             "lang_ids": np.asarray(lang_ids, np.int32)}
    for s, side_rows in enumerate(rows):
      n = len(side_rows)
      if n:
        src, tgt, score = zip(*side_rows)
        value["vocab_ids"][s, :n], value["translation"][s, :n], value["score"][s, :n] = src, tgt, score
        value["vocab_mask"][s, :n] = True
    self.loaded_header = dict(header)
    return value

  def check(self, value: Value, run: "RunSpec") -> None:
    header = self.loaded_header or {}
    gold = {"precision": repr(self.precision), "seed": str(self.seed)} if self.method == "gold" else {}
    lang_vocab_lib.check_header_settings(FILENAME, header, {
        "method": self.method, "knn": str(self.knn), **gold,
        "source": self.source or "", "min_count": str(self.vocab.min_count), "split": self.vocab.split,
        "vocab_size": str(run.vocabulary.size)}, options="options")
    lang_vocab_lib.check_sides(FILENAME, header, self.sides)
    expected = [run.language_id(lang_vocab_lib.side_language(label)) for label in self.sides]
    if [int(x) for x in np.asarray(value["lang_ids"])] != expected:
      raise UserError(f"{FILENAME} has lang_ids {np.asarray(value['lang_ids']).tolist()}, but this run's "
                      f"{list(self.sides)} have {expected}; remove it or use a new MODEL_DIR.")
    mask = np.asarray(value["vocab_mask"], bool)
    ids, translation = np.asarray(value["vocab_ids"]), np.asarray(value["translation"])
    low, high = run.vocabulary.specials.regular_range(run.vocabulary.size)
    for s in range(mask.shape[0]):
      if mask[s].any() and (ids[s][mask[s]].min() < low or ids[s][mask[s]].max() >= high):
        raise UserError(f"{FILENAME} holds ids outside this run's regular ids [{low}, {high}); remove it or use a "
                        "new MODEL_DIR.")
      found = translation[s][mask[s]]
      stray = sorted(set(found[found >= 0].tolist()) - set(ids[s ^ 1][mask[s ^ 1]].tolist()))
      if stray:
        raise UserError(f"{FILENAME}: {self.sides[s]} tokens translate to ids {stray[:5]} that are not in the "
                        f"{self.sides[s ^ 1]} vocabulary of the file; fix those rows or remove the file.")

  def describe(self, value: Value) -> str:
    mask = np.asarray(value["vocab_mask"], bool)
    translation, score = np.asarray(value["translation"]), np.asarray(value["score"])
    induced = (translation >= 0) & mask
    origin = (f"from {self.source}" if self.source else "empty until the first refresh")
    if self.method == "gold":
      origin = f"the true token map, each entry kept with probability {self.precision:g} (seed {self.seed})"
    if self.refresh_every:
      origin += f", refreshed every {self.refresh_every} steps"
    sides = self.sides
    counts = "; ".join(
        f"{int(induced[s].sum()):,} {sides[s]}->{sides[s + 1]} and {int(induced[s + 1].sum()):,} "
        f"{sides[s + 1]}->{sides[s]} pairs of {int(mask[s].sum()):,} / {int(mask[s + 1].sum()):,} tokens"
        for s in range(0, mask.shape[0], 2))
    text = f"induced_dictionary: {counts} ({self.method}, knn {self.knn}; {origin})"
    examples = np.flatnonzero(induced[0])[:5]
    if examples.size:
      ids = np.asarray(value["vocab_ids"])
      shown = [f"{self._piece_of(int(ids[0, i])) or int(ids[0, i])}->"
               f"{self._piece_of(int(translation[0, i])) or int(translation[0, i])} ({score[0, i]:.3f})"
               for i in examples]
      text += "; e.g. " + ", ".join(shown)
    return text


def _int_option(options: Mapping[str, Any], key: str, default: int, low: int) -> int:
  value = options.get(key, default)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise UserError(f"induced_dictionary option {key!r} must be an integer >= {low}, got {value!r}.")
  return int(value)


def _natural_language() -> str:
  from flax_xalign.tasks import synthetic as synthetic_tasks
  return synthetic_tasks.NATURAL


def _gold_options(run: "RunSpec", options: Mapping[str, Any], method: str) -> tuple[Any, float, int]:
  """(the synthetic language, precision, seed) of method 'gold'; (None, 1.0, 0) for the others."""
  if method != "gold":
    given = sorted({"precision", "seed"} & set(options))
    if given:
      raise UserError(f"induced_dictionary option(s) {given} belong to method 'gold'; method {method!r} takes none.")
    return None, 1.0, 0
  from flax_xalign.assets.dictionary import transliterated_language
  precision = options.get("precision", 1.0)
  if isinstance(precision, bool) or not isinstance(precision, (int, float)) or not 0.0 <= precision <= 1.0:
    raise UserError(f"induced_dictionary option 'precision' must be a number in [0, 1], got {precision!r}.")
  if options.get("refresh_every", 0) or options.get("source") is not None:
    raise UserError("induced_dictionary method 'gold' reads the true token map and nothing else: drop its "
                    "'source' and 'refresh_every' options.")
  return transliterated_language(run), float(precision), _int_option(options, "seed", 0, 0)


@registry.register("induced_dictionary")
def _induced_dictionary(run: "RunSpec") -> Asset:
  options = run.options_of("induced_dictionary")
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise UserError(f"unknown induced_dictionary option(s) {unknown}; it takes {', '.join(map(repr, OPTIONS))}.")
  vocab_options = {**run.options_of("lang_vocab"),
                   **{k: v for k, v in options.items() if k in lang_vocab_lib.OPTIONS}}
  languages, min_count, split, pivot = lang_vocab_lib.settings_of(run, vocab_options)
  method = options.get("method", DEFAULT_METHOD)
  if method not in METHODS:
    raise UserError(f"induced_dictionary option 'method' must be one of {', '.join(map(repr, METHODS))}, "
                    f"got {method!r}.")
  gold, precision, seed = _gold_options(run, options, method)
  source = None if gold is not None else options.get("source", run.init_from_checkpoint)
  if source is not None and (not isinstance(source, str) or not source):
    raise UserError(f"induced_dictionary option 'source' must be a MODEL_DIR path, got {source!r}.")
  piece = lang_vocab_lib.piece_function(run)
  vocab = lang_vocab_lib.LangVocab(languages=languages, min_count=min_count, split=split, task=run.task,
                                   vocab_size=run.vocabulary.size, piece=piece, pivot=pivot)
  return InducedDictionary(vocab=vocab, source=source, method=method, knn=_int_option(options, "knn", DEFAULT_KNN, 1),
                           refresh_every=_int_option(options, "refresh_every", 0, 0),
                           vocab_size=run.vocabulary.size, piece=piece, gold=gold, precision=precision, seed=seed)
