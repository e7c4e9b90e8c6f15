r"""Builds a GPU bundle: one folder that trains AND scores a grid of experiments on a host without TensorFlow.

  xalign gpu_bundle --grid=science --output=.gpu --debian_data=runs/debian_data
  # then, on the GPU host, from the repository root with .gpu carried:
  bash .gpu/run.sh            # results in $OUT/results.json (+ rsim.png)

Run here, where seqio and TensorFlow are installed; it writes everything the host needs and nothing it can
make itself (grid: `flax_xalign.cli.experiments.gpu_grids`):

  start/     the start weights: e5-small trimmed to the grid's text, kept in its source's Q4_0 blocks
             (lossless against what `xalign e5_small` imports), or for --grid=tiny a small MODEL_DIR
  caches/    a packed cache per training setting (`xalign cache`): the Debian help mixture, the Bible
             bitext with eflomal's link groups; each with the validation rows its MLM accuracy reads
  assets/    the assets the host cannot count without seqio (lang_vocab with the pivot, the induced
             dictionaries, the co-occurrence table), built by `xalign assets` for each experiment
  suite/     the evaluation inputs as plain files (`flax_xalign.evaluation.offline.suite`): BLI
             dev/test gold, RSIM/retrieval sentences, MLM rows, the Bible's validation and test gold links
  wheels/    what the host lacks (gin-config, ...), as CPython 3.12 wheels (--wheels=download) 
  run.sh, bundle.json (every file with its size, each part's size, the grid)

The bundle must fit what one device call carries: with the checkout, 64 MiB; the bundle's own limit is
--max_mib (default 56). One that would not fit is refused with one line naming its biggest part, and no
bundle.json is written (the host refuses a folder without one). The bundle is assembled in a staging folder
beside --output and replaces it only when whole and within the limit, so a refused, failed or interrupted
build leaves an earlier bundle as it was. Intermediate work (eflomal's links, the tiny start, the assets'
runs) goes to --work (default OUTPUT.work), kept for a rebuild and never carried; the start weights the host
makes go to --host_work (default /tmp/xalign_gpu-KEY, KEY from the output's path: one per bundle). Both are
this command's folders (a mark says so): a folder of someone else's is refused, and work kept there is
reused only when a fingerprint of its inputs says it was made for this build (`experiments.gpu_folders`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import lzma
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flax_xalign.cli.experiments.gpu_folders import (  # noqa: F401  (check_output, prepare_output: tests')
    BUNDLE_JSON, HOST_START_COMMAND, HOST_WORK_COMMAND, INPUTS_SUFFIX, MARKER, WORK_COMMAND, BuildPaths,
    check_host_start, check_output, check_paths, inputs_fingerprint, made_for, prepare_output, record_made_for,
    staged)
from flax_xalign.errors import ArgumentParser, UserError

MIB = 1 << 20
INTERRUPTED_EXIT = 128 + signal.SIGINT  # errors.interrupted()'s status, after its one line
HOST_PYTHON_TAG = "3.12"
# What the host lacks, pinned: gin for the trainer's flags; grain, array-record for packed caches (ArrayRecord).
HOST_WHEELS = ("gin-config==0.5.0", "grain==0.2.18", "array-record==0.8.6", "portpicker==1.6.0",
               "cloudpickle==3.1.1")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.cli.experiments import gpu_grids

  parser = ArgumentParser(prog="xalign gpu_bundle", description=__doc__.splitlines()[0])
  parser.add_argument("--grid", required=True, choices=sorted(gpu_grids.GRIDS), help="the experiment grid")
  parser.add_argument("--output", required=True, help="the bundle folder (e.g. .gpu)")
  parser.add_argument("--debian_data", required=True, help="the `xalign debian_data` output")
  parser.add_argument("--languages", default="", help="Debian languages besides English (default: the grid's "
                      "that the build has)")
  parser.add_argument("--bible_links", default="", help="`xalign eflomal --bible` output (default: made in --work)")
  parser.add_argument("--start_dir", default="", help="--grid=tiny: the MODEL_DIR the grid starts from (default: "
                      "a 4-layer model initialised here, with a vocabulary of the grid's text)")
  parser.add_argument("--work", default="", help="intermediate files (default OUTPUT.work)")
  parser.add_argument("--host_work", default="", help="where run.sh keeps runs on the host (the induced "
                      "dictionaries name their source there; default /tmp/xalign_gpu-KEY, KEY from --output's path)")
  parser.add_argument("--wheels", choices=("download", "none"), default="download",
                      help="download the host's missing wheels (needs the package index) or carry none")
  parser.add_argument("--max_mib", type=_positive_mib, default=56.0, help="the bundle's size limit in MiB (default 56)")
  parser.add_argument("--overwrite", action="store_true", help="replace a bundle this command wrote before")
  return parser.parse_args(argv)


def _positive_mib(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
  if not 0 < value < float("inf"):
    raise argparse.ArgumentTypeError(f"{text!r} is not a size: give a number of MiB above 0")
  return value


# ---------------------------------------------------------------------------- the bundle's size


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


class Budget:
  """Bytes per part; refuses (one line, the biggest part named) once the bundle would pass the limit."""

  def __init__(self, root: str, limit_mib: float):
    self.root = root
    self.limit_mib = limit_mib  # (printed as given: --max_mib=0.01 is not 0)
    self.limit = int(limit_mib * MIB)
    self.parts: dict[str, int] = {}

  def add(self, part: str) -> int:
    size = folder_bytes(os.path.join(self.root, part)) if os.path.isdir(os.path.join(self.root, part)) else (
        os.path.getsize(os.path.join(self.root, part)) if os.path.exists(os.path.join(self.root, part)) else 0)
    self.parts[part] = size
    total = sum(self.parts.values())
    print(f"  {part}: {size / MIB:.2f} MiB (bundle so far {total / MIB:.2f} MiB of {self.limit_mib:g})",
          flush=True)
    if total > self.limit:
      biggest = max(self.parts, key=self.parts.get)
      raise UserError(f"the bundle would be {_mib(total)} MiB, over --max_mib={self.limit_mib:g}; its "
                      f"biggest part is {biggest} ({_mib(self.parts[biggest])} MiB): make it smaller "
                      "(fewer cache rows or suite sentences in the grid)")
    return size


def _mib(size: int) -> str:
  """MiB to one decimal, or to two significant digits below 0.1 MiB (20 KiB is not "0.0 MiB")."""
  return f"{size / MIB:.1f}" if size >= 0.1 * MIB else f"{size / MIB:.2g}"


# ---------------------------------------------------------------------------- the parts


def bible_links(args: argparse.Namespace, work: str) -> str:
  """eflomal's links of the Bible (`xalign eflomal --bible`), made in WORK unless --bible_links gives them;
  WORK's are reused only when the record written once they were complete says they are eflomal's of the Bible."""
  if args.bible_links:
    return os.path.abspath(args.bible_links)
  target = os.path.join(work, "bible_links")
  made = inputs_fingerprint((), command="xalign eflomal --bible", symmetrize="grow-diag-final-and")
  if not (made_for(target, made) and os.path.isfile(os.path.join(target, "train.links"))):
    from flax_xalign.cli import eflomal

    print("eflomal: aligning the Bible for the link-labelled tasks", flush=True)
    with contextlib.suppress(FileNotFoundError):
      os.unlink(target + INPUTS_SUFFIX)
    check_nested(eflomal.main(["--bible", f"--output_dir={target}"]),
                 f"xalign eflomal --bible --output_dir={target} failed")
    record_made_for(target, made)
  return target


class NestedInterrupt(Exception):
  """A command run in-process stopped at a Ctrl-C and printed its one line: this one ends with 130, silently."""


def check_nested(code: int, failed: str) -> None:
  """After a command run in-process: 130 (Ctrl-C, its line printed) ends this one the same way; any other
  failure is one UserError, `failed` (what failed) with the exit status."""
  if code == INTERRUPTED_EXIT:
    raise NestedInterrupt(failed)
  if code:
    raise UserError(f"{failed} (exit {code}); see above")


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
              prefix: str = "gpu") -> str:
  """The gin file that registers the grid's tasks with `vocabulary` (for `xalign cache` / `xalign assets`)."""
  splits = [s for s in ("train", "validation") if os.path.isfile(os.path.join(links, f"{s}.tsv"))]
  files = {s: os.path.join(links, f"{s}.tsv") for s in splits}
  link_files = {s: os.path.join(links, f"{s}.links") for s in splits
                if os.path.isfile(os.path.join(links, f"{s}.links"))}
  text = f"""# Written by xalign gpu_bundle: the grid's tasks, tokenised with {vocabulary}.
train.user_tasks = [@DebianTasks(), @TsvBitextTask()]
DebianTasks.data_dir = {debian_data!r}
DebianTasks.languages = {list(languages)!r}
DebianTasks.prefix = '{prefix}_debian'
DebianTasks.vocabulary_path = {vocabulary!r}
TsvBitextTask.name = '{prefix}_bible_linked'
TsvBitextTask.files = {files!r}
TsvBitextTask.links = {link_files!r}
TsvBitextTask.lang_a = 'grc'
TsvBitextTask.lang_b = 'en'
TsvBitextTask.vocabulary_path = {vocabulary!r}
TsvBitextTask.normalize = 'nfd_strip_marks'
"""
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  return path


