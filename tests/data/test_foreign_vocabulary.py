"""An imported (XLM-R-layout) SentencePiece vocabulary, end to end in the data path.

The model is our toy unigram model rebuilt the way an imported model's file
is: SentencePiece's ids are the model's, `<s>`=0, `<pad>`=1, `</s>`=2,
`<unk>`=3, the text pieces, and `<mask>` last. The pieces and their scores are
unchanged, so the same text gives the same pieces in both models, and every
batch of a task over the rebuilt model must be the batch of the same task
over our model with each id mapped to its new place (`project_to_xlmr`).
"""

import itertools

import jax
import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.data.vocab import sentencepiece as vocab
from flax_xalign.data.vocab.specials import PROJECT, SpecialTokens, special_tokens_of
from flax_xalign.tasks import user

LENGTH = 23  # Odd, and short enough that rows hold several examples and pairs get trimmed.
ORDER = ("<s>", "<pad>", "</s>", "<unk>")


def rebuild_as_xlmr(model_bytes: bytes) -> bytes:
  """Reorders a SentencePiece model to XLM-R's layout (pieces, types and trainer ids)."""
  proto = sentencepiece_model_pb2.ModelProto.FromString(model_bytes)
  pieces = {p.piece: p for p in proto.pieces}
  specials = [pieces[name] for name in ORDER]
  text = [p for p in proto.pieces if p.piece not in ORDER and p.piece != "<mask>"]
  rebuilt = [sentencepiece_model_pb2.ModelProto.SentencePiece() for _ in range(len(proto.pieces))]
  for target, source in zip(rebuilt, specials + text + [pieces["<mask>"]]):
    target.CopyFrom(source)
  del proto.pieces[:]
  proto.pieces.extend(rebuilt)
  spec = proto.trainer_spec
  spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = 0, 1, 2, 3
  return proto.SerializeToString()


def project_to_xlmr(size: int) -> np.ndarray:
  """int32 [size]: an id of our toy model -> the id of the same piece in the rebuilt model."""
  table = np.arange(size, dtype=np.int32) - 1  # Text pieces 5.. -> 4..
  table[[PROJECT.pad, PROJECT.eos, PROJECT.unk, PROJECT.bos, PROJECT.mask]] = [1, 2, 3, 0, size - 1]
  return table


@pytest.fixture(scope="module")
def models(toy_corpus, tmp_path_factory):
  """(our toy model path, the rebuilt XLM-R-layout model path)."""
  _, ours = toy_corpus
  path = tmp_path_factory.mktemp("xlmr") / "vocabulary.model"
  path.write_bytes(rebuild_as_xlmr(ours.read_bytes()))
  return ours, path


@pytest.fixture(scope="module")
def xlmr_vocabulary(models):
  return vocab.load_vocabulary(models[1])


@pytest.fixture(scope="module")
def xlmr_specials(xlmr_vocabulary):
  return special_tokens_of(xlmr_vocabulary)


def test_the_rebuilt_model_has_xlmr_ids_and_the_same_pieces(models):
  ours, xlmr = (spm.SentencePieceProcessor(model_file=str(p)) for p in models)
  size = ours.get_piece_size()
  assert xlmr.get_piece_size() == size == 61
  assert (xlmr.bos_id(), xlmr.pad_id(), xlmr.eos_id(), xlmr.unk_id()) == (0, 1, 2, 3)
  assert xlmr.piece_to_id("<mask>") == size - 1 and xlmr.is_control(0) and xlmr.is_unknown(3)
  table = project_to_xlmr(size)
  assert all(xlmr.id_to_piece(int(table[i])) == ours.id_to_piece(i) for i in range(size))
  text = "the old cat sat on a mat <mask> in the morning light zzq"
  assert xlmr.encode(text) == table[ours.encode(text)].tolist()


