"""`xalign cache_beam` (DirectRunner) writes the packed cache the one-process writer and the seqio shards give.

References are independent of the Beam writer: the one-process `xalign cache` (its shards byte for byte and
its manifest), and the seqio pipeline's own rows of each shard (`pipeline.get_dataset` with `shard_id`).
Apache Beam lives in its own environment (`make test-beam`, .venv-beam); the missing-Beam error is the
main environment's contract tier.
"""

import json
import os

import numpy as np
import pytest

from flax_xalign import fileio
from flax_xalign.cli import cache_beam
from flax_xalign.data.packed import beam as packed_beam
from flax_xalign.data.packed import format as format_lib

LENGTH, SEED = 19, 3


@pytest.fixture(scope="session")  # Session: it skips before the session-scoped tiny_corpus is built.
def beam():
  return pytest.importorskip("apache_beam")


def _manifest(root, split="train"):
  with open(os.path.join(root, split, format_lib.MANIFEST), encoding="utf-8") as f:
    return json.load(f)


def _cache_rows(root, split="train"):
  """Every row of the split in file order, each one tuple over the features (read with ArrayRecord)."""
  from array_record.python import array_record_module

  packed = format_lib.open_split(str(root), split)  # Sizes and sha256 of every shard checked too.
  dtype = format_lib.record_dtype(packed.manifest.features, packed.manifest.length)
  rows = []
  for path in packed.paths:
    reader = array_record_module.ArrayRecordReader(path)
    records = reader.read_all()
    reader.close()
    decoded = format_lib.decode(records, dtype)
    rows += [tuple(np.concatenate([decoded[n][i] for n in sorted(decoded)]).tolist()) for i in range(len(records))]
  return rows


def _seqio_shard_rows(task, *, shard, shards, rows, seed=SEED):
  """The first `rows` rows of seqio shard `shard` of `shards`: the trainer's stream (batch size 1) of that shard."""
  from flax_xalign.data import pipeline
  from flax_xalign.training.seqio_source import SeqioSource

  data = SeqioSource.resolve(task)
  ds = pipeline.get_dataset(data.provider, languages=data.languages, split="train", feature_lengths={"tokens": LENGTH},
                            batch_size=1, seed=seed, shuffle=True, specials=data.vocabulary_spec.specials,
                            shard_id=shard, num_shards=shards)
  out = []
  for batch in ds.take(rows).as_numpy_iterator():
    out.append(tuple(np.concatenate([batch[n][0] for n in sorted(batch)]).tolist()))
  return out


def test_one_shard_is_the_one_process_writers_cache_byte_for_byte(beam, tiny_corpus, tmp_path):
  del beam, tiny_corpus
  from flax_xalign.cli import cache as cache_cli

  flags = ["--task=tiny_mix", f"--length={LENGTH}", "--examples=45", f"--seed={SEED}", "--shard_mb=1"]
  assert cache_cli.main([*flags, f"--output={tmp_path / 'local'}"]) == 0
  assert cache_beam.main([*flags, f"--output={tmp_path / 'beam'}", "--num_shards=1", "--runner=DirectRunner"]) == 0
  local, got = _manifest(tmp_path / "local"), _manifest(tmp_path / "beam")
  assert got == local  # Shards' sizes and sha256, order, seed, vocabulary: all of it.
  assert got["order"] == {"shuffled": True, "examples": 45} and got["examples"] == 45
  for shard in local["shards"]:
    assert (tmp_path / "beam" / "train" / shard["file"]).read_bytes() == \
        (tmp_path / "local" / "train" / shard["file"]).read_bytes()
  assert sorted(os.listdir(tmp_path / "beam")) == ["train"]  # No staging folder left.


