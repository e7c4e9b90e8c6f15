"""Helpers shared by tests: the tiny encoder config, a toy corpus, directory snapshots."""

import json
import os

# The one tiny encoder of the tests. Odd, distinct sizes, and an attention
# width (heads x head_dim = 30) that differs from embed (24), so a transposed
# or confused axis fails loudly.
TINY_ENCODER = dict(num_layers=2, embed_dim=24, num_heads=3, head_dim=10, mlp_dim=40, max_positions=32,
                    num_languages=3, dropout_rate=0.1, attention_dropout_rate=0.0)


def tiny_encoder_config(**overrides):
  """An EncoderConfig of TINY_ENCODER with `overrides` applied."""
  from flax_xalign.models.config import EncoderConfig

  return EncoderConfig(**{**TINY_ENCODER, **overrides})


def tiny_encoder_gin(**overrides):
  """The same config as gin bindings (for entry-point tests)."""
  values = {**TINY_ENCODER, **overrides}
  return "\n".join(f"EncoderConfig.{k} = {v!r}" for k, v in values.items()) + "\n"


def user_mixture_gin(*, scope, en_name, pair_name, mixture_name, en_files, tsv_files, vocab, tasks=None,
                     mixture_scope=""):
  """Gin bindings for a run on user files: TextTask `en_name` (English), TsvBitextTask `pair_name` (de-en)
  and AlphaMixture `mixture_name` over `tasks` (default both), registered through `train.user_tasks`.

  `scope` prefixes the task bindings (`<scope>_en/TextTask`, `<scope>_pairs/TsvBitextTask`), so a test can
  add more (e.g. `<scope>_en/TextTask.max_line_chars`); the mixture binding is scoped by `mixture_scope`.
  """
  mixture = f"{mixture_scope}/AlphaMixture" if mixture_scope else "AlphaMixture"
  tasks = list(tasks or [en_name, pair_name])
  return "\n".join([
      f"{scope}_en/TextTask.name = '{en_name}'",
      f"{scope}_en/TextTask.files = {json.dumps(en_files)}",
      f"{scope}_en/TextTask.lang = 'en'",
      f"{scope}_en/TextTask.vocabulary_path = '{vocab}'",
      f"{scope}_pairs/TsvBitextTask.name = '{pair_name}'",
      f"{scope}_pairs/TsvBitextTask.files = {json.dumps(tsv_files)}",
      f"{scope}_pairs/TsvBitextTask.lang_a = 'de'",
      f"{scope}_pairs/TsvBitextTask.lang_b = 'en'",
      f"{scope}_pairs/TsvBitextTask.vocabulary_path = '{vocab}'",
      f"{mixture}.name = '{mixture_name}'",
      f"{mixture}.tasks = {json.dumps(tasks)}",
      f"train.user_tasks = [@{scope}_en/TextTask(), @{scope}_pairs/TsvBitextTask(), @{mixture}()]",
      f"MIXTURE_OR_TASK_NAME = '{mixture_name}'",
  ]) + "\n"


WORDS_EN = "the a house dog cat sees runs big small red green old new tree river".split()
WORDS_DE = "das ein haus hund katze sieht läuft groß klein rot grün alt neu baum fluss".split()


def sentences(rng, n):
  """n parallel (en, de) sentences drawn word by word from two aligned lists."""
  pairs = []
  for _ in range(n):
    idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(3, 9))]
    pairs.append((" ".join(WORDS_EN[i] for i in idx), " ".join(WORDS_DE[i] for i in idx)))
  return pairs


def tree_snapshot(path, *, ignore=(".lock",)):
  """{relative path: (size, mtime_ns)} of every file under `path`.

  MODEL_DIR/.lock is left out by default: every run that gets as far as taking the lock rewrites its
  owner record (and empties it on release), which is not a change to the run.
  """
  out = {}
  for dirpath, _, names in os.walk(path):
    for name in names:
      if os.path.relpath(os.path.join(dirpath, name), path) in ignore:
        continue
      full = os.path.join(dirpath, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out


def register_synthetic_afresh(language, **kwargs):
  """`tasks.synthetic.register_synthetic(language)` after forgetting other tests' tasks of the same names.

  Synthetic task names depend on the transforms only, so two test modules with other vocabulary sizes or
  overlaps would clash when pytest-xdist happens to run them in one process (the registry refuses a
  second, different definition of a name, as it should for users).
  """
  import seqio

  from flax_xalign.tasks import registry, synthetic

  for name in synthetic.names(language).values():
    for table in (registry._TASKS, registry._MIXTURES, synthetic._LANGUAGES, synthetic._SPECS):
      table.pop(name, None)
    for seqio_registry in (seqio.MixtureRegistry, seqio.TaskRegistry):
      if name in seqio_registry.names():
        seqio_registry.remove(name)
  return synthetic.register_synthetic(language, **kwargs)


def xla_flags_with_devices(count: int) -> str:
  """$XLA_FLAGS (the tests' compile settings, tests/conftest.py) plus `count` fake host CPU devices."""
  return (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}").strip()


def iterator_checkpoint_round_trip(dataset, directory, *, skip: int, count: int = 2):
  """(the `count` batches after `skip`, the `count` batches an iterator restored from a tf.train.Checkpoint
  written at that point reads): what a resumed run's data iterator must repeat."""
  import tensorflow as tf

  it = iter(dataset)
  for _ in range(skip):
    next(it)
  path = tf.train.Checkpoint(iterator=it).write(str(directory / "it"))
  expected = [next(it) for _ in range(count)]
  restored = iter(dataset)
  tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
  return expected, [next(restored) for _ in range(count)]


def read_only_folder(folder):
  """Creates `folder` so that this process cannot write in it; returns the undo, or None when it cannot.

  Mode 0555 stops anyone but root; root (CI runs as root) ignores modes, so for root the folder is an
  empty read-only tmpfs mount instead (None where mounting is not allowed).
  """
  import stat
  import subprocess

  os.makedirs(folder)
  if os.geteuid() != 0:
    os.chmod(folder, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return lambda: os.chmod(folder, stat.S_IRWXU)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", os.fspath(folder)],
                           capture_output=True, check=False)
  if mounted.returncode != 0:
    return None
  return lambda: subprocess.run(["umount", os.fspath(folder)], check=True)


def load_bench(filename: str):
  """The module bench/`filename` (bench/ is scripts, not a package), loaded afresh."""
  import importlib.util
  import pathlib

  path = pathlib.Path(__file__).resolve().parents[1] / "bench" / filename
  spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
