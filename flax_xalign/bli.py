r"""Bilingual lexicon induction from a checkpoint (Lu, Lu & Zhang 2023, §2.2, Table 1, Fig. 3).

  python -m flax_xalign.bli --checkpoint=DIR --src=grc --tgt=en [--layer=0] [--method=csls|nn] \
      [--output=dict.tsv] [--gold=FILE|token_map] [--min_count=N] [--knn=10] \
      [--layers=all --rsim_plot=PATH] [--max_sentences=5000] [--task=NAME|bible] [--normalize=...] \
      [--isomorphism [--quadruples=2000] [--seed=0]]

Induces a token-level dictionary between the language-specific vocabularies
of --src and --tgt (tokens with count > --min_count in each language's train
text, shared ones removed; the MODEL_DIR's `lang_vocab.tsv` when it has one
and --min_count is not given) from the token-embedding table (--layer=0) or
from the contextual states of --layer averaged over the token's occurrences
in at most --max_sentences monolingual sentences per language. --output gets
`src<TAB>tgt<TAB>score` (SentencePiece pieces, '▁' = word start; best score
first). --gold scores it: a MUSE file (`src tgt` per line; the shipped
Greek->English one is flax_xalign/data/lexicons/grc-en.train.txt), words
normalised as the task normalises text and counted only when they are single
tokens of the language-specific vocabularies (the rest is reported as out of
coverage), or `token_map` for a synthetic run's gold natural <-> derived
ids. It prints Hit@1 / Hit@5 for NN and CSLS and the coverage; the LAST line is
a JSON object: `hit@1`, `hit@5` (of --method), `coverage`, `pairs` (the gold
queries scored), then `nn` / `csls` (both methods), `entries`, `covered`,
`out_of_coverage` and the settings. --layers=all (or a list, `0,4,8`) adds
Hit@1, the mean cosine and the RSIM of the translation pairs (the gold's, else
the layer-0 CSLS dictionary's) at each layer, on the tokens every layer has,
and --rsim_plot draws them (the paper's Fig. 3).

--isomorphism (with --gold; `evaluation/isomorphism.py`) adds Ai & Fang's
isomorphism measures at the embedding layer, over EVERY listed gold pair, not
only single-token ones: `muse_cosine` (Table 2: the mean cosine of the gold
pairs, a word = the mean of its pieces' embeddings; `shuffled_mean`, the mean
cosine of mismatched pairs, is the baseline to read it against; `coverage`
and `skipped` count pairs with an empty word or the unknown piece; with
--layers, `per_layer` gives both at each layer over the pairs every layer
has) and `analogy` (`accuracy`: top-1 of a_src - a_tgt + b_tgt -> b_src over
--quadruples seeded samples of two gold pairs; `mono_accuracy`: b_src - a_src
+ a_tgt -> b_tgt; `nn_accuracy`: b_tgt's nearest source word, the no-offset
floor). With --gold=token_map the pairs are the token map's within the
language-specific vocabularies.

The text comes from the run's task; an import records none: pass --task=NAME
(a registered task or mixture) or --task=bible (the embedded Greek-English
Bible under the checkpoint's vocabulary; for multilingual-e5 add
--normalize=nfd_strip_marks, as its Bible runs do).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from flax_xalign.errors import ArgumentParser, UserError, run_command

DEFAULT_MAX_SENTENCES = 5000
TOKEN_MAP_GOLD = "token_map"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data import normalize
  from flax_xalign.evaluation import bli, isomorphism

  parser = ArgumentParser(prog="python -m flax_xalign.bli", description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", "--model_dir", dest="checkpoint", required=True,
                      help="MODEL_DIR with a checkpoint")
  parser.add_argument("--src", required=True, help="source language code (one of the run's languages)")
  parser.add_argument("--tgt", required=True, help="target language code")
  parser.add_argument("--layer", type=int, default=0, help="0: token-embedding table; l > 0: contextual states")
  parser.add_argument("--method", choices=bli.METHODS, default="csls")
  parser.add_argument("--output", default=None, help="dictionary file: src<TAB>tgt<TAB>score per line")
  parser.add_argument("--gold", default=None, help=f"MUSE lexicon file, or '{TOKEN_MAP_GOLD}' (synthetic run)")
  parser.add_argument("--min_count", type=int, default=None,
                      help="language-specific tokens: count > N (default: MODEL_DIR/lang_vocab.tsv, else the "
                           "run's lang_vocab option, else 100)")
  parser.add_argument("--knn", type=int, default=bli.DEFAULT_KNN, help="K of CSLS")
  parser.add_argument("--layers", default=None, help="'all' or a comma list: per-layer Hit@1, cosine, RSIM")
  parser.add_argument("--rsim_plot", default=None, help="PNG of the per-layer curves (with --layers)")
  parser.add_argument("--max_sentences", type=int, default=DEFAULT_MAX_SENTENCES,
                      help="monolingual sentences per language read for layers > 0")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--task", default=None, help="task or mixture of the text (default: the run's); 'bible'")
  parser.add_argument("--normalize", choices=normalize.NORMALIZERS, default=None,
                      help="text normaliser of the gold words (default: the task's)")
  parser.add_argument("--split", default="train", help="split of the text (vocabularies and layers > 0)")
  parser.add_argument("--isomorphism", action="store_true",
                      help="with --gold: MUSE cosine (gold-pair cosine, multi-piece words averaged, vs shuffled "
                           "pairs) and translation analogies")
  parser.add_argument("--quadruples", type=int, default=isomorphism.DEFAULT_QUADRUPLES,
                      help="analogy quadruples sampled (with --isomorphism)")
  parser.add_argument("--seed", type=int, default=0, help="seed of the analogy sample")
  return parser.parse_args(argv)


def _resolve_task(args: argparse.Namespace, handle) -> tuple[str, str]:
  """(task or mixture name, its normaliser); registers the embedded Bible under the run's vocabulary for 'bible'."""
  from flax_xalign.evaluation import bli

  model_dir, run = handle.path, handle.spec
  handle.register_tasks()
  task = args.task or run.task
  if not task:
    raise UserError(f"{model_dir} records no task (an imported model?); pass --task=NAME (a registered task or "
                    "mixture with both languages' text) or --task=bible (the embedded Greek-English Bible).")
  if task == "bible":
    from flax_xalign.tasks.bible import BibleTasks

    path = handle.dir.file(run.vocabulary.file)
    if run.vocabulary.kind != "sentencepiece" or run.vocabulary.factor != 1 or not os.path.isfile(path):
      raise UserError(f"--task=bible needs a plain SentencePiece vocabulary in {path}; pass --task=NAME instead.")
    normalize = args.normalize or ""
    prefix = f"bli_bible_{run.vocabulary.sha256[:10]}_{normalize or 'raw'}"
    task = BibleTasks(prefix=prefix, vocabulary_path=path, normalize=normalize).register().names()["grc_en_mlm_tlm"]
    return task, normalize
  from flax_xalign import tasks

  tasks.get_provider(task)  # UserError (with close names) when unknown.
  return task, args.normalize if args.normalize is not None else bli.task_normalizer(task, args.src)