@pytest.mark.subprocess  # DirectRunner multi_processing: each Beam worker is a fresh Python.
def test_parallel_shards_are_the_seqio_shard_streams(beam, tiny_corpus, tmp_path):
  del beam, tiny_corpus
  out = tmp_path / "beam"
  # 61 rows over 2 shards: 31 from shard 0, 30 from shard 1 (xalign cache --workers=2 shares them so).
  assert cache_beam.main(["--task=tiny_mix", f"--length={LENGTH}", "--examples=61", f"--seed={SEED}",
                          f"--output={out}", "--num_shards=2", "--direct_num_workers=2",
                          "--direct_running_mode=multi_processing"]) == 0
  expected = (_seqio_shard_rows("tiny_mix", shard=0, shards=2, rows=31)
              + _seqio_shard_rows("tiny_mix", shard=1, shards=2, rows=30))
  assert _cache_rows(out) == expected
  manifest = _manifest(out)
  assert manifest["order"] == {"shuffled": True, "examples": 61, "workers": 2} and manifest["examples"] == 61
  assert [s["examples"] for s in manifest["shards"]] == [31, 30]
  assert sorted(os.listdir(out)) == ["train"] and sorted(os.listdir(out / "train")) == [
      ".xalign_written_by.json", "manifest.json", "shard-00000.array_record", "shard-00001.array_record",
      "vocabulary.model"]
  assert fileio.read_mark(out / "train")["files"] == [
      "manifest.json", "shard-00000.array_record", "shard-00001.array_record", "vocabulary.model"]


def test_an_existing_split_is_refused_and_overwrite_replaces_it(beam, tiny_corpus, tmp_path, capsys):
  del beam, tiny_corpus
  flags = ["--task=tiny_mix", f"--length={LENGTH}", "--examples=12", f"--output={tmp_path}", "--num_shards=2"]
  assert cache_beam.main(flags) == 0
  before = _manifest(tmp_path)
  assert cache_beam.main([*flags[:-1], "--num_shards=3"]) == 2
  assert "already exists" in capsys.readouterr().err
  assert _manifest(tmp_path) == before
  assert cache_beam.main([*flags[:-1], "--num_shards=3", "--overwrite"]) == 0
  assert _manifest(tmp_path)["order"]["workers"] == 3 and sorted(os.listdir(tmp_path)) == ["train"]


