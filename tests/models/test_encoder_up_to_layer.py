"""`Encoder(..., up_to_layer=l)`: the full pass's layer-l states, without the layers above l."""

import jax
import jax.extend
import numpy as np
import pytest

from flax_xalign.models.encoder import Encoder
from tests.models.encoder_testlib import encode, variables_for


def _truncated(variables, batch, config, layer, all_hidden=False):
  return Encoder(config).apply(
      variables, batch["tokens"], lang_ids=batch["lang_ids"], positions=batch["positions"],
      segment_ids=batch["segment_ids"], deterministic=True, return_all_hidden=all_hidden,
      up_to_layer=layer)


def _primitives(jaxpr):
  """Every equation of a closed jaxpr, sub-jaxprs (scan bodies) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _primitives(sub)


@pytest.mark.fast("overrides0", "overrides3")  # Scanned post-LN, unscanned pre-LN: each option once.
@pytest.mark.parametrize("overrides", [{}, {"scan_layers": False}, {"pre_layer_norm": True},
                                       {"pre_layer_norm": True, "scan_layers": False}])
def test_states_equal_the_full_pass_at_every_layer(config, batch, overrides):
  config = config.replace(**overrides)
  assert config.num_layers >= 2
  variables = variables_for(config)
  full = encode(variables, batch, config=config).all_hidden
  for layer in range(config.num_layers + 1):
    out = jax.jit(lambda v, b, layer=layer: _truncated(v, b, config, layer, all_hidden=True))(variables, batch)
    assert len(out.all_hidden) == layer + 1
    np.testing.assert_allclose(out.hidden, full[layer], rtol=1e-5, atol=1e-5)
    for got, want in zip(out.all_hidden, full):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scan", [True, False])
def test_layers_above_are_not_computed(config, batch, scan):
  config = config.replace(scan_layers=scan)
  variables = variables_for(config)

  def layers_run(layer):
    """Exact GELUs (one erf(c) per layer; the MLM head is not called) and scan trip counts."""
    jaxpr = jax.make_jaxpr(lambda v: _truncated(v, batch, config, layer))(variables).jaxpr
    eqns = list(_primitives(jaxpr))
    erfs = sum(e.primitive.name in ("erf", "erfc") for e in eqns)
    trips = [e.params["length"] for e in eqns if e.primitive.name == "scan"]
    return erfs * (trips[0] if scan and trips else 1), trips

  assert layers_run(None)[0] == config.num_layers
  for layer in range(1, config.num_layers + 1):
    count, trips = layers_run(layer)
    assert count == layer, (layer, count, trips)
  assert layers_run(0) == (0, [])


def test_out_of_range_layer_is_refused(config, batch):
  with pytest.raises(ValueError, match="up_to_layer"):
    _truncated(variables_for(config), batch, config, config.num_layers + 1)
