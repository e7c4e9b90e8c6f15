"""awesome-align's self-training objective (SO) against a NumPy port of its label extraction and guide-head loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import tasks
from flax_xalign.assets import registry as asset_registry
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.errors import UserError
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives import dwa
from flax_xalign.objectives import so
from flax_xalign.objectives.base import StepContext
from flax_xalign.objectives.model import PretrainingModel
from flax_xalign.training import aot
from flax_xalign.training.pretrain import TrainConfig, assemble
from tests.objectives.test_dwa import LENGTH, _batch

PAIR_SPANS = (((1, 3), (5, 8)), ((10, 12), (14, 16)))  # (source, target) subword spans of the row's two pairs.
# Ids that begin a word in test_dwa's row (tokens 10 11 | 20 21 22 | 12 13 | 23 24): the words are
# [10 11] -> [20 21] [22] in pair 1 and [12] [13] -> [23 24] in pair 2.
WORD_STARTS = np.isin(np.arange(31), [10, 12, 13, 20, 22, 23])
WORDS = {1: [0, 0], 5: [0, 0, 1], 10: [0, 1], 14: [0, 0]}  # Span start -> each subword's word within its side.


def _softmax(x, axis):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _reference_pair_loss(x, y, guide):
  """One pair, as awesome-align's BertGuideHead computes it (float64): -(Σ P_src G / n_src + Σ P_tgt G / n_tgt)."""
  s = x @ y.T
  return -((_softmax(s, -1) * guide).sum() / len(x) + (_softmax(s, 0) * guide).sum() / len(y))


def test_so_loss_equals_the_reference_pair_by_pair():
  rng = np.random.default_rng(0)
  batch = _batch()
  hidden = rng.normal(size=(1, LENGTH, 6))
  link_mask, source, target = dwa.pair_masks(batch, PROJECT)
  labels = np.asarray(link_mask) & (rng.random((1, LENGTH, LENGTH)) < 0.4)
  scores = jnp.einsum("bid,bjd->bij", hidden, hidden).astype(jnp.float32)
  total, pairs = so.so_loss(scores, jnp.asarray(labels), link_mask, source, target, batch["segment_ids"])
  expected = [_reference_pair_loss(hidden[0, a0:a1], hidden[0, b0:b1], labels[0, a0:a1, b0:b1])
              for (a0, a1), (b0, b1) in PAIR_SPANS]
  assert float(pairs) == 2.0
  np.testing.assert_allclose(float(total), sum(expected), rtol=1e-5)


def test_self_labels_are_awesome_aligns_softmax_extraction():
  rng = np.random.default_rng(1)
  batch = _batch()
  hidden = rng.normal(size=(1, LENGTH, 6)) * 3
  link_mask, _, _ = dwa.pair_masks(batch, PROJECT)
  scores = jnp.einsum("bid,bjd->bij", hidden, hidden).astype(jnp.float32)
  got = np.asarray(so.self_labels(scores, link_mask, 0.2))
  expected = np.zeros_like(got)
  for (a0, a1), (b0, b1) in PAIR_SPANS:
    s = hidden[0, a0:a1] @ hidden[0, b0:b1].T
    expected[0, a0:a1, b0:b1] = (_softmax(s, -1) > 0.2) & (_softmax(s, 0) > 0.2)
  np.testing.assert_array_equal(got, expected)
  assert got.any() and not got.all()


@pytest.mark.parametrize("source", ["self", "links", "union"])
def test_so_term_trains_the_layers_below_the_alignment_layer(tiny_encoder, source):
  encoder = tiny_encoder.replace(vocab_size=31, dropout_rate=0.0)
  objective = so.SelfTraining(so.SoConfig(layer=1, label_source=source))
  assert objective.batch_features == (() if source == "self" else ("link_groups",))
  model = PretrainingModel(encoder=Encoder(encoder), objectives={"so": 1.0},
                           objective_options={"so": objective.config})
  batch = _batch(rows=2)
  batch["link_groups"] = jnp.asarray([[0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 1, 0, 0, 0, 1, 2, 0, 0]] * 2, jnp.int32)
  params = jax.jit(lambda key: jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                                            model.init(key, batch=1, length=LENGTH),
                                            is_leaf=lambda x: hasattr(x, "unbox")))(jax.random.key(0))
  assets = {"word_starts": {"table": jnp.asarray(WORD_STARTS)}} if objective.requires else {}
  assert objective.requires == (() if source == "links" else ("word_starts",))
  loss, metrics = jax.jit(lambda p: model.loss_fn(p, batch, jax.random.key(3), assets))(params)
  assert np.isfinite(float(loss)) and float(metrics["so_pairs"]) == 4.0
  if source == "links":
    assert float(metrics["so_labels"]) == float(metrics["so_given"]) == 8.0  # 4 links per row, 2 rows.
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, jax.random.key(3), assets)[0]))(params)
  # Layers are stacked on a leading axis: the one layer below the alignment layer learns, the ones above do not.
  mlp = np.asarray(grads["layers"]["mlp"]["wi"]["kernel"])
  assert encoder.num_layers >= 2 and np.abs(mlp[0]).sum() > 0 and np.abs(mlp[1:]).sum() == 0
  assert float(jnp.abs(grads["token_embed"]["embedding"]).sum()) > 0


