"""Sentence retrieval: accuracy against brute-force NumPy, mean-pooled states by hand, the CLI end to end."""

import json
import random

import jax
import numpy as np
import pytest

from flax_xalign.cli import retrieval as retrieval_main
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.errors import UserError
from flax_xalign.evaluation import retrieval
from flax_xalign.models.encoder import Encoder
from tests import testlib
from tests.runs.tiny_run import tiny_mix_run
from tests.evaluation.transfer_testlib import random_params

# ------------------------------------------------------------ brute-force references


def cosine_reference(x, y):
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  nx = np.linalg.norm(x, axis=1)
  ny = np.linalg.norm(y, axis=1)
  out = np.zeros((len(x), len(y)))
  for i in range(len(x)):
    for j in range(len(y)):
      if nx[i] > 0 and ny[j] > 0:
        out[i, j] = x[i] @ y[j] / (nx[i] * ny[j])
  return out


def csls_reference(x, y, k):
  """2 cos - r(x) - r(y), r = mean of the min(k, n) highest cosines to the other side (MUSE)."""
  cos = cosine_reference(x, y)
  r_x = np.array([np.mean(sorted(row, reverse=True)[:k]) for row in cos])
  r_y = np.array([np.mean(sorted(col, reverse=True)[:k]) for col in cos.T])
  return 2 * cos - r_x[:, None] - r_y[None, :]


def first_argmax(row):
  best = 0
  for j, value in enumerate(row):
    if value > row[best] + 1e-9:
      best = j
  return best


def accuracy_reference(x, y, method, k=10):
  score = cosine_reference(x, y) if method == "cosine" else csls_reference(x, y, k)
  forward = np.mean([first_argmax(score[i]) == i for i in range(len(x))])
  backward_score = cosine_reference(y, x) if method == "cosine" else csls_reference(y, x, k)
  backward = np.mean([first_argmax(backward_score[j]) == j for j in range(len(y))])
  return forward, backward


def noisy_pairs(n, d, noise, seed):
  rng = np.random.default_rng(seed)
  src = rng.normal(size=(n, d)).astype(np.float32)
  hub = rng.normal(size=d).astype(np.float32)  # A shared direction: hubs for CSLS to discount.
  tgt = src + noise * rng.normal(size=(n, d)).astype(np.float32) + 0.8 * hub
  return src, tgt


@pytest.mark.parametrize("method", retrieval.METHODS)
@pytest.mark.parametrize("n, k", [(37, 10), (6, 10), (23, 3)])
def test_accuracy_matches_brute_force(method, n, k):
  src, tgt = noisy_pairs(n, 11, noise=1.1, seed=n + k)
  result = retrieval.retrieval_accuracy(src, tgt, method=method, csls_k=k)
  forward, backward = accuracy_reference(src, tgt, method, k)
  assert result["pairs"] == n
  assert result["src_to_tgt"] == pytest.approx(forward)
  assert result["tgt_to_src"] == pytest.approx(backward)
  assert result["mean"] == pytest.approx((forward + backward) / 2)
  if n > 20:
    assert 0.0 < forward < 1.0  # The noise makes the test informative.


def test_nearest_indices_match_brute_force():
  src, tgt = noisy_pairs(29, 7, noise=1.5, seed=3)
  cos = cosine_reference(src, tgt)
  csls = csls_reference(src, tgt, 10)
  np.testing.assert_array_equal(retrieval.nearest(src, tgt, method="cosine"), [first_argmax(r) for r in cos])
  np.testing.assert_array_equal(retrieval.nearest(src, tgt, method="csls"), [first_argmax(r) for r in csls])


def test_csls_beats_cosine_on_a_hub():
  # Target 0 is close to every source: cosine retrieves it for everyone, CSLS discounts it.
  rng = np.random.default_rng(0)
  src = rng.normal(size=(12, 16)).astype(np.float32)
  tgt = src + 0.3 * rng.normal(size=src.shape).astype(np.float32)
  tgt[0] = src.mean(axis=0) * 6 + src[0]
  src[:, :] += 2.0 * src.mean(axis=0)
  cosine = retrieval.retrieval_accuracy(src, tgt, method="cosine")
  csls = retrieval.retrieval_accuracy(src, tgt, method="csls")
  assert csls["src_to_tgt"] >= cosine["src_to_tgt"]
  forward, _ = accuracy_reference(src, tgt, "csls")
  assert csls["src_to_tgt"] == pytest.approx(forward)


def test_one_pair_empty_and_mismatched_sets():
  one = np.ones((1, 4), np.float32)
  for method in retrieval.METHODS:
    assert retrieval.retrieval_accuracy(one, -one, method=method)["mean"] == 1.0
  with pytest.raises(UserError, match="no sentence pairs"):
    retrieval.retrieval_accuracy(np.zeros((0, 4)), np.zeros((0, 4)))
  with pytest.raises(UserError, match="one shape"):
    retrieval.retrieval_accuracy(np.zeros((3, 4)), np.zeros((2, 4)))
  with pytest.raises(UserError, match="unknown"):
    retrieval.retrieval_accuracy(one, one, method="dot")


