"""Bilingual lexicon induction of a finished run, end to end: `evaluate_lexicon(run, LexiconOptions(...))`.

What `xalign bli` and the `bli` / `rsim` / `isomorphism`
evaluators compute (the command's docstring describes it for users; the
pieces are `bli.py`, `isomorphism.py` and `rsim.py` beside it):

1. the language-specific vocabularies of `src` and `tgt` (the run's
   `lang_vocab.tsv` when it has one and `min_count` is not given, else
   counted over the task's text);
2. their representations at every layer asked for (0: the token-embedding
   table; l > 0: contextual states averaged over at most `max_sentences`
   monolingual sentences per language);
3. the induced dictionary at `layer` (`method` csls or nn), optionally
   written to `output`; Hit@1/5 of both methods against `gold` (a MUSE file
   or 'token_map'); with `layers`, Hit@1, mean cosine and RSIM per layer
   (`rsim_plot` draws them); with `isomorphism`, Ai & Fang's MUSE cosine
   and translation analogies over every gold pair.

The options keep the command's flag names (a bad value is reported as the
flag, e.g. `--knn=0 must be at least 1.`), so the command, the evaluators and
the experiment drivers share one spelling.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.evaluation.lexicon import bli
from flax_xalign.evaluation.lexicon import rsim
from flax_xalign.evaluation.lexicon import isomorphism as iso  # (`isomorphism` is also an option's name)

DEFAULT_MAX_SENTENCES = 5000
TOKEN_MAP_GOLD = "token_map"

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class LexiconOptions:
  """The settings of one lexicon evaluation (the `bli` command's flags by name; see the module docstring).

  `layers` is None (only `layer`), 'all', or a comma list such as '0,4,8'.
  """

  src: str
  tgt: str
  layer: int = 0
  method: str = "csls"
  output: str | None = None
  gold: str | None = None
  min_count: int | None = None
  knn: int = bli.DEFAULT_KNN
  layers: str | None = None
  rsim_plot: str | None = None
  max_sentences: int = DEFAULT_MAX_SENTENCES
  batch_size: int = 32
  task: str | None = None
  normalize: str | None = None
  split: str = "train"
  isomorphism: bool = False
  quadruples: int = iso.DEFAULT_QUADRUPLES
  seed: int = 0

  def check(self) -> "LexiconOptions":
    """Itself, or a UserError for a combination that cannot run (before anything is read)."""
    if self.src == self.tgt:
      raise UserError(f"--src and --tgt are both {self.src!r}; name two languages.")
    if self.method not in bli.METHODS:
      raise UserError(f"--method={self.method!r}: choose from {', '.join(bli.METHODS)}.")
    if self.rsim_plot and self.layers is None:
      raise UserError("--rsim_plot draws the per-layer curves: add --layers=all (or a list such as 0,4,8).")
    if self.isomorphism and not self.gold:
      raise UserError("--isomorphism measures the gold pairs: add --gold=FILE (a MUSE lexicon) or "
                      f"--gold={TOKEN_MAP_GOLD} (a synthetic run).")
    for name in ("max_sentences", "batch_size", "knn", "quadruples"):
      if getattr(self, name) < 1:
        raise UserError(f"--{name}={getattr(self, name)} must be at least 1.")
    return self


def evaluate_lexicon(run, options: LexiconOptions, *, log: Log = print, text=None) -> dict:
  """The results of `options` on `run` (a `runs.Run`): the JSON object `xalign bli` prints last.

  `text` is where the words and sentences come from: by default (None) the task registry and the run's
  vocabulary (`TaskText`); an object with the same members (`normalizer`, `language_vocabularies`, `sentences`,
  `encode`, and `vocabulary` for `output`) feeds the same scoring from files (`evaluation.offline.suite_files`),
  without seqio.
  """
  opts = options.check()
  model, params, spec, step = run.model, run.params(), run.spec, run.step
  missing = [code for code in (opts.src, opts.tgt) if code not in spec.languages]
  if missing:
    raise UserError(f"language(s) {missing} not in {run.path}'s run (languages "
                    f"{list(spec.languages)}); pick --src and --tgt from those.")
  layers = _layers(opts, model.encoder.config.num_layers)
  text = text if text is not None else TaskText(run, opts)
  normalizer = text.normalizer
  ids, mask, origin = text.language_vocabularies(opts)
  log(f"language-specific vocabularies ({origin}): {opts.src} {int(mask[0].sum()):,}, "
      f"{opts.tgt} {int(mask[1].sum()):,} tokens; {run.path} step {step}, layers {layers}")
  pair_pieces = _pair_pieces(opts, run, text.encode, normalizer, ids, mask) if opts.isomorphism else None
  reps, mask, piece_tables = _representations(
      model, params, spec, text.sentences, opts, ids, mask, layers, log,
      extra_ids=None if pair_pieces is None else [pair_pieces.piece_ids(side) for side in (0, 1)])
  src, tgt = reps[0][opts.layer], reps[1][opts.layer]
  start = time.perf_counter()
  top = bli.induce(src, tgt, method=opts.method, k=1, knn=opts.knn, src_mask=mask[0], tgt_mask=mask[1])
  log(f"induced {opts.method} dictionary at layer {opts.layer} in {time.perf_counter() - start:.1f} s")
  result = {"src": opts.src, "tgt": opts.tgt, "layer": opts.layer, "method": opts.method, "knn": opts.knn,
            "vocab_sizes": [int(mask[0].sum()), int(mask[1].sum())]}
  if opts.output:
    n = _write_dictionary(opts.output, top, ids, mask, _piece_function(text.vocabulary(), spec))
    log(f"wrote {opts.output}: {n:,} entries (src<TAB>tgt<TAB>{opts.method} score)")
    result["dictionary_entries"] = n
  gold = None
  if opts.gold:
    gold = _gold(opts, run, text.encode, normalizer, ids, mask)
    scores = bli.score(src, tgt, gold, src_mask=mask[0], tgt_mask=mask[1], knn=opts.knn)
    ooc = ", ".join(f"{k} {v}" for k, v in gold.out_of_coverage.items() if v) or "none"
    log(f"gold {opts.gold}: {gold.entries:,} source entries, {gold.covered:,} in coverage "
        f"({100 * gold.coverage:.1f}%), {gold.queries:,} queries, {gold.gold_pairs:,} gold pairs; "
        f"out of coverage: {ooc}")
    for method in bli.METHODS:
      log(f"layer {opts.layer} {method:>4}: Hit@1 {100 * scores[method]['hit@1']:.2f}  "
          f"Hit@5 {100 * scores[method]['hit@5']:.2f}")
    result = {"hit@1": scores[opts.method]["hit@1"], "hit@5": scores[opts.method]["hit@5"],
              "coverage": gold.coverage, "pairs": gold.queries, **result, **scores,
              "entries": gold.entries, "covered": gold.covered, "gold_pairs": gold.gold_pairs,
              "out_of_coverage": dict(gold.out_of_coverage), "gold": opts.gold, "normalize": normalizer}
  if opts.layers is not None:
    result["per_layer"] = _per_layer(opts, reps, mask, gold, log)
  if pair_pieces is not None:
    result.update(_isomorphism(opts, pair_pieces, bli.embedding_table(params, spec.model), piece_tables, layers,
                               log))
  return result


def _resolve_task(opts: LexiconOptions, run) -> tuple[str, str]:
  """(task or mixture name, its normaliser); registers the embedded Bible under the run's vocabulary for 'bible'."""
  spec = run.spec
  run.register_tasks()
  task = opts.task or spec.task
  if not task:
    raise UserError(f"{run.path} records no task (an imported model?); pass --task=NAME (a registered task or "
                    "mixture with both languages' text) or --task=bible (the embedded Greek-English Bible).")
  if task == "bible":
    from flax_xalign.tasks.bible import BibleTasks  # Registering tasks imports seqio: only when asked.

    path = run.dir.file(spec.vocabulary.file)
    if spec.vocabulary.kind != "sentencepiece" or spec.vocabulary.factor != 1 or not storage.isfile(path):
      raise UserError(f"--task=bible needs a plain SentencePiece vocabulary in {path}; pass --task=NAME instead.")
    path = storage.local_copy(path)  # (seqio reads a task's vocabulary through TensorFlow's gfile, not our layer)
    normalize = opts.normalize or ""
    prefix = f"bli_bible_{spec.vocabulary.sha256[:10]}_{normalize or 'raw'}"
    task = BibleTasks(prefix=prefix, vocabulary_path=path, normalize=normalize).register().names()["grc_en_mlm_tlm"]
    return task, normalize
  from flax_xalign import tasks

  tasks.get_provider(task)  # UserError (with close names) when unknown.
  return task, opts.normalize if opts.normalize is not None else bli.task_normalizer(task, opts.src)


class TaskText:
  """The words and sentences of a lexicon evaluation from the task registry (seqio) and the run's vocabulary."""

  def __init__(self, run, opts: LexiconOptions):
    self.run = run
    self.task, self.normalizer = _resolve_task(opts, run)
    self._vocabulary = None

  def vocabulary(self):
    if self._vocabulary is None:
      self._vocabulary = self.run.vocabulary()
    return self._vocabulary

  def encode(self, text: str):
    """Piece ids of a (normalised) word or phrase."""
    return self.vocabulary().encode(text)

  def language_vocabularies(self, opts: LexiconOptions):
    """(ids [2, C], mask [2, C], where they came from) of opts.src and opts.tgt (`_language_vocabularies`)."""
    spec = self.run.spec
    return _language_vocabularies(self.run.path, spec.replace(task=self.task), opts,
                                  use_file=self.task == spec.task)

  def sentences(self, code: str, opts: LexiconOptions):
    """Token ids (no specials) of at most opts.max_sentences monolingual `code` sentences of opts.split."""
    return bli.monolingual_sentences(self.task, code, split=opts.split, max_sentences=opts.max_sentences)


def _language_vocabularies(model_dir: str, spec, opts: LexiconOptions, *, use_file: bool):
  """(ids [2, C], mask [2, C], where they came from), side 0 = src; MODEL_DIR's lang_vocab.tsv when `use_file`."""
  from flax_xalign.assets import lang_vocab
  from flax_xalign.run_dir import RunDir

  src, tgt, min_count, split = opts.src, opts.tgt, opts.min_count, opts.split
  path = RunDir(model_dir).file(lang_vocab.FILENAME)
  if use_file and min_count is None and split == "train" and storage.isfile(path):
    asset = lang_vocab.LangVocab(languages=(src, tgt), min_count=0, split=split)
    value = asset.load(model_dir)
    sides = [lang_vocab.side_language(x) for x in lang_vocab.sides_of_header(path, asset.loaded_header)]
    for first in range(0, len(sides), 2):  # the file's pair of src and tgt (one per partner with a pivot)
      pair = sides[first:first + 2]
      if sorted(pair) == sorted((src, tgt)):
        order = [first + pair.index(src), first + pair.index(tgt)]
        return (np.asarray(value["ids"])[order], np.asarray(value["mask"], bool)[order],
                f"{path} (min_count {asset.loaded_header.get('min_count')})")
  value = lang_vocab.lang_vocab_for(spec, languages=(src, tgt), min_count=min_count, split=split)
  used = min_count if min_count is not None else spec.options_of("lang_vocab").get(
      "min_count", lang_vocab.DEFAULT_MIN_COUNT)
  return np.asarray(value["ids"]), np.asarray(value["mask"], bool), f"{spec.task}:{split}, count > {used}"


def _layers(opts: LexiconOptions, num_layers: int) -> list[int]:
  if opts.layers is None:
    wanted = [opts.layer]
  elif opts.layers == "all":
    wanted = list(range(num_layers + 1))
  else:
    try:
      wanted = [int(x) for x in opts.layers.split(",") if x.strip()]
    except ValueError:
      raise UserError(f"--layers={opts.layers!r}: pass 'all' or comma-separated layer numbers, e.g. 0,4,8.") from None
  bad = [layer for layer in wanted if not 0 <= layer <= num_layers]
  if bad:
    raise UserError(f"layer(s) {bad} outside 0..{num_layers} (0 = token embeddings, {num_layers} = last layer).")
  return sorted(set(wanted) | {opts.layer})


def _representations(model, params, spec, sentences_of: Callable, opts: LexiconOptions, ids, mask, layers: list[int],
                     log: Log, extra_ids=None):
  """({layer: [C, e]} per side, mask [2, C] of rows every layer has, contextual piece tables per side).

  `extra_ids` (per side, int [n] token ids; e.g. the gold words' pieces) are averaged in the same encoder
  pass as the language-specific tokens; the third value is, per side, None without contextual layers or
  extra ids, else (sorted collected ids [U], {layer > 0: [U, e] means}, bool [U] seen in the text).
  """
  table = np.asarray(bli.embedding_table(params, spec.model), np.float32)
  reps = [{}, {}]
  pieces = [None, None]
  mask = mask.copy()
  contextual = [layer for layer in layers if layer > 0]
  specials = spec.vocabulary.specials
  limit = min(spec.task_feature_lengths.get("tokens", 512) if spec.task_feature_lengths else 512,
              model.encoder.config.max_positions - model.encoder.config.position_offset)
  for side, code in enumerate((opts.src, opts.tgt)):
    if 0 in layers:
      reps[side][0] = table[ids[side]]
    if not contextual:
      continue
    start = time.perf_counter()
    sentences = sentences_of(code, opts)
    length = min(limit, max(len(s) for s in sentences) + 2)
    rows = bli.sentence_rows(sentences, bos=specials.bos, eos=specials.eos, pad=specials.pad,
                             lang_id=spec.language_id(code), length=length)
    extra = np.zeros(0, np.int64) if extra_ids is None else np.asarray(extra_ids[side], np.int64)
    collected = np.unique(np.concatenate([np.asarray(ids[side], np.int64), extra]))  # Distinct, as required.
    means, counts = bli.contextual_means(model.encoder, params, rows, vocab_ids=collected, layers=contextual,
                                         batch_size=opts.batch_size, progress=log)
    at = np.searchsorted(collected, np.asarray(ids[side], np.int64))
    for i, layer in enumerate(contextual):
      reps[side][layer] = means[i][at]
    if extra_ids is not None:
      pieces[side] = (collected, {layer: means[i] for i, layer in enumerate(contextual)}, counts > 0)
    unseen = int((mask[side] & (counts[at] == 0)).sum())
    mask[side] &= counts[at] > 0
    log(f"{code}: layers {contextual[0]}..{contextual[-1]} averaged over {len(sentences):,} sentences "
        f"({time.perf_counter() - start:.1f} s); {unseen} language-specific tokens never occur there (left out)")
  return reps, mask, pieces


def _read_gold_lexicon(opts: LexiconOptions):
  from flax_xalign.data.sources import lexicon

  if not storage.isfile(opts.gold):
    raise UserError(f"--gold {opts.gold} does not exist; pass a MUSE file (source target per line) or "
                    f"'{TOKEN_MAP_GOLD}'.")
  return lexicon.read_lexicon(opts.gold)


def _gold(opts: LexiconOptions, run, encode: Callable, normalizer: str, ids, mask) -> bli.Gold:
  from flax_xalign.data.vocab import normalize

  sides = {"src_ids": ids[0], "src_mask": mask[0], "tgt_ids": ids[1], "tgt_mask": mask[1]}
  if opts.gold == TOKEN_MAP_GOLD:
    gold = bli.gold_from_token_pairs(_token_map_pairs(run, opts.src, opts.tgt), **sides)
  else:
    gold = bli.gold_from_lexicon(_read_gold_lexicon(opts), encode=encode,
                                 normalize=lambda word: normalize.normalize_text(word, normalizer), **sides)
  if not gold.queries:
    reasons = ", ".join(f"{k} {v}" for k, v in gold.out_of_coverage.items() if v)
    raise UserError(f"no entry of --gold {opts.gold} is in coverage ({gold.entries} entries: {reasons}; e.g. "
                    f"{dict(gold.examples)}): its words must be single tokens of the {opts.src} / {opts.tgt} "
                    "language-specific vocabularies. Check the languages, --normalize, or lower --min_count.")
  return gold


def _token_map_pairs(run, src: str, tgt: str) -> np.ndarray:
  """(natural, derived) id pairs of a synthetic run (a `runs.Run`), oriented src -> tgt."""
  spec = run.spec
  if "token_map" in spec.assets:
    value = run.assets(("token_map",))["token_map"]
  else:
    from flax_xalign.assets.token_map import token_map_of
    from flax_xalign.tasks import synthetic

    language = synthetic.language_of(spec.task)
    if language is None:
      raise UserError(f"--gold={TOKEN_MAP_GOLD} needs a synthetic-language run; {run.path} trained on "
                      f"{spec.task!r}. Pass a MUSE lexicon file instead.")
    value = token_map_of(language.id_map(), spec.vocabulary.specials.first_regular)
  pairs = np.stack([np.asarray(value["queries"]), np.asarray(value["targets"])], axis=1)
  natural = "grc"
  if src == natural and tgt != natural:
    return pairs
  if tgt == natural and src != natural:
    return pairs[:, ::-1]
  raise UserError(f"--gold={TOKEN_MAP_GOLD} maps the natural language {natural!r} to its synthetic copy; pass it "
                  f"as --src or --tgt (got {src} -> {tgt}).")


def _piece_function(vocabulary, spec) -> Callable[[int], str]:
  tokens = getattr(vocabulary, "tokens", None)
  if isinstance(tokens, tuple):  # WordPiece.
    return lambda i: tokens[int(i)]
  base = getattr(vocabulary, "base", vocabulary)
  return lambda i: base.tokenizer.id_to_piece(int(i) % spec.vocabulary.pieces)


def _write_dictionary(path: str, top, ids, mask, piece) -> int:
  from flax_xalign.assets.lang_vocab import clean_piece
  from flax_xalign.fileio import write_atomically

  values, indices = np.asarray(top.values)[:, 0], np.asarray(top.indices)[:, 0]
  rows = [r for r in range(len(values)) if mask[0][r] and indices[r] >= 0]
  rows.sort(key=lambda r: (-values[r], int(ids[0][r])))
  write_atomically(path, "".join(f"{clean_piece(piece(ids[0][r]))}\t{clean_piece(piece(ids[1][indices[r]]))}\t"
                                 f"{values[r]:.6f}\n" for r in rows))
  return len(rows)


def _pair_pieces(opts: LexiconOptions, run, encode: Callable, normalizer: str, ids, mask) -> iso.PairPieces:
  """The gold's translation pairs as piece ids; UserError when fewer than two are usable."""
  from flax_xalign.data.vocab import normalize

  if opts.gold == TOKEN_MAP_GOLD:
    pairs = _token_map_pairs(run, opts.src, opts.tgt)
    pieces = iso.pieces_from_token_pairs(pairs, src_ids=ids[0][mask[0]], tgt_ids=ids[1][mask[1]])
  else:
    from flax_xalign.data.sources import lexicon

    pieces = iso.pieces_from_lexicon(
        lexicon.read_lexicon(opts.gold), encode=encode,
        unknown_id=run.spec.vocabulary.specials.unk,
        normalize=lambda word: normalize.normalize_text(word, normalizer))
  if pieces.pairs < 2:
    reasons = ", ".join(f"{k} {v}" for k, v in pieces.skipped.items() if v) or "none"
    raise UserError(f"--isomorphism needs at least 2 usable pairs of --gold {opts.gold}; {pieces.pairs} of "
                    f"{pieces.given} are (skipped: {reasons}; e.g. {dict(pieces.examples)}). Check --src/--tgt "
                    "and --normalize.")
  return pieces


def _isomorphism(opts: LexiconOptions, pieces, embedding_table, piece_tables, layers: list[int], log: Log) -> dict:
  """{"muse_cosine": ..., "analogy": ...} of the gold pairs (the `isomorphism` option)."""
  table = np.asarray(embedding_table, np.float32)
  x, _ = iso.word_vectors(table, pieces.src)
  y, _ = iso.word_vectors(table, pieces.tgt)
  cos = iso.pair_cosine(x, y, src_word=pieces.src_word, tgt_word=pieces.tgt_word)
  skipped = ", ".join(f"{k} {v}" for k, v in pieces.skipped.items() if v) or "none"
  log(f"MUSE cosine (layer 0, {pieces.pairs:,} of {pieces.given:,} gold pairs, {100 * pieces.coverage:.1f}%; "
      f"skipped: {skipped}; {pieces.identical} identical): gold pairs {cos.mean:.4f}, shuffled pairs "
      f"{cos.shuffled_mean:.4f}, gap {cos.mean - cos.shuffled_mean:+.4f}")
  muse = {"layer": 0, "mean": cos.mean, "shuffled_mean": cos.shuffled_mean, "gap": cos.mean - cos.shuffled_mean,
          "pairs": pieces.pairs, "given": pieces.given, "coverage": pieces.coverage, "skipped": dict(pieces.skipped),
          "skipped_examples": {k: list(v) for k, v in pieces.examples.items()}, "identical": pieces.identical}
  if piece_tables[0] is not None:
    muse["per_layer"] = _muse_per_layer(pieces, table, piece_tables, layers, log)
  quadruples = iso.sample_quadruples(pieces.src_word, pieces.tgt_word, count=opts.quadruples,
                                             seed=opts.seed)
  analogy = {"layer": 0, "seed": opts.seed,
             **iso.translation_analogies(x, y, src_word=pieces.src_word, tgt_word=pieces.tgt_word,
                                                 quadruples=quadruples)}
  log(f"translation analogy (layer 0, {analogy['quadruples']:,} quadruples, seed {opts.seed}; "
      f"{analogy['source_candidates']:,} / {analogy['target_candidates']:,} candidate words): "
      f"a_src-a_tgt+b_tgt->b_src {100 * analogy['accuracy']:.2f}% (cos {analogy['mean_cosine']:.4f}), "
      f"b_src-a_src+a_tgt->b_tgt {100 * analogy['mono_accuracy']:.2f}% (cos {analogy['mono_mean_cosine']:.4f}), "
      f"no-offset NN {100 * analogy['nn_accuracy']:.2f}%")
  return {"muse_cosine": muse, "analogy": analogy}


def _muse_per_layer(pieces, table, piece_tables, layers: list[int], log: Log) -> dict:
  """Gold / shuffled pair cosine at every layer, over the pairs whose pieces all occur in the text read."""
  vectors: dict[int, list] = {}
  valid = np.ones(pieces.pairs, bool)
  for layer in layers:
    sides = []
    for side, word_pieces in enumerate((pieces.src, pieces.tgt)):
      if layer == 0:
        vec, ok = iso.word_vectors(table, word_pieces)
      else:
        collected, means, seen = piece_tables[side]
        rows = np.where(word_pieces >= 0, np.searchsorted(collected, np.maximum(word_pieces, 0)), -1)
        vec, ok = iso.word_vectors(means[layer], rows, row_valid=seen)
      sides.append(vec)
      valid &= ok
    vectors[layer] = sides
  out: dict[str, list] = {"layers": list(layers), "mean": [], "shuffled_mean": []}
  for layer in layers:
    cos = iso.pair_cosine(*vectors[layer], src_word=pieces.src_word, tgt_word=pieces.tgt_word, mask=valid)
    out["mean"].append(cos.mean)
    out["shuffled_mean"].append(cos.shuffled_mean)
  out["pairs"] = int(valid.sum())
  log(f"MUSE cosine per layer ({out['pairs']:,} gold pairs whose pieces all occur in the text read):")
  log("| layer | gold pairs | shuffled pairs |")
  for layer, mean, shuffled in zip(out["layers"], out["mean"], out["shuffled_mean"]):
    log(f"| {layer} | {mean:.4f} | {shuffled:.4f} |")
  return out


def _per_layer(opts: LexiconOptions, reps, mask, gold, log: Log) -> dict:
  if gold is not None:
    pairs, what = gold.first_pairs(), "gold pairs (first translation)"
  else:
    top = bli.induce(reps[0][0] if 0 in reps[0] else reps[0][opts.layer],
                     reps[1][0] if 0 in reps[1] else reps[1][opts.layer], method="csls", k=1, knn=opts.knn,
                     src_mask=mask[0], tgt_mask=mask[1])
    rows = np.flatnonzero(mask[0] & (np.asarray(top.indices)[:, 0] >= 0))
    pairs, what = (rows, np.asarray(top.indices)[rows, 0]), "CSLS dictionary pairs"
  curves = bli.layer_curves(reps[0], reps[1], pairs=pairs, src_mask=mask[0], tgt_mask=mask[1], gold=gold,
                            knn=opts.knn)
  log(f"per layer, {len(pairs[0]):,} {what}:")
  log("| layer | " + " | ".join(k for k in curves if k != "layers") + " |")
  for i, layer in enumerate(curves["layers"]):
    log(f"| {layer} | " + " | ".join(f"{curves[k][i]:.4f}" for k in curves if k != "layers") + " |")
  if opts.rsim_plot:
    rsim.plot_layers(curves, opts.rsim_plot, title=f"{opts.src}-{opts.tgt}: {what}")
    log(f"wrote {opts.rsim_plot}")
  return curves
