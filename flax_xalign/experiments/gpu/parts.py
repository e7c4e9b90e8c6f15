"""What a bundle's build makes before its rows' parts (`builder`): eflomal's links of the Bible, the tasks gin
file the caches and assets are read through, the alignment peers and the start weights (e5-small trimmed to the
grid's text, or the tiny grid's 4-layer model).

Work kept in the build's work folder is reused only when the fingerprint written when it was made matches this
build's inputs (`folders.made_for`). Tasks are registered through gin, which only cli/ parses: the command hands
the build a `TaskRegistrar`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu.bundle import Start
from flax_xalign.experiments.gpu.folders import (HOST_START_COMMAND, INPUTS_SUFFIX, check_host_start,
                                                 inputs_fingerprint, made_for, record_made_for)

# Registers the tasks a gin file's `train.user_tasks` define (seqio); the gin edge's (cli/), passed in.
TaskRegistrar = Callable[[str], None]

# The Bible bitext task's recipe (on the gin search path), included by the tasks file and e5_so_eflomal.gin.
BIBLE_TASK_GIN = "experiments/bible_linked_task.gin"
E5_SOURCE = "e5_small_trimmed.zip"
# The tiny grid's model: 4 layers, small enough that a CPU runs the grid in a minute or two.
TINY_MODEL = dict(num_layers=4, embed_dim=32, num_heads=4, head_dim=8, mlp_dim=64, max_positions=64,
                  num_languages=0, dropout_rate=0.0, attention_dropout_rate=0.0)
TINY_VOCAB_SIZE = 300


def bible_links(given: str, work: str) -> str:
  """eflomal's links of the Bible (`xalign eflomal --bible`), made in WORK unless `given` (--bible_links) names
  them; WORK's are reused only when the record written once they were complete says they are eflomal's of the
  Bible."""
  if given:
    return os.path.abspath(given)
  target = os.path.join(work, "bible_links")
  made = inputs_fingerprint((), command="xalign eflomal --bible", symmetrize="grow-diag-final-and")
  if not (made_for(target, made) and os.path.isfile(os.path.join(target, "train.links"))):
    from flax_xalign.evaluation.word_alignment import bible_links as links_lib

    print("eflomal: aligning the Bible for the link-labelled tasks", flush=True)
    with contextlib.suppress(FileNotFoundError):
      os.unlink(target + INPUTS_SUFFIX)
    links_lib.check_output_dir(target)
    symmetrize = "grow-diag-final-and"
    result, _ = links_lib.write_bible_links(target, symmetrize=symmetrize, verbose=True)
    print(f"eflomal {result.version}, {symmetrize}, {result.seconds:.1f} s")
    record_made_for(target, made)
  return target


def alignment_peers(links: str, *, verses: int | None = None) -> dict[str, Any]:
  """What the Bible rows are compared with, scored here on the same test verses the host scores them on:
  eflomal's links (the statistical aligner users run; `xalign eflomal --bible`, grow-diag-final-and) and the
  diagonal (word i -> round(i·m/n)). `verses`: the first N test verses, as the suite keeps (None: all)."""
  from flax_xalign.evaluation.word_alignment import aer, word_align

  pairs, sure = word_align.bible_gold("test", max_pairs=verses)
  tsv = aer.read_pairs(os.path.join(links, "test.tsv"))[:len(pairs)]
  if [(list(a), list(b)) for a, b in pairs] != [(list(a), list(b)) for a, b in tsv]:
    raise UserError(f"{links}/test.tsv does not start with the Bible's test verses; rebuild it with "
                    "`xalign eflomal --bible`")
  eflomal = [g.sure for g in aer.read_pharaoh(os.path.join(links, "test.links"))][:len(pairs)]
  diagonal = [{(i, min(len(b) - 1, round(i * len(b) / len(a)))) for i in range(len(a))} if a and b else set()
              for a, b in pairs]
  return {"verses": len(pairs), "eflomal": aer.score(eflomal, sure).as_dict(),
          "diagonal": aer.score(diagonal, sure).as_dict(),
          "eflomal_links": "xalign eflomal --bible (every verse pair at once, grow-diag-final-and)"}


def tasks_gin(path: str, *, debian_data: str, languages: Sequence[str], links: str, vocabulary: str,
              debian_prefix: str = "gpu_debian", bible_task: str = "gpu_bible_linked",
              splits: Sequence[str] = ("train", "validation"), with_links: bool = True,
              bible_prefix: str | None = None) -> str:
  """The gin file that registers the grid's tasks with `vocabulary` (the Debian help mixture, DebianTasks, and
  the Bible bitext of `links`' `splits`, BIBLE_TASK_GIN's TsvBitextTask with eflomal's links unless not
  `with_links`; with `bible_prefix`, also the Bible's monolingual + bitext tasks and their MLM + TLM mixture
  `{bible_prefix}_grc_en_mlm_tlm`, BibleTasks, train books only): the values it is given, the recipe included."""
  splits = [s for s in splits if os.path.isfile(os.path.join(links, f"{s}.tsv"))]
  files = {s: os.path.join(links, f"{s}.tsv") for s in splits}
  link_files = {s: os.path.join(links, f"{s}.links") for s in splits
                if with_links and os.path.isfile(os.path.join(links, f"{s}.links"))}
  bible = ([f"BibleTasks.prefix = {bible_prefix!r}", f"BibleTasks.vocabulary_path = {vocabulary!r}",
            "BibleTasks.normalize = 'nfd_strip_marks'"] if bible_prefix else [])
  text = "\n".join([
      f"# Written by xalign gpu_bundle: the grid's tasks, tokenised with {vocabulary}.",
      f"include '{BIBLE_TASK_GIN}'",
      f"train.user_tasks = [@DebianTasks(), @TsvBitextTask(){', @BibleTasks()' if bible_prefix else ''}]",
      *bible,
      f"DebianTasks.data_dir = {debian_data!r}", f"DebianTasks.languages = {list(languages)!r}",
      f"DebianTasks.prefix = {debian_prefix!r}", f"DebianTasks.vocabulary_path = {vocabulary!r}",
      f"BIBLE_LINKED_TASK = {bible_task!r}", f"BIBLE_TSV_FILES = {files!r}", f"BIBLE_LINK_FILES = {link_files!r}",
      f"BIBLE_VOCABULARY = {vocabulary!r}", ""])
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path


def start_weights(start_dir: str, grid: Any, out: str, host_start: str, *, work: str, debian_data: str,
                  languages: Sequence[str], links: str, register_tasks: TaskRegistrar) -> Start:
  """The start weights in their carried form in OUT/start/, and as the MODEL_DIR `host_start` the host will
  make from them (made here the same way, from the carried form: the assets and suite are built against it).
  `start_dir`: the tiny grid's given MODEL_DIR ("": made in `work`). `host_start` is replaced only when this
  command made it and it holds only what it made (`check_host_start`)."""
  from flax_xalign import fileio
  from flax_xalign.experiments.gpu.start import make_start

  target = os.path.join(out, "start")
  if grid.start == "tiny":
    start_dir = start_dir or tiny_start(os.path.join(work, "tiny_start"), debian_data=debian_data,
                                        languages=languages, links=links)
    shutil.copytree(start_dir, os.path.join(target, "model"),
                    ignore=shutil.ignore_patterns("*.lock", "events.out.*"))
    start = Start(kind="model_dir", path="start/model")
  else:
    os.makedirs(target, exist_ok=True)
    save_e5_trimmed(os.path.join(target, E5_SOURCE), work=work, debian_data=debian_data, languages=languages,
                    links=links, register_tasks=register_tasks)
    start = Start(kind="e5_q4", path=f"start/{E5_SOURCE}")
  check_host_start(host_start)  # (checked before any work; again before its removal)
  if os.path.lexists(host_start):
    shutil.rmtree(host_start)
  make_start(os.path.join(out, start.path), start.kind, host_start)
  fileio.write_mark(host_start, HOST_START_COMMAND, os.listdir(host_start))
  return start


def tiny_start(output: str, *, debian_data: str, languages: Sequence[str], links: str) -> str:
  """The tiny grid's start when --start_dir is not given: `_make_tiny_start` into `output` (in the build's work
  folder), reused by a rebuild only when its fingerprint (`made_for`) says it was made from these inputs."""
  made = inputs_fingerprint([*(os.path.join(debian_data, "help", f"{lang}.train.txt") for lang in ("en", *languages)),
                             os.path.join(links, "train.tsv")], languages=list(languages), model=TINY_MODEL,
                            vocab_size=TINY_VOCAB_SIZE)
  if made_for(output, made) and os.path.isdir(os.path.join(output, "checkpoints")):
    print(f"tiny start: {output}, made from these inputs by an earlier build", flush=True)
    return output
  for stale in (output + INPUTS_SUFFIX, output + ".spm.model", output + ".spm.vocab"):  # The work folder's (ours).
    with contextlib.suppress(FileNotFoundError):
      os.unlink(stale)
  shutil.rmtree(output, ignore_errors=True)
  _make_tiny_start(output, debian_data=debian_data, languages=languages, links=links)
  record_made_for(output, made)
  return output


def _make_tiny_start(output: str, *, debian_data: str, languages: Sequence[str], links: str) -> None:
  """A 4-layer model initialised from seed 0, with a SentencePiece vocabulary of the help text and the Bible
  verses the grid reads, as the new MODEL_DIR `output`."""
  import itertools
  import random

  import flax.linen as nn
  import jax

  from flax_xalign.data.vocab import normalize
  from flax_xalign.data.vocab import sentencepiece as vocab_lib
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.config import EncoderConfig
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel

  lines = []
  for lang in ("en", *languages):
    with open(os.path.join(debian_data, "help", f"{lang}.train.txt"), encoding="utf-8") as f:
      lines += [line.strip() for line in f if line.strip()]
  with open(os.path.join(links, "train.tsv"), encoding="utf-8") as f:  # As many verses as help lines: the
    for line in itertools.islice(f, len(lines)):                       # help words stay whole pieces.
      lines += [normalize.normalize_text(side, "nfd_strip_marks") for side in line.rstrip("\n").split("\t")]
  random.Random(0).shuffle(lines)
  os.makedirs(os.path.dirname(output), exist_ok=True)
  path = vocab_lib.train_sentencepiece(lines, vocab_size=TINY_VOCAB_SIZE, model_path=output + ".spm.model")
  vocabulary = vocab_lib.load_vocabulary(path)
  config = EncoderConfig(vocab_size=vocabulary.vocab_size, **TINY_MODEL)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  params = nn.meta.unbox(model.init(jax.random.key(0), batch=1, length=8))
  write_model_dir(output, config=config, params=params, vocabulary=vocabulary, languages=sorted({"en", *languages}),
                  task_feature_lengths={"tokens": 32})
  print(f"tiny start: a 4-layer model, {vocabulary.vocab_size} pieces -> {output}", flush=True)


def save_e5_trimmed(path: str, *, work: str, debian_data: str, languages: Sequence[str], links: str,
                    register_tasks: TaskRegistrar) -> None:
  """e5-small's source blocks trimmed to the pieces of the Debian help text and the Bible (one vocabulary for
  both settings), as `xalign e5_small --trim_vocab_to=gpu_trim --save_trimmed_source=PATH` writes them; the
  tasks registered through WORK/trim_tasks.gin (`tasks_gin`, e5's XLM-R vocabulary)."""
  import seqio

  from flax_xalign.fileio import check_output_file
  from flax_xalign.interop import e5_trimmed
  from flax_xalign.interop.e5_small import xlmr_vocabulary

  register_tasks(tasks_gin(os.path.join(work, "trim_tasks.gin"), debian_data=debian_data, languages=languages,
                           links=links, vocabulary=xlmr_vocabulary(), debian_prefix="gpu_trim_debian",
                           bible_task="gpu_trim_bible", splits=("train", "validation", "test"), with_links=False))
  if "gpu_trim" not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add("gpu_trim", ["gpu_trim_debian_mlm", "gpu_trim_bible"], default_rate=1.0)
  print(f"e5-small trimmed to the Debian help ({', '.join(languages)}, en) and the Bible -> {path}", flush=True)
  check_output_file(path, setting="--save_trimmed_source", inputs={"--data_dir": None})
  # The run's languages are the Debian mixture's (evaluation reads that task and checks they match; e5 has no
  # language embeddings, so the Bible runs' grc needs no id of its own).
  e5_trimmed.write_trimmed_source(path, task="gpu_trim", normalizers=("nfd_strip_marks",),
                                  languages=sorted({"en", *languages}), data_dir=None)
