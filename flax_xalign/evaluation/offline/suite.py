"""Writes an offline evaluation suite: the data of every evaluation, read through seqio HERE, as plain files.

    from flax_xalign.evaluation.offline.suite import SuiteSizes, write_suite
    write_suite("bundle/suite", Run.open("runs/e5_debian"), debian_data="runs/debian_data")

reads what the CPU drivers read (`experiments/e5_debian.py`: the `xalign debian_data` build's help
text through DebianTasks, its BLI gold and held-out help bitext; the embedded Bible's gold alignments),
tokenised with `run`'s vocabulary, and writes a folder a host without TensorFlow/seqio scores a run from
(`scoring.score`). The files (paths relative to the suite, named in suite.json):

    suite.json                         the layout below, the sizes, the vocabulary's sha256, each file's bytes
    tokens.json                        {"lexicon" | "sentences" | "words": {text: [ids]}}: every text a scorer
                                       tokenises, as the run's vocabulary tokenised it (`suite_files.TABLES`)
    bli/<lang>-<pivot>.vocab.npz       ids, mask [2, C]: the language-specific vocabularies (count > min_count)
    bli/<lang>-<pivot>.<split>.txt     the MUSE gold of each split (dev, test; or the provisional inversion)
    sentences/<lang>.npz               monolingual sentences as ragged token ids (`suite_files.save_ragged`)
    retrieval/<pivot>-<lang>.tsv       the held-out help paragraph pairs scored (pivot<TAB>lang)
    mlm.npz                            held-out MLM feature rows [batches, batch, length] per feature, top_token
    bible/<src>_<tgt>.<split>.tsv      the Bible verses (words), validation and test
    bible/<src>_<tgt>.<split>.pharaoh  their gold links; bible/NOTICE the corpus's licence
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from flax_xalign.errors import UserError
from flax_xalign.evaluation.offline import suite_files as sf

PIVOT = "en"
DEBIAN_PREFIX = "e5_debian_help"  # The e5 Debian runs' task prefix (gin_configs/experiments/code_switch/e5_debian.gin).
DEBIAN_FEATURE_LENGTHS = {"tokens": 64}  # TASK_FEATURE_LENGTHS of the same gin file.
BLI_SPLITS = ("dev", "test")
BIBLE_SPLITS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class SuiteSizes:
  """How much of each source a suite keeps (the defaults are the CPU drivers').

  eval_sentences: monolingual sentences per language for BLI/RSIM's contextual layers.
  retrieval_pairs: held-out help paragraph pairs per language.
  mlm_batches, mlm_batch_size: held-out MLM rows kept (batches of batch_size rows).
  baseline_batches: training batches the MLM unigram baseline counts over.
  bible_pairs: Bible verses per split (None: every verse of validation and test).
  """

  eval_sentences: int = 200
  retrieval_pairs: int = 100
  mlm_batches: int = 8
  mlm_batch_size: int = 32
  baseline_batches: int = 100
  bible_pairs: int | None = None

  def check(self) -> "SuiteSizes":
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if value is not None and value < 1:
        raise UserError(f"SuiteSizes.{field.name}={value} must be at least 1.")
    return self


def write_suite(output_dir: str, run: Any, *, debian_data: str | None = None, task: str | None = None,
                languages: Sequence[str] | None = None, pivot: str = PIVOT, gold: str | dict | None = None,
                retrieval: str | None = None, min_count: int = 5, mlm_split: str = "validation",
                mlm_feature_lengths: dict[str, int] | None = None,
                bible_languages: tuple[str, str] = ("grc", "en"), sizes: SuiteSizes = SuiteSizes(),
                progress: Callable[[str], None] = print) -> dict[str, Any]:
  """Writes the suite of `run`'s vocabulary into `output_dir` (new or empty); returns its suite.json.

  Args:
    output_dir: the suite folder.
    run: a `runs.Run` whose vocabulary, languages and feature lengths the suite is tokenised for (the
      starting model of the runs to score, e.g. the help-trimmed e5-small import).
    debian_data: an `xalign debian_data` output: registers its help tasks under `run`'s vocabulary
      (DebianTasks, prefix e5_debian_help, as the e5 Debian driver) and gives the defaults of `task`
      (their mixture), `languages` (every built help language), `gold` (DIR/bli/{lang}-en.{split}.txt,
      else the inverted DIR/dict/en-{lang}.tsv) and `retrieval` (DIR/help_bitext/en-{lang}.test.tsv).
    task: a registered task or mixture with the monolingual text of every language (BLI's vocabularies
      and sentences, the MLM rows).
    languages: the languages paired with `pivot` (BLI lang -> pivot, retrieval pivot-lang).
    gold: BLI gold, a template with {lang} and {split} (dev, test), or {(lang, split): (path, kind)}; a missing
      file leaves that split out.
    retrieval: held-out pairs, a template with {lang} of pivot<TAB>lang lines.
    min_count: language-specific vocabularies keep tokens counted more than this.
    mlm_split: the held-out split of `task` whose rows the MLM accuracy scores.
    mlm_feature_lengths: the rows' feature lengths (default the run's; with debian_data and a run that
      records none, the e5 Debian runs' {"tokens": 64}).
    bible_languages: the language codes the aligner gives the Bible's two sides.
    sizes: how much of each source to keep (`SuiteSizes`).
    progress: receives one line per step.
  """
  from flax_xalign.fileio import check_output_folder, makedirs, write_atomically

  sizes = sizes.check()
  output_dir = check_output_folder(output_dir, setting="write_suite output_dir")
  makedirs(output_dir, setting="write_suite output_dir")
  spec = run.spec
  if spec.vocabulary.kind != "sentencepiece":
    raise UserError(f"{run.path}'s vocabulary is {spec.vocabulary.kind}; offline suites are written for "
                    "SentencePiece vocabularies.")
  if debian_data:
    task, languages, gold, retrieval = _debian_sources(debian_data, run, task, languages, gold, retrieval,
                                                       output_dir)
  if not task or not languages or not retrieval:
    raise UserError("write_suite needs debian_data=DIR, or task=, languages=, gold= and retrieval= naming the "
                    "sources.")
  languages = sorted(languages)
  vocabulary = run.vocabulary()
  recorders = {name: sf.Recorder(_encoder(vocabulary, name)) for name in sf.TABLES}
  layout: dict[str, Any] = {
      "format": sf.FORMAT, "version": sf.VERSION, "tokens": sf.TOKENS_JSON, "languages": list(spec.languages),
      "vocabulary": {"sha256": spec.vocabulary.sha256, "kind": spec.vocabulary.kind, "run": run.path},
      "sizes": dataclasses.asdict(sizes), "sources": {"task": task, "debian_data": debian_data}}
  layout["bli"] = _write_bli(output_dir, run, task, languages, pivot, gold, min_count, sizes, recorders, progress)
  layout["retrieval"] = _write_retrieval(output_dir, languages, pivot, retrieval, sizes, recorders, progress)
  if debian_data and not (mlm_feature_lengths or spec.task_feature_lengths):
    mlm_feature_lengths = dict(DEBIAN_FEATURE_LENGTHS)
  layout["mlm"] = _write_mlm(output_dir, run, task, mlm_split, mlm_feature_lengths, sizes, progress)
  layout["word_alignment"] = _write_bible(output_dir, bible_languages, sizes, recorders, progress)
  write_atomically(os.path.join(output_dir, sf.TOKENS_JSON),
                   json.dumps({name: r.table for name, r in recorders.items()}, ensure_ascii=False))
  files = {}
  for folder, _, names in os.walk(output_dir):
    for name in names:
      path = os.path.join(folder, name)
      files[os.path.relpath(path, output_dir)] = os.path.getsize(path)
  files.pop(sf.SUITE_JSON, None)
  layout["files"] = dict(sorted(files.items()))
  layout["bytes"] = sum(files.values())
  write_atomically(os.path.join(output_dir, sf.SUITE_JSON), json.dumps(layout, indent=2, ensure_ascii=False))
  progress(f"wrote the suite {output_dir}: {len(files)} files, {layout['bytes'] / 1e6:.2f} MB")
  return layout


def _encoder(vocabulary: Any, table: str) -> Callable[[str], list[int]]:
  """How the reference scorers tokenise each table's texts (see suite_files.TABLES)."""
  if table == sf.LEXICON:
    return vocabulary.encode
  processor = getattr(vocabulary, "tokenizer", None)
  if table == sf.SENTENCES:
    from flax_xalign.evaluation.retrieval import encode_sentences

    return lambda text: encode_sentences(vocabulary, [text])[0]
  return (lambda text: processor.encode([text])[0]) if processor is not None else vocabulary.encode


def _debian_sources(data_dir, run, task, languages, gold, retrieval, output_dir):
  """(task, languages, gold template, retrieval template) of a Debian build, its tasks registered."""
  from flax_xalign.tasks import debian as debian_tasks

  data_dir = os.path.abspath(os.path.expanduser(data_dir))
  built = debian_tasks._built_languages(data_dir)
  chosen = sorted(languages or built)
  absent = [x for x in chosen if x not in built]
  if absent:
    raise UserError(f"languages {absent} have no help text in {data_dir} (built: {', '.join(built)}).")
  vocabulary_path = run.dir.file(run.spec.vocabulary.file)
  if not task:
    debian_tasks.DebianTasks(data_dir=data_dir, languages=tuple(chosen), prefix=DEBIAN_PREFIX,
                             vocabulary_path=vocabulary_path).register()
    task = f"{DEBIAN_PREFIX}_mlm"
  if gold is None:
    gold = _debian_gold(data_dir, chosen, os.path.join(output_dir, "bli"))
  retrieval = retrieval or os.path.join(data_dir, "help_bitext", "en-{lang}.test.tsv")
  return task, chosen, gold, retrieval


def _debian_gold(data_dir: str, languages: Sequence[str], scratch: str) -> dict[tuple[str, str], tuple[str, str]]:
  """{(lang, split): (path, 'gold' | 'provisional')}: bli/{lang}-en.{split}.txt, else (test only) the inverted
  dict/en-{lang}.tsv (one-word entries), as the e5 Debian driver's `gold_for`."""
  from flax_xalign.fileio import makedirs, write_atomically

  found = {}
  for lang in languages:
    for split in BLI_SPLITS:
      path = os.path.join(data_dir, "bli", f"{lang}-en.{split}.txt")
      if os.path.isfile(path):
        found[(lang, split)] = (path, "gold")
    dictionary = os.path.join(data_dir, "dict", f"en-{lang}.tsv")
    if (lang, "test") in found or not os.path.isfile(dictionary):
      continue
    pairs = []
    with open(dictionary, encoding="utf-8") as f:
      for line in f:
        fields = line.rstrip("\n").split("\t")
        if len(fields) == 2 and all(w and len(w.split()) == 1 for w in fields):
          pairs.append(f"{fields[1]} {fields[0]}\n")
    if pairs:
      makedirs(scratch, setting="write_suite output_dir")
      path = os.path.join(scratch, f"{lang}-en.provisional.txt")
      write_atomically(path, "".join(dict.fromkeys(pairs)))
      found[(lang, "test")] = (path, "provisional")
  return found


def _gold_files(gold, lang: str) -> dict[str, tuple[str, str]]:
  if isinstance(gold, dict):
    return {split: gold[(lang, split)] for split in BLI_SPLITS if (lang, split) in gold}
  out = {}
  for split in BLI_SPLITS:
    path = gold.format(lang=lang, split=split) if gold else ""
    if path and os.path.isfile(path):
      out[split] = (path, "gold")
  return out


def _write_bli(output_dir, run, task, languages, pivot, gold, min_count, sizes, recorders, progress) -> dict:
  """The language-specific vocabularies, sentences and gold of every lang -> pivot pair with usable gold."""
  from flax_xalign.data.sources import lexicon
  from flax_xalign.data.vocab import normalize
  from flax_xalign.evaluation.lexicon import bli
  from flax_xalign.evaluation.lexicon import isomorphism as iso
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions, TaskText

  folder = os.path.join(output_dir, "bli")
  os.makedirs(folder, exist_ok=True)
  os.makedirs(os.path.join(output_dir, "sentences"), exist_ok=True)
  layout: dict[str, Any] = {"task": task, "pivot": pivot, "min_count": min_count, "normalize": "",
                            "max_sentences": sizes.eval_sentences, "languages": {}, "skipped": {}}
  sentences_written: dict[str, str] = {}
  record = recorders[sf.LEXICON].encode
  for lang in languages:
    golds = _gold_files(gold, lang)
    if not golds:
      layout["skipped"][lang] = "no BLI gold"
      progress(f"  BLI {lang}: no gold, left out")
      continue
    opts = LexiconOptions(src=lang, tgt=pivot, task=task, normalize="", min_count=min_count,
                          max_sentences=sizes.eval_sentences, gold=next(iter(golds.values()))[0]).check()
    text = TaskText(run, opts)
    ids, mask, origin = text.language_vocabularies(opts)
    entry: dict[str, Any] = {"vocabularies": f"bli/{lang}-{pivot}.vocab.npz", "sentences": {}, "gold": {}}
    for split, (path, kind) in golds.items():
      words = lexicon.read_lexicon(path)
      keep = lambda w: normalize.normalize_text(w, text.normalizer)  # noqa: E731
      found = bli.gold_from_lexicon(words, encode=record, normalize=keep, src_ids=ids[0], src_mask=mask[0],
                                    tgt_ids=ids[1], tgt_mask=mask[1])
      pieces = iso.pieces_from_lexicon(words, encode=record, unknown_id=run.spec.vocabulary.specials.unk,
                                       normalize=keep)
      if not found.queries or pieces.pairs < 2:
        layout["skipped"][f"{lang}.{split}"] = f"{found.queries} gold queries in coverage, {pieces.pairs} pairs"
        progress(f"  BLI {lang} {split}: no usable gold ({layout['skipped'][f'{lang}.{split}']}), left out")
        continue
      relative = f"bli/{lang}-{pivot}.{split}.txt"
      if os.path.abspath(path) != os.path.abspath(os.path.join(output_dir, relative)):
        shutil.copyfile(path, os.path.join(output_dir, relative))
      entry["gold"][split] = {"file": relative, "kind": kind, "queries": found.queries}
    if not entry["gold"]:
      continue
    np.savez_compressed(os.path.join(output_dir, entry["vocabularies"]), ids=np.asarray(ids),
                        mask=np.asarray(mask, bool))
    for code in (lang, pivot):
      if code not in sentences_written:
        relative = f"sentences/{code}.npz"
        sf.save_ragged(os.path.join(output_dir, relative), text.sentences(code, opts))
        sentences_written[code] = relative
      entry["sentences"][code] = sentences_written[code]
    layout["languages"][lang] = entry
    queries = ", ".join(f"{split} {g['queries']}" for split, g in entry["gold"].items())
    progress(f"  BLI {lang} -> {pivot}: {int(mask[0].sum()):,} / {int(mask[1].sum()):,} tokens ({origin}); "
             f"gold queries {queries}")
  for name in os.listdir(folder):  # The provisional inversions were copied under their split's name.
    if name.endswith(".provisional.txt"):
      os.remove(os.path.join(folder, name))
  if not layout["languages"]:
    raise UserError(f"no language of {languages} has usable BLI gold ({layout['skipped']}); check the gold files.")
  return layout


def _write_retrieval(output_dir, languages, pivot, template, sizes, recorders, progress) -> dict:
  from flax_xalign.evaluation.retrieval import read_pairs

  os.makedirs(os.path.join(output_dir, "retrieval"), exist_ok=True)
  layout = {"src_lang": pivot, "languages": {}}
  record = recorders[sf.SENTENCES].encode
  for lang in languages:
    pairs = read_pairs(template.format(lang=lang))[:sizes.retrieval_pairs]
    relative = f"retrieval/{pivot}-{lang}.tsv"
    with open(os.path.join(output_dir, relative), "w", encoding="utf-8") as f:
      f.writelines(f"{a}\t{b}\n" for a, b in pairs)
    for a, b in pairs:
      record(a)
      record(b)
    layout["languages"][lang] = {"tsv": relative, "pairs": len(pairs)}
    progress(f"  retrieval {pivot}-{lang}: {len(pairs)} pairs")
  return layout


def _write_mlm(output_dir, run, task, split, feature_lengths, sizes, progress) -> dict:
  from flax_xalign.evaluation import mlm_eval

  vocab, top_token, batches = mlm_eval.held_out_batches(
      run, split=split, name=task, batch_size=sizes.mlm_batch_size, baseline_batches=sizes.baseline_batches,
      feature_lengths=feature_lengths)
  kept = list(itertools.islice(batches, sizes.mlm_batches))
  if not kept:
    raise UserError(f"split {split!r} of {task!r} gave no full batch of {sizes.mlm_batch_size} rows; lower "
                    "SuiteSizes.mlm_batch_size.")
  arrays = {name: np.stack([np.asarray(b[name]) for b in kept]) for name in kept[0]}
  np.savez_compressed(os.path.join(output_dir, "mlm.npz"), top_token=np.asarray(top_token), **arrays)
  languages = list(run.spec.languages)
  progress(f"  MLM: {len(kept)} held-out batches of {sizes.mlm_batch_size} rows ({task}:{split})")
  return {"file": "mlm.npz", "task": task, "split": split, "batches": len(kept), "batch_size": sizes.mlm_batch_size,
          "seed": 0, "features": sorted(arrays), "languages": languages,
          "most_frequent_token": {code: vocab.decode([int(top_token[i])]) for i, code in enumerate(languages, 1)}}


def _write_bible(output_dir, languages, sizes, recorders, progress) -> dict:
  from flax_xalign.data.sources import bible
  from flax_xalign.data.vocab import normalize
  from flax_xalign.evaluation.word_alignment import aer, word_align

  os.makedirs(os.path.join(output_dir, "bible"), exist_ok=True)
  src, tgt = languages
  layout: dict[str, Any] = {"src_lang": src, "tgt_lang": tgt, "notice": "bible/NOTICE",
                            "normalizers": list(normalize.NORMALIZERS), "splits": {}}
  with open(os.path.join(output_dir, layout["notice"]), "w", encoding="utf-8") as f:
    f.write(bible.LICENSE_NOTICE)
  record = recorders[sf.WORDS].encode
  for split in BIBLE_SPLITS:
    pairs, sure = word_align.bible_gold(split, max_pairs=sizes.bible_pairs)
    stem = f"bible/{src}_{tgt}.{split}"
    with open(os.path.join(output_dir, stem + ".tsv"), "w", encoding="utf-8") as f:
      f.writelines(f"{' '.join(a)}\t{' '.join(b)}\n" for a, b in pairs)
    with open(os.path.join(output_dir, stem + ".pharaoh"), "w", encoding="utf-8") as f:
      f.writelines(aer.format_links(links) + "\n" for links in sure)
    words = sorted({w for a, b in pairs for w in (*a, *b)})
    for name in normalize.NORMALIZERS:  # The host's aligner picks its normaliser from the run (model_defaults).
      for word in words:
        record(normalize.normalize_text(word, name))
    layout["splits"][split] = {"pairs": stem + ".tsv", "gold": stem + ".pharaoh", "count": len(pairs)}
    progress(f"  Bible {split}: {len(pairs)} verses, {len(words):,} distinct words")
  return layout