def start_weights(args: argparse.Namespace, grid: Any, out: str, host_start: str, *, work: str, debian_data: str,
                  languages: Sequence[str], links: str) -> dict[str, Any]:
  """The start weights in their carried form in OUT/start/, and as the MODEL_DIR `host_start` the host will
  make from them (made here the same way, from the carried form: the assets and suite are built against it).
  `host_start` is replaced only when this command made it and it holds only what it made (`check_host_start`)."""
  from flax_xalign import fileio

  target = os.path.join(out, "start")
  if grid.start == "tiny":
    start_dir = args.start_dir or tiny_start(os.path.join(work, "tiny_start"), debian_data=debian_data,
                                             languages=languages, links=links)
    shutil.copytree(start_dir, os.path.join(target, "model"),
                    ignore=shutil.ignore_patterns("*.lock", "events.out.*"))
    start = {"kind": "model_dir", "path": "start/model"}
  else:
    os.makedirs(target, exist_ok=True)
    _save_e5_trimmed(os.path.join(target, E5_SOURCE), debian_data=debian_data, languages=languages, links=links)
    start = {"kind": "e5_q4", "path": f"start/{E5_SOURCE}"}
  from flax_xalign.cli import gpu_run

  check_host_start(host_start)  # (checked before any work; again before its removal)
  if os.path.lexists(host_start):
    shutil.rmtree(host_start)
  gpu_run.make_start(os.path.join(out, start["path"]), start["kind"], host_start)
  fileio.write_mark(host_start, HOST_START_COMMAND, os.listdir(host_start))
  return start


