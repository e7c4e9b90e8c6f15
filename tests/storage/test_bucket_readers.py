"""Every reader of a run and every command output, with the run in a bucket (a real GCS server on 127.0.0.1,
tests/gcs.py): eval, align, bli, retrieval, export_hf and trim read a run trained into gs:// and write their
outputs there, with the same numbers as on a local copy of the run; an output in a missing bucket is one
`error:` line before any work.

One tiny run is trained per module (2 layers, embed 24, no language embeddings and heads x head_dim = embed,
so that export_hf takes it; a unigram vocabulary, so that trim does), then copied to a local folder object by
object, asked of the server itself.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from flax_xalign import storage
from tests.hardening import harness

pytestmark = pytest.mark.contract

NAME = "readers_run"  # The run's prefix in the bucket (the session's server is shared with other modules).
URL = f"gs://bucket/{NAME}"
PAIRS = ("das haus sieht den hund\tthe house sees the dog\n"
         "der fluss läuft\tthe river runs\n"
         "grün neu haus\tgreen new house\n")
GOLD = "haus house\nsieht sees\nläuft runs\ngrün green\nfluss river\ndas the\nhund dog\nneu new\n"


def _download(gcs, prefix: str, folder: pathlib.Path) -> pathlib.Path:
  """Every object under `prefix`/ written under `folder`, as the server lists and serves them."""
  for name in gcs.objects("bucket", prefix + "/"):
    target = folder / name[len(prefix) + 1:]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gcs.read("bucket", name))
  return folder


@pytest.fixture(scope="module")
def run(gcs, tiny_corpus, tmp_path_factory):
  """{"url": the run in the bucket, "local": its local copy, "root": a scratch folder (also the cwd)}."""
  from flax_xalign.data.vocab import sentencepiece as vocab

  root = tmp_path_factory.mktemp("bucket_readers")
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(root)  # Where a URL mistaken for a local path would land (checked by every test).
    files = tiny_corpus["files"]
    text = [line for key, path in files.items() if key[0] != "de_en" for line in open(path, encoding="utf-8")]
    model = vocab.train_sentencepiece(text, vocab_size=59, model_path=root / "unigram.model", model_type="unigram")
    gin_file = harness.write_run_gin(root / "run.gin", tiny_corpus, tag="bkr", vocab=str(model),
                                     extra="EncoderConfig.num_languages = 0\nEncoderConfig.head_dim = 8\n")
    assert harness.call_main("train", harness.train_argv(gin_file, URL, "--gin.TRAIN_STEPS=2")) == 0
    local = _download(gcs, NAME, root / "local_run")
    (root / "pairs.tsv").write_text(PAIRS, encoding="utf-8")
    (root / "gold.txt").write_text(GOLD, encoding="utf-8")
    storage.write_object(f"gs://bucket/{NAME}_in/pairs.tsv", PAIRS.encode())
    yield {"url": URL, "local": str(local), "root": root}
    assert not list(root.glob("gs*")), "a local folder named after a URL was written"


def _ok(capfd, entry, argv):
  outcome = harness.run_main(capfd, entry, argv)
  assert outcome.code == 0, outcome.err[-3000:]
  return outcome


def _last_json(outcome):
  return json.loads(outcome.out.strip().splitlines()[-1])


def test_eval_reads_the_bucket_run_and_writes_eval_json_into_it(gcs, run, capfd):
  for model_dir in (run["url"], run["local"]):
    _ok(capfd, "eval", [f"--gin.MODEL_DIR='{model_dir}'", "--gin.SPLIT='validation'"])
  in_bucket = json.loads(gcs.read("bucket", f"{NAME}/eval.json"))
  assert in_bucket["step"] == 2 and in_bucket["overall"]["predictions"] > 0
  assert in_bucket == json.loads(pathlib.Path(run["local"], "eval.json").read_text())


def test_align_reads_the_bucket_run_and_input_and_writes_links_to_the_bucket(gcs, run, capfd):
  flags = ["--layer=2", "--method=sinkhorn", "--batch_size=4"]
  local_links = run["root"] / "links.txt"
  _ok(capfd, "align", [f"--model_dir={run['local']}", "--input=pairs.tsv", f"--output={local_links}", *flags])
  for source, name in (("pairs.tsv", "local_input"), (f"gs://bucket/{NAME}_in/pairs.tsv", "bucket_input")):
    out = _ok(capfd, "align", [f"--model_dir={run['url']}", f"--input={source}",
                               f"--output=gs://bucket/{NAME}_out/{name}.txt", *flags])
    assert f"wrote gs://bucket/{NAME}_out/{name}.txt" in out.out
    assert gcs.read("bucket", f"{NAME}_out/{name}.txt") == local_links.read_bytes()
  assert len(local_links.read_text().splitlines()) == 3


def test_bli_and_retrieval_read_the_bucket_run_and_write_their_outputs_there(gcs, run, capfd):
  bli = ["--src=de", "--tgt=en", "--gold=gold.txt", "--min_count=1"]
  local = _last_json(_ok(capfd, "bli", [f"--model_dir={run['local']}", *bli, "--output=dict.tsv"]))
  remote = _last_json(_ok(capfd, "bli", [f"--model_dir={run['url']}", *bli,
                                          f"--output=gs://bucket/{NAME}_out/dict.tsv"]))
  assert remote == local and remote["coverage"] > 0
  assert gcs.read("bucket", f"{NAME}_out/dict.tsv") == (run["root"] / "dict.tsv").read_bytes()

  retrieval = ["--tsv=pairs.tsv", "--src_lang=de", "--tgt_lang=en", "--layers=0,2"]
  local = _last_json(_ok(capfd, "retrieval", [f"--model_dir={run['local']}", *retrieval]))
  remote = _last_json(_ok(capfd, "retrieval", [f"--model_dir={run['url']}", *retrieval,
                                                f"--output=gs://bucket/{NAME}_out/retrieval.json"]))
  assert remote["scores"] == local["scores"] and remote["checkpoint"] == run["url"] and remote["pairs"] == 3
  assert json.loads(gcs.read("bucket", f"{NAME}_out/retrieval.json"))["scores"] == local["scores"]


def test_export_hf_writes_its_folder_into_the_bucket(gcs, run, capfd):
  local = run["root"] / "hf"
  _ok(capfd, "export_hf", [f"--model_dir={run['local']}", f"--output={local}", "--layout=xlmr"])
  _ok(capfd, "export_hf", [f"--model_dir={run['url']}", f"--output=gs://bucket/{NAME}_hf", "--layout=xlmr"])
  names = [n.split("/", 1)[1] for n in gcs.objects("bucket", f"{NAME}_hf/")]
  assert names == sorted(os.listdir(local)) and "model.safetensors" in names
  for name in names:
    data = gcs.read("bucket", f"{NAME}_hf/{name}")
    if name == "config.json":  # It names the run exported.
      ours, theirs = json.loads(data), json.loads((local / name).read_text())
      assert ours.pop("flax_xalign") == {"checkpoint": run["url"], "step": 2}
      theirs.pop("flax_xalign")
      assert ours == theirs
    else:
      assert data == (local / name).read_bytes(), name


def test_import_hf_writes_a_run_into_the_bucket_that_reads_back_as_the_local_import(gcs, run, capfd):
  """The HF folder is local (a download, a hub cache); the run it becomes may be a bucket's."""
  import numpy as np

  from flax_xalign.runs import Run

  hf = run["root"] / "hf_for_import"
  if not hf.exists():
    _ok(capfd, "export_hf", [f"--model_dir={run['local']}", f"--output={hf}", "--layout=xlmr"])
  local = run["root"] / "imported"
  for output in (str(local), f"gs://bucket/{NAME}_imported"):
    _ok(capfd, "import_hf", [f"--source={hf}", f"--output={output}"])
  assert f"{NAME}_imported/checkpoints/0/commit_success.txt" in gcs.objects("bucket", f"{NAME}_imported/")
  ours, theirs = Run.open(f"gs://bucket/{NAME}_imported"), Run.open(str(local))
  assert ours.spec.model == theirs.spec.model
  a, b = ours.params(), theirs.params()
  import jax

  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_trim_reads_the_bucket_run_and_writes_the_trimmed_run_into_the_bucket(gcs, run, capfd):
  from flax_xalign.runs import Run

  out = _last_json(_ok(capfd, "trim", [f"--model_dir={run['url']}", "--task=bkr_en", "--splits=train",
                                       f"--output=gs://bucket/{NAME}_trimmed"]))
  assert 5 < out["pieces_after"] < out["pieces_before"] == 59
  names = gcs.objects("bucket", f"{NAME}_trimmed/")
  assert f"{NAME}_trimmed/checkpoints/0/commit_success.txt" in names and f"{NAME}_trimmed/vocabulary.model" in names
  trimmed = Run.open(f"gs://bucket/{NAME}_trimmed")
  assert trimmed.spec.model.vocab_size == out["pieces_after"]
  assert trimmed.vocabulary().vocab_size == out["pieces_after"]


