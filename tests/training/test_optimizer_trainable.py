"""OptimizerConfig.trainable: only the named parameters train (the head warm-up of an imported encoder)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flax_xalign.errors import UserError
from flax_xalign.training.optimizer import OptimizerConfig, decay_mask, make_optimizer


def _params():
  rng = np.random.default_rng(0)
  leaf = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  return {"token_embed": {"embedding": leaf(10, 4)},
          "layers_0": {"attention": {"kernel": leaf(4, 4)}, "norm": {"scale": leaf(4)}},
          "mlm_head": {"transform": {"kernel": leaf(4, 4), "bias": leaf(4)}, "norm": {"scale": leaf(4)},
                       "output_bias": leaf(10)}}


def test_only_the_named_subtree_moves_and_it_moves_as_adamw_on_that_subtree_alone():
  config = OptimizerConfig(learning_rate=1e-2, warmup_steps=0, clip_norm=1.0, trainable=("mlm_head",))
  params = _params()
  # Frozen gradients 1000x larger: counted in the clip's norm they would shrink the head's update.
  grads = jax.tree.map(lambda p: 1e3 * jnp.ones_like(p), params)
  grads["mlm_head"] = jax.tree.map(lambda p: 0.01 * (1 + jnp.arange(p.size, dtype=jnp.float32).reshape(p.shape)),
                                   params["mlm_head"])
  tx, _ = make_optimizer(config, total_steps=10)
  state = tx.init(params)
  updates, _ = tx.update(grads, state, params)
  new = optax.apply_updates(params, updates)
  for key in ("token_embed", "layers_0"):
    jax.tree.map(np.testing.assert_array_equal, new[key], params[key])
  # The reference: the same clip + AdamW built by hand on the head alone.
  head = params["mlm_head"]
  ref_tx = optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(optax.linear_schedule(1e-2, 0.0, 10), b1=0.9, b2=0.98, eps=1e-6,
                                   weight_decay=0.01, mask=decay_mask))
  ref_updates, _ = ref_tx.update(grads["mlm_head"], ref_tx.init(head), head)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9),
               new["mlm_head"], optax.apply_updates(head, ref_updates))
  assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(new["mlm_head"]), jax.tree.leaves(head)))


def test_the_frozen_parameters_moments_stay_zero_and_the_state_keeps_the_full_trees_structure():
  params = _params()
  full_tx = make_optimizer(OptimizerConfig(), 10)[0]
  tx = make_optimizer(OptimizerConfig(warmup_steps=0, trainable=("mlm_head",)), 10)[0]
  state = tx.init(params)
  # The same leaves as the full optimizer's (shardings and checkpoints see one structure).
  assert jax.tree.structure(jax.tree.leaves(state)) == jax.tree.structure(jax.tree.leaves(full_tx.init(params)))
  grads = jax.tree.map(jnp.ones_like, params)
  _, state = tx.update(grads, state, params)
  adam = next(s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState))
  for key in ("token_embed", "layers_0"):
    assert all(float(jnp.abs(m).max()) == 0 for m in jax.tree.leaves(adam.mu[key]))
  assert all(float(jnp.abs(m).max()) > 0 for m in jax.tree.leaves(adam.mu["mlm_head"]))


def test_a_prefix_that_names_no_parameter_is_one_clear_error():
  tx, _ = make_optimizer(OptimizerConfig(trainable=("mlm_hed",)), 10)
  with pytest.raises(UserError, match=r"names no parameter: \['mlm_hed'\].*mlm_head"):
    tx.init(_params())


def test_a_prefix_matches_whole_path_components_only():
  tx, _ = make_optimizer(OptimizerConfig(warmup_steps=0, trainable=("layers_0/norm",)), 10)
  params = _params()
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  moved = {"/".join(str(k.key) for k in path) for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]
           if float(jnp.abs(u).max()) > 0}
  assert moved == {"layers_0/norm/scale"}
  with pytest.raises(UserError):
    make_optimizer(OptimizerConfig(trainable=("layers_0/nor",)), 10)[0].init(params)