E5_SOURCE = "e5_small_trimmed.zip"
# The tiny grid's model: 4 layers, small enough that a CPU runs the grid in a minute or two.
TINY_MODEL = dict(num_layers=4, embed_dim=32, num_heads=4, head_dim=8, mlp_dim=64, max_positions=64,
                  num_languages=0, dropout_rate=0.0, attention_dropout_rate=0.0)
TINY_VOCAB_SIZE = 300


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


def _save_e5_trimmed(path: str, *, debian_data: str, languages: Sequence[str], links: str) -> None:
  """e5-small's source blocks trimmed to the pieces of the Debian help text and the Bible (one vocabulary for
  both settings): `xalign e5_small --trim_vocab_to=... --save_trimmed_source=PATH`."""
  import seqio

  from flax_xalign.cli import compile_check, e5_small as e5_cli
  from flax_xalign.tasks.debian import DebianTasks
  from flax_xalign.tasks.user import TsvBitextTask

  vocabulary = compile_check.xlmr_vocabulary()
  DebianTasks(data_dir=debian_data, languages=tuple(languages), prefix="gpu_trim_debian",
              vocabulary_path=vocabulary).register()
  splits = [s for s in ("train", "validation", "test") if os.path.isfile(os.path.join(links, f"{s}.tsv"))]
  TsvBitextTask(name="gpu_trim_bible", files={s: os.path.join(links, f"{s}.tsv") for s in splits},
                lang_a="grc", lang_b="en", vocabulary_path=vocabulary, normalize="nfd_strip_marks").register()
  if "gpu_trim" not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add("gpu_trim", ["gpu_trim_debian_mlm", "gpu_trim_bible"], default_rate=1.0)
  print(f"e5-small trimmed to the Debian help ({', '.join(languages)}, en) and the Bible -> {path}", flush=True)
  # The run's languages are the Debian mixture's (evaluation reads that task and checks they match; e5 has no
  # language embeddings, so the Bible runs' grc needs no id of its own).
  code = e5_cli.main(["--trim_vocab_to=gpu_trim", "--trim_normalize=nfd_strip_marks", f"--save_trimmed_source={path}",
                      f"--languages={','.join(sorted({'en', *languages}))}"])
  check_nested(code, f"writing e5-small's trimmed source {path} failed")


