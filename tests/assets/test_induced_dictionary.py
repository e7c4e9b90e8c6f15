"""The `induced_dictionary` asset: CSLS against a NumPy brute force, refresh, files, exact resume.

A tiny model trained for 3 steps on `tiny_mix` (en, de) is the source; the
dictionary between the de and en language-specific vocabularies is compared
with CSLS written here from the paper's Eq. 1-2 (r_K = mean of the K highest
cosines into the other set). The resume tests (`slow` tier: three runs each)
train with a small objective that reads the dictionary and logs a checksum
of it, so every logged step says which dictionary it trained with.
"""

import dataclasses
import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_xalign.assets import induced_dictionary as idict
from flax_xalign.assets import lang_vocab as lv
from flax_xalign.assets import registry
from flax_xalign.errors import UserError
from flax_xalign.objectives import base as objectives_base
from flax_xalign.run_spec import RunSpec
from flax_xalign.runs import Run
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.runs.tiny_run import tiny_mix_run
from tests.testlib import tiny_encoder_config

MIN_COUNT = 20
STEPS = 6
VOCAB_OPTIONS = {"lang_vocab": {"min_count": MIN_COUNT}}


@objectives_base.register("test_induced_loss")
class InducedLoss(objectives_base.ObjectiveBase):
  """Minus the mean input-embedding cosine of the dictionary's de->en pairs; logs a checksum of the dictionary."""

  requires = ("induced_dictionary",)

  def __call__(self, ctx):
    d = ctx.assets["induced_dictionary"]
    table = ctx.params["token_embed"]["embedding"].astype(jnp.float32)
    valid = (d["vocab_mask"][0] & (d["translation"][0] >= 0)).astype(jnp.float32)
    src, tgt = table[d["vocab_ids"][0]], table[jnp.maximum(d["translation"][0], 0)]
    cos = jnp.sum(src * tgt, -1) / (jnp.linalg.norm(src, axis=-1) * jnp.linalg.norm(tgt, axis=-1) + 1e-6)
    count = jnp.sum(valid)
    checksum = jnp.sum(d["score"] * valid) + jnp.sum(jnp.where(valid > 0, d["translation"][0], 0)) * 1e-3
    return objectives_base.LossTerm(loss=-jnp.sum(cos * valid) / jnp.maximum(count, 1.0),
                                    metrics={"checksum": checksum, "pairs": count})


def _pretrain(model_dir, *, steps, objectives, asset_options=None, init=None, every=3, callback=None):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=steps, encoder=tiny_encoder_config(), objectives=objectives,
      asset_options=asset_options, init_from_checkpoint=init,
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=every, keep=5, async_save=False),
      log_every=1, seed=7, step_callback=callback)


@pytest.fixture(scope="module")
def source(tmp_path_factory, tiny_corpus):
  """A MODEL_DIR with a 3-step MLM checkpoint (the shared tiny run), and its input embedding table."""
  model_dir = tiny_mix_run(tmp_path_factory, tiny_corpus, "induce_source")
  params = Run.open(str(model_dir)).params()
  return str(model_dir), np.asarray(jax.device_get(params["token_embed"]["embedding"]), np.float32)


def _run(asset_options, **changes):
  from flax_xalign.training.data import resolve_task

  data = resolve_task("tiny_mix")
  return RunSpec(task="tiny_mix", languages=data.languages, task_feature_lengths={"tokens": 19},
                 task_definitions=data.definitions, vocabulary=data.vocabulary_spec,
                 model=tiny_encoder_config(vocab_size=data.vocabulary_spec.size), objectives={"mlm": 1.0},
                 asset_options={**VOCAB_OPTIONS, **asset_options}, **changes)


def _numpy_csls_top1(x, y, knn, *, method):
  """Top-1 of each row of x among the rows of y, brute force (ties: the lower index)."""
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  y = y / np.linalg.norm(y, axis=1, keepdims=True)
  cos = (x.astype(np.float64) @ y.T.astype(np.float64))
  if method == "csls":
    r_x = np.sort(cos, axis=1)[:, ::-1][:, :min(knn, len(y))].mean(axis=1)
    r_y = np.sort(cos, axis=0)[::-1, :][:min(knn, len(x)), :].mean(axis=0)
    cos = 2 * cos - r_x[:, None] - r_y[None, :]
  best = cos.argmax(axis=1)
  ordered = np.sort(cos, axis=1)
  gap = ordered[:, -1] - ordered[:, -2] if cos.shape[1] > 1 else np.full(len(x), np.inf)
  return best, cos[np.arange(len(x)), best], gap