def _language_vocabularies(model_dir: str, run, src: str, tgt: str, min_count: int | None, split: str,
                           use_file: bool):
  """(ids [2, C], mask [2, C], where they came from), side 0 = src; MODEL_DIR's lang_vocab.tsv when `use_file`."""
  import numpy as np

  from flax_xalign.assets import lang_vocab
  from flax_xalign.run_dir import RunDir

  path = RunDir(model_dir).file(lang_vocab.FILENAME)
  if use_file and min_count is None and split == "train" and os.path.isfile(path):
    asset = lang_vocab.LangVocab(languages=(src, tgt), min_count=0, split=split)
    value = asset.load(model_dir)
    languages = asset.loaded_header["languages"].split()
    if sorted(languages) == sorted((src, tgt)):
      order = [languages.index(src), languages.index(tgt)]
      return (np.asarray(value["ids"])[order], np.asarray(value["mask"], bool)[order],
              f"{path} (min_count {asset.loaded_header.get('min_count')})")
  value = lang_vocab.lang_vocab_for(run, languages=(src, tgt), min_count=min_count, split=split)
  used = min_count if min_count is not None else run.options_of("lang_vocab").get(
      "min_count", lang_vocab.DEFAULT_MIN_COUNT)
  return np.asarray(value["ids"]), np.asarray(value["mask"], bool), f"{run.task}:{split}, count > {used}"