def test_zero_vectors_and_duplicates():
  # Row 2 is an empty sentence (zero vector: cosine 0 with all, never nearest while others are positive).
  src = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 1]], np.float32)
  tgt = np.array([[1, .1, 0], [0, 1, .1], [-1, -1, -1], [.1, 0, 1]], np.float32)
  result = retrieval.retrieval_accuracy(src, tgt, method="cosine")
  forward, backward = accuracy_reference(src, tgt, "cosine")
  assert (result["src_to_tgt"], result["tgt_to_src"]) == (pytest.approx(forward), pytest.approx(backward))
  # Two identical target sentences: index scoring misses one (the tie goes to row 0), keys count both.
  src = np.array([[1, 0], [1, 0.01], [0, 1]], np.float32)
  tgt = np.array([[1, 0.5], [1, 0.5], [0, 1]], np.float32)
  plain = retrieval.retrieval_accuracy(src, tgt)
  keyed = retrieval.retrieval_accuracy(src, tgt, tgt_keys=retrieval.duplicate_keys(["x", "x", "y"]),
                                       src_keys=retrieval.duplicate_keys(["p", "q", "r"]))
  assert plain["src_to_tgt"] == pytest.approx(2 / 3) and keyed["src_to_tgt"] == 1.0
  assert list(retrieval.duplicate_keys(["a", "b", "a", "c", "b"])) == [0, 1, 0, 3, 1]
  with pytest.raises(UserError, match="one key per pair"):
    retrieval.retrieval_accuracy(src, tgt, src_keys=[0, 1])