def write_caches(grid: Any, out: str, tasks_file: str) -> dict[str, dict[str, Any]]:
  from flax_xalign.cli import cache as cache_cli

  caches = {}
  for name, spec in grid.caches.items():
    folder = os.path.join(out, "caches", name)
    common = [f"--gin_file={tasks_file}", f"--task={spec.task}", f"--output={folder}", f"--length={spec.length}"]
    print(f"cache {name}: {spec.task}, {spec.rows} train rows of {spec.length}", flush=True)
    check_nested(cache_cli.main([*common, "--split=train", f"--examples={spec.rows}"]),
                 f"xalign cache of {spec.task} (train) failed")
    if spec.eval_rows:
      check_nested(cache_cli.main([*common, "--split=validation", f"--examples={spec.eval_rows}"]),
                   f"xalign cache of {spec.task} (validation) failed")
    caches[name] = {"task": spec.task, "length": spec.length, "rows": spec.rows, "eval_rows": spec.eval_rows,
                    "links": spec.links, "path": os.path.relpath(folder, out)}
  return caches


# Asset files the host cannot make without seqio; the vocabulary travels with the caches and the start.
CARRIED_ASSET_FILES = ("lang_vocab.tsv", "induced_dictionary.tsv", "cooc.npz", "cooc.json")


def write_assets(grid: Any, bundle: Mapping[str, Any], out: str, work: str, tasks_file: str, host_start: str,
                 host_work: str) -> dict[str, str]:
  """`xalign assets` for each distinct objective that needs assets; the carried files go to OUT/assets/KEY."""
  from flax_xalign.cli import assets as assets_cli
  from flax_xalign.cli import gpu_run

  keys: dict[str, str] = {}
  built: dict[str, bool] = {}
  for experiment in bundle["experiments"]:
    key = experiment["objective"]
    if experiment["family"] != "debian" or experiment["name"] == "warmup":
      continue
    if key not in built:
      model_dir = os.path.join(work, "assets", key)
      shutil.rmtree(model_dir, ignore_errors=True)
      argv = gpu_run.train_argv(out, bundle, experiment, model_dir=model_dir, init_dir=host_start,
                                start_dir=host_start, steps=1)
      argv = [a for a in argv if not a.startswith("--gin.train.data=")] + [f"--gin_file={tasks_file}"]
      print(f"assets of {key}", flush=True)
      check_nested(assets_cli.main(argv), f"xalign assets for {key} failed")
      kept = [f for f in sorted(os.listdir(model_dir)) if f in CARRIED_ASSET_FILES]
      for f in kept:  # xz: the co-occurrence table's 17 MB carry as 4 (the host unpacks them, byte for byte).
        os.makedirs(os.path.join(out, "assets", key), exist_ok=True)
        with open(os.path.join(model_dir, f), "rb") as src, lzma.open(os.path.join(out, "assets", key, f + ".xz"),
                                                                      "wb", preset=6) as dst:
          shutil.copyfileobj(src, dst, 1 << 20)
      built[key] = bool(kept)
    if built[key]:
      keys[experiment["name"]] = key
  return keys


def write_suite(grid: Any, out: str, *, debian_data: str, languages: Sequence[str], host_start: str) -> None:
  """The evaluation suite every row is scored from (`evaluation.offline.suite.write_suite`)."""
  from flax_xalign.cli import gpu_run
  from flax_xalign.evaluation.offline.suite import SuiteSizes, write_suite as write
  from flax_xalign.runs import Run

  print("evaluation suite", flush=True)
  write(os.path.join(out, gpu_run.SUITE_DIR), Run.open(host_start), debian_data=debian_data,
        languages=list(languages), sizes=SuiteSizes(**grid.suite_sizes),
        progress=lambda line: print(line, flush=True))