def _layers(args: argparse.Namespace, num_layers: int) -> list[int]:
  if args.layers is None:
    wanted = [args.layer]
  elif args.layers == "all":
    wanted = list(range(num_layers + 1))
  else:
    try:
      wanted = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
      raise UserError(f"--layers={args.layers!r}: pass 'all' or comma-separated layer numbers, e.g. 0,4,8.") from None
  bad = [layer for layer in wanted if not 0 <= layer <= num_layers]
  if bad:
    raise UserError(f"layer(s) {bad} outside 0..{num_layers} (0 = token embeddings, {num_layers} = last layer).")
  return sorted(set(wanted) | {args.layer})


def _representations(model, params, run, task: str, args, ids, mask, layers: list[int], log, extra_ids=None):
  """({layer: [C, e]} per side, mask [2, C] of rows every layer has, contextual piece tables per side).

  `extra_ids` (per side, int [n] token ids; e.g. the gold words' pieces) are averaged in the same encoder
  pass as the language-specific tokens; the third value is, per side, None without contextual layers or
  extra ids, else (sorted collected ids [U], {layer > 0: [U, e] means}, bool [U] seen in the text).
  """
  import numpy as np

  from flax_xalign.evaluation import bli

  table = np.asarray(bli.embedding_table(params, run.model), np.float32)
  reps = [{}, {}]
  pieces = [None, None]
  mask = mask.copy()
  contextual = [layer for layer in layers if layer > 0]
  specials = run.vocabulary.specials
  limit = min(run.task_feature_lengths.get("tokens", 512) if run.task_feature_lengths else 512,
              model.encoder.config.max_positions - model.encoder.config.position_offset)
  for side, code in enumerate((args.src, args.tgt)):
    if 0 in layers:
      reps[side][0] = table[ids[side]]
    if not contextual:
      continue
    start = time.perf_counter()
    sentences = bli.monolingual_sentences(task, code, split=args.split, max_sentences=args.max_sentences)
    length = min(limit, max(len(s) for s in sentences) + 2)
    rows = bli.sentence_rows(sentences, bos=specials.bos, eos=specials.eos, pad=specials.pad,
                             lang_id=run.language_id(code), length=length)
    extra = np.zeros(0, np.int64) if extra_ids is None else np.asarray(extra_ids[side], np.int64)
    collected = np.unique(np.concatenate([np.asarray(ids[side], np.int64), extra]))  # Distinct, as required.
    means, counts = bli.contextual_means(model.encoder, params, rows, vocab_ids=collected, layers=contextual,
                                         batch_size=args.batch_size, progress=log)
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


