"""The vocabulary asset for both kinds: SentencePiece model and WordPiece vocab.txt.

Each kind is built, saved, loaded, fingerprinted and checked against the run
manifest; an edited byte or the other casing is refused; the manifest's
vocabulary record survives the RunSpec JSON round trip; and
`load_run_vocabulary` gives back a vocabulary that tokenises as the original.
"""

import hashlib
import os

import pytest

from flax_xalign.assets import check_fingerprint
from flax_xalign.assets.vocabulary import VocabularyAsset, load_run_vocabulary, spec_of
from flax_xalign.data.vocab.specials import SpecialTokens, special_tokens_of
from flax_xalign.data.vocab.wordpiece import WordPieceVocabulary
from flax_xalign.errors import UserError
from flax_xalign.run_spec import RunSpec, VocabularySpec
from tests.testlib import tiny_encoder_config

TEXT = "the cat sat on a mat and the dog ran to the big red house"


def _wordpiece_bytes() -> bytes:
  """A 70-token uncased vocab.txt: reserved block, specials, words, letters."""
  tokens = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused2]"]
  tokens += ["the", "cat", "dog", "house", "big", "red", "##s", "##ed", ".", ","]
  tokens += list("abcdefghijklmnopqrstuvwxyz") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyz"]
  return ("\n".join(tokens) + "\n").encode("utf-8")


@pytest.fixture(scope="module")
def sentencepiece(toy_corpus):
  import seqio

  _, model = toy_corpus
  return seqio.SentencePieceVocabulary(str(model), extra_ids=0)


@pytest.fixture(scope="module")
def wordpiece():
  return WordPieceVocabulary(_wordpiece_bytes(), lower_case=True)


def _run(vocabulary) -> RunSpec:
  spec = spec_of(vocabulary)
  return RunSpec(task="t", languages=("en",), task_feature_lengths={"tokens": 19}, vocabulary=spec,
                 model=tiny_encoder_config(vocab_size=spec.size), objectives={"mlm": 1.0}, task_definitions=None)


def _sha256(path) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


# ------------------------------------------------------------------ specs


def test_spec_of_sentencepiece_is_unchanged(sentencepiece, toy_corpus):
  spec = spec_of(sentencepiece)
  assert (spec.file, spec.kind, spec.lower_case, spec.factor) == ("vocabulary.model", "sentencepiece", False, 1)
  assert spec.sha256 == _sha256(toy_corpus[1])
  assert spec.size == spec.pieces == 61 and spec.specials == special_tokens_of(sentencepiece)


def test_spec_of_wordpiece(wordpiece):
  spec = spec_of(wordpiece)
  assert (spec.file, spec.kind, spec.lower_case, spec.factor) == ("vocabulary.txt", "wordpiece", True, 1)
  assert spec.sha256 == hashlib.sha256(_wordpiece_bytes()).hexdigest()
  assert spec.size == spec.pieces == 70
  assert spec.specials == SpecialTokens(pad=0, unk=3, bos=4, eos=5, mask=6, first_regular=8)


def test_wordpiece_spec_json_round_trip_through_the_run_manifest(wordpiece):
  run = _run(wordpiece)
  data = run.to_json()
  assert data["vocabulary"]["kind"] == "wordpiece" and data["vocabulary"]["lower_case"] is True
  assert RunSpec.from_json(data) == run
  fingerprint = run.vocabulary.fingerprint()
  assert (fingerprint["kind"], fingerprint["lower_case"]) == ("wordpiece", True)
  cased = run.vocabulary.__class__(**{**run.vocabulary.__dict__, "lower_case": False})
  assert cased.fingerprint() != fingerprint


def test_manifests_written_before_wordpiece_still_load(sentencepiece):
  data = _run(sentencepiece).to_json()
  del data["vocabulary"]["kind"], data["vocabulary"]["lower_case"]
  spec = RunSpec.from_json(data).vocabulary
  assert (spec.kind, spec.lower_case) == ("sentencepiece", False)
  assert RunSpec.from_json(data) == _run(sentencepiece)
  with pytest.raises(UserError, match="'bpe' vocabulary"):
    VocabularySpec(file="x", sha256="0" * 64, size=5, pieces=5, kind="bpe")


