"""TFDS tasks (tasks/tfds.py) and readers (data/tfds_sources.py), offline.

`tfds.testing.mock_data` replaces what the builders read with examples made
here from the builders' own feature specs (so the mapping of every field is
checked against text we know), and the data directory holds only the
metadata TFDS writes when it prepares a dataset (dataset_info.json with the
split sizes), so "prepared" and the split counts behave as with real data.
"""

import contextlib
import functools
import os

import numpy as np
import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds
import tree

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign.data.sources import tfds as tfds_sources
from flax_xalign.data.sources.readers import SentencePairExample
from flax_xalign.data.sources.readers import TaggedSentence
from flax_xalign.tasks import tfds as tfds_tasks
from flax_xalign.training.data import resolve_task
from tests.conftest import tiny_sentences

PREFIX = "tt"
ALPHA = 0.7
# Train-split sizes written into the fake metadata (what `tfds build` records).
TRAIN_SIZES = {"wiki40b/de": 1000, "wiki40b/en": 3000, "c4/multilingual": {"de": 20000, "en": 90000},
               "para_crawl/ende": 500, "ted_multi_translate": 700, "opus/medical": 64}
EVAL_SPLITS = {"xnli": ("validation", "test"), "xtreme_xnli": ("train",), "paws_x_wiki/de": ("train", "test"),
               "wikiann/de": ("train", "validation", "test"), "xtreme_pos/xtreme_pos_de": ("train", "dev", "test"),
               "tatoeba/tatoeba_de": ("train",)}
EN, DE = tiny_sentences("en", 8, 11), tiny_sentences("de", 8, 12)
XNLI_LANGS = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh")


def _write_metadata(data_dir, name, sizes):
  builder = tfds.builder(name, data_dir=str(data_dir))
  template = tfds.core.ShardedFileTemplate(data_dir=builder.data_path, dataset_name=builder.name,
                                           filetype_suffix="tfrecord")
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[n], num_bytes=0, filename_template=template)
      for split, n in sizes.items()]))
  builder.data_path.mkdir(parents=True, exist_ok=True)
  builder.info.write_to_directory(builder.data_path)


def _article(paragraphs):
  """wiki40b markup: a title, sections, each paragraph after its marker."""
  body = "".join(f"_START_SECTION_\nS\n_START_PARAGRAPH_\n{p.replace(' | ', '_NEWLINE_')}\n"
                 for p in paragraphs)
  return f"\n_START_ARTICLE_\nTitle\n{body}"


# Expected text of each task's first examples, written independently of the preprocessors.
WIKI = {"de": [[DE[0] + " | " + DE[1], DE[2]], [DE[3]]], "en": [[EN[0], EN[1] + " | " + EN[2]], [EN[3]]]}
C4 = {"de": ["\n".join(DE[:2]) + "\n\n" + DE[2], DE[3]], "en": [EN[4] + "\n  \n" + EN[5], EN[6]]}


def _examples(builder, split):
  """Python examples of one builder split, matching its feature spec."""
  name, config = builder.name, builder.builder_config.name if builder.builder_config else ""
  if name == "wiki40b":
    return [{"text": _article(p), "version_id": "1", "wikidata_id": "Q1"} for p in WIKI[config]]
  if name == "c4":
    lang = split.split("-")[0]
    return [{"text": t, "url": "u", "timestamp": "t", "content-length": "1", "content-type": "text"}
            for t in C4[lang]]
  if name in ("para_crawl", "opus"):
    return [{"de": d, "en": e} for d, e in zip(DE[:3], EN[:3])]
  if name == "ted_multi_translate":
    return [{"talk_name": "t", "translations": {"fr": "bonjour", "de": DE[4], "en": EN[4]}},
            {"talk_name": "t", "translations": {"en": EN[5], "fr": "x"}},
            {"talk_name": "t", "translations": {"de": DE[6], "en": EN[6]}}]
  if name in ("xnli", "xtreme_xnli"):
    return [{"premise": {lang: f"{lang} premise {i}" for lang in XNLI_LANGS},
             "hypothesis": {"en": f"en hyp {i}", "de": f"de hyp {i}"},
             "label": i % 3} for i in range(3)]
  if name == "paws_x_wiki":
    return [{"sentence1": f"s1 {i}", "sentence2": f"s2 {i}", "label": i % 2} for i in range(3)]
  if name == "wikiann":
    return [{"tokens": ["Angela", "Merkel", "lacht"], "tags": [1, 2, 0], "langs": ["de"] * 3,
             "spans": ["PER: Angela Merkel"]}]
  if name == "xtreme_pos":
    return [{"tokens": ["Sie", "lacht", split], "upos": [10, 15, 7]}]
  if name == "tatoeba":
    return [{"source_sentence": DE[i] + "\n", "target_sentence": EN[i] + "\n",
             "source_language": "deu", "target_language": "eng"} for i in range(4)]
  raise AssertionError(f"no fake examples for {name}")


