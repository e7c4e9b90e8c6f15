"""What `xalign align` does once its flags are read: align sentence pairs with a run, write the links, score them.

The command (`flax_xalign.cli.align`) turns its flags into an `AlignJob` and
calls `align`; here the pairs (a TSV file, or the embedded Greek-English
verses and their gold written beside the output) are read, the aligner is
loaded from the run, the Pharaoh links are written and, with gold, scored;
a sweep scores every layer and method, prints the table and writes the
layer plot. It sits in evaluation/ because it opens a run (`runs.Run`) and
scores against gold (`aer`). The printed lines are the command's.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from flax_xalign import storage
from flax_xalign.errors import UserError


@dataclasses.dataclass(frozen=True)
class AlignJob:
  """The flags of `xalign align` (its help says what each does), typed.

  `solver` holds the `ops.AlignmentSolver` fields the flags set (an unset
  similarity left out: it then follows the model). The solver is built, and a
  bad value refused, only after the inputs are read, so a bad input file is
  named first, as the command always has.
  """

  model_dir: str
  output: str
  input: str | None = None
  bible_gold: str | None = None
  layer: int | None = None
  method: str | None = None
  src_lang: str | None = None
  tgt_lang: str | None = None
  solver: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  batch_size: int = 32
  max_length: int = 256
  vocabulary: str | None = None
  normalize: str | None = None
  encoding: str | None = None
  pair_layout: str | None = None
  gold: str | None = None
  gold_format: str = "pharaoh"
  sweep: bool = False


def output_folder(output: str) -> str:
  """The folder (or bucket prefix) --output is written in (where --bible_gold writes its verses and gold)."""
  return storage.dirname(output) if storage.is_url(output) else os.path.dirname(os.path.abspath(output))


def plot_path(output: str) -> str:
  """The layer plot a sweep writes beside --output."""
  return os.path.splitext(output)[0] + "_layers.png"


def check_files(job: AlignJob) -> None:
  """The output is none of the inputs and can be written; the inputs can be read (before any work).

  Whether the output lies in the run's own files is the command's check (`cli.common.check_outside_run`),
  made before this one.
  """
  from flax_xalign import fileio

  inputs = {"--input": job.input, "--gold": job.gold, "--vocabulary": job.vocabulary}
  if job.bible_gold:  # Its gold is written beside --output, then read back as --input and --gold.
    folder = output_folder(job.output)
    inputs = {"--bible_gold": [storage.join(folder, f"grc_en.{job.bible_gold}.{ext}") for ext in ("tsv", "pharaoh")]}
  fileio.check_output_file(job.output, inputs=inputs)
  if job.sweep:
    fileio.check_output_file(plot_path(job.output), setting="--output's plot", inputs=inputs)
  for flag, path in inputs.items():
    if path and not job.bible_gold:
      fileio.check_input_file(path, setting=flag)


def scores_line(scores: Any) -> str:
  """P/R/F1/AER of one set of links, as the command prints them."""
  return (f"P {100 * scores.precision:.1f}  R {100 * scores.recall:.1f}  F1 {100 * scores.f1:.1f}  "
          f"AER {100 * scores.aer:.1f}  ({scores.num_predicted} links, {scores.num_sure} sure)")


def _inputs(job: AlignJob) -> tuple[AlignJob, list[tuple[list[str], list[str]]], list[Any] | None]:
  """(the job with --bible_gold's files as its --input and --gold, the pairs, the gold entries or None)."""
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import word_align

  if job.bible_gold:
    if job.input or job.gold:
      raise UserError("--bible_gold replaces --input and --gold; pass one or the other.")
    path, gold_path = word_align.export_bible_gold(job.bible_gold, output_folder(job.output))
    job = dataclasses.replace(job, input=path, gold=gold_path, gold_format="pharaoh")
  elif not job.input:
    raise UserError("pass --input=FILE (source<TAB>target per line), or --bible_gold=test for the embedded verses.")
  pairs = aer.read_pairs(job.input, setting="--input")
  gold = None
  if job.gold:
    gold = aer.read_gold(job.gold, job.gold_format, num_sentences=len(pairs))
    aer.check_gold_fits(gold, pairs, gold_path=f"--gold {job.gold}", input_path=f"--input {job.input}")
  elif job.sweep:
    raise UserError("--sweep scores every layer and method against gold links: pass --gold=FILE.")
  return job, pairs, gold


def _sweep(job: AlignJob, aligner: Any, pairs: list, gold: list) -> tuple[str, int, list]:
  """Scores every layer and method against the gold, prints the table, writes the plot: (method, layer, links) of
  the best (method, layer), or of the best one --method/--layer pin."""
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import word_align

  methods = tuple(dict.fromkeys(word_align.SWEEP_METHODS + ((job.method,) if job.method else ())))
  every = aligner.run(pairs, layers=range(aligner.num_layers + 1), methods=methods, verbose=True)
  sure, possible = [g.sure for g in gold], [g.possible for g in gold]
  table = {key: aer.score(links, sure, possible) for key, links in every.items()}
  print(aer.format_table(table, title=f"{os.path.basename(job.gold)}, {aligner.options.similarity} similarity"))
  plot = plot_path(job.output)
  aer.plot_layer_curve(table, plot, title=f"{aligner.src_lang}-{aligner.tgt_lang} word alignment")
  print(f"wrote {plot}")
  pinned = [k for k in table if job.method in (None, k[0]) and job.layer in (None, k[1])]
  method, layer = min(pinned, key=lambda k: (table[k].aer, k[1], k[0]))  # Best unless pinned.
  return method, layer, every[(method, layer)]


def align(job: AlignJob) -> None:
  """Checks the files, reads the pairs and gold, aligns them with the run and writes (and scores) the links.

  UserError for a bad input, gold, layer, language or solver value, before the output is written.
  """
  from flax_xalign import ops
  from flax_xalign.evaluation.word_alignment import aer
  from flax_xalign.evaluation.word_alignment import word_align
  from flax_xalign.runs import Run

  check_files(job)
  job, pairs, gold = _inputs(job)
  options = ops.AlignmentSolver(**job.solver)
  aligner, _, step = word_align.load_aligner(
      Run.open(job.model_dir), src_lang=job.src_lang, tgt_lang=job.tgt_lang, vocabulary_path=job.vocabulary,
      max_length=job.max_length, batch_size=job.batch_size, options=options, similarity=job.solver.get("similarity"),
      normalize=job.normalize, encoding=job.encoding, pair_layout=job.pair_layout)
  options = aligner.options
  print(aligner.settings.describe(), flush=True)
  layer = job.layer if job.layer is not None else round(2 * aligner.num_layers / 3)
  method = job.method or "sinkhorn"
  aligner.validate([layer], [method])
  print(f"aligning {len(pairs)} pairs ({aligner.src_lang} -> {aligner.tgt_lang}) with {job.model_dir} "
        f"(step {step}, {aligner.num_layers} layers, {aligner.pair_layout} pair layout; "
        f"{options.sinkhorn_kernel} kernel, {options.sinkhorn_order}, mu {options.mu}, "
        f"{options.sinkhorn_iters} iterations, {options.sinkhorn_extraction} extraction)", flush=True)
  start = time.perf_counter()
  if job.sweep:
    method, layer, links = _sweep(job, aligner, pairs, gold)
  else:
    links = aligner.align(pairs, layer=layer, method=method)
  seconds = time.perf_counter() - start
  aer.write_pharaoh(job.output, links)
  print(f"wrote {job.output}: {method}, layer {layer}, {options.similarity} similarity "
        f"({seconds:.1f} s, {1000 * seconds / len(pairs):.0f} s per 1000 pairs)")
  if gold is not None:
    print(f"{method} layer {layer}: " + scores_line(aer.score(links, [g.sure for g in gold],
                                                               [g.possible for g in gold])))