def test_so_config_is_validated():
  with pytest.raises(UserError, match="label_source='gold'"):
    so.SoConfig(label_source="gold")
  with pytest.raises(UserError, match="softmax_threshold=1.5"):
    so.SoConfig(softmax_threshold=1.5)
  with pytest.raises(UserError, match="label_level='bpe'"):
    so.SoConfig(label_level="bpe")
  assert so.SoConfig().label_level == "word"
  assert so.default_layer(12) == 8 and so.default_layer(4) == 3


# ---------------------------------------------------------------- awesome-align's word-level labels


def _stub_context(batch, hidden, assets):
  """A StepContext whose encoder pass returns `hidden` (the alignment layer's states)."""
  out = type("Out", (), {"hidden": jnp.asarray(hidden, jnp.float32)})()
  return StepContext(params={}, apply=lambda *a, **k: out, batch=batch, masked=None, hidden=None, all_hidden=None,
                     logits=None, rng=jax.random.key(0), train=True, assets=assets, specials=PROJECT, num_layers=2)


def _awesome_align_reference(hidden, threshold, *, level):
  """awesome-align's SO step in NumPy (float64), pair by pair: the softmax-threshold subword links, mapped to
  words and back to every subword pair of the aligned words (`get_aligned_word`), then the guide-head loss;
  the mean over pairs that have a label. Returns (loss, labels per pair)."""
  losses, guides = [], []
  for (a0, a1), (b0, b1) in PAIR_SPANS:
    x, y = hidden[a0:a1], hidden[b0:b1]
    s = x @ y.T
    sub = (_softmax(s, -1) > threshold) & (_softmax(s, 0) > threshold)
    if level == "word":
      w_a, w_b = WORDS[a0], WORDS[b0]
      word_links = {(w_a[i], w_b[j]) for i, j in zip(*np.nonzero(sub))}
      guide = np.array([[(w_a[i], w_b[j]) in word_links for j in range(b1 - b0)] for i in range(a1 - a0)])
    else:
      guide = sub
    guides.append(guide)
    if guide.any():
      losses.append(_reference_pair_loss(x, y, guide))
  return float(np.mean(losses)), guides


def test_word_ids_number_words_and_start_each_side_afresh():
  batch = _batch()
  _, source, target = dwa.pair_masks(batch, PROJECT)
  got = np.asarray(so.word_ids(batch["tokens"], source | target, jnp.asarray(WORD_STARTS)))[0]
  #       <s> 10 11 </s> <s> 20 21 22 </s> <s> 12 13 </s> <s> 23 24 </s> pad
  assert got.tolist() == [0, 1, 1, 0, 0, 2, 2, 3, 0, 0, 4, 5, 0, 0, 6, 6, 0, 0]
  # A side whose first piece does not begin a word (a cut text) still starts a word of its own.
  no_starts = np.asarray(so.word_ids(batch["tokens"], source | target, jnp.zeros(31, bool)))[0]
  assert no_starts.tolist() == [0, 1, 1, 0, 0, 2, 2, 2, 0, 0, 3, 3, 0, 0, 4, 4, 0, 0]