def test_a_workers_error_is_one_line_and_leaves_no_staging_folder(beam, tiny_corpus, tmp_path, monkeypatch,
                                                                    capsys):
  del beam, tiny_corpus
  from flax_xalign.data.packed import parallel
  from flax_xalign.errors import UserError

  def fail(data, spec, index):
    raise UserError(f"shard {index} cannot be read")

  monkeypatch.setattr(parallel, "shard_rows", fail)  # The DirectRunner's default mode runs it in-process.
  assert cache_beam.main(["--task=tiny_mix", f"--length={LENGTH}", "--examples=4", f"--output={tmp_path}",
                          "--num_shards=2"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: shard ") and err[0].endswith("cannot be read"), err
  assert os.listdir(tmp_path) == []


def test_a_remote_workers_error_relayed_as_text_is_one_line():
  relayed = RuntimeError("Pipeline failed: Traceback (most recent call last):\n  File ...\n"
                         "flax_xalign.errors.UserError: worker of shard 3: bad vocabulary [while running 'WriteShard']\n")
  assert str(packed_beam.worker_error(relayed)) == "worker of shard 3: bad vocabulary"
  assert packed_beam.worker_error(RuntimeError("killed")) is None


@pytest.fixture
def remote_root(beam, tmp_path, monkeypatch):
  """A Beam file system of scheme `cachebeamfake://` over a local folder: the code path of gs:// (renames,
  creates, deletes through `FileSystems`), run here without a cloud."""
  from apache_beam.io import localfilesystem

  root = tmp_path / "bucket"
  root.mkdir()

  class FakeRemote(localfilesystem.LocalFileSystem):
    @classmethod
    def scheme(cls):
      return "cachebeamfake"

    @staticmethod
    def _local(path):
      return os.path.join(str(root), path.split("://", 1)[1])

    def join(self, basepath, *paths):
      return "/".join([basepath.rstrip("/"), *paths])

    def create(self, path, *args, **kwargs):
      os.makedirs(os.path.dirname(self._local(path)), exist_ok=True)
      return super().create(self._local(path), *args, **kwargs)

    def exists(self, path):
      return super().exists(self._local(path))

    def rename(self, sources, destinations):
      for d in destinations:
        os.makedirs(os.path.dirname(self._local(d)), exist_ok=True)
      super().rename([self._local(p) for p in sources], [self._local(p) for p in destinations])

    def delete(self, paths):  # An object store holds no empty folders: a prefix goes with all under it.
      import shutil

      for path in map(self._local, paths):
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

  yield root
  monkeypatch.setattr(FakeRemote, "scheme", classmethod(lambda cls: "cachebeamfake-retired"))  # Unregistered.


def test_a_remote_output_commits_the_one_process_writers_split(remote_root, tiny_corpus, tmp_path, capsys):
  del tiny_corpus
  from flax_xalign.cli import cache as cache_cli

  flags = ["--task=tiny_mix", f"--length={LENGTH}", "--examples=45", f"--seed={SEED}", "--shard_mb=1"]
  assert cache_cli.main([*flags, f"--output={tmp_path / 'local'}"]) == 0
  assert cache_beam.main([*flags, "--output=cachebeamfake://cache", "--num_shards=1"]) == 0
  got = remote_root / "cache"
  assert sorted(os.listdir(got)) == ["train"]  # The staging prefix is gone.
  assert _manifest(got) == _manifest(tmp_path / "local")
  names = sorted(os.listdir(tmp_path / "local" / "train"))
  assert sorted(os.listdir(got / "train")) == names
  for name in names:
    if name != fileio.MARK:  # The mark names the writer's process and host; its files must agree.
      assert (got / "train" / name).read_bytes() == (tmp_path / "local" / "train" / name).read_bytes(), name
  assert fileio.read_mark(got / "train")["files"] == fileio.read_mark(tmp_path / "local" / "train")["files"]
  capsys.readouterr()
  assert cache_beam.main([*flags, "--output=cachebeamfake://cache", "--num_shards=1"]) == 2
  assert "already exists" in capsys.readouterr().err
  assert cache_beam.main([*flags, "--output=cachebeamfake://cache", "--overwrite"]) == 2
  assert "--overwrite of a split on cachebeamfake://" in capsys.readouterr().err


def test_a_users_folder_is_refused_before_any_work(beam, tmp_path, capsys):
  del beam
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("my notes\n")
  assert cache_beam.main(["--task=no_such_task", f"--output={mine}"]) == 2  # Refused before the task is looked up.
  assert "non-empty folder" in capsys.readouterr().err
  assert sorted(os.listdir(mine)) == ["notes.txt"] and (mine / "notes.txt").read_text() == "my notes\n"


@pytest.mark.parametrize("argv, match", [
    (["--task=t", "--output=x", "--workers=2"], "--num_shards=N"),
    (["--task=t", "--output=x", "--num_shards=0"], "--num_shards=0 must be"),
    (["--task=t", "--output=x", "--no_such_flag"], "unrecognized arguments: --no_such_flag"),
])
def test_bad_command_line_is_one_user_error(beam, argv, match, capsys):
  del beam
  try:
    code = cache_beam.main(argv)
  except SystemExit as e:  # argparse's errors (errors.ArgumentParser) exit 2 themselves.
    code = e.code
  assert code == 2
  err = capsys.readouterr().err
  assert match in err and err.count("\n") == 1, err


def test_ordered_parts_refuses_two_attempts_of_a_shard():
  files = [(1, 0, "part00001.bbb-00000.array_record", 3, 30, "s"), (0, 0, "part00000.aaa-00000.array_record", 2, 20, "t"),
           (0, 1, "part00000.aaa-00001.array_record", 1, 10, "u")]
  assert [f[2] for f in packed_beam.ordered_parts(files)] == [
      "part00000.aaa-00000.array_record", "part00000.aaa-00001.array_record", "part00001.bbb-00000.array_record"]
  with pytest.raises(Exception, match=r"shard\(s\) \[0\] twice"):
    packed_beam.ordered_parts([*files, (0, 0, "part00000.ccc-00000.array_record", 2, 20, "t")])


@pytest.mark.contract  # Needs no Beam: the main environment's contract step runs it.
def test_missing_beam_names_make_install_beam(monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(packed_beam, "beam", None)
  assert cache_beam.main(["--task=t", f"--output={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert "needs Apache Beam" in err and "make install-beam" in err and err.count("\n") == 1
  assert os.listdir(tmp_path) == []
