"""The Beam co-occurrence pipeline (DirectRunner) writes the table the local counter writes, bit for bit.

Apache Beam lives in its own environment (`make test-beam`, .venv-beam, runs the pipeline tests); the
command's errors need no Beam and are the main environment's contract tier (`make test-contract`).
"""

import collections
import json
import os
import random

import numpy as np
import pytest

from flax_xalign.cli import cooc_beam as cooc_beam_cli
from flax_xalign.data import cooc
from flax_xalign.data.cooc import beam as cooc_beam
from tests.data.cooc_reference import table_as_dict, brute_table


@pytest.fixture(scope="session")  # Session: it skips before the session-scoped toy_corpus is built.
def beam():
  return pytest.importorskip("apache_beam")


def _load(directory):
  table = cooc.load_table(str(directory))
  with open(directory / cooc.MANIFEST_FILE, encoding="utf-8") as f:
    manifest = json.load(f)
  return table, manifest


def _assert_same_table(local_dir, beam_dir):
  """indptr/indices/log_x bit-equal (dtypes included), manifests equal but for the timing field `seconds`."""
  (local, local_info), (got, got_info) = _load(local_dir), _load(beam_dir)
  for name, view in (("indptr", np.int64), ("indices", np.int32), ("log_x", np.uint32)):
    a, b = getattr(local, name), getattr(got, name)
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert np.array_equal(a.view(view), b.view(view)), name
  local_info.pop("seconds"), got_info.pop("seconds")
  assert got_info == local_info
  # np.savez stamps its zip members with a fixed date: the table file itself is byte-identical.
  assert (beam_dir / cooc.TABLE_FILE).read_bytes() == (local_dir / cooc.TABLE_FILE).read_bytes()


def _metric(result, name):
  from apache_beam.metrics.metric import MetricsFilter

  counters = result.metrics().query(MetricsFilter().with_namespace(cooc_beam.METRICS_NAMESPACE).with_name(name))
  return sum(c.committed if c.committed is not None else c.attempted for c in counters["counters"])


@pytest.fixture(scope="module")
def beam_corpus(beam, tmp_path_factory, toy_corpus):
  """Text files en/de, and tasks cb_en (text), cb_de_en (bitext) and their mixture cb_mix."""
  del beam
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("cooc_beam_corpus")
  source, model = toy_corpus
  en = [line for line in (source / "en.txt").read_text().splitlines() if line.strip()][:70]
  de = [line for line in (source / "de.txt").read_text().splitlines() if line.strip()][:45]
  pairs = [line.split("\t") for line in (source / "de_en.tsv").read_text().splitlines() if line.strip()][:30]
  # Blank and whitespace-only lines, and a CRLF line: none of them may count.
  (root / "en.txt").write_text("\n".join(en[:30]) + "\n\n  \n" + en[30] + "\r\n" + "\n".join(en[31:]) + "\n",
                               encoding="utf-8")
  (root / "de.txt").write_text("\n".join(de), encoding="utf-8")  # No final newline.
  (root / "de_en.tsv").write_text("\n".join(f"{d}\t{e}" for d, e in pairs) + "\n", encoding="utf-8")
  for task in (user.TextTask(name="cb_en", files={"train": str(root / "en.txt")}, lang="en",
                             vocabulary_path=str(model)),
               user.TsvBitextTask(name="cb_de_en", files={"train": str(root / "de_en.tsv")}, lang_a="de",
                                  lang_b="en", vocabulary_path=str(model)),
               user.AlphaMixture(name="cb_mix", tasks=("cb_en", "cb_de_en"))):
    task.register()
  return {"root": root, "model": str(model), "en": en, "de": de}


def test_task_pipeline_writes_the_local_table(beam_corpus, tmp_path):
  from flax_xalign.cli import cooc as cooc_command

  local_dir, beam_dir = tmp_path / "local", tmp_path / "beam"
  cooc_command.main(["--task=cb_mix", "--window=2", f"--output={local_dir}"])
  result = cooc_beam_cli.run(["--task=cb_mix", "--window=2", f"--output={beam_dir}", "--shards=3", "--buckets=5",
                          "--runner=DirectRunner"])
  _assert_same_table(local_dir, beam_dir)
  # Two members x 3 shards, each counted apart; their row buckets merged by key (more parts than keys).
  assert _metric(result, "shards") == 6
  assert _metric(result, "bucket_parts") > 5
  info = _load(beam_dir)[1]
  local_source = _load(local_dir)[1]["source"]  # Both record the vocabulary the ids come from.
  assert info["source"] == {"task": "cb_mix", "split": "train", "examples": 100, "skipped_sides": 0,
                            "vocabulary_sha256": local_source["vocabulary_sha256"]}
  assert len(local_source["vocabulary_sha256"]) == 64
  assert info["sequences"] == 130