@pytest.mark.parametrize("method,knn", [("csls", 10), ("csls", 3), ("nn", 10)])
def test_build_matches_a_numpy_brute_force(source, method, knn):
  model_dir, table = source
  run = _run({"induced_dictionary": {"source": model_dir, "method": method, "knn": knn}})
  asset = registry.create("induced_dictionary", run)
  value = asset.build(run, source=Run.open(model_dir))
  vocab = lv.lang_vocab_for(run, log=None)
  assert {k: (v.dtype, v.shape) for k, v in value.items()} == {
      "vocab_ids": (np.int32, vocab["ids"].shape), "vocab_mask": (np.bool_, vocab["ids"].shape),
      "translation": (np.int32, vocab["ids"].shape), "score": (np.float32, vocab["ids"].shape),
      "lang_ids": (np.int32, (2,))}
  np.testing.assert_array_equal(value["vocab_ids"], vocab["ids"])
  np.testing.assert_array_equal(value["vocab_mask"], vocab["mask"])
  np.testing.assert_array_equal(value["lang_ids"], vocab["lang_ids"])
  sides = [vocab["ids"][s][vocab["mask"][s]] for s in (0, 1)]
  assert min(map(len, sides)) > knn  # Both vocabularies are larger than K: r_K is a true top-K mean.
  for s in (0, 1):
    best, score, gap = _numpy_csls_top1(table[sides[s]], table[sides[1 - s]], knn, method=method)
    n = len(sides[s])
    clear = gap > 1e-5  # Rows whose best target is not a float tie.
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(value["translation"][s, :n][clear], sides[1 - s][best][clear])
    np.testing.assert_allclose(value["score"][s, :n], score, rtol=1e-5, atol=1e-5)
    assert (value["translation"][s, n:] == -1).all() and (value["score"][s, n:] == 0).all()
  assert "pairs" in asset.describe(value) and "e.g." in asset.describe(value)


@pytest.mark.parametrize("method", ["csls", "nn"])
def test_many_pairs_each_induce_between_their_own_two_sides(method):
  """Four sides (two pairs, as a pivot run lays them out): side s translates into side s ^ 1 only."""
  rng = np.random.default_rng(4)
  table = rng.normal(size=(97, 7)).astype(np.float32)
  sizes = [13, 11, 17, 9]  # distinct, and the pivot's two sides overlap (ids 40..49)
  ids = np.zeros((4, 17), np.int32)
  mask = np.zeros((4, 17), bool)
  for s, (start, n) in enumerate(zip((5, 40, 60, 44), sizes)):
    ids[s, :n] = np.arange(start, start + n)
    mask[s, :n] = True
  translation, score = jax.device_get(idict.induce_dictionary(jnp.asarray(table), jnp.asarray(ids),
                                                              jnp.asarray(mask), method=method, knn=3))
  for s, n in enumerate(sizes):
    other = ids[s ^ 1][mask[s ^ 1]]
    best, want, gap = _numpy_csls_top1(table[ids[s, :n]], table[other], 3, method=method)
    clear = gap > 1e-5
    np.testing.assert_array_equal(translation[s, :n][clear], other[best][clear])
    np.testing.assert_allclose(score[s, :n], want, rtol=1e-5, atol=1e-5)
    assert (translation[s, n:] == -1).all()


def test_refresh_equals_a_build_from_the_same_parameters(source):
  model_dir, _ = source
  run = _run({"induced_dictionary": {"source": model_dir, "refresh_every": 2}})
  asset = registry.create("induced_dictionary", run)
  assert asset.refresh_every == 2
  source_run = Run.open(model_dir)
  built = asset.build(run, source=source_run)
  params = source_run.params()
  start = idict.empty_value(lv.lang_vocab_for(run, log=None))
  refreshed = jax.device_get(jax.jit(lambda p, v: asset.refresh(p, v, run))(params, start))
  for key in built:
    assert refreshed[key].dtype == built[key].dtype and refreshed[key].shape == built[key].shape, key
    np.testing.assert_array_equal(refreshed[key], built[key], err_msg=key)


