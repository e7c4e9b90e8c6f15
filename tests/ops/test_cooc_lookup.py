"""CSR co-occurrence lookup against a Python dict, at realistic sizes and at the edges."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse

from flax_xalign import ops
from flax_xalign.ops import cooc_lookup  # The module (ops.cooc_lookup).
from tests import testlib

V = 3001  # Odd, so a transposed axis or an off-by-one row fails.
PAIRS = 200_000
QUERIES = 100_000
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _random_pairs(rng, vocab, n, *, empty_rows=(), single_row=None, full_row=None):
  """{(a, b): X} with X > 0; `empty_rows` have no entry, `single_row` exactly one, `full_row` all V."""
  a = rng.integers(0, vocab, n)
  b = rng.integers(0, vocab, n)
  x = rng.gamma(0.7, 20.0, n) + 1e-3
  pairs = {}
  for i, j, v in zip(a.tolist(), b.tolist(), x.tolist()):
    if i in empty_rows or i == single_row or i == full_row:
      continue
    pairs[(i, j)] = v
  if single_row is not None:
    pairs[(single_row, vocab // 2)] = 3.5
  if full_row is not None:
    for j in range(vocab):
      pairs[(full_row, j)] = 1.0 + j
  return pairs


def _reference(pairs, rows, cols):
  """Expected (log_x, found) from the dict: float32(log X) where present, 0 / False elsewhere."""
  log_x = np.zeros(rows.shape, np.float32)
  found = np.zeros(rows.shape, bool)
  for k, (a, b) in enumerate(zip(rows.ravel().tolist(), cols.ravel().tolist())):
    x = pairs.get((a, b))
    if x is not None:
      log_x.flat[k], found.flat[k] = np.float32(np.log(x)), True
  return log_x, found


@pytest.fixture(scope="module")
def table():
  rng = np.random.default_rng(0)
  empty = {1, 17, 2999, V - 1}  # The last row empty: indptr[V] == indptr[V - 1].
  pairs = _random_pairs(rng, V, PAIRS, empty_rows=empty, single_row=5, full_row=0)
  return pairs, ops.csr_from_pairs(pairs, V), empty


def test_csr_from_pairs_matches_scipy(table):
  pairs, (indptr, indices, log_x), empty = table
  assert indptr.dtype == np.int32 and indices.dtype == np.int32 and log_x.dtype == np.float32
  assert indptr.shape == (V + 1,) and indices.shape == log_x.shape == (len(pairs),)
  keys = np.array(list(pairs))
  ref = scipy.sparse.csr_matrix((np.log(list(pairs.values())), (keys[:, 0], keys[:, 1])), shape=(V, V))
  ref.sort_indices()
  np.testing.assert_array_equal(indptr, ref.indptr)
  np.testing.assert_array_equal(indices, ref.indices)
  np.testing.assert_array_equal(log_x, ref.data.astype(np.float32))
  assert all(indptr[r] == indptr[r + 1] for r in empty)
  assert indptr[1] - indptr[0] == V and indptr[6] - indptr[5] == 1
  # X == 0 is absent; negative values and foreign ids are refused.
  z_indptr, z_indices, _ = ops.csr_from_pairs({(0, 1): 0.0, (2, 0): 4.0}, 3)
  np.testing.assert_array_equal(z_indptr, [0, 0, 0, 1])
  np.testing.assert_array_equal(z_indices, [0])
  with pytest.raises(ValueError, match=">= 0"):
    ops.csr_from_pairs({(0, 1): -1.0}, 3)
  with pytest.raises(ValueError, match=r"\[0, 3\)"):
    ops.csr_from_pairs({(0, 3): 1.0}, 3)


def _queries(rng, pairs, empty):
  """Half present pairs, half random (mostly missing); plus the edges, duplicated and shuffled."""
  keys = np.array(list(pairs))
  present = keys[rng.integers(0, len(keys), QUERIES // 2)]
  random = rng.integers(0, V, (QUERIES // 2, 2))
  edges = [(0, 0), (0, V - 1), (0, V // 3),  # The full row: both ends and the middle.
           (5, V // 2), (5, V // 2 - 1), (5, V // 2 + 1), (5, 0), (5, V - 1),  # The row of one entry.
           *[(r, c) for r in sorted(empty) for c in (0, 1, V - 1)],  # Empty rows, the last one included.
           (V - 2, 0), (V - 2, V - 1), (2, 0), (2, V - 1)]
  row_ends = [(a, b) for a in (2, 3, V - 3) for b in (keys[keys[:, 0] == a][:, 1].min(),
                                                        keys[keys[:, 0] == a][:, 1].max())]
  q = np.concatenate([present, random, np.array(edges * 3 + row_ends * 3)])  # Duplicates on purpose.
  q = q[rng.permutation(len(q))]
  return q[:, 0].astype(np.int32), q[:, 1].astype(np.int32)


def test_lookup_matches_a_dict(table):
  pairs, (indptr, indices, log_x), empty = table
  rng = np.random.default_rng(1)
  rows, cols = _queries(rng, pairs, empty)
  expected, expected_found = _reference(pairs, rows, cols)
  assert 0.3 < expected_found.mean() < 0.7  # Both outcomes are well represented.
  fn = jax.jit(cooc_lookup.lookup)
  out = fn(indptr, indices, log_x, rows, cols)
  assert out.log_x.dtype == jnp.float32 and out.found.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(out.found), expected_found)
  np.testing.assert_array_equal(np.asarray(out.log_x), expected)
  # Any query shape: the same queries as [batch, length, pairs].
  shaped = fn(indptr, indices, log_x, rows[:96 * 13 * 4].reshape(96, 13, 4), cols[:96 * 13 * 4].reshape(96, 13, 4))
  assert shaped.log_x.shape == (96, 13, 4)
  np.testing.assert_array_equal(np.asarray(shaped.log_x).ravel(), expected[:96 * 13 * 4])
  for unroll in (False, True):  # Both loop forms, whatever the default on this backend.
    forced = jax.jit(functools.partial(cooc_lookup.lookup, unroll=unroll))(indptr, indices, log_x, rows, cols)
    np.testing.assert_array_equal(np.asarray(forced.log_x), expected)
    np.testing.assert_array_equal(np.asarray(forced.found), expected_found)
  # vmap over a leading axis equals the batched call.
  mapped = jax.vmap(lambda r, c: cooc_lookup.lookup(indptr, indices, log_x, r, c))(rows[:4000].reshape(40, 100),
                                                                                cols[:4000].reshape(40, 100))
  np.testing.assert_array_equal(np.asarray(mapped.found).ravel(), expected_found[:4000])


def test_ids_outside_the_vocabulary_are_not_found(table):
  _, (indptr, indices, log_x), _ = table
  rows = np.array([-1, V, V + 7, 0, 0, 0, np.iinfo(np.int32).max, np.iinfo(np.int32).min], np.int32)
  cols = np.array([0, 0, 1, -1, V, V + 3, 0, 0], np.int32)
  out = cooc_lookup.lookup(indptr, indices, log_x, rows, cols)
  assert not np.asarray(out.found).any() and not np.asarray(out.log_x).any()


def test_search_steps_are_enough_and_tight():
  # A row of length L needs ceil(log2(L + 1)) halvings; the longest row is min(nnz, V).
  assert [cooc_lookup.search_steps(n, 10**6) for n in (1, 2, 3, 4, 7, 8, 255, 256)] == [1, 2, 2, 3, 3, 4, 8, 9]
  assert cooc_lookup.search_steps(10**8, 32000) == 15 and cooc_lookup.search_steps(10**8, 32767) == 15
  assert cooc_lookup.search_steps(10**8, 32768) == 16
  # Rows whose lengths are exactly 2**k - 1 and 2**k (the worst cases of the halving) in a table with
  # V = 64: every column of every row found, every absent one not.
  vocab = 64
  pairs = {}
  for a, length in enumerate((1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64)):
    for b in range(0, vocab, max(1, vocab // length))[:length]:
      pairs[(a, b)] = 1.0 + a + b / 100
  indptr, indices, log_x = ops.csr_from_pairs(pairs, vocab)
  rows, cols = np.meshgrid(np.arange(vocab), np.arange(vocab), indexing="ij")
  out = cooc_lookup.lookup(indptr, indices, log_x, rows.astype(np.int32), cols.astype(np.int32))
  expected, found = _reference(pairs, rows, cols)
  np.testing.assert_array_equal(np.asarray(out.found), found)
  np.testing.assert_array_equal(np.asarray(out.log_x), expected)


def test_a_table_of_one_entry_and_bad_calls():
  indptr, indices, log_x = ops.csr_from_pairs({(2, 4): np.e}, 7)
  out = cooc_lookup.lookup_table({"indptr": indptr, "indices": indices, "log_x": log_x},
                         np.array([[2, 2], [4, 0]], np.int32), np.array([[4, 3], [2, 0]], np.int32))
  np.testing.assert_array_equal(np.asarray(out.found), [[True, False], [False, False]])
  np.testing.assert_allclose(np.asarray(out.log_x), [[1.0, 0.0], [0.0, 0.0]], rtol=1e-7)
  with pytest.raises(ValueError, match="same shape"):
    cooc_lookup.lookup(indptr, indices, log_x, np.zeros(3, np.int32), np.zeros(4, np.int32))
  with pytest.raises(ValueError, match="no entries"):
    cooc_lookup.lookup(np.zeros(8, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32),
                    np.zeros(3, np.int32), np.zeros(3, np.int32))


_SHARDED_SCRIPT = """
import json, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from flax_xalign import ops
rng = np.random.default_rng(3)
V = 501
pairs = {(int(a), int(b)): float(x) for a, b, x in zip(rng.integers(0, V, 20000), rng.integers(0, V, 20000),
                                                      rng.gamma(1.0, 5.0, 20000) + 0.01)}
