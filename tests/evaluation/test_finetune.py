"""Fine-tuning: batch order, the AdamW train step, learning a task, evaluation.

The tagging tests share one encoder config, head and update rule, so their
train step compiles once per session.
"""

import functools

import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.evaluation.transfer import finetune
from flax_xalign.evaluation.transfer.featurize import Featurizer
from flax_xalign.evaluation.transfer.transfer_data import LabelledSentence
from flax_xalign.models.heads import make_head
from flax_xalign.training.optimizer import OptimizerConfig
from tests.evaluation.transfer_testlib import BATCH, LENGTH, LR, STEPS, tagged

# The update rule `finetune` keys its compiled step by (schedule fields zeroed).
FINETUNE_RULE = OptimizerConfig(learning_rate=0.0, warmup_steps=0, end_learning_rate_ratio=0.0,
                                weight_decay=0.01, b2=0.999, eps=1e-8, clip_norm=1.0)
TAGS = {"adj": 0, "det": 1, "noun": 2, "verb": 3}


def test_batch_order_covers_epochs_and_groups_by_length():
  lengths = np.random.default_rng(0).integers(3, 100, size=1000)
  plain = finetune.batch_order(lengths, 10, 300, seed=1)
  grouped = finetune.batch_order(lengths, 10, 300, seed=1, group_by_length=True)
  assert plain.shape == grouped.shape == (300, 10)
  # Three epochs, each example once per epoch, in both orders.
  for order in (plain, grouped):
    for epoch in order.reshape(3, 1000):
      assert sorted(epoch) == list(range(1000))
  np.testing.assert_array_equal(plain, finetune.batch_order(lengths, 10, 300, seed=1))
  spread = lambda order: np.mean(np.ptp(lengths[order], axis=1))  # noqa: E731
  assert spread(grouped) < 0.2 * spread(plain)
  assert [finetune.bucket_length(n, 112) for n in (1, 32, 33, 97, 101)] == [32, 32, 64, 112, 112]


def adamw_reference(params, grads, mu, nu, count, learning_rate, rule):
  """One AdamW step in float64 NumPy, written from the paper, not from optax.

  Gradients are clipped to global norm `rule.clip_norm`; Adam moments with
  bias correction; decoupled weight decay on "kernel" and "embedding" leaves
  only. params, grads: pytrees; mu, nu: {path: moment} (None at count 1).

  Returns:
    (new params {path: array}, mu, nu, the gradients' global norm).
  """
  flat_params = {jax.tree_util.keystr(k): (k, np.asarray(v, np.float64))
                 for k, v in jax.tree_util.tree_flatten_with_path(params)[0]}
  flat_grads = {jax.tree_util.keystr(k): np.asarray(v, np.float64)
                for k, v in jax.tree_util.tree_flatten_with_path(grads)[0]}
  norm = np.sqrt(sum(np.sum(g * g) for g in flat_grads.values()))
  scale = min(1.0, rule.clip_norm / norm)
  mu = mu or {k: 0.0 for k in flat_params}
  nu = nu or {k: 0.0 for k in flat_params}
  new = {}
  for name, (path, p) in flat_params.items():
    g = flat_grads[name] * scale
    mu[name] = rule.b1 * mu[name] + (1 - rule.b1) * g
    nu[name] = rule.b2 * nu[name] + (1 - rule.b2) * g * g
    update = (mu[name] / (1 - rule.b1**count)) / (np.sqrt(nu[name] / (1 - rule.b2**count))
                                                 + rule.eps)
    if path[-1].key in ("kernel", "embedding"):
      update = update + rule.weight_decay * p
    new[name] = p - learning_rate * update
  return new, mu, nu, norm


def test_train_step_is_a_clipped_adamw_step_at_the_injected_learning_rate(transfer_model,
                                                                           spm_vocabulary):
  encoder, params = transfer_model
  head = make_head(encoder.config, "tagging", len(TAGS))
  train_step, init_optimizer = finetune._train_functions(encoder.config, head, FINETUNE_RULE, 0)
  features = Featurizer(spm_vocabulary, max_length=LENGTH).featurize(tagged(200, seed=1),
                                                                     label_index=TAGS)
  batch = {k: getattr(features, k)[:BATCH] for k in ("tokens", "labels", "weights")}
  assert batch["tokens"].shape == (BATCH, LENGTH)  # The training shape: no new compilation.
  state = {"encoder": finetune.encoder_params(params),
           "head": head.init(jax.random.key(1), np.zeros((1, 2, 24), np.float32),
                             deterministic=True)["params"]}
  names = {path[-1].key for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]}
  assert {"kernel", "embedding"} <= names and {"scale", "bias"} <= names  # Decayed and not.
  opt_state = init_optimizer(state)
  assert opt_state.hyperparams["learning_rate"] == 0.0
  language_id, rng = np.int32(2), jax.random.key(7)
  grad_fn = jax.jit(jax.grad(lambda p, key: finetune.finetune_loss(
      p, batch, language_id, key, encoder=encoder, head=head, pad_id=0)[0]))
  mu = nu = None
  for step, learning_rate in enumerate((0.05, 0.02)):
    grads = grad_fn(state, jax.random.fold_in(rng, step))  # The step's dropout key.
    new_state, opt_state, _ = train_step(state, opt_state, batch, language_id,
                                         np.float32(learning_rate), rng, np.int32(step))
    injected = opt_state.hyperparams["learning_rate"]
    assert injected.dtype == np.float32 and injected == np.float32(learning_rate)
    expected, mu, nu, norm = adamw_reference(state, grads, mu, nu, step + 1, learning_rate,
                                             FINETUNE_RULE)
    assert norm > FINETUNE_RULE.clip_norm  # Clipping changes the update.
    for path, value in jax.tree_util.tree_flatten_with_path(new_state)[0]:
      name = jax.tree_util.keystr(path)
      # Decay alone moves a LayerNorm scale by lr * 0.01 = 2e-4 or more.
      np.testing.assert_allclose(value, expected[name], rtol=0, atol=2e-6, err_msg=name)
    state = new_state


