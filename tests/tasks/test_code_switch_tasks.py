"""CodeSwitchedTask (tasks/code_switch.py): registration, tokens, errors, gin training and re-registration."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign import train as train_main
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from flax_xalign.runs import checkpoints as run_checkpoints
from flax_xalign.tasks import code_switch
from flax_xalign.tasks import user

from tests import testlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def de_en_dictionary(tmp_path_factory):
  """The tiny corpus' full German->English word dictionary (MUSE format)."""
  path = tmp_path_factory.mktemp("cs_dictionary") / "de-en.txt"
  lines = ["# the tiny corpus' word lists, aligned by position"]
  lines += [f"{de} {en}" for de, en in zip(testlib.WORDS_DE, testlib.WORDS_EN)]
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def _examples(name, split="train"):
  ds = seqio.get_mixture_or_task(name).get_dataset(None, split=split, shuffle=False, num_epochs=1)
  return list(ds.as_numpy_iterator())


def open_text(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _lines(path):
  return [line.strip() for line in open_text(path).splitlines() if line.strip()]


def test_rate_one_turns_german_into_the_parallel_english(tiny_corpus, de_en_dictionary):
  spec = code_switch.CodeSwitchedTask(name="cs_de_all", source="tiny_de", dictionary=de_en_dictionary,
                                      rate=1.0)
  assert spec.register() is spec and spec.register() is spec  # Idempotent.
  assert tasks.languages_of("cs_de_all") == ("de",)
  assert tasks.get_vocabulary("cs_de_all") == tasks.get_vocabulary("tiny_de")
  vocabulary = vocab_lib.load_vocabulary(tiny_corpus["vocab"])
  for split in ("train", "validation"):
    english = _lines(tiny_corpus["files"][("en", split)])
    examples = _examples("cs_de_all", split)
    assert len(examples) == len(english)
    for ex, sentence in zip(examples, english):
      assert ex["tokens"].tolist() == vocabulary.encode(sentence)
      assert ex["lang"] == b"de" and ex["lang_b"] == b"" and ex["tokens_b"].size == 0


def test_partial_rate_switches_words_to_their_translations(tiny_corpus, de_en_dictionary):
  code_switch.CodeSwitchedTask(name="cs_de_half", source="tiny_de", dictionary=de_en_dictionary,
                               rate=0.5, seed=3).register()
  vocabulary = vocab_lib.load_vocabulary(tiny_corpus["vocab"])
  german = _lines(tiny_corpus["files"][("de", "train")])
  english = _lines(tiny_corpus["files"][("en", "train")])
  switched = total = 0
  for ex, de, en in zip(_examples("cs_de_half"), german, english):
    # Decode by re-encoding every candidate: word i is German or its English translation.
    candidates = [vocabulary.encode(" ".join(w)) for w in _choices(de.split(), en.split())]
    assert ex["tokens"].tolist() in candidates, de
    chosen = _choices(de.split(), en.split())[candidates.index(ex["tokens"].tolist())]
    switched += sum(c != d for c, d in zip(chosen, de.split()))
    total += len(de.split())
  assert 0.4 < switched / total < 0.6, switched / total
  # Unshuffled and shuffled builds switch each sentence the same way.
  first = {tuple(ex["tokens"]) for ex in _examples("cs_de_half")}
  ds = seqio.get_mixture_or_task("cs_de_half").get_dataset(None, split="train", shuffle=True, seed=5,
                                                           num_epochs=1)
  assert {tuple(ex["tokens"]) for ex in ds.as_numpy_iterator()} == first


def _choices(de_words, en_words, limit=4096):
  """Every mix of German and English words of a parallel sentence (short sentences only)."""
  out = [[]]
  for d, e in zip(de_words, en_words):
    out = [o + [w] for o in out for w in dict.fromkeys((d, e))]
    assert len(out) <= limit
  return out


def test_clear_errors(tiny_corpus, de_en_dictionary, tmp_path):
  def make(**kw):
    defaults = {"name": "cs_bad", "source": "tiny_de", "dictionary": de_en_dictionary}
    return code_switch.CodeSwitchedTask(**{**defaults, **kw}).register()

  with pytest.raises(errors.UserError, match=r"Unknown task or mixture 'tiny_dee'.*Did you mean 'tiny_de'"):
    make(source="tiny_dee")
  with pytest.raises(errors.UserError, match=r"source 'tiny_de_en' is a bitext task \(de-en\), not monolingual"):
    make(source="tiny_de_en")
  with pytest.raises(errors.UserError, match=r"source 'tiny_mix' is a mixture"):
    make(source="tiny_mix")
  with pytest.raises(errors.UserError, match=r"dictionary file .*none.txt does not exist"):
    make(dictionary=str(tmp_path / "none.txt"))
  for rate in (1.5, -0.01, "0.1"):
    with pytest.raises(errors.UserError, match=r"CodeSwitchedTask 'cs_bad': rate=.* must be a number in \[0, 1\]"):
      make(rate=rate)
  with pytest.raises(errors.UserError, match="seed=0.5 must be an integer"):
    make(seed=0.5)
  plain = seqio.Task("cs_plain_source", source=seqio.FunctionDataSource(lambda split, shuffle_files: None,
                                                                         splits=["train"]),
                     output_features={})
  seqio.TaskRegistry.add_provider("cs_plain_source", plain)
  try:
    with pytest.raises(errors.UserError, match="plain seqio task, which exposes only token ids"):
      make(source="cs_plain_source")
  finally:
    seqio.TaskRegistry.remove("cs_plain_source")
  code_switch.CodeSwitchedTask(name="cs_de_once", source="tiny_de", dictionary=de_en_dictionary).register()
  with pytest.raises(errors.UserError, match="different definition"):
    code_switch.CodeSwitchedTask(name="cs_de_once", source="tiny_de", dictionary=de_en_dictionary,
                                 rate=0.3).register()
  bad = tmp_path / "bad.txt"
  bad.write_text("haus house\nzu viele wörter\n", encoding="utf-8")
  code_switch.CodeSwitchedTask(name="cs_de_baddict", source="tiny_de", dictionary=str(bad)).register()
  with pytest.raises(errors.UserError, match=r"bad.txt:2: expected 'source target'"):
    _examples("cs_de_baddict")


def test_describe_lists_the_source_first(tiny_corpus, de_en_dictionary):
  code_switch.CodeSwitchedTask(name="cs_de_all", source="tiny_de", dictionary=de_en_dictionary,
                               rate=1.0).register()
  user.AlphaMixture(name="cs_desc_mix", tasks=("cs_de_all", "tiny_de", "tiny_de_en")).register()
  definitions = tasks.describe("cs_desc_mix")
  assert [(d["kind"], d["args"]["name"]) for d in definitions] == [
      ("TextTask", "tiny_de"), ("CodeSwitchedTask", "cs_de_all"), ("TsvBitextTask", "tiny_de_en"),
      ("AlphaMixture", "cs_desc_mix")]
  assert definitions[1]["args"] == {"name": "cs_de_all", "source": "tiny_de", "dictionary": de_en_dictionary,
                                    "rate": 1.0, "seed": 0, "lowercase": True}
  tasks.register_described(json.loads(json.dumps(definitions)))  # Same process: a no-op.
  code_switch.CodeSwitchedTask(name="cs_on_bible", source="bible_en_mlm", dictionary=de_en_dictionary).register()
  assert [d["kind"] for d in tasks.describe("cs_on_bible")] == ["CodeSwitchedTask"]  # Embedded source.


_FRESH_PROCESS = """
import json, sys
from tests import conftest  # Maps flax_xalign.tasks to tasks/ when not installed.
import seqio
from flax_xalign import tasks
definitions, name = json.loads(sys.stdin.read())
tasks.register_described(definitions)
tasks.register_described(definitions)  # Idempotent.
ds = seqio.get_mixture_or_task(name).get_dataset(None, split="train", shuffle=False, num_epochs=1)
print(json.dumps({"languages": tasks.languages_of(name), "described": tasks.describe(name),
                  "tokens": [ex["tokens"].tolist() for ex in ds.take(40).as_numpy_iterator()]}))
"""


def _gin_file(tmp_path, corpus, dictionary):
  tag = tmp_path.name.replace("-", "_")[-40:]
  files = {s: corpus["files"][("de", s)] for s in ("train", "validation")}
  text = f"""
include 'runs/pretrain.gin'
{testlib.tiny_encoder_gin()}
CODE_SWITCH_DICTIONARY = '{dictionary}'
cs_de/TextTask.name = '{tag}_de'
cs_de/TextTask.files = {json.dumps(files)}
cs_de/TextTask.lang = 'de'
cs_de/TextTask.vocabulary_path = '{corpus["vocab"]}'
CodeSwitchedTask.name = '{tag}_de_cs'
CodeSwitchedTask.source = '{tag}_de'
CodeSwitchedTask.dictionary = %CODE_SWITCH_DICTIONARY
CodeSwitchedTask.rate = 0.5
CodeSwitchedTask.seed = 1
AlphaMixture.name = '{tag}_mix'
AlphaMixture.tasks = ['{tag}_de_cs', '{tag}_de', 'tiny_de_en']
train.user_tasks = [@cs_de/TextTask(), @CodeSwitchedTask(), @AlphaMixture()]
MIXTURE_OR_TASK_NAME = '{tag}_mix'
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 1
CHECKPOINT_EVERY = 2
EVAL_EVERY = 2
train.eval_batches = 1
"""
  path = tmp_path / "run.gin"
  path.write_text(text)
  return str(path), tag


def test_the_iterator_checkpoint_restores_the_code_switched_stream(tiny_corpus, de_en_dictionary, tmp_path):
  """What a resumed run relies on (the slow gin run below resumes for real): the data iterator, whose map
  holds the dictionary's lookup table, is checkpointed and restored mid-stream."""
  from flax_xalign.data import pipeline

  code_switch.CodeSwitchedTask(name="cs_de_iter", source="tiny_de", dictionary=de_en_dictionary, rate=0.5,
                               seed=1).register()
  user.AlphaMixture(name="cs_iter_mix", tasks=("cs_de_iter", "tiny_de_en")).register()
  provider, languages, _ = tasks.resolve("cs_iter_mix")
  ds = pipeline.get_dataset(provider, languages=languages, split="train", feature_lengths={"tokens": 19},
                            batch_size=6, seed=2)
  expected, restored = testlib.iterator_checkpoint_round_trip(ds, tmp_path, skip=3)
  for want, got in zip(expected, restored):
    assert set(want) == set(got)
    for key in want:
      np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)