def _fake_as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
  del decoders, read_config, shuffle_files
  examples = _examples(self, str(split))
  specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.tf_dtype),
                                self.info.features.get_tensor_info())
  datasets = [tf.data.Dataset.from_tensors(tree.map_structure_up_to(
      specs, lambda value, spec: tf.constant(np.asarray(value).tolist(), spec.dtype),
      self.info.features.encode_example(ex), specs)) for ex in examples]
  return functools.reduce(lambda a, b: a.concatenate(b), datasets)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("tfds")
  for name, size in TRAIN_SIZES.items():
    sizes = {"train": size} if isinstance(size, int) else {
        s: n for lang, train in size.items() for s, n in ((lang, train), (f"{lang}-validation", 5))}
    if name.startswith("wiki40b") or name == "ted_multi_translate":
      sizes.update(validation=5, test=5)
    _write_metadata(root, name, sizes)
  for name, splits in EVAL_SPLITS.items():
    _write_metadata(root, name, dict.fromkeys(splits, 3))
  return str(root)


@contextlib.contextmanager
def _mocked(data_dir):
  with tfds.testing.mock_data(data_dir=data_dir, as_dataset_fn=_fake_as_dataset):
    yield


@pytest.fixture(scope="module")
def spec(data_dir, toy_corpus):
  return tfds_tasks.TfdsTasks(
      prefix=PREFIX, languages=("de", "en"), vocabulary_path=str(toy_corpus[1]), data_dir=data_dir,
      bitext=("para_crawl", "ted_multi_translate", "opus/medical")).register()


def _examples_of(name, split="train"):
  task = seqio.TaskRegistry.get(name)
  ds = task.get_dataset(None, split=split, shuffle=False)
  return [{k: v.decode() if isinstance(v, bytes) else v.tolist() for k, v in ex.items()}
          for ex in ds.as_numpy_iterator()]


def _encode(name, texts):
  vocabulary = tasks.get_vocabulary(name)
  return [vocabulary.encode(t) for t in texts]


def test_registration_reads_nothing(tmp_path, toy_corpus):
  missing = tmp_path / "not_yet"
  spec = tfds_tasks.TfdsTasks(prefix="tt_lazy", languages=("de", "en", "sw"), data_dir=str(missing),
                              vocabulary_path=str(toy_corpus[1])).register()
  assert not missing.exists()
  names = set(tasks.task_names(spec.mixture_name))
  assert names == {"tt_lazy_wiki40b_de", "tt_lazy_wiki40b_en", "tt_lazy_mc4_de", "tt_lazy_mc4_en",
                   "tt_lazy_mc4_sw", "tt_lazy_para_crawl_de_en", "tt_lazy_ted_de_en"}
  assert tasks.languages_of(spec.mixture_name) == ("de", "en", "sw")
  assert tasks.registry.language_pairs(spec.mixture_name) == (("de", "en"),)
  assert spec.register() is spec  # Idempotent.


def test_bad_settings_are_user_errors(toy_corpus):
  model = str(toy_corpus[1])
  with pytest.raises(errors.UserError, match="no selected dataset has xx"):
    tfds_tasks.TfdsTasks(prefix="tt_bad", languages=("de", "xx"), vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match="not a bitext source"):
    tfds_tasks.TfdsTasks(prefix="tt_bad", languages=("de",), bitext=("wmt",), vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match="subsets medical, law"):
    tfds_tasks.TfdsTasks(prefix="tt_bad", languages=("de",), bitext=("opus/bible",),
                         vocabulary_path=model).register()