def download_wheels(out: str) -> None:
  import subprocess

  target = os.path.join(out, "wheels")
  os.makedirs(target, exist_ok=True)
  argv = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--no-deps",
          f"--python-version={HOST_PYTHON_TAG}", "-d", target, "--platform", "manylinux2014_x86_64",
          "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", *HOST_WHEELS]
  done = subprocess.run(argv, capture_output=True, text=True, check=False)
  if done.returncode:
    raise UserError(f"pip download of the host's wheels failed ({done.stderr.strip().splitlines()[-1:]}); "
                    "build where the package index can be reached, or pass --wheels=none for a host that has "
                    "them")


RUN_SH = """#!/usr/bin/env bash
# Written by xalign gpu_bundle (grid {grid}): trains and scores the grid on this host, TF-free.
#   bash {rel}/run.sh           (from the repository root; results in $OUT, default ./gpu_out)
# BUDGET_S (default {budget:.0f}): seconds for training + scoring; PARALLEL (default 3): runs at once;
# PYTHON (default python3): the interpreter with jax, flax, optax, orbax, numpy, scipy, sentencepiece.
set -euo pipefail
py="${{PYTHON:-python3}}"
here="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
root="$(cd "$here/.." && pwd)"
site="${{TMPDIR:-/tmp}}/xalign_gpu_site"
if compgen -G "$here/wheels/*.whl" >/dev/null; then
  "$py" -m pip install --quiet --no-deps --no-index --target="$site" "$here"/wheels/*.whl
fi
export PYTHONPATH="$root:$site${{PYTHONPATH:+:$PYTHONPATH}}"
export OUT="${{OUT:-$root/gpu_out}}" JAX_COMPILATION_CACHE_DIR="${{JAX_COMPILATION_CACHE_DIR:-${{WORK:-{work}}}/jax_cache}}"
cd "$root"
exec "$py" -m flax_xalign.cli.gpu_run "$here" --out="$OUT" "$@"
"""


def build(args: argparse.Namespace) -> dict[str, Any]:
  from flax_xalign.cli.experiments import gpu_grids

  grid = gpu_grids.grid_named(args.grid)
  paths = check_paths(args, grid)
  languages = _languages(args, paths.debian_data)
  print(f"GPU bundle, grid {grid.name}: {grid.description}", flush=True)
  if grid.measured is not None:  # Refused before any work when even the estimate does not fit.
    parts = gpu_grids.estimate_bytes(grid)
    print(f"  estimated {sum(parts.values()) / MIB:.1f} MiB (from the bundle measured {grid.measured.when})",
          flush=True)
    if sum(parts.values()) > args.max_mib * MIB:
      biggest = max(parts, key=parts.get)
      raise UserError(f"the bundle would be about {sum(parts.values()) / MIB:.1f} MiB, over --max_mib="
                      f"{args.max_mib:g}; its biggest part is {biggest} ({parts[biggest] / MIB:.1f} MiB)")
  started = time.monotonic()
  with staged(paths.output) as staging:  # The old bundle is replaced only by a whole one within --max_mib.
    bundle = assemble(args, grid, paths, staging, languages=languages)
  out = paths.output
  rel = os.path.relpath(out, os.getcwd()) if out.startswith(os.getcwd()) else out
  print(f"bundle {out}: {bundle['bytes'] / MIB:.1f} MiB in {len(bundle['files'])} files, built in "
        f"{time.monotonic() - started:.0f} s "
        f"({', '.join(f'{k} {v / MIB:.1f}' for k, v in bundle['parts'].items())} MiB). On the host: bash {rel}/run.sh",
        flush=True)
  return bundle