def test_bag_of_pieces_by_hand():
  src, tgt = retrieval.bag_of_pieces([[7, 7, 9], []], [[9], [300, 7]])
  # Distinct pieces 7, 9, 300 in that order.
  np.testing.assert_array_equal(src, [[2, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(tgt, [[0, 1, 0], [1, 0, 1]])
  empty_src, empty_tgt = retrieval.bag_of_pieces([[]], [[]])
  assert empty_src.shape == empty_tgt.shape == (1, 1) and not empty_src.any()


# ------------------------------------------------------------ mean-pooled states


class IdVocabulary:
  """A fake vocabulary: a sentence is space-separated integer ids."""

  def encode(self, text):
    return [int(t) for t in text.split()]


def hand_means(encoder, params, ids, layer, language):
  """Each sentence encoded alone, unpadded: mean of the states between <s> and </s>."""
  # Jitted (one compile per sentence length) rather than run op by op: the same function of one unpadded row.
  apply = jax.jit(lambda p, tokens, lang_ids, positions, segment_ids: encoder.apply(
      {"params": p}, tokens, lang_ids=lang_ids, positions=positions, segment_ids=segment_ids, deterministic=True,
      return_all_hidden=True).all_hidden)
  out = []
  for sentence in ids:
    tokens = np.asarray([[PROJECT.bos, *sentence, PROJECT.eos]], np.int32)
    n = tokens.shape[1]
    hidden = apply(params, tokens, np.full((1, n), language, np.int32), np.arange(n, dtype=np.int32)[None],
                   np.ones((1, n), np.int32))[layer]
    body = np.asarray(hidden, np.float64)[0, 1:n - 1]
    out.append(body.mean(axis=0) if len(body) else np.zeros(hidden.shape[-1]))
  return np.asarray(out)


def test_sentence_embeddings_are_padding_free_means():
  config = testlib.tiny_encoder_config(vocab_size=61, dropout_rate=0.0)
  encoder, params = Encoder(config), random_params(config, seed=2)
  rng = random.Random(1)
  ids = [[rng.randrange(5, 61) for _ in range(rng.choice([0, 1, 2, 5, 13, 29]))] for _ in range(11)]
  ids[0], ids[1] = [], [17]  # An empty and a one-token sentence.
  texts = [" ".join(map(str, s)) for s in ids]
  stats = {}
  got = retrieval.sentence_embeddings(encoder, params, IdVocabulary(), texts, layers=(2, 0), language=2,
                                      batch_size=4, max_length=32, specials=PROJECT, stats=stats)
  assert sorted(got) == [0, 2] and stats["truncated"] == 0
  for layer in (0, 2):
    assert got[layer].shape == (11, config.embed_dim)
    np.testing.assert_allclose(got[layer], hand_means(encoder, params, ids, layer, 2), rtol=2e-5, atol=2e-5)
  assert not got[0][0].any()
  # Another language id changes the states (the model has language embeddings).
  other = retrieval.sentence_embeddings(encoder, params, IdVocabulary(), texts[1:3], layers=(0,), language=1,
                                        specials=PROJECT)
  assert not np.allclose(other[0], got[0][1:3])
  # Truncation: a 29-token sentence keeps 10 ids under max_length=12.
  cut = retrieval.sentence_embeddings(encoder, params, IdVocabulary(), texts, layers=(1,), language=2,
                                      max_length=12, specials=PROJECT, stats=stats)
  long_rows = [i for i, s in enumerate(ids) if len(s) > 10]
  assert stats["truncated"] == len(long_rows) > 0
  np.testing.assert_allclose(cut[1][long_rows], hand_means(encoder, params, [ids[i][:10] for i in long_rows], 1, 2),
                             rtol=2e-5, atol=2e-5)
  with pytest.raises(UserError, match="outside 0..2"):
    retrieval.sentence_embeddings(encoder, params, IdVocabulary(), texts, layers=(3,), specials=PROJECT)
  assert retrieval.sentence_embeddings(encoder, params, IdVocabulary(), [], layers=(1,),
                                       specials=PROJECT)[1].shape == (0, config.embed_dim)
  jax.clear_caches()


# ------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_corpus):
  """A copy of the shared 3-step MLM run on tiny_mix (de, en)."""
  return tiny_mix_run(tmp_path_factory, tiny_corpus, "retrieval_cli")


@pytest.fixture
def tsv(tmp_path):
  pairs = testlib.sentences(random.Random(5), 40)
  path = tmp_path / "de_en.tsv"
  path.write_text("".join(f"{de}\t{en}\n" for en, de in pairs) + "\n", encoding="utf-8")
  return path


def _last_json(text):
  return json.loads(text.strip().splitlines()[-1])


def test_cli_table_baselines_and_json(checkpoint, tsv, tmp_path, capsys):
  output = tmp_path / "r.json"
  code = retrieval_main.main([f"--checkpoint={checkpoint}", f"--tsv={tsv}", "--src_lang=de", "--tgt_lang=en",
                              "--csls_k=5", f"--output={output}", "--batch_size=7"])
  text = capsys.readouterr().out
  assert code == 0, text
  result = _last_json(text)
  assert json.loads(output.read_text()) == result
  assert result["pairs"] == 40 and result["layers"] == [0, 1, 2] and result["methods"] == ["cosine", "csls"]
  assert result["baselines"]["chance"] == pytest.approx(1 / 40)
  for method in ("cosine", "csls"):
    assert set(result["scores"][method]) == {"0", "1", "2"}
    best = result["best"][method]
    assert best["mean"] == max(s["mean"] for s in result["scores"][method].values())
    for scores in (*result["scores"][method].values(), result["baselines"]["bag_of_pieces"][method]):
      assert 0.0 <= scores["src_to_tgt"] <= 1.0 and 0.0 <= scores["tgt_to_src"] <= 1.0
  # de and en share no piece in the toy corpus beyond a few subwords: the bag baseline is weak but defined.
  assert "layer 2" in text and "bag of pieces" in text and "chance" in text
  # One layer, one method, the first pairs; the same numbers as in the full sweep.
  code = retrieval_main.main([f"--checkpoint={checkpoint}", f"--tsv={tsv}", "--src_lang=de", "--tgt_lang=en",
                              "--layers=2", "--method=csls", "--csls_k=5"])
  small = _last_json(capsys.readouterr().out)
  assert code == 0 and small["scores"] == {"csls": {"2": result["scores"]["csls"]["2"]}}


@pytest.mark.parametrize("flags, needle", [
    ([], "exactly one of --tsv"),
    (["--tsv=MISSING", "--src_lang=de", "--tgt_lang=en"], "does not exist"),
    (["--src_lang=de", "--tgt_lang=fr"], "not one of the checkpoint's languages"),
    (["--src_lang=de", "--tgt_lang=en", "--layers=5"], "0..2"),
    (["--src_lang=de", "--tgt_lang=en", "--method=dot"], "--method"),
    (["--src_lang=de", "--tgt_lang=en", "--max_pairs=0"], "--max_pairs"),
])
def test_cli_refuses_bad_input(checkpoint, tsv, capsys, flags, needle):
  args = [f"--checkpoint={checkpoint}"] + flags
  if flags and not any(f.startswith("--tsv") for f in flags):
    args.append(f"--tsv={tsv}")
  code = retrieval_main.main(args)
  err = capsys.readouterr().err
  assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
  assert needle in err, err


def test_cli_names_the_bad_line(checkpoint, tmp_path, capsys):
  bad = tmp_path / "bad.tsv"
  bad.write_text("ein haus\ta house\nnur eine spalte\n", encoding="utf-8")
  code = retrieval_main.main([f"--checkpoint={checkpoint}", f"--tsv={bad}", "--src_lang=de", "--tgt_lang=en"])
  err = capsys.readouterr().err
  assert code == 2 and f"{bad}:2" in err and "2 tab-separated fields" in err, err