# ------------------------------------------------------------------ the asset


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_asset_round_trip(kind, sentencepiece, wordpiece, tmp_path):
  vocabulary = {"sentencepiece": sentencepiece, "wordpiece": wordpiece}[kind]
  filename = {"sentencepiece": "vocabulary.model", "wordpiece": "vocabulary.txt"}[kind]
  run = _run(vocabulary)
  asset = VocabularyAsset(vocabulary)
  assert asset.files == (filename,) and not asset.exists_in(str(tmp_path))
  value = asset.build(run)
  asset.save(str(tmp_path), value)
  assert sorted(os.listdir(tmp_path)) == [filename] and asset.exists_in(str(tmp_path))
  path = tmp_path / filename
  # The file is the vocabulary's own bytes; its plain sha256 is the manifest's.
  assert path.read_bytes() == (vocabulary.sp_model if kind == "sentencepiece" else _wordpiece_bytes())
  assert _sha256(path) == run.vocabulary.sha256
  loaded = asset.load(str(tmp_path))
  assert asset.fingerprint(loaded) == asset.fingerprint(value)
  asset.check(loaded, run)
  if kind == "sentencepiece":  # Unchanged: version and the plain file hash, nothing else.
    assert asset.fingerprint(value) == {"version": 1, "sha256": run.vocabulary.sha256}
  else:
    assert asset.fingerprint(value) == {"version": 1, "sha256": run.vocabulary.sha256, "kind": "wordpiece",
                                        "lower_case": True}
  assert VocabularyAsset.for_spec(run.vocabulary).fingerprint(loaded) == asset.fingerprint(value)
  assert asset.describe(loaded).startswith("vocabulary: ")

  # One edited byte: another fingerprint, refused by check and by the manifest's fingerprint.
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 1
  path.write_bytes(bytes(data))
  edited = asset.load(str(tmp_path))
  assert asset.fingerprint(edited) != asset.fingerprint(value)
  with pytest.raises(UserError, match=f"vocabulary file \\({filename}\\) is not the task's"):
    asset.check(edited, run)
  with pytest.raises(UserError, match="is not the one the run manifest records"):
    check_fingerprint(asset, edited, asset.fingerprint(value), where=str(tmp_path))


def test_the_two_kinds_do_not_see_each_others_files(sentencepiece, wordpiece, tmp_path):
  VocabularyAsset(wordpiece).save(str(tmp_path), VocabularyAsset(wordpiece).build(_run(wordpiece)))
  assert VocabularyAsset(wordpiece).exists_in(str(tmp_path))
  assert not VocabularyAsset(sentencepiece).exists_in(str(tmp_path))
  assert not VocabularyAsset().exists_in(str(tmp_path))  # The default is SentencePiece.
  loaded = VocabularyAsset(wordpiece).load(str(tmp_path))
  with pytest.raises(UserError, match="not a WordPiece vocab.txt"):
    VocabularyAsset(wordpiece).check(loaded, _run(sentencepiece))


def test_wordpiece_casing_is_part_of_the_asset(wordpiece, tmp_path):
  run = _run(wordpiece)
  asset = VocabularyAsset(wordpiece)
  value = asset.build(run)
  asset.save(str(tmp_path), value)
  cased = VocabularyAsset(kind="wordpiece", lower_case=False)
  assert cased.files == asset.files
  loaded = cased.load(str(tmp_path))
  assert cased.fingerprint(loaded)["sha256"] == asset.fingerprint(value)["sha256"]
  assert cased.fingerprint(loaded) != asset.fingerprint(value)
  with pytest.raises(UserError, match="lower_case=False"):
    cased.check(loaded, run)
  with pytest.raises(UserError, match="is not the one the run manifest records"):
    check_fingerprint(cased, loaded, asset.fingerprint(value), where=str(tmp_path))
  with pytest.raises(ValueError, match="contradicts"):
    VocabularyAsset(wordpiece, lower_case=False)
  with pytest.raises(ValueError, match="WordPiece vocabularies only"):
    VocabularyAsset(kind="sentencepiece", lower_case=True)


# ------------------------------------------------------------------ load_run_vocabulary


@pytest.mark.parametrize("kind", ["sentencepiece", "wordpiece"])
def test_load_run_vocabulary_gives_a_working_vocabulary(kind, sentencepiece, wordpiece, tmp_path):
  import tensorflow as tf

  vocabulary = {"sentencepiece": sentencepiece, "wordpiece": wordpiece}[kind]
  run = _run(vocabulary)
  asset = VocabularyAsset(vocabulary)
  asset.save(str(tmp_path), asset.build(run))
  loaded = load_run_vocabulary(str(tmp_path), RunSpec.from_json(run.to_json()).vocabulary)
  assert isinstance(loaded, type(vocabulary))  # A SentencePiece one reads special spellings as text.
  assert loaded.vocab_size == run.vocabulary.size
  assert special_tokens_of(loaded) == run.vocabulary.specials
  ids = loaded.encode(TEXT)
  assert list(ids) == list(vocabulary.encode(TEXT)) and len(ids) > 0
  assert loaded.encode_tf(tf.constant(TEXT)).numpy().tolist() == list(ids)
  assert loaded.decode(ids) == TEXT
  if kind == "wordpiece":
    assert loaded == vocabulary and loaded.lower_case and loaded.encode(TEXT.upper()) == ids

  (tmp_path / run.vocabulary.file).write_bytes(b"[PAD]\n")
  with pytest.raises(UserError, match="sha256 differs"):
    load_run_vocabulary(str(tmp_path), run.vocabulary)
  os.remove(tmp_path / run.vocabulary.file)
  with pytest.raises(UserError, match="is missing"):
    load_run_vocabulary(str(tmp_path), run.vocabulary)
