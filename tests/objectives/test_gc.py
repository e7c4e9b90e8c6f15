"""MLM-GC's `gc` term: against a loop-by-loop NumPy reference, the Eq. 6 reading, the collapse guard, a smoke.

The reference walks every masked slot and every neighbour within ±n with the
rules written out from the paper and the spec (same segment, same pair side,
inside the row, not a layout special, the masked-neighbour and neighbour-id
switches), looks X up in a Python dict and sums GloVe's weighted squares in
float64. The batches are random packed rows with unframed segments (text
tokens of two segments side by side), translation pairs (two sides in one
segment), padding and specials, and the table holds most pairs, specials
included, so any pair counted across a boundary or with a special would show.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign import run_spec as run_spec_lib
from flax_xalign.data.vocab.specials import PROJECT
from flax_xalign.errors import UserError
from flax_xalign.objectives import base, gc
from flax_xalign.objectives.masking import MaskedTokens
from flax_xalign.ops.cooc_lookup import csr_from_pairs
from flax_xalign.training import checkpoints
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import optimizer_record

from tests.testlib import tiny_encoder_config

V, E, L, B, P = 41, 7, 13, 4, 5
LAYOUT = (PROJECT.pad, PROJECT.bos, PROJECT.eos, PROJECT.mask)


# ---------------------------------------------------------------------------- data


def random_rows(rng, batch=B, length=L):
  """Packed rows: segments of 2-6 tokens, framed by <s> </s> or not, some split into two pair sides."""
  feats = {k: np.zeros((batch, length), np.int32) for k in ("tokens", "segment_ids", "pair_side", "lang_ids",
                                                              "positions")}
  for r in range(batch):
    cursor, segment = 0, 1
    while cursor < length:
      n = min(int(rng.integers(2, 7)), length - cursor)
      ids = rng.integers(PROJECT.first_regular, V, n)
      ids[rng.random(n) < 0.1] = PROJECT.unk
      if rng.random() < 0.5 and n >= 3:
        ids[0], ids[-1] = PROJECT.bos, PROJECT.eos
      span = slice(cursor, cursor + n)
      feats["tokens"][r, span] = ids
      feats["segment_ids"][r, span] = segment
      feats["positions"][r, span] = np.arange(n)
      feats["lang_ids"][r, span] = 1
      if rng.random() < 0.35 and n >= 2:
        half = int(rng.integers(1, n))
        feats["pair_side"][r, span] = np.where(np.arange(n) < half, 1, 2)
      cursor += n
      segment += 1
      if rng.random() < 0.25 and r % 2 == 0:
        break  # The rest of the row is padding.
  return feats


def random_masking(rng, tokens, slots=P):
  """Hand-made masking: regular positions, inputs <mask> / random / kept, weight-0 slots on real tokens too."""
  batch, _ = tokens.shape
  positions = np.zeros((batch, slots), np.int32)
  weights = np.zeros((batch, slots), np.float32)
  inputs = tokens.copy()
  for r in range(batch):
    regular = np.flatnonzero(tokens[r] >= PROJECT.first_regular)
    chosen = rng.permutation(regular)[:slots]
    positions[r, :len(chosen)] = chosen
    weights[r, :len(chosen)] = 1.0
    if len(chosen) == slots:
      weights[r, -1] = 0.0  # A slot on a real token that does not count.
    for i, t in enumerate(chosen):
      mode = (r + i) % 3
      inputs[r, t] = PROJECT.mask if mode == 0 else (int(rng.integers(PROJECT.first_regular, V)) if mode == 1
                                                     else tokens[r, t])
  targets = np.take_along_axis(tokens, positions, axis=1)
  return MaskedTokens(inputs=inputs, positions=positions, targets=targets, weights=weights)


def random_table(rng, density=0.7):
  """{(a, b): X} over every id, specials included; X spans both sides of x_max = 100."""
  return {(a, b): float(np.exp(rng.uniform(-1.0, 6.5)))
          for a in range(V) for b in range(V) if rng.random() < density}


def device_table(pairs):
  indptr, indices, log_x = csr_from_pairs(pairs, V)
  return {"indptr": jnp.asarray(indptr), "indices": jnp.asarray(indices), "log_x": jnp.asarray(log_x)}


def gc_term(feats, masked, table, hidden, logits, bias, **options):
  """The `gc` term of a hand-made step context, under jit (one compile instead of hundreds of eager ops)."""
  objective = base.get("gc", **options)

  def term(feats, masked, cooc, hidden, logits, bias):
    ctx = base.StepContext(
        params={"mlm_head": {"output_bias": bias}}, apply=None, batch=feats, masked=MaskedTokens(*masked),
        hidden=hidden, all_hidden=None, logits=logits, rng=jax.random.key(0), train=True, assets={"cooc": cooc},
        specials=PROJECT)
    return objective(ctx)

  arrays = (feats, tuple(masked), device_table(table), hidden, logits, bias)
  return jax.jit(term)(*jax.tree.map(jnp.asarray, arrays))


# ---------------------------------------------------------------------------- reference


def reference(feats, masked, table, hidden, logits, bias, *, window, representation="hidden",
              masked_neighbours="include", neighbour_ids="original", scale_sqrt_d=True, per_window_norm=True,
              x_max=100.0, alpha=0.75):
  """(loss, loss_sum, count, metrics) by loops over slots and neighbours, in float64."""
  tokens, segment, side = feats["tokens"], feats["segment_ids"], feats["pair_side"]
  hidden, logits, bias = (np.asarray(x, np.float64) for x in (hidden, logits, bias))
  scale = 1.0 / math.sqrt(hidden.shape[-1]) if scale_sqrt_d else 1.0
  loss_sum = count = error_sum = f_sum = abs_sum = n_found = n_pairs = 0.0
  for b in range(tokens.shape[0]):
    for p in range(masked.positions.shape[1]):
      weight = float(masked.weights[b, p])
      if weight <= 0:
        continue
      t = int(masked.positions[b, p])
      w_t = int(tokens[b, t])
      slot_sum = 0.0
      for k in range(t - window, t + window + 1):
        if k == t or k < 0 or k >= tokens.shape[1]:
          continue
        if segment[b, t] == 0 or segment[b, k] != segment[b, t] or side[b, k] != side[b, t]:
          continue
        if tokens[b, k] in LAYOUT:
          continue
        if masked_neighbours == "exclude" and masked.inputs[b, k] == PROJECT.mask:
          continue
        w_k = int(tokens[b, k] if neighbour_ids == "original" else masked.inputs[b, k])
        if w_k in LAYOUT:
          continue
        n_pairs += 1
        x = table.get((w_t, w_k), 0.0)
        if x == 0.0:
          continue
        if representation == "hidden":
          s = float(hidden[b, t] @ hidden[b, k]) * scale
        else:
          s = (logits[b, p, w_k] - bias[w_k]) * scale
        f = min(1.0, (x / x_max) ** alpha)
        term = f * (s - math.log(x)) ** 2
        slot_sum += term
        error_sum += term
        f_sum += f
        abs_sum += abs(s)
        n_found += 1
      loss_sum += weight * slot_sum / (2 * window if per_window_norm else 1)
      count += weight
  metrics = {"error": error_sum / max(f_sum, 1e-12), "found": n_found / max(n_pairs, 1),
             "abs_score": abs_sum / max(n_found, 1), "pairs": n_pairs / max(count, 1)}
  return loss_sum / max(count, 1), loss_sum, count, metrics


def _case(seed):
  rng = np.random.default_rng(seed)
  feats = random_rows(rng)
  masked = random_masking(rng, feats["tokens"])
  table = random_table(rng)
  hidden = (rng.normal(size=(B, L, E)) * 1.5).astype(np.float32)
  logits = (rng.normal(size=(B, P, V)) * 3).astype(np.float32)
  bias = rng.normal(size=V).astype(np.float32)
  return feats, masked, table, hidden, logits, bias


def _check(term, ref):
  loss, loss_sum, count, metrics = ref
  np.testing.assert_allclose(float(term.loss), loss, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(float(term.loss_sum), loss_sum, rtol=2e-5, atol=1e-6)
  assert float(term.count) == count
  for key, value in metrics.items():
    np.testing.assert_allclose(float(term.metrics[key]), value, rtol=2e-5, atol=1e-6, err_msg=key)


# ---------------------------------------------------------------------------- the loss


# Every combination of the three switches once; each switch meets both windows (one compile per case).
_SWITCHES = [(r, m, i, 1 + (a + c) % 2) for a, r in enumerate(("hidden", "output"))
             for b, m in enumerate(("include", "exclude")) for c, i in enumerate(("original", "input"))]


@pytest.mark.parametrize("representation, masked_neighbours, neighbour_ids, window", _SWITCHES)
def test_loss_matches_the_loop_reference(representation, masked_neighbours, neighbour_ids, window):
  options = {"window": window, "representation": representation, "masked_neighbours": masked_neighbours,
             "neighbour_ids": neighbour_ids}
  case = _case(_SWITCHES.index((representation, masked_neighbours, neighbour_ids, window)))
  term = gc_term(*case, **options)
  _check(term, reference(*case, **options))
  assert float(term.metrics["found"]) > 0.3 and float(term.count) > 8  # The cases exercise real pairs.


def test_loss_without_scale_or_window_norm_and_other_weighting():
  options = {"window": 3, "scale_sqrt_d": False, "per_window_norm": False, "x_max": 10.0, "alpha": 0.5,
             "accept_collapse_risk": True}
  case = _case(20)
  term = gc_term(*case, **options)
  del options["accept_collapse_risk"]
  _check(term, reference(*case, **options))


def test_hand_computed_row():
  # <s> a b c </s> <pad>, b masked; window 1; X[b, a] = 10, X[b, c] = 200; d = 4.
  a, b_, c = 5, 6, 7
  feats = {"tokens": np.array([[PROJECT.bos, a, b_, c, PROJECT.eos, 0]], np.int32),
           "segment_ids": np.array([[1, 1, 1, 1, 1, 0]], np.int32)}
  feats["pair_side"] = np.zeros_like(feats["tokens"])
  masked = MaskedTokens(inputs=np.array([[PROJECT.bos, a, PROJECT.mask, c, PROJECT.eos, 0]], np.int32),
                        positions=np.array([[2]], np.int32), targets=np.array([[b_]], np.int32),
                        weights=np.ones((1, 1), np.float32))
  hidden = np.zeros((1, 6, 4), np.float32)
  hidden[0, 1, 0], hidden[0, 2, 0], hidden[0, 3, 1] = 1.0, 2.0, 5.0  # s(b, a) = 2 / √4 = 1, s(b, c) = 0
  term = gc_term(feats, masked, {(b_, a): 10.0, (b_, c): 200.0}, hidden, np.zeros((1, 1, V), np.float32),
                 np.zeros(V, np.float32), window=1)
  expected = ((10 / 100) ** 0.75 * (1 - math.log(10)) ** 2 + 1.0 * (0 - math.log(200)) ** 2) / 2
  np.testing.assert_allclose(float(term.loss), expected, rtol=1e-5)
  assert float(term.metrics["found"]) == 1.0 and float(term.metrics["pairs"]) == 2.0


def test_pairs_across_segments_sides_padding_or_specials_count_nothing():
  rng = np.random.default_rng(5)
  feats = random_rows(rng)
  masked = random_masking(rng, feats["tokens"])
  tokens, segment, side = feats["tokens"], feats["segment_ids"], feats["pair_side"]
  # Every pair the rules forbid (within ±2 of a slot) is in the table; nothing else is.
  forbidden = {}
  for b in range(B):
    for t in masked.positions[b]:
      for k in range(max(0, t - 2), min(L, t + 3)):
        if k != t and (segment[b, k] != segment[b, t] or side[b, k] != side[b, t] or tokens[b, k] in LAYOUT):
          forbidden[(int(tokens[b, t]), int(tokens[b, k]))] = 50.0
  forbidden.pop((int(tokens[0, masked.positions[0, 0]]), int(tokens[0, masked.positions[0, 0]])), None)
  assert len(forbidden) > 5
  allowed = {(int(tokens[b, t]), int(tokens[b, k]))
             for b in range(B) for t in masked.positions[b] for k in range(max(0, t - 2), min(L, t + 3))
             if k != t and segment[b, k] == segment[b, t] > 0 and side[b, k] == side[b, t]
             and tokens[b, k] not in LAYOUT}
  table = {key: x for key, x in forbidden.items() if key not in allowed}
  hidden = rng.normal(size=(B, L, E)).astype(np.float32)
  term = gc_term(feats, masked, table, hidden, np.zeros((B, P, V), np.float32), np.zeros(V, np.float32), window=2)
  assert float(term.loss) == 0.0 and float(term.metrics["found"]) == 0.0


def test_missing_pairs_and_an_empty_batch_give_zero_not_nan():
  case = list(_case(3))
  case[2] = {(1, 2): 5.0}  # A table with no pair the batch has.
  term = gc_term(*case)
  assert float(term.loss) == 0.0 and float(term.metrics["found"]) == 0.0
  case[1] = case[1]._replace(weights=np.zeros_like(case[1].weights))  # No masked slot at all.
  term = gc_term(*case)
  assert float(term.loss) == 0.0 and float(term.count) == 0.0
  assert all(np.isfinite(float(v)) for v in term.metrics.values())


def test_eq6_score_is_the_head_state_times_the_tied_embedding_row():
  """H^T O_w of App. D read off the logits = LayerNorm(GELU(dense(H_t))) · E[w], E the tied embedding."""
  from flax_xalign.models.encoder import MlmHead

  config = tiny_encoder_config(vocab_size=V, embed_dim=E)
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 3, E)).astype(np.float32)
  embedding = rng.normal(size=(V, E)).astype(np.float32)
  head = MlmHead(config)
  params = jax.tree.map(np.asarray, nn_unbox(head.init(jax.random.key(0), hidden, embedding)["params"]))
  params["output_bias"] = rng.normal(size=V).astype(np.float32)
  params["norm"]["scale"] = rng.uniform(0.5, 1.5, E).astype(np.float32)
  logits = head.apply({"params": params}, hidden, embedding)
  cols = rng.integers(0, V, (2, 3, 4))
  scores = gc.output_scores(logits, params["output_bias"], jnp.asarray(cols), scale=0.5)
  # By hand: dense, exact GELU, LayerNorm, then the embedding row.
  z = hidden.astype(np.float64) @ params["transform"]["kernel"] + params["transform"]["bias"]
  z = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
  z = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + config.layer_norm_epsilon)
  z = z * params["norm"]["scale"] + params["norm"]["bias"]
  expected = 0.5 * np.einsum("bpe,bpne->bpn", z, embedding[cols])
  np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)


def nn_unbox(params):
  import flax.linen as nn

  return nn.meta.unbox(params)


# ---------------------------------------------------------------------------- options and the guard


def test_bad_options_are_one_user_error_naming_each():
  with pytest.raises(UserError) as error:
    base.get("gc", window=0, representation="outputs", masked_neighbours="yes", neighbour_ids="label",
             x_max=-1, alpha=float("nan"), per_window_norm="no")
  message = str(error.value)
  for word in ("window", "representation", "masked_neighbours", "neighbour_ids", "x_max", "alpha",
               "per_window_norm", "train.objective_options"):
    assert word in message, word


def _run(objectives=None, gc_options=None, warmup=10000, cooc_window=None):
  vocabulary = run_spec_lib.VocabularySpec(file="vocabulary.model", sha256="ab" * 32, size=V, pieces=V)
  return run_spec_lib.RunSpec(
      task="t", languages=("de", "en"), task_feature_lengths={"tokens": L}, vocabulary=vocabulary,
      model=tiny_encoder_config(vocab_size=V), objectives=objectives or {"mlm": 1.0, "gc": 1.0},
      objective_options={"gc": dict(gc_options or {})},
      asset_options={} if cooc_window is None else {"cooc": {"window": cooc_window}},
      optimizer=optimizer_record(OptimizerConfig(warmup_steps=warmup)))


def test_guard_refuses_what_collapses_unless_accepted(capsys):
  base.get("gc").check(_run())  # The paper's settings pass.
  refused = [
      ({}, {"warmup": 0}, "no learning-rate warmup"),
      ({"scale_sqrt_d": False}, {}, "scale_sqrt_d=False"),
      ({"per_window_norm": False}, {}, "per_window_norm=False"),
      ({}, {"objectives": {"gc": 1.0}}, "no MLM or TLM term"),
  ]
  for options, run_changes, phrase in refused:
    with pytest.raises(UserError, match="accept_collapse_risk") as error:
      base.get("gc", **options).check(_run(gc_options=options, **run_changes))
    assert phrase in str(error.value)
    base.get("gc", accept_collapse_risk=True, **options).check(_run(gc_options=options, **run_changes))
    assert phrase in capsys.readouterr().out


def test_window_wider_than_the_table_is_refused():
  base.get("gc", window=3).check(_run(cooc_window=3))
  with pytest.raises(UserError, match="wider than the co-occurrence table's window 2"):
    base.get("gc", window=3).check(_run())
  from flax_xalign.assets import cooc

  assert gc.TABLE_DEFAULT_WINDOW == cooc.DEFAULT_WINDOW


def test_optimizer_record_round_trips_and_old_manifests_still_load():
  run = _run()
  assert run_spec_lib.RunSpec.from_json(run.to_json()) == run
  old = run.to_json()
  del old["optimizer"]  # A manifest written before the record.
  loaded = run_spec_lib.RunSpec.from_json(old)
  assert loaded.optimizer == {}
  base.get("gc").check(loaded)  # Nothing recorded: nothing to refuse.
  # A resume may change the optimiser's schedule: compatibility compares only what shapes its state.
  checkpoints.check_compatible(run, run.replace(optimizer={"warmup_steps": 5}), where="x")


def test_pretrain_refuses_a_gc_run_without_warmup_before_writing(tmp_path, tiny_corpus, tiny_encoder):
  from flax_xalign.training.pretrain import pretrain

  model_dir = tmp_path / "gc"
  with pytest.raises(UserError, match="no learning-rate warmup"):
    pretrain(model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
             batch_size=6, train_steps=2, encoder=tiny_encoder, objectives={"mlm": 1.0, "gc": 1.0},
             optimizer=OptimizerConfig(warmup_steps=0))
  assert not model_dir.exists()


# ---------------------------------------------------------------------------- training smoke


def test_trains_a_few_steps_through_the_trainer():
  from flax_xalign.assets.runtime import RunAssets
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training import partitioning
  from flax_xalign.training.trainer import LoopConfig, Trainer

  rng = np.random.default_rng(7)
  table = {key: x for key, x in random_table(rng, density=0.5).items() if key[0] not in LAYOUT}
  indptr, indices, log_x = csr_from_pairs(table, V)
  assets = RunAssets.of_values({"cooc": {"indptr": indptr, "indices": indices, "log_x": log_x}})
  model = PretrainingModel(encoder=Encoder(tiny_encoder_config(vocab_size=V)), objectives={"mlm": 1.0, "gc": 1.0})
  trainer = Trainer(model=model, optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
                    partitioner=partitioning.Partitioner(mesh=partitioning.make_mesh(1),
                                                         rules=partitioning.logical_axis_rules()),
                    loop=LoopConfig(train_steps=4, batch_size=6, length=L, seed=0), assets=assets)
  state = trainer.init_state()
  rows = random_rows(rng, batch=6)
  rows["lang_ids"] = np.where(rows["segment_ids"] > 0, 1 + rows["segment_ids"] % 2, 0).astype(np.int32)
  history = []
  with trainer.mesh_context():
    batch = trainer.shard(rows)
    for step in range(4):
      state, metrics = trainer.train_step(state, batch, jax.random.fold_in(trainer.base_rng, step),
                                          trainer.assets.device)
      history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
  for row in history:
    for key in ("loss", "mlm", "gc", "gc_error", "gc_found", "gc_abs_score", "gc_pairs"):
      assert np.isfinite(row[key]), (key, row)
    np.testing.assert_allclose(row["loss"], row["mlm"] + row["gc"], rtol=1e-5)
    assert 0.0 < row["gc_found"] <= 1.0 and row["gc"] > 0.0
