"""Plain seqio tasks and mixtures (registered with seqio directly) on our path.

A plain task here reads a few in-memory sentences through a
`seqio.FunctionDataSource`, tokenises them with the tiny corpus' SentencePiece
model and outputs `tokens` only: no `tokens_b`, no language features.
"""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio
import tensorflow as tf

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.data.vocab import specials
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from flax_xalign.tasks import registry
from flax_xalign.tasks import user

SENTENCES = {
    "train": ["the cat sat on the mat", "a dog ran to the big red house",
              "birds sang in the morning light", "the old river", "a stone",
              "green hills at night", "the small tree"],
    "validation": ["the red bird", "a big old dog sat", "night and day"],
}
SIZED_TRAIN = 7  # What the sized source's num_input_examples reports.
L = 19


def _sentences(split, shuffle_files, seed=None):
  del shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices({"tokens": SENTENCES[split]})


def _text_and_b(split, shuffle_files, seed=None):
  del shuffle_files, seed
  return tf.data.Dataset.from_tensor_slices({"text": SENTENCES[split]})


def _add_plain_task(name, vocabulary, num_input_examples=None):
  if name in seqio.TaskRegistry.names():
    return
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(_sentences, splits=tuple(SENTENCES),
                                      num_input_examples=num_input_examples),
      preprocessors=[functools.partial(seqio.preprocessors.tokenize,
                                       copy_pretokenized=False)],
      output_features={"tokens": seqio.Feature(vocabulary, add_eos=False)})


@pytest.fixture(scope="module")
def plain(tiny_corpus):
  """plain_en (size unknown), plain_en_sized and the seqio mixture plain_mix."""
  vocabulary = vocab_lib.LazyVocabulary(vocab_lib.FixedPath(tiny_corpus["vocab"]))
  _add_plain_task("plain_en", vocabulary)
  _add_plain_task("plain_en_sized", vocabulary,
                  num_input_examples={"train": SIZED_TRAIN, "validation": 3})
  if "plain_mix" not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add("plain_mix", [("plain_en_sized", 2.0),
                                            ("plain_en", 1.0)])
  return vocabulary


def _rows(name, languages, split="validation", **kwargs):
  provider, languages, _ = tasks.resolve(name, languages)
  args = dict(split=split, feature_lengths={"tokens": L}, batch_size=1,
              seed=None, shuffle=False, pack=False, num_epochs=1)
  args.update(kwargs)
  ds = pipeline.get_dataset(provider, languages=languages, **args)
  return [{k: v[0] for k, v in b.items()} for b in ds.as_numpy_iterator()]


def test_plain_task_resolves_and_yields_layout_with_one_language(plain):
  provider, languages, vocabulary = tasks.resolve("plain_en", ["en"])
  assert provider is seqio.TaskRegistry.get("plain_en")
  assert languages == ("en",) and vocabulary == plain
  assert tasks.get_vocabulary("plain_en") == plain
  assert tasks.task_names("plain_en") == ("plain_en",)
  rows = _rows("plain_en", ["en"])
  assert len(rows) == len(SENTENCES["validation"])
  for row, text in zip(rows, SENTENCES["validation"]):
    ids = list(plain.encode(text))
    n = len(ids) + 2
    np.testing.assert_array_equal(
        row["tokens"], [specials.PROJECT.bos] + ids + [specials.PROJECT.eos]
        + [0] * (L - n))
    np.testing.assert_array_equal(row["lang_ids"], [1] * n + [0] * (L - n))
    np.testing.assert_array_equal(row["positions"],
                                  list(range(n)) + [0] * (L - n))
    np.testing.assert_array_equal(row["segment_ids"], [1] * n + [0] * (L - n))
    assert not row["pair_side"].any()


def test_plain_mixture_trains_and_evaluates(plain):
  del plain
  provider, languages, _ = tasks.resolve("plain_mix", ["en"])
  ds = pipeline.get_dataset(provider, languages=languages, split="train",
                            feature_lengths={"tokens": 4 * L}, batch_size=4,
                            seed=0)
  batch = next(ds.as_numpy_iterator())
  assert batch["tokens"].shape == (4, 4 * L)
  assert batch["segment_ids"].max() >= 2  # Packed: several sentences a row.
  assert set(np.unique(batch["lang_ids"])) <= {0, 1}
  # The evaluation pass reads each task of the mixture once (listed order).
  assert tasks.task_names("plain_mix") == ("plain_en_sized", "plain_en")
  rows = _rows("plain_mix", ["en"])
  assert len(rows) == 2 * len(SENTENCES["validation"])


