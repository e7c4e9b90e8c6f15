"""The co-occurrence counter (MLM-GC §3.2) against a brute-force dict counter written here from the definitions."""

import json
import random

import numpy as np
import pytest

from flax_xalign.data import cooc
from flax_xalign.errors import UserError
from tests.data.cooc_reference import table_as_dict, brute_counts, brute_table

V = 23  # Odd and small: many repeated pairs, diagonal pairs ("the the") included.


def _corpus(seed, languages=("de", "en", "fr"), sizes=(40, 90, 25), vocab=V):
  """(lang index, ids) sequences: lengths 0..14, languages of different sizes, some very repetitive."""
  rng = random.Random(seed)
  sequences = []
  for lang, n in zip(range(len(languages)), sizes):
    for _ in range(n):
      length = rng.choice([0, 1, 1, 2, 3, 5, 8, 14])
      # A skewed id distribution so that frequent and rare ids (the counter's two paths) both occur.
      sequences.append((lang, np.array([min(int(rng.expovariate(0.25)), vocab - 1) for _ in range(length)],
                                       np.int32)))
  rng.shuffle(sequences)
  return sequences


def _raw_dict(counts):
  size = counts.vocab_size
  out = {}
  for key, n in zip(counts.keys.tolist(), counts.counts.tolist()):
    group, ab = divmod(key, size * size)
    lang, d = divmod(group, counts.window)
    out[(lang, d + 1, ab // size, ab % size)] = n
  return out


@pytest.mark.parametrize("window", [1, 2, 3])
def test_raw_counts_match_the_brute_force_counter(window):
  sequences = _corpus(window)
  counts = cooc.count_sequences(sequences, languages=("de", "en", "fr"), vocab_size=V, window=window)
  pairs, tokens = brute_counts(sequences, window)
  assert counts.keys.dtype == counts.counts.dtype == np.int64
  assert (np.diff(counts.keys) > 0).all()  # Sorted unique.
  assert _raw_dict(counts) == dict(pairs)
  assert counts.tokens.tolist() == [tokens[i] for i in range(3)]
  assert counts.sequences == len(sequences)


@pytest.mark.parametrize("threads, chunk_tokens, max_frequent", [(0, 5, 0), (0, 11, 4), (2, 7, 3), (2, 10**6, 64)])
def test_chunking_threads_and_the_dense_path_do_not_change_the_counts(threads, chunk_tokens, max_frequent):
  sequences = _corpus(7)
  counter = cooc.PairCounter(languages=("de", "en", "fr"), vocab_size=V, window=2, threads=threads,
                             chunk_tokens=chunk_tokens, max_frequent=max_frequent)
  for lang, ids in sequences[:60]:
    counter.add(lang, ids)
  rest = sequences[60:]
  for lang in range(3):  # The flat batch entry point, one language per call.
    mine = [ids for code, ids in rest if code == lang]
    counter.add_batch(lang, np.concatenate(mine), [len(ids) for ids in mine])
  counts = counter.result()
  assert _raw_dict(counts) == dict(brute_counts(sequences, 2)[0])
  assert counts.sequences == len(sequences)


def test_a_window_longer_than_any_sequence_counts_every_pair_inside_each():
  sequences = [(0, np.arange(20) % 7), (0, np.array([3, 3])), (0, np.array([5]))]
  counts = cooc.count_sequences(sequences, languages=("xx",), vocab_size=7, window=300)  # > 255: wide `left`.
  assert _raw_dict(counts) == dict(brute_counts(sequences, 300)[0])
  assert int(counts.counts.sum()) == 20 * 19 // 2 + 1


def test_large_vocabulary_uses_64_bit_keys():
  rng = np.random.default_rng(0)
  size = 70_001  # > 2**16: a * V + b no longer fits uint32.
  sequences = [(0, rng.integers(size - 50, size, 9).astype(np.int32)) for _ in range(30)]
  counts = cooc.count_sequences(sequences, languages=("xx",), vocab_size=size, window=2)
  assert _raw_dict(counts) == dict(brute_counts(sequences, 2)[0])


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("drop_diagonal", [False, True])
def test_table_matches_the_brute_force_table_bit_for_bit(window, drop_diagonal):
  languages = ("de", "en", "fr")
  sequences = _corpus(10 + window)
  counts = cooc.count_sequences(sequences, languages=languages, vocab_size=V, window=window)
  table = cooc.finalize(counts, drop_diagonal=drop_diagonal, source={"test": 1})
  expected, ref, c_lang = brute_table(sequences, languages, window, drop_diagonal=drop_diagonal)
  got = table_as_dict(table)
  assert got.keys() == expected.keys()
  assert all(got[k] == expected[k] for k in expected)  # Exact float32 equality.
  assert table.indptr.dtype == np.int64 and table.indices.dtype == np.int32 and table.log_x.dtype == np.float32
  assert all((np.diff(table.indices[s:e]) > 0).all() for s, e in zip(table.indptr[:-1], table.indptr[1:]))
  assert got == {(b, a): x for (a, b), x in got.items()}  # Symmetric.
  assert any(a == b for a, b in got) != drop_diagonal
  info = table.info
  assert ref == "en" and info["reference_language"] == "en" and "reference_language_requested" not in info
  assert info["c_lang"] == c_lang and info["c_lang"]["en"] == 1.0
  assert c_lang["de"] != c_lang["fr"]  # Different sizes -> different constants.
  assert info["window"] == window and info["vocab_size"] == V and info["nnz"] == len(expected)
  assert info["drop_diagonal"] == drop_diagonal and info["source"] == {"test": 1}
  assert info["sequences"] == len(sequences) and info["languages"] == list(languages)
  json.dumps(info)


def test_distance_weights_and_language_constant_by_hand():
  # en: "1 2 3" (3 tokens); de: "1 2" "2 2 2" (5 tokens) -> c_en = 1, c_de = 3/5.
  sequences = [(1, np.array([1, 2, 3])), (0, np.array([1, 2])), (0, np.array([2, 2, 2]))]
  table = cooc.finalize(cooc.count_sequences(sequences, languages=("de", "en"), vocab_size=5, window=2))
  x = {k: float(np.exp(np.float64(v))) for k, v in table_as_dict(table).items()}
  # (1,2): en d=1 -> 1/2; de d=1 -> 0.6 * 1/2. (1,3): en d=2 -> 1/3. (2,3): en d=1 -> 1/2.
  # (2,2): de "2 2 2": d=1 twice, d=2 once, each seen from both ends: 0.6 * (2*2/2 + 2*1/3).
  expected = {(1, 2): 0.5 + 0.3, (1, 3): 1 / 3, (2, 3): 0.5, (2, 2): 0.6 * (2.0 + 2 / 3)}
  expected.update({(b, a): v for (a, b), v in expected.items()})
  assert x.keys() == expected.keys()
  for key, value in expected.items():
    assert x[key] == pytest.approx(value, rel=1e-6), key
  assert table.info["tokens"] == {"de": 5, "en": 3} and table.info["c_lang"] == {"de": 0.6, "en": 1.0}
  assert table.top_pairs(2, 2) == [(2, pytest.approx(1.6, rel=1e-6)), (1, pytest.approx(0.8, rel=1e-6))]
  assert table.top_pairs(4, 3) == []


def test_no_pair_crosses_a_sequence_boundary():
  counts = cooc.count_sequences([(0, np.array([1, 2])), (0, np.array([3])), (0, np.array([], np.int32)),
                                 (0, np.array([4, 5]))], languages=("en",), vocab_size=6, window=3)
  assert _raw_dict(counts) == {(0, 1, 1, 2): 1, (0, 1, 4, 5): 1}
  assert counts.tokens.tolist() == [5] and counts.sequences == 4


def test_reference_language_falls_back_to_the_first_sorted_language():
  sequences = [(0, np.array([1, 2, 1])), (1, np.array([3, 4, 3, 4, 4, 3]))]
  lines = []
  table = cooc.finalize(cooc.count_sequences(sequences, languages=("el", "fr"), vocab_size=5, window=1),
                        log=lines.append)
  assert table.info["reference_language"] == "el" and table.info["reference_language_requested"] == "en"
  assert table.info["c_lang"] == {"el": 1.0, "fr": 0.5} and "'el'" in lines[0]
  other = cooc.finalize(cooc.count_sequences(sequences, languages=("el", "fr"), vocab_size=5, window=1),
                        reference_language="fr")
  assert other.info["c_lang"] == {"el": 2.0, "fr": 1.0}
  # A language without tokens is absent from the manifest.
  only = cooc.finalize(cooc.count_sequences(sequences[1:], languages=("el", "fr"), vocab_size=5, window=1))
  assert only.info["languages"] == ["fr"] and only.info["tokens"] == {"fr": 6}


def test_merge_is_exact_associative_and_commutative():
  sequences = _corpus(21)
  kwargs = {"languages": ("de", "en", "fr"), "vocab_size": V, "window": 2}
  whole = cooc.count_sequences(sequences, **kwargs)
  shards = [cooc.count_sequences(sequences[i::4], **kwargs) for i in range(4)]
  empty = cooc.empty_counts(**kwargs)
  orders = [
      shards[0].merge(shards[1]).merge(shards[2]).merge(shards[3]),
      shards[3].merge(shards[2].merge(shards[1].merge(shards[0]))),
      shards[2].merge(shards[0]).merge(empty).merge(shards[3].merge(shards[1])),
      empty.merge(shards[1].merge(shards[3])).merge(shards[0].merge(shards[2])),
  ]
  for merged in orders:
    np.testing.assert_array_equal(merged.keys, whole.keys)
    np.testing.assert_array_equal(merged.counts, whole.counts)
    np.testing.assert_array_equal(merged.tokens, whole.tokens)
    assert merged.sequences == whole.sequences
  tables = [cooc.finalize(m) for m in [whole] + orders]
  assert len({t.info["corpus_fingerprint"] for t in tables}) == 1
  for t in tables[1:]:
    assert t.log_x.tobytes() == tables[0].log_x.tobytes() and t.indices.tobytes() == tables[0].indices.tobytes()
  with pytest.raises(ValueError, match="cannot merge"):
    whole.merge(cooc.empty_counts(languages=("de", "en", "fr"), vocab_size=V, window=3))


def test_save_load_round_trip_is_bit_exact(tmp_path):
  table = cooc.finalize(cooc.count_sequences(_corpus(5), languages=("de", "en", "fr"), vocab_size=V, window=2),
                        source={"files": ["x.txt"]})
  cooc.save_table(str(tmp_path), table)
  loaded = cooc.load_table(str(tmp_path))
  for name in ("indptr", "indices", "log_x"):
    got, want = getattr(loaded, name), getattr(table, name)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
  assert loaded.info == json.loads(json.dumps(table.info))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["cooc.json", "cooc.npz"]


def test_malformed_and_missing_files_are_user_errors(tmp_path):
  with pytest.raises(UserError, match="cooc.npz does not exist"):
    cooc.load_table(str(tmp_path))
  table = cooc.finalize(cooc.count_sequences(_corpus(5), languages=("de", "en", "fr"), vocab_size=V, window=2))
  cooc.save_table(str(tmp_path), table)
  (tmp_path / "cooc.npz").write_bytes((tmp_path / "cooc.npz").read_bytes()[:100])
  with pytest.raises(UserError, match="cooc.npz is not a co-occurrence table"):
    cooc.load_table(str(tmp_path))
  np.savez(tmp_path / "cooc.npz", indptr=table.indptr, indices=table.indices[:-1], log_x=table.log_x[:-1])
  with pytest.raises(UserError, match="cooc.npz is malformed"):
    cooc.load_table(str(tmp_path))
  cooc.save_table(str(tmp_path), table)
  (tmp_path / "cooc.json").write_text("{not json")
  with pytest.raises(UserError, match="cooc.json is not a JSON manifest"):
    cooc.load_table(str(tmp_path))


@pytest.mark.parametrize("call, match", [
    (lambda: cooc.count_sequences([(0, np.array([1, 23]))], languages=("en",), vocab_size=V), "outside the vocab"),
    (lambda: cooc.count_sequences([(0, np.array([-1, 2]))], languages=("en",), vocab_size=V), "outside the vocab"),
    (lambda: cooc.count_sequences([(1, np.array([1, 2]))], languages=("en",), vocab_size=V), "language index 1"),
    (lambda: cooc.count_sequences([], languages=("en",), vocab_size=V, window=0), "window must be"),
    (lambda: cooc.count_sequences([], languages=("en", "de"), vocab_size=V), "sorted and distinct"),
    (lambda: cooc.finalize(cooc.empty_counts(languages=("en",), vocab_size=V, window=2)), "corpus is empty"),
    (lambda: cooc.finalize(cooc.count_sequences([(0, np.array([3]))], languages=("en",), vocab_size=V)),
     "no pair of tokens"),
])
def test_bad_input_is_one_user_error(call, match):
  with pytest.raises(UserError, match=match):
    call()