def _gold(args, handle, vocabulary, normalizer: str, ids, mask):
  from flax_xalign.data import lexicon, normalize
  from flax_xalign.evaluation import bli

  sides = {"src_ids": ids[0], "src_mask": mask[0], "tgt_ids": ids[1], "tgt_mask": mask[1]}
  if args.gold == TOKEN_MAP_GOLD:
    pairs = _token_map_pairs(handle, args.src, args.tgt)
    gold = bli.gold_from_token_pairs(pairs, **sides)
  else:
    if not os.path.isfile(args.gold):
      raise UserError(f"--gold {args.gold} does not exist; pass a MUSE file (source target per line) or "
                      f"'{TOKEN_MAP_GOLD}'.")
    gold = bli.gold_from_lexicon(lexicon.read_lexicon(args.gold), encode=lambda text: vocabulary.encode(text),
                                 normalize=lambda word: normalize.normalize_text(word, normalizer), **sides)
  if not gold.queries:
    reasons = ", ".join(f"{k} {v}" for k, v in gold.out_of_coverage.items() if v)
    raise UserError(f"no entry of --gold {args.gold} is in coverage ({gold.entries} entries: {reasons}; e.g. "
                    f"{dict(gold.examples)}): its words must be single tokens of the {args.src} / {args.tgt} "
                    "language-specific vocabularies. Check the languages, --normalize, or lower --min_count.")
  return gold


def _token_map_pairs(handle, src: str, tgt: str):
  """(natural, derived) id pairs of a synthetic run (a `runs.Run`), oriented src -> tgt."""
  import numpy as np

  model_dir, run = handle.path, handle.spec
  if "token_map" in run.assets:
    value = handle.assets(("token_map",))["token_map"]
  else:
    from flax_xalign.assets.synthetic import token_map_of
    from flax_xalign.tasks import synthetic

    language = synthetic.language_of(run.task)
    if language is None:
      raise UserError(f"--gold={TOKEN_MAP_GOLD} needs a synthetic-language run; {model_dir} trained on "
                      f"{run.task!r}. Pass a MUSE lexicon file instead.")
    value = token_map_of(language.id_map(), run.vocabulary.specials.first_regular)
  pairs = np.stack([np.asarray(value["queries"]), np.asarray(value["targets"])], axis=1)
  natural = "grc"
  if src == natural and tgt != natural:
    return pairs
  if tgt == natural and src != natural:
    return pairs[:, ::-1]
  raise UserError(f"--gold={TOKEN_MAP_GOLD} maps the natural language {natural!r} to its synthetic copy; pass it "
                  f"as --src or --tgt (got {src} -> {tgt}).")


def _piece_function(vocabulary, run):
  tokens = getattr(vocabulary, "tokens", None)
  if isinstance(tokens, tuple):  # WordPiece.
    return lambda i: tokens[int(i)]
  base = getattr(vocabulary, "base", vocabulary)
  return lambda i: base.tokenizer.id_to_piece(int(i) % run.vocabulary.pieces)


def _write_dictionary(path: str, top, ids, mask, piece) -> int:
  import numpy as np

  from flax_xalign.assets.lang_vocab import clean_piece
  from flax_xalign.fileio import write_atomically

  values, indices = np.asarray(top.values)[:, 0], np.asarray(top.indices)[:, 0]
  rows = [r for r in range(len(values)) if mask[0][r] and indices[r] >= 0]
  rows.sort(key=lambda r: (-values[r], int(ids[0][r])))
  write_atomically(path, "".join(f"{clean_piece(piece(ids[0][r]))}\t{clean_piece(piece(ids[1][indices[r]]))}\t"
                                 f"{values[r]:.6f}\n" for r in rows))
  return len(rows)