def test_languages_of_a_plain_task_must_be_given(plain):
  del plain
  with pytest.raises(errors.UserError,
                     match=r"plain seqio task.*train.languages = \['en', 'de'\]"):
    tasks.languages_of("plain_en")
  with pytest.raises(errors.UserError, match="contains plain seqio tasks"):
    tasks.resolve("plain_mix")
  assert tasks.languages_of("plain_en", ["en", "de", "en"]) == ("de", "en")
  with pytest.raises(errors.UserError, match="list of language codes"):
    tasks.languages_of("plain_en", "en")
  with pytest.raises(errors.UserError, match=r"lacks \['en'\]"):
    tasks.languages_of("bible_en_mlm", ["de"])


def test_several_languages_without_a_lang_feature_are_refused(plain):
  del plain
  with pytest.raises(errors.UserError,
                     match="lacks the feature 'lang'.*de, en"):
    _rows("plain_en", ["de", "en"])


def test_unknown_names_list_plain_seqio_names(plain):
  del plain
  with pytest.raises(errors.UserError) as info:
    tasks.resolve("plain_enn")
  message = str(info.value)
  assert "Did you mean 'plain_en'" in message
  assert "Registered directly with seqio:" in message and "plain_mix" in message


def test_alpha_rate_asks_a_plain_task_for_its_size(plain):
  del plain
  sized = seqio.TaskRegistry.get("plain_en_sized")
  assert registry.num_train_examples(sized) == SIZED_TRAIN
  assert registry.alpha_rate(sized, alpha=0.5) == pytest.approx(SIZED_TRAIN ** 0.5)
  unsized = seqio.TaskRegistry.get("plain_en")
  with pytest.raises(errors.UserError,
                     match=r"'plain_en'.*does not know.*sizes=\{'plain_en': N\}"):
    registry.num_train_examples(unsized)
  user.AlphaMixture(name="plain_alpha", tasks=("plain_en_sized", "plain_en"),
                    alpha=0.5).register()
  mixture = seqio.MixtureRegistry.get("plain_alpha")
  with pytest.raises(errors.UserError, match="explicit sizes"):
    mixture.get_rate(unsized)
  user.AlphaMixture(name="plain_alpha_sized", tasks=("plain_en_sized", "plain_en"),
                    alpha=0.5, sizes={"plain_en": 11}).register()
  mixture = seqio.MixtureRegistry.get("plain_alpha_sized")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"plain_en_sized": SIZED_TRAIN ** 0.5,
                                 "plain_en": 11 ** 0.5})
  # Plain members registered by this module: the module whose import registers them again.
  module = {"kind": "PythonModule", "args": {"module": __name__}}
  assert tasks.describe("plain_en") == [module]
  assert tasks.describe("plain_alpha_sized")[0] == module


def test_plain_tasks_with_our_features_mix_with_ours(plain, tiny_corpus):
  """Members may be plain seqio tasks; one vocabulary is still required."""
  del tiny_corpus
  for name, vocabulary in (("plain_de_full", plain),
                           ("plain_de_other_vocab",
                            seqio.SentencePieceVocabulary(plain.sentencepiece_model_file))):
    if name not in seqio.TaskRegistry.names():
      seqio.TaskRegistry.add(
          name,
          source=seqio.FunctionDataSource(_text_and_b, splits=tuple(SENTENCES),
                                          num_input_examples={"train": 7, "validation": 3}),
          preprocessors=[functools.partial(registry.tokenize_and_tag, lang="de")],
          output_features=registry.output_features(vocabulary))
  with pytest.raises(errors.UserError, match="different vocabularies"):
    user.AlphaMixture(name="plain_ours_bad", tasks=("tiny_en", "plain_de_other_vocab")).register()
  with pytest.raises(errors.UserError, match="different output features"):
    user.AlphaMixture(name="plain_ours_bad2", tasks=("tiny_en", "plain_en_sized")).register()
  with pytest.raises(errors.UserError, match="is a mixture"):
    user.AlphaMixture(name="plain_ours_bad3", tasks=("tiny_en", "plain_mix")).register()
  user.AlphaMixture(name="plain_ours", tasks=("tiny_en", "plain_de_full")).register()
  mixture = seqio.MixtureRegistry.get("plain_ours")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"tiny_en": 400 ** 0.7, "plain_de_full": 7 ** 0.7})
  with pytest.raises(errors.UserError, match="plain_de_full"):
    tasks.languages_of("plain_ours")
  rows = _rows("plain_ours", ["de", "en"])
  assert len(rows) == 60 + 3  # tiny_en validation lines + plain sentences.
  assert {int(r["lang_ids"][0]) for r in rows} == {1, 2}