def test_monolingual_tasks_give_paragraphs_and_lines(spec, data_dir):
  with _mocked(data_dir):
    wiki_de, mc4_en = _examples_of(f"{PREFIX}_wiki40b_de"), _examples_of(f"{PREFIX}_mc4_en")
  paragraphs = [DE[0] + " " + DE[1], DE[2], DE[3]]  # _NEWLINE_ joins lines of one paragraph.
  assert [ex["tokens"] for ex in wiki_de] == _encode(spec.mixture_name, paragraphs)
  assert {(ex["lang"], ex["lang_b"]) for ex in wiki_de} == {("de", "")}
  assert all(ex["tokens_b"] == [] for ex in wiki_de + mc4_en)
  assert [ex["tokens"] for ex in mc4_en] == _encode(spec.mixture_name, [EN[4], EN[5], EN[6]])  # Blank line dropped.
  assert {ex["lang"] for ex in mc4_en} == {"en"}


@pytest.mark.parametrize("task,pairs", [
    ("para_crawl_de_en", [(DE[i], EN[i]) for i in range(3)]),
    ("opus_medical_de_en", [(DE[i], EN[i]) for i in range(3)]),
    ("ted_de_en", [(DE[4], EN[4]), (DE[6], EN[6])]),  # The talk sentence without German is skipped.
])
def test_bitext_tasks_keep_sides_apart(spec, data_dir, task, pairs):
  with _mocked(data_dir):
    examples = _examples_of(f"{PREFIX}_{task}")
  assert [ex["tokens"] for ex in examples] == _encode(spec.mixture_name, [a for a, _ in pairs])
  assert [ex["tokens_b"] for ex in examples] == _encode(spec.mixture_name, [b for _, b in pairs])
  assert {(ex["lang"], ex["lang_b"]) for ex in examples} == {("de", "en")}


def test_mixture_rates_are_n_to_the_alpha(spec, data_dir):
  sizes = {"wiki40b_de": 1000, "wiki40b_en": 3000, "mc4_de": 20000, "mc4_en": 90000,
           "para_crawl_de_en": 500, "ted_de_en": 700, "opus_medical_de_en": 64}
  weights = {f"{PREFIX}_{k}": n ** ALPHA for k, n in sizes.items()}
  total = sum(weights.values())
  with _mocked(data_dir):
    mixture = seqio.get_mixture_or_task(spec.mixture_name)
    rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert {k: r / sum(rates.values()) for k, r in rates.items()} == pytest.approx(
      {k: w / total for k, w in weights.items()})
  assert rates[f"{PREFIX}_mc4_en"] / rates[f"{PREFIX}_opus_medical_de_en"] == pytest.approx(
      (90000 / 64) ** 0.7)


def test_training_batch_from_resolve_task(spec, data_dir):
  with _mocked(data_dir):
    data = resolve_task(spec.mixture_name)
    batches = data.dataset(feature_lengths={"tokens": 13}, batch_size=3, seed=0)
    rows = [b for b, _ in zip(batches.as_numpy_iterator(), range(6))]
  assert data.languages == ("de", "en") and data.language_pairs == (("de", "en"),)
  assert [d["kind"] for d in data.definitions] == ["TfdsTasks"]
  for batch in rows:
    assert {k: v.shape for k, v in batch.items()} == {k: (3, 13) for k in batch}
    real = batch["segment_ids"] > 0
    assert set(np.unique(batch["lang_ids"][real])) <= {1, 2}
  assert any((b["pair_side"] == 2).any() for b in rows)  # Bitext rows came through.


def test_describe_reregisters(spec):
  definitions = tasks.describe(spec.mixture_name)
  assert definitions[0]["args"]["languages"] == ["de", "en"]
  tasks.register_described(definitions)  # Same definition: idempotent, no error.


def test_missing_dataset_is_one_user_error(tmp_path, toy_corpus):
  empty = tmp_path / "tfds_empty"
  empty.mkdir()
  spec = tfds_tasks.TfdsTasks(prefix="tt_missing", languages=("de",), monolingual=("wiki40b",), bitext=(),
                              data_dir=str(empty), vocabulary_path=str(toy_corpus[1])).register()
  expected = rf"wiki40b/de:1.3.0' is not prepared in .*tfds build wiki40b/de --data_dir={empty}"
  with pytest.raises(errors.UserError, match=expected):
    next(iter(seqio.TaskRegistry.get("tt_missing_wiki40b_de").get_dataset(None, split="train")))
  with pytest.raises(errors.UserError, match=expected):
    resolve_task(spec.mixture_name).dataset(feature_lengths={"tokens": 13}, batch_size=2, seed=0)
  with pytest.raises(errors.UserError, match=r"tfds build xnli --data_dir="):
    tfds_sources.load_xnli("de", data_dir=str(empty))