def run(args: argparse.Namespace) -> dict:
  """Runs the command on parsed `args`; returns the JSON object it prints last (for drivers and notebooks)."""
  from flax_xalign.evaluation import bli
  from flax_xalign.runs import Run

  def log(line: str) -> None:
    print(line, flush=True)

  if args.src == args.tgt:
    raise UserError(f"--src and --tgt are both {args.src!r}; name two languages.")
  if args.rsim_plot and args.layers is None:
    raise UserError("--rsim_plot draws the per-layer curves: add --layers=all (or a list such as 0,4,8).")
  if args.isomorphism and not args.gold:
    raise UserError("--isomorphism measures the gold pairs: add --gold=FILE (a MUSE lexicon) or "
                    f"--gold={TOKEN_MAP_GOLD} (a synthetic run).")
  for name in ("max_sentences", "batch_size", "knn", "quadruples"):
    if getattr(args, name) < 1:
      raise UserError(f"--{name}={getattr(args, name)} must be at least 1.")
  if not os.path.isdir(args.checkpoint):
    raise UserError(f"--checkpoint {args.checkpoint} is not a directory; pass a MODEL_DIR written by "
                    "python -m flax_xalign.train or an import.")
  handle = Run.open(args.checkpoint)
  model, params, run_spec, step = handle.model, handle.params(), handle.spec, handle.step
  missing = [code for code in (args.src, args.tgt) if code not in run_spec.languages]
  if missing:
    raise UserError(f"language(s) {missing} not in {args.checkpoint}'s run (languages "
                    f"{list(run_spec.languages)}); pick --src and --tgt from those.")
  layers = _layers(args, model.encoder.config.num_layers)
  task, normalizer = _resolve_task(args, handle)
  run_for_task = run_spec.replace(task=task)
  ids, mask, origin = _language_vocabularies(args.checkpoint, run_for_task, args.src, args.tgt, args.min_count,
                                             args.split, use_file=task == run_spec.task)
  log(f"language-specific vocabularies ({origin}): {args.src} {int(mask[0].sum()):,}, "
      f"{args.tgt} {int(mask[1].sum()):,} tokens; {args.checkpoint} step {step}, layers {layers}")
  vocabulary = handle.vocabulary()
  pair_pieces = None
  if args.isomorphism:
    pair_pieces = _pair_pieces(args, handle, vocabulary, normalizer, ids, mask)
  reps, mask, piece_tables = _representations(
      model, params, run_spec, task, args, ids, mask, layers, log,
      extra_ids=None if pair_pieces is None else [pair_pieces.piece_ids(side) for side in (0, 1)])
  src, tgt = reps[0][args.layer], reps[1][args.layer]
  start = time.perf_counter()
  top = bli.induce(src, tgt, method=args.method, k=1, knn=args.knn, src_mask=mask[0], tgt_mask=mask[1])
  log(f"induced {args.method} dictionary at layer {args.layer} in {time.perf_counter() - start:.1f} s")
  result = {"src": args.src, "tgt": args.tgt, "layer": args.layer, "method": args.method, "knn": args.knn,
            "vocab_sizes": [int(mask[0].sum()), int(mask[1].sum())]}
  if args.output:
    n = _write_dictionary(args.output, top, ids, mask, _piece_function(vocabulary, run_spec))
    log(f"wrote {args.output}: {n:,} entries (src<TAB>tgt<TAB>{args.method} score)")
    result["dictionary_entries"] = n
  gold = None
  if args.gold:
    gold = _gold(args, handle, vocabulary, normalizer, ids, mask)
    scores = bli.score(src, tgt, gold, src_mask=mask[0], tgt_mask=mask[1], knn=args.knn)
    ooc = ", ".join(f"{k} {v}" for k, v in gold.out_of_coverage.items() if v) or "none"
    log(f"gold {args.gold}: {gold.entries:,} source entries, {gold.covered:,} in coverage "
        f"({100 * gold.coverage:.1f}%), {gold.queries:,} queries, {gold.gold_pairs:,} gold pairs; "
        f"out of coverage: {ooc}")
    for method in bli.METHODS:
      log(f"layer {args.layer} {method:>4}: Hit@1 {100 * scores[method]['hit@1']:.2f}  "
          f"Hit@5 {100 * scores[method]['hit@5']:.2f}")
    result = {"hit@1": scores[args.method]["hit@1"], "hit@5": scores[args.method]["hit@5"],
              "coverage": gold.coverage, "pairs": gold.queries, **result, **scores,
              "entries": gold.entries, "covered": gold.covered, "gold_pairs": gold.gold_pairs,
              "out_of_coverage": dict(gold.out_of_coverage), "gold": args.gold, "normalize": normalizer}
  if args.layers is not None:
    result["per_layer"] = _per_layer(args, reps, mask, gold, log)
  if pair_pieces is not None:
    result.update(_isomorphism(args, pair_pieces, bli.embedding_table(params, run_spec.model), piece_tables, layers, log))
  print(json.dumps(result, ensure_ascii=False), flush=True)
  return result