def test_special_tokens_of_reads_the_xlmr_layout(models):
  processor = spm.SentencePieceProcessor(model_file=str(models[1]))
  size = processor.get_piece_size()
  found = special_tokens_of(processor)
  # Regular ids lie between <unk> and <mask>, not above every special id.
  assert found == SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=size - 1, first_regular=4,
                                end_regular=size - 1)
  np.testing.assert_array_equal(np.flatnonzero(found.is_regular(np.arange(size))), np.arange(4, size - 1))
  assert vocab.check_special_ids(processor, models[1]) == found
  assert special_tokens_of(vocab.load_vocabulary(models[1])) == found


@pytest.fixture(scope="module")
def task_pairs(toy_corpus, models):
  """{kind: (task over our model, the same task over the rebuilt model)}."""
  root, _ = toy_corpus
  names = {}
  for tag, model in zip(("ours", "xlmr"), models):
    user.TextTask(name=f"fv_{tag}_en", files={"train": str(root / "en.txt")}, lang="en",
                  vocabulary_path=str(model)).register()
    user.TsvBitextTask(name=f"fv_{tag}_de_en", files={"train": str(root / "de_en.tsv")}, lang_a="de",
                       lang_b="en", vocabulary_path=str(model)).register()
    user.AlphaMixture(name=f"fv_{tag}_mix", tasks=(f"fv_{tag}_en", f"fv_{tag}_de_en")).register()
  for kind in ("en", "de_en", "mix"):
    names[kind] = (f"fv_ours_{kind}", f"fv_xlmr_{kind}")
  return names


def _batches(name, *, specials=None, pack=True, seed=3, count=6):
  provider, languages, vocabulary = tasks.resolve(name)
  specials = special_tokens_of(vocabulary) if specials is None else specials
  ds = pipeline.get_dataset(provider, languages=languages, split="train", feature_lengths={"tokens": LENGTH},
                            batch_size=4, seed=seed, pack=pack, specials=specials)
  return list(itertools.islice(ds.as_numpy_iterator(), count))


def _sides(segment_ids, pair_side):
  """(start, end) of every side of every example in one row (a pair has two)."""
  edges = np.flatnonzero(np.diff(np.concatenate([[0], segment_ids * 3 + pair_side, [0]])))
  return [(s, e) for s, e in zip(edges[:-1], edges[1:]) if segment_ids[s] > 0]


def _check_layout(batch, specials):
  tokens, segments = batch["tokens"], batch["segment_ids"]
  padding = segments == 0
  np.testing.assert_array_equal(tokens[padding], specials.pad)
  assert not (tokens[~padding] == specials.pad).any()  # No real token is <pad>.
  for p in ("positions", "pair_side", "lang_ids"):
    assert not batch[p][padding].any(), p
  pairs = 0
  for row in range(tokens.shape[0]):
    for start, end in _sides(segments[row], batch["pair_side"][row]):
      side = tokens[row, start:end]
      assert side[0] == specials.bos and side[-1] == specials.eos, side  # <s> ... </s>
      inner = side[1:-1]
      assert not np.isin(inner, [specials.bos, specials.eos, specials.pad, specials.mask]).any(), side
      np.testing.assert_array_equal(batch["positions"][row, start:end], np.arange(end - start))
      pairs += batch["pair_side"][row, start] == 2
  return pairs, int(padding.sum())


# The mixture holds both kinds of example; unpacked pairs are laid out by the test after this one too.
@pytest.mark.fast("True-mix", "False-de_en")
@pytest.mark.parametrize("kind", ["en", "de_en", "mix"])
@pytest.mark.parametrize("pack", [True, False])
def test_batches_are_our_batches_with_the_ids_moved(task_pairs, xlmr_specials, kind, pack):
  ours, xlmr = task_pairs[kind]
  expected, got = _batches(ours, pack=pack), _batches(xlmr, pack=pack)
  assert len(got) == len(expected) > 0
  table = project_to_xlmr(tasks.get_vocabulary(xlmr).vocab_size)
  padded = pairs = 0
  for want, batch in zip(expected, got):
    np.testing.assert_array_equal(batch["tokens"], table[want["tokens"]])
    for key in ("segment_ids", "positions", "pair_side", "lang_ids"):
      np.testing.assert_array_equal(batch[key], want[key], err_msg=key)
    batch_pairs, padding = _check_layout(batch, xlmr_specials)
    pairs, padded = pairs + batch_pairs, padded + padding
  assert (pairs > 0) == (kind != "en")
  assert padded > 0  # Some row ends in padding (<pad> = 1).