def assemble(args: argparse.Namespace, grid: Any, paths: BuildPaths, out: str, *,
             languages: Sequence[str]) -> dict[str, Any]:
  """The bundle's every part in `out` (the staging folder, renamed to `paths.output` afterwards), bundle.json
  last; refused (UserError) as soon as it passes --max_mib."""
  from flax_xalign import fileio
  from flax_xalign.cli import gpu_run
  from flax_xalign.cli.experiments import gpu_grids

  work, host_work, debian_data = paths.work, paths.host_work, paths.debian_data
  host_start = os.path.join(host_work, "start")
  fileio.mark_new_folder(work, WORK_COMMAND, setting="--work")  # (checked: new, empty or already ours)
  fileio.mark_new_folder(host_work, HOST_WORK_COMMAND, setting="--host_work")
  budget = Budget(out, args.max_mib)

  links = bible_links(args, work)
  start = start_weights(args, grid, out, host_start, work=work, debian_data=debian_data, languages=languages,
                        links=links)
  budget.add("start")
  tasks_file = tasks_gin(os.path.join(work, "tasks.gin"), debian_data=debian_data, languages=languages, links=links,
                         vocabulary=os.path.join(host_start, "vocabulary.model"))
  caches = write_caches(grid, out, tasks_file)
  budget.add("caches")
  bundle = {
      "format": "flax_xalign.gpu_bundle", "version": 1, "grid": grid.name, "budget_s": grid.budget_s,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "start": start, "caches": caches, "work": host_work, "languages": list(languages),
      "alignment_peers": alignment_peers(links, verses=grid.suite_sizes.get("bible_pairs")),
      "common_bindings": list(gpu_grids.COMMON_BINDINGS),
      "families": {f.name: {"cache": f.cache, "batch_size": f.batch_size, "share": f.share,
                            "bindings": list(f.bindings)} for f in grid.families},
      "experiments": [_experiment_record(e, host_start) for e in grid.all_experiments()],
  }
  asset_keys = write_assets(grid, bundle, out, work, tasks_file, host_start, host_work)
  for experiment in bundle["experiments"]:
    experiment["assets"] = asset_keys.get(experiment["name"], "")
  budget.add("assets")
  write_suite(grid, out, debian_data=debian_data, languages=languages, host_start=host_start)
  budget.add(gpu_run.SUITE_DIR)
  if args.wheels == "download":
    download_wheels(out)
  budget.add("wheels")
  final = paths.output
  rel = os.path.relpath(final, os.getcwd()) if final.startswith(os.getcwd()) else final
  with open(os.path.join(out, "run.sh"), "w", encoding="utf-8") as f:
    f.write(RUN_SH.format(grid=grid.name, rel=rel, budget=grid.budget_s, work=host_work))
  os.chmod(os.path.join(out, "run.sh"), 0o755)
  budget.add("run.sh")
  bundle["parts"] = dict(budget.parts)
  bundle["bytes"] = sum(budget.parts.values())
  bundle["files"] = {os.path.relpath(os.path.join(d, f), out): os.path.getsize(os.path.join(d, f))
                     for d, _, names in os.walk(out) for f in names if f != MARKER}
  fileio.write_atomically(os.path.join(out, BUNDLE_JSON), json.dumps(bundle, indent=1, sort_keys=True))
  return bundle


def _experiment_record(e: Any, host_start: str) -> dict[str, Any]:
  bindings = list(e.bindings)
  if e.objective == "tcs":  # The encoder's embeddings after the warm-up are e5's: induce from the start.
    bindings.append(f"train.asset_options = {{'lang_vocab': {{'min_count': %LANG_VOCAB_MIN_COUNT}}, "
                    f"'induced_dictionary': {{'method': 'csls', 'knn': 10, 'refresh_every': 0, "
                    f"'source': '{host_start}'}}}}")
  return {"name": e.name, "family": e.family, "objective": e.objective, "seed": e.seed, "start": e.start,
          "gin_files": list(e.gin_files), "bindings": bindings, "cost": e.cost, "metrics": list(e.metrics)}


def _languages(args: argparse.Namespace, debian_data: str) -> list[str]:
  from flax_xalign.cli.experiments import gpu_grids
  from flax_xalign.tasks import debian as debian_tasks

  built = debian_tasks._built_languages(debian_data)
  wanted = [x for x in args.languages.split(",") if x] or [x for x in gpu_grids.DEBIAN_LANGUAGES if x in built]
  missing = [x for x in wanted if x not in built]
  if missing or not wanted:
    raise UserError(f"--debian_data {args.debian_data} has no help text for {missing or wanted} "
                    f"(it has {sorted(built)}); rebuild it with `xalign debian_data --languages=...`")
  return wanted


def main(argv: Sequence[str] | None = None) -> int:
  from flax_xalign.cli import common

  try:
    return common.main_of(parse_args, build, argv)
  except NestedInterrupt:  # (the nested command printed the one `interrupted` line; the staging folder is gone)
    return INTERRUPTED_EXIT


if __name__ == "__main__":
  sys.exit(main())