def _pair_pieces(args, handle, vocabulary, normalizer: str, ids, mask):
  """The gold's translation pairs as piece ids (`isomorphism.PairPieces`); UserError when none is usable."""
  from flax_xalign.data import lexicon, normalize
  from flax_xalign.evaluation import isomorphism

  if args.gold == TOKEN_MAP_GOLD:
    pairs = _token_map_pairs(handle, args.src, args.tgt)
    pieces = isomorphism.pieces_from_token_pairs(pairs, src_ids=ids[0][mask[0]], tgt_ids=ids[1][mask[1]])
  else:
    pieces = isomorphism.pieces_from_lexicon(
        lexicon.read_lexicon(args.gold), encode=lambda text: vocabulary.encode(text),
        unknown_id=handle.spec.vocabulary.specials.unk,
        normalize=lambda word: normalize.normalize_text(word, normalizer))
  if pieces.pairs < 2:
    reasons = ", ".join(f"{k} {v}" for k, v in pieces.skipped.items() if v) or "none"
    raise UserError(f"--isomorphism needs at least 2 usable pairs of --gold {args.gold}; {pieces.pairs} of "
                    f"{pieces.given} are (skipped: {reasons}; e.g. {dict(pieces.examples)}). Check --src/--tgt "
                    "and --normalize.")
  return pieces


def _isomorphism(args, pieces, embedding_table, piece_tables, layers: list[int], log) -> dict:
  """{"muse_cosine": ..., "analogy": ...} of the gold pairs (module docstring, --isomorphism)."""
  import numpy as np

  from flax_xalign.evaluation import isomorphism

  table = np.asarray(embedding_table, np.float32)
  x, _ = isomorphism.word_vectors(table, pieces.src)
  y, _ = isomorphism.word_vectors(table, pieces.tgt)
  cos = isomorphism.pair_cosine(x, y, src_word=pieces.src_word, tgt_word=pieces.tgt_word)
  skipped = ", ".join(f"{k} {v}" for k, v in pieces.skipped.items() if v) or "none"
  log(f"MUSE cosine (layer 0, {pieces.pairs:,} of {pieces.given:,} gold pairs, {100 * pieces.coverage:.1f}%; "
      f"skipped: {skipped}; {pieces.identical} identical): gold pairs {cos.mean:.4f}, shuffled pairs "
      f"{cos.shuffled_mean:.4f}, gap {cos.mean - cos.shuffled_mean:+.4f}")
  muse = {"layer": 0, "mean": cos.mean, "shuffled_mean": cos.shuffled_mean, "gap": cos.mean - cos.shuffled_mean,
          "pairs": pieces.pairs, "given": pieces.given, "coverage": pieces.coverage, "skipped": dict(pieces.skipped),
          "skipped_examples": {k: list(v) for k, v in pieces.examples.items()}, "identical": pieces.identical}
  if piece_tables[0] is not None:
    muse["per_layer"] = _muse_per_layer(pieces, table, piece_tables, layers, log)
  quadruples = isomorphism.sample_quadruples(pieces.src_word, pieces.tgt_word, count=args.quadruples,
                                             seed=args.seed)
  analogy = {"layer": 0, "seed": args.seed,
             **isomorphism.translation_analogies(x, y, src_word=pieces.src_word, tgt_word=pieces.tgt_word,
                                                 quadruples=quadruples)}
  log(f"translation analogy (layer 0, {analogy['quadruples']:,} quadruples, seed {args.seed}; "
      f"{analogy['source_candidates']:,} / {analogy['target_candidates']:,} candidate words): "
      f"a_src-a_tgt+b_tgt->b_src {100 * analogy['accuracy']:.2f}% (cos {analogy['mean_cosine']:.4f}), "
      f"b_src-a_src+a_tgt->b_tgt {100 * analogy['mono_accuracy']:.2f}% (cos {analogy['mono_mean_cosine']:.4f}), "
      f"no-offset NN {100 * analogy['nn_accuracy']:.2f}%")
  return {"muse_cosine": muse, "analogy": analogy}