def test_a_pair_is_laid_out_as_two_sentences(task_pairs, xlmr_vocabulary, xlmr_specials, toy_corpus):
  root, _ = toy_corpus
  a, b = (root / "de_en.tsv").read_text(encoding="utf-8").splitlines()[0].split("\t")
  ids_a, ids_b = xlmr_vocabulary.encode(a), xlmr_vocabulary.encode(b)
  provider, _, _ = tasks.resolve(task_pairs["de_en"][1])
  rows = list(pipeline.get_dataset(provider, languages=("de", "en"), split="train",
                                   feature_lengths={"tokens": 64}, batch_size=1, seed=None, shuffle=False,
                                   pack=False, num_epochs=1, specials=xlmr_specials).as_numpy_iterator())
  row = {k: v[0] for k, v in rows[0].items()}
  n = len(ids_a) + len(ids_b) + 4
  np.testing.assert_array_equal(row["tokens"][:n], [0, *ids_a, 2, 0, *ids_b, 2])
  np.testing.assert_array_equal(row["tokens"][n:], 1)
  np.testing.assert_array_equal(row["positions"][:n],
                                [*range(len(ids_a) + 2), *range(len(ids_b) + 2)])
  np.testing.assert_array_equal(row["pair_side"][:n], [1] * (len(ids_a) + 2) + [2] * (len(ids_b) + 2))
  np.testing.assert_array_equal(row["segment_ids"], [1] * n + [0] * (64 - n))


def test_masking_touches_only_regular_ids(task_pairs, xlmr_vocabulary, xlmr_specials):
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import MaskingConfig, PretrainingModel
  from tests.testlib import tiny_encoder_config

  size = xlmr_vocabulary.vocab_size
  model = PretrainingModel(encoder=Encoder(tiny_encoder_config(vocab_size=size)), objectives={"mlm": 1.0},
                           masking=MaskingConfig(mask_rate=0.5, replace_with_mask_rate=0.4,
                                                 replace_with_random_rate=0.5),
                           specials=xlmr_specials)
  low, high = xlmr_specials.regular_range(size)
  assert (low, high) == (4, size - 1)
  masked_count = random_count = 0
  mask = jax.jit(model.mask)  # One program for the four batches (eager, it runs op by op).
  for i, batch in enumerate(_batches(task_pairs["mix"][1], count=4)):
    tokens = batch["tokens"]
    masked = jax.device_get(mask({k: jax.numpy.asarray(v) for k, v in batch.items()}, jax.random.key(i)))
    used = masked.weights > 0
    chosen = np.zeros(tokens.shape, bool)
    for row in range(tokens.shape[0]):
      chosen[row, masked.positions[row][used[row]]] = True
    assert chosen.sum() == used.sum() > 0
    assert xlmr_specials.is_regular(tokens[chosen]).all()  # Never <s>, </s>, <pad>, <unk>, <mask>.
    np.testing.assert_array_equal(masked.targets[used], np.take_along_axis(tokens, masked.positions, 1)[used])
    np.testing.assert_array_equal(masked.inputs[~chosen], tokens[~chosen])  # Specials and padding untouched.
    shown = masked.inputs[chosen]
    replaced = shown[(shown != xlmr_specials.mask) & (shown != tokens[chosen])]
    assert ((replaced >= low) & (replaced < high)).all(), replaced
    masked_count += int((shown == xlmr_specials.mask).sum())
    random_count += replaced.size
  assert masked_count > 0 and random_count > 0