def test_text_pipeline_matches_the_local_table_and_the_definitions(beam_corpus, tmp_path):
  import sentencepiece as spm

  from flax_xalign.cli import cooc as cooc_command

  root, model = beam_corpus["root"], beam_corpus["model"]
  texts = [f"--text={root / 'en.txt'}:en", f"--text={root / 'de.txt'}:de"]
  local_dir, beam_dir = tmp_path / "local", tmp_path / "beam"
  assert cooc_command.main([*texts, f"--vocabulary={model}", "--window=3", f"--output={local_dir}"]) == 0
  result = cooc_beam_cli.run([*texts, f"--vocabulary={model}", "--window=3", f"--output={beam_dir}",
                          "--lines_per_shard=16", "--buckets=7"])
  _assert_same_table(local_dir, beam_dir)  # (the vocabulary's sha256 in both manifests' source included)
  assert cooc.load_table(str(beam_dir)).info["source"][cooc.VOCABULARY_KEY]
  assert _metric(result, "shards") >= 2
  sp = spm.SentencePieceProcessor(model_file=model)
  sequences = [(1, sp.encode(t.strip())) for t in beam_corpus["en"]] + [(0, sp.encode(t.strip()))
                                                                          for t in beam_corpus["de"]]
  got, expected = table_as_dict(cooc.load_table(str(beam_dir))), brute_table(sequences, ("de", "en"), 3)[0]
  assert got.keys() == expected.keys() and all(got[k] == expected[k] for k in expected)


def test_split_rows_and_merge_are_exact(beam):
  del beam
  rng = random.Random(3)
  sequences = [(rng.randrange(2), np.array([rng.randrange(11) for _ in range(rng.randrange(9))], np.int32))
               for _ in range(60)]
  whole = cooc.count_sequences(sequences, languages=("de", "en"), vocab_size=11, window=2)
  shards = [cooc.count_sequences(sequences[i::4], languages=("de", "en"), vocab_size=11, window=2) for i in range(4)]
  by_bucket = collections.defaultdict(list)
  for shard in shards:
    for bucket, part in cooc_beam.split_rows(shard, 3):
      rows = (part.keys // 11) % 11
      assert (rows % 3 == bucket).all() and (np.diff(part.keys) > 0).all()
      by_bucket[bucket].append(part)
  merged = [cooc_beam.merge_counts(parts[::-1]) for _, parts in sorted(by_bucket.items(), reverse=True)]
  totals = cooc_beam.sum_totals([cooc_beam.Totals(tokens=s.tokens, sequences=s.sequences) for s in shards],
                                languages=2)
  got = cooc_beam.assemble(merged, totals, cooc_beam.Settings(languages=("de", "en"), vocab_size=11, window=2))
  for name in ("keys", "counts", "tokens"):
    assert np.array_equal(getattr(got, name), getattr(whole, name)), name
  assert got.sequences == whole.sequences == 60


@pytest.mark.contract  # The command's refusals need no Beam: they run in the main environment's contract step.
@pytest.mark.parametrize("argv, match", [
    (["--output=x"], "either a task"),
    (["--task=t", "--text=a:en", "--output=x"], "either a task"),
    (["--task=t"], "--output=DIR is missing"),
    (["--task=t", "--output=x", "--window=0"], "--window must be"),
    (["--task=t", "--output=x", "--shards=0"], "--shards must be"),
    (["--task=t", "--output=x", "--buckets=70000"], "--buckets must be"),
    (["--text=a.txt:en", "--output=x"], "needs --vocabulary"),
])
def test_bad_command_line_is_one_user_error(argv, match, capsys):
  assert cooc_beam_cli.main(argv) == 2
  assert match in capsys.readouterr().err


@pytest.mark.contract
def test_a_dangerous_local_output_is_refused_before_the_pipeline(tmp_path, capsys):
  # The local command's rules, checked before Beam is needed: never into a user's non-empty folder, never
  # onto an input.
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("my notes\n")
  data = tmp_path / "data"
  data.mkdir()
  (data / "en.txt").write_text("a line\n")
  (data / "spm.model").write_bytes(b"not read before the checks")
  text = f"--text={data / 'en.txt'}:en"
  for output, match in ((mine, "non-empty folder"), (data, "holds the --text")):
    assert cooc_beam_cli.main([text, f"--vocabulary={data / 'spm.model'}", f"--output={output}"]) == 2
    assert match in capsys.readouterr().err
  assert (mine / "notes.txt").read_text() == "my notes\n" and sorted(os.listdir(mine)) == ["notes.txt"]


@pytest.mark.contract
def test_missing_beam_names_the_extra(monkeypatch, capsys, tmp_path):
  monkeypatch.setattr(cooc_beam, "beam", None)
  assert cooc_beam_cli.main(["--task=t", f"--output={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert "needs Apache Beam" in err and ".[beam]" in err and err.count("\n") == 1
