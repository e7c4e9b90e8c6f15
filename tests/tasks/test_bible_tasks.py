"""Tests for the Bible seqio tasks (real corpus, the 8000-piece vocab)."""

import numpy as np
import pytest
import seqio

from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.data.vocab import sentencepiece as vocab
from flax_xalign.tasks import bible as bible_tasks

NAMES = ("bible_en_mlm", "bible_grc_mlm", "bible_grc_en_tlm",
         "bible_grc_en_mlm_tlm")


def test_registered_without_touching_data():
  assert set(NAMES) <= set(tasks.registered_names())
  assert tasks.languages_of("bible_en_mlm") == ("en",)
  assert tasks.languages_of("bible_grc_en_tlm") == ("en", "grc")
  assert tasks.languages_of("bible_grc_en_mlm_tlm") == ("en", "grc")
  assert tasks.get_vocabulary("bible_grc_mlm") is bible_tasks.VOCABULARY
  assert tasks.registry.language_pairs("bible_grc_en_mlm_tlm") == (
      ("grc", "en"),)
  assert tasks.registry.language_pairs("bible_en_mlm") == ()
  assert tasks.describe("bible_grc_en_mlm_tlm") == []  # Registers on import.


def test_mixture_rates_follow_alpha(bible_data_dir):
  del bible_data_dir
  mixture = seqio.get_mixture_or_task("bible_grc_en_mlm_tlm")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"bible_en_mlm": 29608 ** 0.7,
                                 "bible_grc_mlm": 6346 ** 0.7,
                                 "bible_grc_en_tlm": 6343 ** 0.7})


def test_tlm_batch_layout(bible_data_dir):
  del bible_data_dir
  provider, languages, vocabulary = tasks.resolve("bible_grc_en_tlm")
  assert vocabulary is bible_tasks.VOCABULARY
  ds = pipeline.get_dataset(
      provider, languages=languages, split="test",
      feature_lengths={"tokens": 47}, batch_size=2, seed=None, shuffle=False,
      pack=False, num_epochs=1)
  assert languages == ("en", "grc")
  row = {k: v[0] for k, v in next(ds.as_numpy_iterator()).items()}
  v = tasks.get_vocabulary("bible_grc_en_tlm")
  assert v.vocab_size == bible_tasks.BIBLE_VOCAB_SIZE
  assert v.tokenizer.id_to_piece(vocab.MASK_ID) == "<mask>"
  first = row["pair_side"] == 1
  second = row["pair_side"] == 2
  assert first.any() and second.any()
  assert set(row["lang_ids"][first]) == {2}  # grc
  assert set(row["lang_ids"][second]) == {1}  # en
  assert row["positions"][second][0] == 0
  text_a = v.decode(row["tokens"][first][1:-1].tolist())
  assert text_a.startswith("Ἀρχὴ τοῦ εὐαγγελίου")  # Mark 1:1.
  assert np.all(row["tokens"][row["segment_ids"] == 0] == 0)


def test_bible_tasks_under_another_vocabulary(bible_data_dir, tiny_corpus):
  """BibleTasks: the same corpus, another tokenizer and a normaliser; re-registrable from describe()."""
  del bible_data_dir
  spec = bible_tasks.BibleTasks(prefix="bt_other", vocabulary_path=tiny_corpus["vocab"],
                                normalize="nfd_strip_marks").register()
  names = spec.names()
  assert tasks.languages_of(names["grc_en_mlm_tlm"]) == ("en", "grc")
  assert tasks.registry.language_pairs(names["grc_en_mlm_tlm"]) == (("grc", "en"),)
  described = tasks.describe(names["grc_en_mlm_tlm"])
  assert described == [{"kind": "BibleTasks", "args": {
      "prefix": "bt_other", "vocabulary_path": tiny_corpus["vocab"], "normalize": "nfd_strip_marks"}}]
  tasks.register_described(described)  # Idempotent: the same definition again.
  provider, languages, vocabulary = tasks.resolve(names["en_mlm"])
  assert vocabulary.vocab_size == 83
  ds = pipeline.get_dataset(provider, languages=languages, split="test", feature_lengths={"tokens": 300},
                            batch_size=1, seed=None, shuffle=False, pack=False, num_epochs=1)
  row = next(ds.as_numpy_iterator())["tokens"][0]
  # Mark 1:1 through the 83-piece tiny vocabulary (it has no capitals and no "p": they become <unk>).
  assert vocabulary.decode([t for t in row.tolist() if t > 4]).startswith("his is the beginning of the gosel")