def _muse_per_layer(pieces, table, piece_tables, layers: list[int], log) -> dict:
  """Gold / shuffled pair cosine at every layer, over the pairs whose pieces all occur in the text read."""
  import numpy as np

  from flax_xalign.evaluation import isomorphism

  vectors: dict[int, list] = {}
  valid = np.ones(pieces.pairs, bool)
  for layer in layers:
    sides = []
    for side, word_pieces in enumerate((pieces.src, pieces.tgt)):
      if layer == 0:
        vec, ok = isomorphism.word_vectors(table, word_pieces)
      else:
        collected, means, seen = piece_tables[side]
        rows = np.where(word_pieces >= 0, np.searchsorted(collected, np.maximum(word_pieces, 0)), -1)
        vec, ok = isomorphism.word_vectors(means[layer], rows, row_valid=seen)
      sides.append(vec)
      valid &= ok
    vectors[layer] = sides
  out: dict[str, list] = {"layers": list(layers), "mean": [], "shuffled_mean": []}
  for layer in layers:
    cos = isomorphism.pair_cosine(*vectors[layer], src_word=pieces.src_word, tgt_word=pieces.tgt_word, mask=valid)
    out["mean"].append(cos.mean)
    out["shuffled_mean"].append(cos.shuffled_mean)
  out["pairs"] = int(valid.sum())
  log(f"MUSE cosine per layer ({out['pairs']:,} gold pairs whose pieces all occur in the text read):")
  log("| layer | gold pairs | shuffled pairs |")
  for layer, mean, shuffled in zip(out["layers"], out["mean"], out["shuffled_mean"]):
    log(f"| {layer} | {mean:.4f} | {shuffled:.4f} |")
  return out


def _per_layer(args, reps, mask, gold, log) -> dict:
  import numpy as np

  from flax_xalign.evaluation import bli, rsim

  if gold is not None:
    pairs, what = gold.first_pairs(), "gold pairs (first translation)"
  else:
    top = bli.induce(reps[0][0] if 0 in reps[0] else reps[0][args.layer],
                     reps[1][0] if 0 in reps[1] else reps[1][args.layer], method="csls", k=1, knn=args.knn,
                     src_mask=mask[0], tgt_mask=mask[1])
    rows = np.flatnonzero(mask[0] & (np.asarray(top.indices)[:, 0] >= 0))
    pairs, what = (rows, np.asarray(top.indices)[rows, 0]), "CSLS dictionary pairs"
  curves = bli.layer_curves(reps[0], reps[1], pairs=pairs, src_mask=mask[0], tgt_mask=mask[1], gold=gold,
                            knn=args.knn)
  log(f"per layer, {len(pairs[0]):,} {what}:")
  log("| layer | " + " | ".join(k for k in curves if k != "layers") + " |")
  for i, layer in enumerate(curves["layers"]):
    log(f"| {layer} | " + " | ".join(f"{curves[k][i]:.4f}" for k in curves if k != "layers") + " |")
  if args.rsim_plot:
    rsim.plot_layers(curves, args.rsim_plot, title=f"{args.src}-{args.tgt}: {what}")
    log(f"wrote {args.rsim_plot}")
  return curves


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else list(argv))
  from flax_xalign import gin_cli

  gin_cli.quiet_known_noise()
  return run_command(lambda: run(args))


if __name__ == "__main__":
  sys.exit(main())