def _in_a_fresh_process(definitions, task_name):
  """_FRESH_PROCESS's answer for `task_name` after re-registering `definitions` in a new interpreter."""
  result = subprocess.run(
      [sys.executable, "-c", _FRESH_PROCESS], input=json.dumps([definitions, task_name]), cwd="/",
      env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, check=False, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess  # A fresh interpreter is the point: nothing registered but what the definitions say.
def test_a_fresh_process_re_registers_the_described_tasks_and_switches_the_same_words(
    tiny_corpus, de_en_dictionary):
  code_switch.CodeSwitchedTask(name="cs_de_fresh", source="tiny_de", dictionary=de_en_dictionary, rate=0.5,
                               seed=1).register()
  user.AlphaMixture(name="cs_fresh_mix", tasks=("cs_de_fresh", "tiny_de", "tiny_de_en")).register()
  definitions = json.loads(json.dumps(tasks.describe("cs_fresh_mix")))  # As the run manifest keeps them.
  expected = [ex["tokens"].tolist() for ex in _examples("cs_de_fresh")[:40]]
  assert expected != [ex["tokens"].tolist() for ex in _examples("tiny_de")[:40]]
  fresh = _in_a_fresh_process(definitions, "cs_de_fresh")
  assert fresh["languages"] == ["de"]
  assert fresh["described"] == definitions[:2]
  assert fresh["tokens"] == expected  # Same switches in another process.


# Two training runs through the entry point and a fresh process (~50 s); the two tests above check the
# iterator checkpoint and the re-registration without training.
@pytest.mark.slow
def test_gin_training_run_and_manifest_reregistration(tmp_path, tiny_corpus, de_en_dictionary, capsys):
  dictionary = tmp_path / "de-en.txt"  # A file of its own: read (and reported) in this run.
  dictionary.write_text(open_text(de_en_dictionary), encoding="utf-8")
  gin_file, tag = _gin_file(tmp_path, tiny_corpus, str(dictionary))
  model_dir = tmp_path / "model"
  code = train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=2"])
  out, err = capsys.readouterr()
  assert code == 0, err[-3000:]
  assert "step 2/2" in out
  assert f"dictionary {dictionary}: 15 pairs over 15 source words" in out
  rows = [json.loads(line) for line in open_text(model_dir / "metrics.jsonl").splitlines()]
  assert any("eval_loss" in r for r in rows) and all(r["loss"] > 0 for r in rows if "loss" in r)
  # Resuming restores the data iterator, whose map holds the dictionary's lookup table.
  code = train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", "--gin.TRAIN_STEPS=4"])
  out, err = capsys.readouterr()
  assert code == 0 and "resumed from" in out and "step 4/4" in out, err[-3000:]

  run, _ = run_checkpoints.read_run_at(str(model_dir), 2)
  definitions = [dict(d) for d in run.task_definitions]
  assert [(d["kind"], d["args"]["name"]) for d in definitions] == [
      ("TextTask", f"{tag}_de"), ("CodeSwitchedTask", f"{tag}_de_cs"), ("TsvBitextTask", "tiny_de_en"),
      ("AlphaMixture", f"{tag}_mix")]
  assert run.languages == ("de", "en")
  expected = [ex["tokens"].tolist() for ex in _examples(f"{tag}_de_cs")[:40]]
  assert expected != [ex["tokens"].tolist() for ex in _examples(f"{tag}_de")[:40]]
  fresh = _in_a_fresh_process(definitions, f"{tag}_de_cs")
  assert fresh["languages"] == ["de"]
  assert fresh["described"] == definitions[:2]
  assert fresh["tokens"] == expected  # Same switches in another process.


def test_example_gin_file_registers_its_code_switched_mixture(tmp_path):
  import gin

  from flax_xalign.cli import configurables
  from flax_xalign.cli import gin_cli

  dictionary = tmp_path / "grc-en.txt"
  dictionary.write_text("λόγος word\nθεὸς god\n", encoding="utf-8")
  configurables.register()
  args = gin_cli.parse_args(["--gin_file=experiments/code_switched_mixture.gin", "--gin.MODEL_DIR='m'",
                             f"--gin.CODE_SWITCH_DICTIONARY='{dictionary}'"], description="")
  try:
    gin_cli.parse_gin(args)
    references = gin.query_parameter("train.user_tasks")
    assert [r.configurable.name for r in references] == ["CodeSwitchedTask", "AlphaMixture"]
    task = gin.get_configurable("flax_xalign.CodeSwitchedTask")()
    mixture = gin.get_configurable("flax_xalign.AlphaMixture")()
  finally:
    gin.clear_config()
  assert task == code_switch.CodeSwitchedTask(name="bible_grc_cs_mlm", source="bible_grc_mlm",
                                              dictionary=str(dictionary), rate=0.15)
  task.register()
  mixture.register()
  assert tasks.languages_of("bible_grc_cs_en_mix") == ("en", "grc")
  assert tasks.languages_of("bible_grc_cs_mlm") == ("grc",)
  assert [d["kind"] for d in tasks.describe("bible_grc_cs_en_mix")] == ["CodeSwitchedTask", "AlphaMixture"]