@pytest.mark.parametrize("entry, flags", [
    ("align", ["--input=pairs.tsv"]),
    ("bli", ["--src=de", "--tgt=en"]),
    ("retrieval", ["--tsv=pairs.tsv"]),
    ("export_hf", ["--layout=xlmr"]),
    ("trim", ["--task=bkr_en"]),
])
def test_an_output_in_a_missing_bucket_is_one_error_before_any_work(run, capfd, entry, flags):
  outcome = harness.run_main(capfd, entry, [f"--model_dir={run['url']}", *flags, "--output=gs://nosuchbucket/x"])
  harness.assert_user_error(outcome, "gs://nosuchbucket", "does not exist")
  assert not outcome.out.strip(), outcome.out  # Refused before the run was read.


def test_an_output_onto_the_bucket_runs_own_files_is_refused(run, capfd):
  outcome = harness.run_main(capfd, "align", [f"--model_dir={run['url']}/", "--input=pairs.tsv",
                                              f"--output=gs://bucket//{NAME}/config.gin"])
  harness.assert_user_error(outcome, "config.gin of the run")


def test_an_eval_report_into_a_missing_bucket_is_one_error_before_any_work(run, capfd):
  outcome = harness.run_main(capfd, "eval", [f"--gin.MODEL_DIR='{run['local']}'", "--gin.SPLIT='validation'",
                                             "--gin.evaluate.output='gs://nosuchbucket/eval.json'"])
  harness.assert_user_error(outcome, "gs://nosuchbucket", "does not exist")
  assert "accuracy" not in outcome.out and "predictions" not in outcome.out, outcome.out


def test_eflomal_reads_its_bitext_from_the_bucket_and_writes_its_links_there(gcs, run, capfd):
  local = run["root"] / "eflomal.links"
  _ok(capfd, "eflomal", [f"--input={run['root'] / 'pairs.tsv'}", f"--output={local}"])
  _ok(capfd, "eflomal", [f"--input=gs://bucket/{NAME}_in/pairs.tsv", f"--output=gs://bucket/{NAME}_out/e.links"])
  remote = gcs.read("bucket", f"{NAME}_out/e.links").decode().splitlines()  # (eflomal samples: not bit-equal)
  assert len(remote) == len(local.read_text().splitlines()) == 3
  assert all(link.count("-") == 1 for line in remote for link in line.split()) and any(remote)
  outcome = harness.run_main(capfd, "eflomal", ["--bible", f"--output_dir=gs://bucket/{NAME}_bible"])
  harness.assert_user_error(outcome, "--output_dir=gs://bucket", "local path only")