def test_file_task_counts_its_non_empty_lines_without_loading(tmp_path, tiny_corpus):
  lines = ["one line", "", "  ", "two\tcolumns", "\u3000", "last line"]
  (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  (tmp_path / "b.txt").write_text("x\n\ny", encoding="utf-8")  # No final newline.
  user.TextTask(name="plain_count_text", files={"train": str(tmp_path / "*.txt")},
                lang="en", vocabulary_path=tiny_corpus["vocab"]).register()
  loader = registry._TASKS["plain_count_text"].loader  # pylint: disable=protected-access
  assert loader.num_examples("train") == 5 == len(loader("train")["text"])
  task = seqio.TaskRegistry.get("plain_count_text")
  assert registry.num_train_examples(task) == 5
  # The count checks only what it needs: a bad TSV row still counts.
  (tmp_path / "pairs.tsv").write_text("a\tb\nno tab\n\nc\td\n", encoding="utf-8")
  user.TsvBitextTask(name="plain_count_tsv", files={"train": str(tmp_path / "pairs.tsv")},
                     lang_a="de", lang_b="en", vocabulary_path=tiny_corpus["vocab"]).register()
  loader = registry._TASKS["plain_count_tsv"].loader  # pylint: disable=protected-access
  assert loader.num_examples("train") == 3
  with pytest.raises(errors.UserError, match="expected 2 tab-separated"):
    loader("train")
  (tmp_path / "empty.tsv").write_text("\n \n", encoding="utf-8")
  user.TsvBitextTask(name="plain_count_empty", files={"train": str(tmp_path / "empty.tsv")},
                     lang_a="de", lang_b="en", vocabulary_path=tiny_corpus["vocab"]).register()
  with pytest.raises(errors.UserError, match="corpus is empty"):
    registry._TASKS["plain_count_empty"].loader.num_examples("train")  # pylint: disable=protected-access


@pytest.mark.subprocess  # Only a fresh interpreter shows what importing the pipeline pulls in.
def test_pipeline_does_not_import_the_task_families():
  code = ("import sys, json; import flax_xalign.data.pipeline; "
          "print(json.dumps(sorted(m for m in sys.modules "
          "if m == 'tasks' or m.startswith(('flax_xalign.tasks', 'tasks.')))))")
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True,
                          text=True, check=False, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def _pretrain_task(tiny_corpus):
  """A task registered with seqio directly (not through our task families), and the pretrain settings."""
  from tests.testlib import tiny_encoder_config

  name = "plain_seqio_for_pretrain"
  if name not in seqio.TaskRegistry.names():
    sentences = open(tiny_corpus["files"][("en", "train")], encoding="utf-8").read().splitlines()
    vocabulary = vocab_lib.load_vocabulary(tiny_corpus["vocab"])

    def dataset_fn(split, shuffle_files, seed=None):
      del split, shuffle_files, seed
      return tf.data.Dataset.from_tensor_slices({"text": sentences})

    seqio.TaskRegistry.add(
        name, source=seqio.FunctionDataSource(dataset_fn, splits=("train",)),
        preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={"tokens": "text"}),
                       seqio.preprocessors.tokenize],
        output_features={"tokens": seqio.Feature(vocabulary, add_eos=False)})
  return dict(mixture_or_task_name=name, task_feature_lengths={"tokens": 19}, batch_size=6, train_steps=2,
              encoder=tiny_encoder_config(), objectives={"mlm": 1.0}, log_every=1, seed=1)


def test_a_run_on_a_plain_seqio_task_needs_its_languages_and_records_its_module(tmp_path, tiny_corpus):
  """The run's manifest without training (`assets_only`, the assets command's path); the slow test below trains."""
  from flax_xalign.training.pretrain import pretrain

  kwargs = _pretrain_task(tiny_corpus)
  with pytest.raises(errors.UserError, match="train.languages"):
    pretrain(model_dir=str(tmp_path / "refused"), **kwargs)
  assert not (tmp_path / "refused").exists()
  run = pretrain(model_dir=str(tmp_path / "run"), languages=["en"], assets_only=True, **kwargs)
  assert run.languages == ("en",) and run.language_pairs == ()
  assert tuple(run.task_definitions) == ({"kind": "PythonModule", "args": {"module": __name__}},)


@pytest.mark.slow  # A training run (~10 s); the test above checks the refusal and the manifest without one.
def test_pretrain_on_a_plain_seqio_task_with_languages_given(tmp_path, tiny_corpus):
  """A task registered with seqio directly trains when the run names its language."""
  import json

  from flax_xalign.errors import UserError
  from flax_xalign.runs.checkpoints import read_run_spec
  from flax_xalign.training.pretrain import pretrain

  kwargs = _pretrain_task(tiny_corpus)
  with pytest.raises(UserError, match="train.languages"):
    pretrain(model_dir=str(tmp_path / "refused"), **kwargs)
  assert not (tmp_path / "refused").exists()
  result = pretrain(model_dir=str(tmp_path / "run"), languages=["en"], **kwargs)
  assert result.last_step == 2
  _, run, _ = read_run_spec(str(tmp_path / "run"))
  assert run.languages == ("en",) and run.task_definitions == ({"kind": "PythonModule", "args": {"module": __name__}},) and run.language_pairs == ()
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2] and all(r["mlm"] > 0 for r in rows)