def test_padding_is_the_vocabularys_pad_id(transfer_model):
  encoder, params = transfer_model
  head = make_head(encoder.config, "tagging", len(TAGS))
  state = {"encoder": finetune.encoder_params(params),
           "head": head.init(jax.random.key(1), np.zeros((1, 2, 24), np.float32),
                             deterministic=True)["params"]}

  def loss(tokens, pad_id):
    batch = {"tokens": tokens, "labels": np.full(tokens.shape, 2, np.int32),
             "weights": np.isin(tokens, (7, 8, 9)).astype(np.float32)}
    loss_fn = jax.jit(functools.partial(finetune.finetune_loss, encoder=encoder, head=head,
                                        pad_id=pad_id))
    return float(loss_fn(state, batch, np.int32(1), None)[0])

  row = np.array([[0, 7, 8, 9, 2]], np.int32)  # XLM-R-like: <s>=0, </s>=2, <pad>=1.
  padded = np.concatenate([row, np.ones((1, 6), np.int32)], axis=1)
  assert loss(padded, pad_id=1) == pytest.approx(loss(row, pad_id=1), rel=1e-6)
  # Read as tokens, the pads change the result (so the comparison above means something).
  assert loss(padded, pad_id=0) != pytest.approx(loss(row, pad_id=1), rel=1e-5)


def test_finetune_learns_a_tagging_task(transfer_model, spm_vocabulary, capsys):
  encoder, params = transfer_model
  train = tagged(200, seed=1)
  embedding = np.array(params["token_embed"]["embedding"])
  finetuned = finetune.finetune(encoder, params, spm_vocabulary, train, language_id=1,
                                steps=STEPS, batch_size=BATCH, max_length=LENGTH,
                                learning_rate=LR, seed=0, name="toy pos")
  assert finetuned.label_set == ("adj", "det", "noun", "verb")
  assert "finetune toy pos: 60 steps" in capsys.readouterr().out
  assert finetuned.history["loss"][-5:].mean() < 0.5 * finetuned.history["loss"][:5].mean()
  # Tags depend on later subwords ("▁a" starts "a" and "alt", "▁k" "katze" and
  # "klein"), so the encoder, not just the embeddings, has to learn.
  assert finetune.evaluate(finetuned, train, language_id=1)["accuracy"] > 0.9
  scores = finetune.evaluate(finetuned, tagged(60, seed=2), language_id=1)
  assert scores["accuracy"] > 0.85 and scores["f1"] > 0.8
  assert scores["count"] == sum(len(s.words) for s in tagged(60, seed=2))
  # Batches of rows sorted by length, the last one partial: the same predictions.
  assert finetune.evaluate(finetuned, tagged(60, seed=2), language_id=1, batch_size=16) == scores
  # The pretrained parameters are untouched (a later fine-tuning starts from them).
  np.testing.assert_array_equal(params["token_embed"]["embedding"], embedding)
  # Length-grouped batches (all cut to LENGTH here, so no new compilation).
  train_step, _ = finetune._train_functions(encoder.config, finetuned.head, FINETUNE_RULE, 0)
  misses, compiled = finetune._train_functions.cache_info().misses, train_step._cache_size()
  grouped = finetune.finetune(encoder, params, spm_vocabulary, train, steps=5, batch_size=BATCH,
                              max_length=LENGTH, learning_rate=LR, group_by_length=True,
                              log=None)
  assert grouped.history["loss"].shape == (5,) and np.isfinite(grouped.history["loss"]).all()
  # Another step count and schedule: the same cached step, nothing compiled.
  assert finetune._train_functions.cache_info().misses == misses
  assert train_step._cache_size() == compiled


def test_evaluate_an_untrained_classifier(transfer_model, spm_vocabulary):
  encoder, params = transfer_model
  head = make_head(encoder.config, "classification", 2)
  hidden = np.random.default_rng(0).normal(size=(3, 5, 24)).astype(np.float32)
  variables = head.init(jax.random.key(0), hidden, deterministic=True)
  untrained = finetune.FinetunedModel(
      config=encoder.config, head=head, task="classification", label_set=("de", "en"),
      params={"encoder": finetune.encoder_params(params), "head": variables["params"]},
      featurizer=Featurizer(spm_vocabulary, max_length=LENGTH), history={}, seconds=0.0)
  examples = [LabelledSentence(s.words, "en") for s in tagged(10, seed=3)]
  scores = finetune.evaluate(untrained, examples, batch_size=4)
  assert scores["count"] == 10 and scores["accuracy"] in (0.0, 1.0)  # One class predicted.
  with pytest.raises(UserError, match="fine-tuned for classification"):
    finetune.evaluate(untrained, tagged(2, seed=0))


@pytest.mark.slow  # Compiles a second train step (~15 s of CPU).
def test_finetune_learns_a_classification_task(transfer_model, spm_vocabulary):
  encoder, params = transfer_model
  # Label: does the sentence contain "the"? Read from the <s> state's context.
  train = [LabelledSentence(s.words, "yes" if "the" in s.words else "no")
           for s in tagged(200, seed=3)]
  finetuned = finetune.finetune(encoder, params, spm_vocabulary, train, steps=STEPS,
                                batch_size=BATCH, max_length=LENGTH, learning_rate=LR, log=None)
  assert finetuned.task == "classification" and finetuned.label_set == ("no", "yes")
  assert finetune.evaluate(finetuned, train)["accuracy"] > 0.9