def test_word_level_labels_cover_every_subword_pair_of_the_linked_words():
  batch = _batch()
  link_mask, source, target = dwa.pair_masks(batch, PROJECT)
  words = so.word_ids(batch["tokens"], source | target, jnp.asarray(WORD_STARTS))
  links = np.zeros((1, LENGTH, LENGTH), bool)
  links[0, 2, 6] = True   # 11 -> 21: the words [10 11] and [20 21]
  links[0, 11, 15] = True  # 13 -> 24: the words [13] and [23 24]
  got = np.asarray(so.word_level_labels(jnp.asarray(links), words, link_mask))[0]
  expected = {(1, 5), (1, 6), (2, 5), (2, 6), (11, 14), (11, 15)}  # Worked out by hand.
  assert set(zip(*np.nonzero(got))) == expected


@pytest.mark.parametrize("level", ["word", "subword"])
def test_so_term_equals_awesome_aligns_word_level_step(level):
  rng = np.random.default_rng(4)
  batch = _batch()
  hidden = rng.normal(size=(LENGTH, 5)) * 1.5
  threshold = 0.3
  expected, guides = _awesome_align_reference(hidden, threshold, level=level)
  if level == "word":  # The example must tell the levels apart: word labels add pairs the subword links miss.
    _, sub_guides = _awesome_align_reference(hidden, threshold, level="subword")
    assert sum(g.sum() for g in guides) > sum(g.sum() for g in sub_guides)
  objective = so.SelfTraining(so.SoConfig(layer=1, softmax_threshold=threshold, label_level=level))
  term = objective(_stub_context(batch, hidden[None], {"word_starts": {"table": jnp.asarray(WORD_STARTS)}}))
  np.testing.assert_allclose(float(term.loss), expected, rtol=1e-5)
  assert float(term.metrics["labels"]) == sum(g.sum() for g in guides)


def test_a_pair_without_labels_is_left_out_of_the_mean():
  """Pair 2 with no given link gives the loss of the row without pair 2 (not half of it)."""
  rng = np.random.default_rng(5)
  hidden = rng.normal(size=(1, LENGTH, 5))
  objective = so.SelfTraining(so.SoConfig(layer=1, label_source="links"))
  with_pair = dict(_batch())
  with_pair["link_groups"] = jnp.asarray([[0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], jnp.int32)
  alone = {k: v.at[0, 9:].set(0) for k, v in with_pair.items()}  # Pair 2 replaced by padding.
  term = objective(_stub_context(with_pair, hidden, {}))
  reference = objective(_stub_context(alone, hidden, {}))
  guide = np.array([[1, 0, 0], [0, 1, 1]], bool)  # Groups 1 and 2 of pair 1, by hand.
  expected = _reference_pair_loss(hidden[0, 1:3], hidden[0, 5:8], guide)
  np.testing.assert_allclose(float(term.loss), expected, rtol=1e-5)
  np.testing.assert_allclose(float(term.loss), float(reference.loss), rtol=1e-6)
  assert float(term.metrics["pairs"]) == 2.0 and float(term.metrics["labelled_pairs"]) == 1.0


def test_the_continuous_pair_layout_is_refused_before_training(tiny_corpus, tiny_encoder):
  config = TrainConfig(model_dir="unused", mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
                       batch_size=1, train_steps=1, encoder=tiny_encoder, objectives={"so": 1.0},
                       pair_layout="continuous")
  with pytest.raises(UserError) as e:
    assemble(config)
  message = str(e.value)
  assert "\n" not in message and "'so' objective" in message
  assert "train.pair_layout='continuous'" in message and "train.pair_layout='restart'" in message


def test_the_trainer_gives_word_level_so_a_word_start_table(tiny_corpus, tiny_encoder):
  """The `word_starts` asset resolves for an SO run, and its table marks one id per whitespace word."""
  assembly = assemble(TrainConfig(model_dir="unused", mixture_or_task_name="tiny_mix",
                                  task_feature_lengths={"tokens": 19}, batch_size=1, train_steps=1,
                                  encoder=tiny_encoder, objectives={"so": 1.0}))
  assets, _ = asset_registry.resolve(assembly.model.requires(), {}, assembly.run)
  table = assets["word_starts"].build(assembly.run)["table"]
  (shape, dtype), = aot.asset_shapes("word_starts", vocab_size=assembly.run.vocabulary.size,
                                     sizes=aot.AssetSizes()).values()
  assert table.shape == shape and table.dtype == dtype  # What the compile check passes abstractly.
  vocabulary = tasks.get_vocabulary("tiny_mix")
  for line in open(tiny_corpus["files"][("en", "validation")], encoding="utf-8").read().splitlines()[:20]:
    assert table[vocabulary.encode(line)].sum() == len(line.split())