def test_file_round_trip_is_bit_exact(source, tmp_path):
  model_dir, _ = source
  run = _run({"induced_dictionary": {"source": model_dir}})
  asset = registry.create("induced_dictionary", run)
  value = asset.build(run, source=Run.open(model_dir))
  asset.save(str(tmp_path), value)
  lines = (tmp_path / idict.FILENAME).read_text(encoding="utf-8").splitlines()
  assert "# languages: de en" in lines and f"# source: {model_dir}" in lines
  body = [line.split("\t") for line in lines if not line.startswith("#")]
  assert body[0] == ["src_lang", "src_id", "tgt_id", "src_piece", "tgt_piece", "score"]
  assert len(body) - 1 == int(value["vocab_mask"].sum())
  reader = registry.create("induced_dictionary", run)
  loaded = reader.load(str(tmp_path))
  assert reader.fingerprint(loaded) == asset.fingerprint(value)
  for key in value:
    assert loaded[key].dtype == value[key].dtype
    np.testing.assert_array_equal(loaded[key], value[key])
  reader.check(loaded, run)
  # The empty dictionary of a run without a source round-trips too (tgt_id -1).
  empty_run = _run({"induced_dictionary": {"refresh_every": 4}})
  empty_asset = registry.create("induced_dictionary", empty_run)
  empty = empty_asset.build(empty_run)
  assert (empty["translation"] == -1).all() and not empty["score"].any()
  empty_asset.save(str(tmp_path / "empty"), empty)
  assert empty_asset.fingerprint(empty_asset.load(str(tmp_path / "empty"))) == empty_asset.fingerprint(empty)
  assert "0 de->en" in empty_asset.describe(empty) and "empty until the first refresh" in empty_asset.describe(empty)


def test_malformed_or_foreign_files_are_refused(source, tmp_path):
  model_dir, _ = source
  run = _run({"induced_dictionary": {"source": model_dir}})
  asset = registry.create("induced_dictionary", run)
  asset.save(str(tmp_path), asset.build(run, source=Run.open(model_dir)))
  path = tmp_path / idict.FILENAME
  lines = path.read_text(encoding="utf-8").splitlines()
  number = next(i for i, line in enumerate(lines) if line.startswith("en\t")) + 1
  broken = list(lines)
  broken[number - 1] = "\t".join(broken[number - 1].split("\t")[:5] + ["nan?"])
  path.write_text("\n".join(broken) + "\n", encoding="utf-8")
  with pytest.raises(UserError, match=rf"induced_dictionary.tsv:{number}: malformed row"):
    asset.load(str(tmp_path))
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  other = _run({"induced_dictionary": {"source": model_dir, "method": "nn"}})
  reader = registry.create("induced_dictionary", other)
  with pytest.raises(UserError, match="method 'csls'"):
    reader.check(reader.load(str(tmp_path)), other)


def test_bad_options_and_sources_are_user_errors(source):
  model_dir, _ = source
  with pytest.raises(UserError, match="needs a model to induce from"):
    run = _run({})
    registry.create("induced_dictionary", run).build(run)
  with pytest.raises(UserError, match=r"unknown induced_dictionary option\(s\) \['k'\]"):
    registry.create("induced_dictionary", _run({"induced_dictionary": {"k": 3}}))
  with pytest.raises(UserError, match="'method' must be one of 'csls', 'nn'"):
    registry.create("induced_dictionary", _run({"induced_dictionary": {"method": "cosine"}}))
  with pytest.raises(UserError, match="'knn' must be an integer >= 1"):
    registry.create("induced_dictionary", _run({"induced_dictionary": {"knn": 0}}))
  with pytest.raises(UserError, match="'refresh_every' must be an integer >= 0"):
    registry.create("induced_dictionary", _run({"induced_dictionary": {"refresh_every": -2}}))
  # The lang_vocab options are reused, and may be overridden here.
  asset = registry.create("induced_dictionary", _run({"induced_dictionary": {"min_count": 7, "languages": ["en", "de"]}}))
  assert asset.vocab.min_count == 7 and asset.languages == ("en", "de")
  # A source whose vocabulary differs from the run's is refused before its parameters are read.
  run = _run({"induced_dictionary": {"source": model_dir}})
  foreign = run.replace(vocabulary=dataclasses.replace(run.vocabulary, sha256="0" * 64))

  class Unread:
    spec = Run.open(model_dir).spec

    def params(self):
      raise AssertionError("the parameters were read before the vocabulary check")

  with pytest.raises(UserError, match="trained with another vocabulary"):
    registry.create("induced_dictionary", foreign).build(foreign, source=Unread())
  # The asset opens no checkpoint itself: a source it was not handed is a programming error.
  with pytest.raises(ValueError, match="pass the opened source run"):
    registry.create("induced_dictionary", run).build(run)