def test_readers_return_harness_types(data_dir):
  with _mocked(data_dir):
    xnli = tfds_sources.load_xnli("de", "test", data_dir=data_dir)
    xnli_train = tfds_sources.load_xnli("en", "train", data_dir=data_dir)
    paws = tfds_sources.load_pawsx("de", "test", data_dir=data_dir)
    ner = tfds_sources.load_wikiann("de", "validation", data_dir=data_dir)
    pos = tfds_sources.load_xtreme_pos("de", "validation", data_dir=data_dir)
    tatoeba = tfds_sources.load_tatoeba("de", data_dir=data_dir)
  assert xnli == [SentencePairExample(f"de premise {i}", f"de hyp {i}", label)
                  for i, label in enumerate(["entailment", "neutral", "contradiction"])]
  assert xnli_train[1] == SentencePairExample("en premise 1", "en hyp 1", "neutral")
  assert paws == [SentencePairExample(f"s1 {i}", f"s2 {i}", str(i % 2)) for i in range(3)]
  assert ner == [TaggedSentence(("Angela", "Merkel", "lacht"), ("B-PER", "I-PER", "O"))]
  assert pos == [TaggedSentence(("Sie", "lacht", "dev"), ("PRON", "VERB", "NOUN"))]  # validation = dev.
  assert tatoeba == [(DE[i], EN[i]) for i in range(4)] and tatoeba[0].target == EN[0]


def test_readers_refuse_unknown_languages_and_splits(data_dir):
  with pytest.raises(errors.UserError, match="XNLI has no language 'xx'"):
    tfds_sources.load_xnli("xx")
  with pytest.raises(errors.UserError, match="paws_x_wiki' has no language 'pt'"):
    tfds_sources.load_pawsx("pt")
  with _mocked(data_dir), pytest.raises(errors.UserError, match=r"no split 'validation'; it has test, train"):
    tfds_sources.load_pawsx("de", "validation", data_dir=data_dir)
  assert os.path.isdir(data_dir)


@pytest.mark.contract
def test_a_data_dir_in_a_bucket_is_read_through_the_storage_layer(gcs, data_dir, toy_corpus):
  """data_dir=gs://... (issue 46): TFDS reads its prepared metadata (split sizes: the mixture's rates) through
  etils.epath, which the storage layer points at gcsfs, so a real GCS server on 127.0.0.1 serves it; the
  records themselves are read by TensorFlow's own GCS file system, which cannot be pointed at an emulator (it
  always asks www.googleapis.com): here mock_data stands in for them, as in every test of this file."""
  from flax_xalign import storage

  for folder, _, names in os.walk(data_dir):
    for name in names:
      with open(os.path.join(folder, name), "rb") as f:
        storage.write_object("gs://bucket/tfds/" + os.path.relpath(os.path.join(folder, name), data_dir), f.read())
  spec_ = tfds_tasks.TfdsTasks(prefix="tt_gcs", languages=("de", "en"), vocabulary_path=str(toy_corpus[1]),
                               data_dir="gs://bucket/tfds", bitext=("para_crawl",)).register()
  with _mocked("gs://bucket/tfds"):
    mixture = seqio.get_mixture_or_task(spec_.mixture_name)
    rates = {t.name.removeprefix("tt_gcs_"): mixture.get_rate(t) for t in mixture.tasks}
    examples = _examples_of("tt_gcs_para_crawl_de_en")
  sizes = {"wiki40b_de": 1000, "wiki40b_en": 3000, "mc4_de": 20000, "mc4_en": 90000, "para_crawl_de_en": 500}
  assert rates == pytest.approx({k: n ** ALPHA for k, n in sizes.items()})
  assert [ex["tokens_b"] for ex in examples] == _encode(spec_.mixture_name, EN[:3])
  assert tfds_sources.split_size("para_crawl/ende", "train", "gs://bucket/tfds") == 500
  with pytest.raises(errors.UserError, match="is not prepared in gs://bucket/tfds_none"):
    tfds_sources.prepared_builder("wiki40b/de", "gs://bucket/tfds_none")
