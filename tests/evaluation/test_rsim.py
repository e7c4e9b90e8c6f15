"""RSIM against scipy's Pearson correlation over the explicitly built cosine vectors; the plots."""

import numpy as np
import pytest
import scipy.stats

from flax_xalign.evaluation.lexicon import rsim
def _cosines(v):
  """The vector (cos(v_i, v_j))_{i<j} in the paper's order, built pair by pair."""
  out = []
  for i in range(len(v)):
    for j in range(i + 1, len(v)):
      out.append(float(np.dot(v[i], v[j]) / (np.linalg.norm(v[i]) * np.linalg.norm(v[j]))))
  return np.asarray(out)


def _pairs(rng, s, e=24, f=17, noise=0.5):
  x = rng.normal(size=(s, e))
  # y: a random linear image of x plus noise, in another width: related but not identical geometry.
  y = x @ rng.normal(size=(e, f)) + noise * rng.normal(size=(s, f))
  return x.astype(np.float32), y.astype(np.float32)


@pytest.mark.parametrize("s, block", [(2, 512), (3, 1), (37, 8), (64, 16), (61, 512)])
def test_rsim_matches_scipy_pearson(s, block):
  x, y = _pairs(np.random.default_rng(s), s)
  want = scipy.stats.pearsonr(_cosines(x), _cosines(y))[0] if s > 2 else float("nan")
  got = float(rsim.rsim(x, y, block=block))
  if s == 2:  # One pair i < j: the correlation is undefined.
    assert np.isnan(got)
  else:
    np.testing.assert_allclose(got, want, atol=2e-6)


def test_rsim_mask_drops_rows_and_thousands_of_pairs_stay_accurate():
  rng = np.random.default_rng(0)
  x, y = _pairs(rng, 50)
  mask = rng.random(50) < 0.6
  want = scipy.stats.pearsonr(_cosines(x[mask]), _cosines(y[mask]))[0]
  np.testing.assert_allclose(float(rsim.rsim(x, y, mask, block=16)), want, atol=2e-6)
  # 2,000 pairs (~2M cosines each side), cosines with a large common offset: float32 sums would lose it.
  x, y = _pairs(rng, 2000, noise=2.0)
  x, y = x + 3.0, y + 3.0
  iu = np.triu_indices(2000, k=1)
  xn = x / np.linalg.norm(x, axis=1, keepdims=True)
  yn = y / np.linalg.norm(y, axis=1, keepdims=True)
  want = scipy.stats.pearsonr((xn.astype(np.float64) @ xn.T)[iu], (yn.astype(np.float64) @ yn.T)[iu])[0]
  np.testing.assert_allclose(float(rsim.rsim(x, y)), want, atol=1e-6)


def test_identical_geometry_is_one_and_rotation_invariant():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(20, 12)).astype(np.float32)
  rotation, _ = np.linalg.qr(rng.normal(size=(12, 12)))
  np.testing.assert_allclose(float(rsim.rsim(x, (x @ rotation).astype(np.float32))), 1.0, atol=1e-5)


def test_mean_pair_cosine():
  x = np.array([[1, 0], [0, 2], [1, 1], [5, 5]], np.float32)
  y = np.array([[1, 0], [1, 0], [-1, -1], [1, 0]], np.float32)
  # cosines: 1, 0, -1, 1/sqrt(2); the last row masked out.
  np.testing.assert_allclose(float(rsim.mean_pair_cosine(x, y, np.array([1, 1, 1, 0], bool))), 0.0, atol=1e-6)
  np.testing.assert_allclose(float(rsim.mean_pair_cosine(x, y)), (1 + 0 - 1 + 0.5 ** 0.5) / 4, atol=1e-6)
  assert np.isnan(float(rsim.mean_pair_cosine(x, y, np.zeros(4, bool))))


def test_plots_and_delta(tmp_path):
  layers = [0, 1, 2, 3]
  path = rsim.plot_layers({"layers": layers, "hit@1_nn": [0.5, 0.4, 0.3, 0.2], "hit@1_csls": [0.6, 0.5, 0.3, 0.2],
                           "mean_cosine": [0.1, 0.3, 0.5, 0.7], "rsim": [0.6, 0.5, 0.4, 0.3]},
                          str(tmp_path / "layers.png"), title="toy")
  assert (tmp_path / "layers.png").stat().st_size > 1000 and path.endswith("layers.png")
  rsims = {"MLM": [0.6, 0.5, 0.4, 0.3], "SCS": [0.6, 0.55, 0.5, 0.45], "TCS": [0.6, 0.5, 0.45, 0.3]}
  deltas = rsim.delta_rsim(rsims, "MLM")
  assert set(deltas) == {"SCS", "TCS"}
  np.testing.assert_allclose(deltas["SCS"], [0.0, 0.05, 0.1, 0.15], atol=1e-12)
  rsim.plot_delta_rsim(rsims, "MLM", str(tmp_path / "delta.png"))
  assert (tmp_path / "delta.png").stat().st_size > 1000
  with pytest.raises(ValueError, match="baseline"):
    rsim.delta_rsim(rsims, "XLM")


def test_layer_curves_controls_are_centred_and_shuffled_rsim_by_hand():
  """rsim_centred: scipy's Pearson of the cosines after each side's mean is subtracted; rsim_shuffled: of the
  target pairs permuted by the same draw. A direction added to every vector (an anisotropic layer) moves RSIM
  and leaves the centred control where it was."""
  from flax_xalign.evaluation.lexicon import bli

  rng = np.random.default_rng(3)
  x0, y0 = _pairs(rng, 40, e=16, f=16, noise=3.0)
  direction = 6.0 * rng.normal(size=16)
  x, y = (x0 + direction).astype(np.float32), (y0 + direction).astype(np.float32)
  pairs = (np.arange(40), np.arange(40))
  curves = bli.layer_curves({0: x}, {0: y}, pairs=pairs)
  plain = bli.layer_curves({0: x0}, {0: y0}, pairs=pairs)
  centred = scipy.stats.pearsonr(_cosines(x - x.mean(0)), _cosines(y - y.mean(0)))[0]
  np.testing.assert_allclose(curves["rsim_centred"][0], centred, atol=2e-6)
  np.testing.assert_allclose(curves["rsim_centred"][0], plain["rsim_centred"][0], atol=1e-5)
  shuffle = np.random.default_rng(0).permutation(40)
  # (float32 cosines near 1 in the shifted space: the uncentred ones round more)
  np.testing.assert_allclose(curves["rsim_shuffled"][0], scipy.stats.pearsonr(_cosines(x), _cosines(y[shuffle]))[0],
                             atol=1e-5)
  np.testing.assert_allclose(curves["rsim"][0], scipy.stats.pearsonr(_cosines(x), _cosines(y))[0], atol=1e-5)
  assert abs(curves["rsim"][0] - plain["rsim"][0]) > 0.02  # The shift moved RSIM (0.59 -> 0.55 here) ...
  assert abs(plain["rsim_shuffled"][0]) < 0.2 < plain["rsim"][0]  # ... and without the pairing little is left.