def _rows(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if "loss" in r}


def _step_value(model_dir, step, asset):
  return asset.load(os.path.join(model_dir, "checkpoints", str(step), "assets"))


def _resume_matches(tmp_path, source, objectives, keys):
  """Uninterrupted vs interrupted at step 5 and resumed: the same losses, per-step dictionaries.

  refresh_every=2, checkpoint every 3: refreshes after steps 2, 4, 6; checkpoints at 3 and 6, and at 5
  where the run is stopped (so it resumes with the dictionary of step 4).
  """
  model_dir, _ = source
  options = {**VOCAB_OPTIONS, "induced_dictionary": {"refresh_every": 2}}
  full = tmp_path / "full"
  result = _pretrain(full, steps=STEPS, objectives=objectives, asset_options=options, init=model_dir)
  assert result.trace_counts["train_step"] == 1  # Three refreshes, no recompilation.

  def stop_at_5(step, metrics):
    if step == 5:
      os.kill(os.getpid(), signal.SIGTERM)

  resumed = tmp_path / "resumed"
  first = _pretrain(resumed, steps=STEPS, objectives=objectives, asset_options=options, init=model_dir,
                    callback=stop_at_5)
  assert first.interrupted and first.last_step == 5
  second = _pretrain(resumed, steps=STEPS, objectives=objectives, asset_options=options, init=model_dir)
  assert second.last_step == STEPS
  a, b = _rows(full), _rows(resumed)
  assert sorted(b) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    for key in keys:
      np.testing.assert_allclose(b[step][key], a[step][key], rtol=1e-6, err_msg=f"{key} at step {step}")

  run = _run({"induced_dictionary": {"refresh_every": 2, "source": model_dir}})
  asset = registry.create("induced_dictionary", run)
  initial = asset.load(str(full))  # MODEL_DIR keeps the dictionary induced from the source.
  # Built by the assembler (training's SourceRun) and from runs.Run: the same dictionary.
  assert asset.fingerprint(initial) == asset.fingerprint(asset.build(run, source=Run.open(model_dir)))
  # Step 6 refreshed after itself: its checkpoint holds the dictionary of its own parameters.
  params = Run.open(str(full), step=6).params()
  expected = jax.device_get(asset.refresh(params, initial, run))
  for directory in (full, resumed):
    saved = _step_value(str(directory), 6, asset)
    for key in expected:
      np.testing.assert_array_equal(saved[key], expected[key], err_msg=f"{key} at step 6 of {directory.name}")
  assert asset.fingerprint(_step_value(str(full), 3, asset)) != asset.fingerprint(initial)
  assert asset.fingerprint(_step_value(str(full), 3, asset)) == asset.fingerprint(_step_value(str(resumed), 3, asset))
  return a


@pytest.mark.slow  # Three tiny-encoder runs; tests/training/test_loop.py resumes a refreshed asset.
def test_exact_resume_with_a_refreshed_dictionary(tmp_path, source):
  rows = _resume_matches(tmp_path, source, {"mlm": 1.0, "test_induced_loss": 0.1},
                         ("loss", "mlm", "test_induced_loss", "test_induced_loss_checksum"))
  checksums = [rows[s]["test_induced_loss_checksum"] for s in range(1, STEPS + 1)]
  # The dictionary changes only after steps 2 and 4 (refresh_every=2; the one after 6 is never used).
  assert checksums[0] == checksums[1] and checksums[2] == checksums[3] and checksums[4] == checksums[5]
  assert len({checksums[0], checksums[2], checksums[4]}) == 3


@pytest.mark.slow  # Three tiny-encoder runs; tests/training/test_loop.py resumes a refreshed asset.
def test_exact_resume_with_tcs(tmp_path, source):
  from flax_xalign.objectives import base

  try:
    import flax_xalign.objectives.code_switch  # noqa: F401  (registers tcs)
  except ImportError:
    pass
  if "tcs" not in base.names():
    pytest.skip("the tcs objective is not registered yet")
  _resume_matches(tmp_path, source, {"mlm": 1.0, "tcs": 1.0}, ("loss", "mlm", "tcs"))