indptr, indices, log_x = ops.csr_from_pairs(pairs, V)
rows = rng.integers(0, V, (16, 24, 4)).astype(np.int32)
cols = rng.integers(0, V, (16, 24, 4)).astype(np.int32)
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
table = [jax.device_put(a, rep) for a in (indptr, indices, log_x)]
q = [jax.device_put(a, data) for a in (rows, cols)]
out = jax.jit(ops.cooc_lookup.lookup)(*table, *q)
single = ops.cooc_lookup.lookup(indptr, indices, log_x, rows, cols)
print(json.dumps({"devices": len(jax.devices()), "sharded": str(out.log_x.sharding.spec),
                  "equal": bool((np.asarray(out.log_x) == np.asarray(single.log_x)).all()
                                and (np.asarray(out.found) == np.asarray(single.found)).all()),
                  "found": int(np.asarray(out.found).sum())}))
"""


@pytest.mark.subprocess  # 8 fake devices need a fresh JAX (the device count is fixed when JAX starts).
def test_sharded_queries_on_8_fake_devices():
  env = dict(os.environ, XLA_FLAGS=testlib.xla_flags_with_devices(8), JAX_PLATFORMS="cpu",
             TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", _SHARDED_SCRIPT], env=env, capture_output=True, text=True,
                        timeout=300, cwd=REPO, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["devices"] == 8 and out["equal"] and out["found"] > 0
  assert "data" in out["sharded"]  # The result stays sharded like the queries: no gather to one device.
