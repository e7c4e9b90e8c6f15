"""The t5x adapter, driven the way t5x's trainer drives a `BaseModel`.

These run without t5x (the unit tier; real t5x is tests/interop/test_t5x_real.py,
`make test-t5x`): `fake_t5x_train` below does, in a few lines, what t5x's
`train.py` + `Trainer` do with a model: `get_initial_variables` under
`eval_shape`, logical names from `params_axes` (`get_axis_names`), mesh axes
from the rules table (`logical_to_mesh`), a jitted step of
`jax.value_and_grad(model.loss_fn, has_aux=True)` inside the mesh and the
logical-rules context, an optax update, clu metrics merged over steps, then
`eval_fn` and `score_batch`. The gin file is parsed against stand-ins
registered under t5x's module names, in a subprocess.
"""

import functools
import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow as tf
from flax import traverse_util
from flax.linen import partitioning as flax_partitioning
from jax.sharding import NamedSharding, PartitionSpec as P

from flax_xalign.assets.base import Asset
from flax_xalign.data.feature_converter import MODEL_FEATURE_KEYS, XAlignFeatureConverter
from flax_xalign.errors import UserError
from flax_xalign.interop import t5x as xalign_t5x
from flax_xalign.training import optimizer as optimizer_lib
from flax_xalign.training import partitioning
from tests.testlib import tiny_encoder_config

REPO = pathlib.Path(__file__).resolve().parents[2]
GIN_FILE = REPO / "gin_configs" / "t5x" / "pretrain.gin"
B, L, V = 4, 13, 61
LANGUAGES = ("de", "en")


def make_batch(seed=0):
  """Our batch features: row 0 packs two monolingual examples, row 1 is a pair, row 3 has padding."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(5, V, size=(B, L)).astype(np.int32)
  segment_ids = np.ones((B, L), np.int32)
  positions = np.tile(np.arange(L, dtype=np.int32), (B, 1))
  lang_ids = np.ones((B, L), np.int32)
  pair_side = np.zeros((B, L), np.int32)
  tokens[:, 0], tokens[:, -1] = 3, 1
  segment_ids[0, 7:], positions[0, 7:], tokens[0, 6:8] = 2, np.arange(L - 7), (1, 3)
  pair_side[1, :6], pair_side[1, 6:] = 1, 2
  lang_ids[1, 6:], positions[1, 6:], tokens[1, 5:7] = 2, np.arange(L - 6), (1, 3)
  tokens[3, 9:], segment_ids[3, 9:], positions[3, 9:], lang_ids[3, 9:] = 0, 0, 0, 0
  tokens[3, 8] = 1
  return dict(tokens=tokens, lang_ids=lang_ids, segment_ids=segment_ids, positions=positions,
              pair_side=pair_side)


def make_model(**kwargs):
  kwargs.setdefault("languages", LANGUAGES)
  return xalign_t5x.XAlignT5xModel(tiny_encoder_config(vocab_size=V), **kwargs)


@pytest.fixture(scope="module")
def model():
  return make_model()


@pytest.fixture(scope="module")
def params(model):
  return model.get_initial_variables(jax.random.PRNGKey(0), {"tokens": (B, L)})["params"]


# ---------------------------------------------------------------- the fake t5x trainer


def fake_t5x_train(model, batch, *, steps, learning_rate=1e-2):
  """What t5x's train.py and Trainer do with a BaseModel, on our rules and mesh."""
  rules = partitioning.logical_axis_rules()
  mesh = partitioning.make_mesh(1)
  input_shapes = {k: (B, *np.shape(v)[1:]) for k, v in batch.items()}
  input_types = {k: jnp.int32 for k in batch}
  init_fn = functools.partial(model.get_initial_variables, input_shapes=input_shapes, input_types=input_types)
  rng = jax.random.PRNGKey(17)
  abstract = jax.eval_shape(init_fn, rng)
  axis_names = flax_partitioning.get_axis_names(abstract["params_axes"])  # t5x: train_state.params_axes
  mesh_specs = flax_partitioning.logical_to_mesh(axis_names, rules)
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), mesh_specs, is_leaf=lambda x: isinstance(x, P))
  params = jax.jit(lambda r: init_fn(r)["params"], out_shardings=shardings)(rng)

  tx = optax.adamw(learning_rate)
  opt_state = tx.init(params)

  def train_step(params, opt_state, batch, dropout_rng):
    (loss, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, dropout_rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, metrics

  step_fn = jax.jit(train_step, donate_argnums=(0, 1))
  eval_fn = jax.jit(model.eval_fn)
  score_fn = jax.jit(model.score_batch)
  losses, step_metrics = [], []
  base_rng = jax.random.PRNGKey(23)
  with jax.set_mesh(mesh), flax_partitioning.axis_rules(rules):  # t5x's PjittedFnWithContext
    for step in range(steps):
      params, opt_state, loss, metrics = step_fn(params, opt_state, batch, jax.random.fold_in(base_rng, step))
      losses.append(float(loss))
      step_metrics.append(metrics)
    eval_loss, eval_metrics = eval_fn(params, batch)
    scores = score_fn(params, batch)
  return dict(params=params, losses=losses, step_metrics=step_metrics, eval=(eval_loss, eval_metrics),
              scores=scores, axis_names=axis_names, mesh_specs=mesh_specs, score_fn=score_fn, mesh=mesh,
              rules=rules)


@pytest.fixture(scope="module")
def trained(model):
  return fake_t5x_train(model, make_batch(), steps=20)


def test_fake_t5x_loop_reduces_the_loss(trained):
  losses = trained["losses"]
  assert all(np.isfinite(losses))
  assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
  # t5x merges the per-step clu metrics and computes their mean.
  merged = functools.reduce(lambda a, b: {k: a[k].merge(b[k]) for k in a}, trained["step_metrics"][:3])
  np.testing.assert_allclose(float(merged["loss"].compute()), np.mean(losses[:3]), rtol=1e-6)
  assert {"loss", "mlm", "tlm", "tokens"} <= set(merged)
  eval_loss, eval_metrics = trained["eval"]
  assert np.isfinite(float(eval_loss))
  assert float(eval_metrics["loss"].compute()) == pytest.approx(float(eval_loss))


def test_mesh_specs_follow_our_rules_table(trained):
  specs = trained["mesh_specs"]
  assert specs["token_embed"]["embedding"] == P("model", None)  # vocab -> model
  wi = specs["layers"]["mlp"]["wi"]["kernel"]  # scanned: [layers, embed, mlp]
  assert wi == P(None, None, "model")
  # Exactly the shardings our own partitioner gives (before its divisibility fallback).
  boxed = jax.eval_shape(lambda: make_model().model.init(jax.random.PRNGKey(0), batch=B, length=L))
  ours = nn.logical_to_mesh(nn.get_partition_spec(boxed), trained["rules"])
  assert jax.tree.leaves(ours, is_leaf=lambda x: isinstance(x, P)) == jax.tree.leaves(
      specs, is_leaf=lambda x: isinstance(x, P))


def test_params_axes_cover_every_param_with_our_logical_names(model):
  variables = model.get_initial_variables(jax.random.PRNGKey(0), {"tokens": (B, L)})
  assert set(variables) == {"params", "params_axes"}
  boxed = jax.jit(functools.partial(model.model.init, batch=B, length=L))(jax.random.PRNGKey(0))
  # t5x's train_state._validate_params_axes, made two-sided.
  axis_names = traverse_util.flatten_dict(flax_partitioning.get_axis_names(variables["params_axes"]), sep="/")
  flat_params = traverse_util.flatten_dict(variables["params"], sep="/")
  assert set(axis_names) == set(flat_params)
  expected = traverse_util.flatten_dict(nn.get_partition_spec(boxed), sep="/")
  for name, spec in axis_names.items():
    assert spec == expected[name], name
    assert len(spec) == flat_params[name].ndim, name
  raw = traverse_util.flatten_dict(variables["params_axes"])
  assert all(key[-1].endswith("_axes") and isinstance(v, flax_partitioning.AxisMetadata) for key, v in raw.items())
  for name, value in traverse_util.flatten_dict(nn.meta.unbox(boxed), sep="/").items():
    np.testing.assert_array_equal(flat_params[name], value)


# ---------------------------------------------------------------- the loss is ours


def test_loss_fn_is_pretraining_model_loss(model, params):
  batch, rng = make_batch(1), jax.random.PRNGKey(5)
  loss, metrics = jax.jit(model.loss_fn)(params, batch, rng)
  ours, our_metrics = jax.jit(functools.partial(model.model.loss_fn, train=True))(params, batch, rng, {})
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(ours))
  assert set(metrics) == set(our_metrics)
  for key, value in our_metrics.items():
    np.testing.assert_array_equal(np.asarray(metrics[key].compute()), np.asarray(value), err_msg=key)
  # dropout_rng=None: deterministic evaluation with the fixed key.
  eval_loss, _ = jax.jit(model.eval_fn)(params, batch)
  ours_eval, _ = jax.jit(functools.partial(model.model.loss_fn, train=False))(params, batch, model.eval_rng(), {})
  np.testing.assert_array_equal(np.asarray(eval_loss), np.asarray(ours_eval))
  assert float(eval_loss) != float(loss)  # dropout and masking differ from the train call


def test_score_batch_is_deterministic_masked_log_likelihood(model, trained):
  params, batch = trained["params"], make_batch()
  scores = np.asarray(trained["scores"])
  assert scores.shape == (B,)
  np.testing.assert_array_equal(scores, np.asarray(trained["score_fn"](params, batch)))
  # Independently: log-softmax of the logits at the targets that masked_predictions reports.
  key = jax.random.PRNGKey(xalign_t5x.EVAL_SEED)
  logits = jax.jit(lambda p, b: model.model.forward(p, b, key, train=False).logits)(params, batch)
  shown = jax.jit(model.model.masked_predictions)(params, batch, key)
  logits = np.asarray(logits, np.float64)
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  targets, weights = np.asarray(shown["targets"]), np.asarray(shown["weights"])
  expected = (np.take_along_axis(log_probs, targets[..., None], -1)[..., 0] * weights).sum(-1)
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
  assert (weights.sum(-1) > 0).all() and (scores < 0).all()
  full, inter = jax.jit(functools.partial(model.score_batch, return_intermediates=True))(params, batch)
  np.testing.assert_allclose(np.asarray(full), scores, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(inter["targets"]), targets)
  predicted, aux = jax.jit(model.predict_batch_with_aux)(params, batch)
  np.testing.assert_array_equal(np.asarray(predicted), np.asarray(shown["predicted"]))
  np.testing.assert_array_equal(np.asarray(jax.jit(model.predict_batch)(params, batch)), np.asarray(predicted))
  assert set(aux) >= {"targets", "weights", "positions", "log_probs"}


def test_flax_mutables_refused(model, params):
  with pytest.raises(ValueError, match="mutable"):
    model.loss_fn(params, make_batch(), None, flax_mutables={"cache": {}})


# ---------------------------------------------------------------- assets


class _Dictionary(Asset):
  name, files = "dictionary", ("dictionary.npz",)

  def __init__(self, refresh_every=0):
    self.refresh_every = refresh_every

  def build(self, run):
    raise NotImplementedError

  def save(self, directory, value):
    raise NotImplementedError

  def load(self, directory):
    raise NotImplementedError


def _dictionary_value():
  return {"pairs": np.array([[5, 30], [6, 31], [7, 32], [8, 8]], np.int32),
          "mask": np.array([True, True, True, False]), "lang_ids": np.array([1, 2], np.int32)}


def test_static_assets_reach_the_objectives(params):
  value = _dictionary_value()
  model = make_model(objectives={"mlm": 1.0, "align": 1.0}, assets={"dictionary": value})
  batch, rng = make_batch(2), jax.random.PRNGKey(9)
  loss, metrics = jax.jit(model.loss_fn)(params, batch, rng)
  ours, our_metrics = jax.jit(functools.partial(model.model.loss_fn, train=True))(
      params, batch, rng, {"dictionary": {k: jnp.asarray(v) for k, v in value.items()}})
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(ours))
  assert float(metrics["align_pairs"].compute()) == 3.0
  np.testing.assert_array_equal(np.asarray(metrics["align"].compute()), np.asarray(our_metrics["align"]))
  # An (Asset, value) pair of a static asset is accepted too.
  make_model(objectives={"mlm": 1.0, "align": 1.0}, assets={"dictionary": (_Dictionary(), value)})


def test_missing_and_refreshed_assets_are_refused():
  with pytest.raises(UserError, match="need the asset 'dictionary'"):
    make_model(objectives={"mlm": 1.0, "align": 1.0})
  with pytest.raises(UserError, match=r"refreshes every 50 steps.*python -m flax_xalign.train"):
    make_model(objectives={"mlm": 1.0, "align": 1.0},
               assets={"dictionary": (_Dictionary(refresh_every=50), _dictionary_value())})


def test_bad_configs_are_refused():
  with pytest.raises(UserError, match="vocab_size"):
    xalign_t5x.XAlignT5xModel(tiny_encoder_config())
  with pytest.raises(UserError, match="num_languages=3 is too small for 3 languages"):
    make_model(languages=("de", "en", "fr"))


# ---------------------------------------------------------------- feature converter


def _task_dataset():
  examples = [([7, 8, 9], [], "en", ""), ([10, 11], [], "de", ""), ([12, 13, 14], [15, 16], "de", "en"),
              ([17] * 20, [], "en", "")]
  return tf.data.Dataset.from_generator(
      lambda: ({"tokens": a, "tokens_b": b, "lang": la, "lang_b": lb} for a, b, la, lb in examples),
      output_signature={"tokens": tf.TensorSpec([None], tf.int32), "tokens_b": tf.TensorSpec([None], tf.int32),
                        "lang": tf.TensorSpec([], tf.string), "lang_b": tf.TensorSpec([], tf.string)})


@pytest.mark.parametrize("pack", [True, False])
def test_feature_converter_class_makes_our_batch_features(model, pack):
  converter = model.FEATURE_CONVERTER_CLS(pack=pack, use_custom_packing_ops=False)  # as t5x's utils.get_dataset
  assert isinstance(converter, XAlignFeatureConverter) and converter.languages == LANGUAGES
  lengths = {"tokens": L}
  got = list(converter(_task_dataset(), lengths).as_numpy_iterator())
  want = list(XAlignFeatureConverter(LANGUAGES, pack=pack)(_task_dataset(), lengths).as_numpy_iterator())
  assert len(got) == len(want) > 0
  for g, w in zip(got, want):
    assert set(g) == set(MODEL_FEATURE_KEYS)
    for key in MODEL_FEATURE_KEYS:
      np.testing.assert_array_equal(g[key], w[key], err_msg=key)
  assert xalign_t5x.feature_converter_for(list(reversed(LANGUAGES))) is model.FEATURE_CONVERTER_CLS


def test_converted_batches_train(model, params):
  ds = model.FEATURE_CONVERTER_CLS(pack=True)(_task_dataset(), {"tokens": L}).batch(2, drop_remainder=True)
  input_shapes = {k: tuple(v.shape) for k, v in ds.element_spec.items()}  # t5x's train.py
  assert set(input_shapes) == set(MODEL_FEATURE_KEYS)
  variables = model.get_initial_variables(jax.random.PRNGKey(0), input_shapes)
  batch = next(ds.as_numpy_iterator())
  loss, _ = jax.jit(model.loss_fn)(variables["params"], batch, jax.random.PRNGKey(1))
  assert np.isfinite(float(loss))


def test_feature_converter_without_languages_is_refused():
  with pytest.raises(UserError, match="languages"):
    xalign_t5x.XAlignT5xModel.FEATURE_CONVERTER_CLS(pack=True)
  with pytest.raises(UserError):
    xalign_t5x.feature_converter_for("en")


# ---------------------------------------------------------------- gin file

# Stand-ins for the t5x configurables the gin file names, then t5x's own
# sequence: gin.configurable(train), parse the files, call it.
_GIN_SCRIPT = r'''
import dataclasses, json, sys, types
import gin

def module(name, **attrs):
  mod = types.ModuleType(name)
  mod.__dict__.update(attrs)
  sys.modules[name] = mod
  return mod

class PjitPartitioner:
  def __init__(self, num_partitions=None, model_parallel_submesh=None, logical_axis_rules=None):
    self.num_partitions, self.logical_axis_rules = num_partitions, logical_axis_rules

@dataclasses.dataclass
class DatasetConfig:
  mixture_or_task_name: str
  task_feature_lengths: dict
  split: str
  batch_size: int
  shuffle: bool
  seed: object
  use_cached: bool = False
  pack: bool = False
  module: object = None

@dataclasses.dataclass
class SaveCheckpointConfig:
  period: int = 0
  dtype: str = "float32"
  keep: object = None
  save_dataset: bool = False

@dataclasses.dataclass
class RestoreCheckpointConfig:
  path: object = ()

@dataclasses.dataclass
class CheckpointConfig:
  save: object = None
  restore: object = None

class Trainer:
  learning_rate_fn = None
  def __init__(self, model=None, num_microbatches=None, learning_rate_fn=None):
    self.num_microbatches, self.learning_rate_fn = num_microbatches, learning_rate_fn

def chain(transformations):
  import optax
  return ("OptaxWrapper", optax.chain(*transformations))

t5x = module("t5x")
for name, attrs in {
    "partitioning": dict(PjitPartitioner=PjitPartitioner),
    "utils": dict(DatasetConfig=DatasetConfig, CheckpointConfig=CheckpointConfig,
                  SaveCheckpointConfig=SaveCheckpointConfig, RestoreCheckpointConfig=RestoreCheckpointConfig),
    "trainer": dict(Trainer=Trainer),
    "gin_utils": dict(summarize_gin_config=lambda *args: None),
    "optimizers": dict(chain=chain)}.items():
  setattr(t5x, name, module("t5x." + name, **attrs))

def train(*, model, model_dir, train_dataset_cfg, train_eval_dataset_cfg, infer_eval_dataset_cfg,
          checkpoint_cfg, partitioner, trainer_cls, total_steps, eval_steps, eval_period, random_seed,
          use_hardware_rng, summarize_config_fn):
  return locals()

train_using_gin = gin.configurable(train)
gin.parse_config_files_and_bindings([sys.argv[1]], sys.argv[2:])
out = train_using_gin()
model, optimizer = out["model"], out["model"].optimizer_def
trainer = gin.get_configurable(Trainer)()
converter = model.FEATURE_CONVERTER_CLS(pack=True, use_custom_packing_ops=False)
print(json.dumps({
    "model": type(model).__module__ + "." + type(model).__name__,
    "objectives": dict(model.model.objectives),
    "vocab_size": model.config.vocab_size,
    "languages": list(converter.languages),
    "rules": [list(r) for r in out["partitioner"].logical_axis_rules],
    "num_partitions": out["partitioner"].num_partitions,
    "total_steps": out["total_steps"],
    "task": out["train_dataset_cfg"].mixture_or_task_name,
    "lengths": out["train_dataset_cfg"].task_feature_lengths,
    "module": out["train_dataset_cfg"].module,
    "eval_split": out["train_eval_dataset_cfg"].split,
    "optimizer": optimizer[0],
    "learning_rates": [float(trainer.learning_rate_fn(s)) for s in (0, 50, 100, 600)],
}))
'''


@pytest.mark.subprocess
def test_gin_file_parses_with_t5x_stand_ins():
  text = GIN_FILE.read_text()
  assert "python -m t5x.train" in text.split("from __gin__")[0]  # the README block comes first
  proc = subprocess.run(
      [sys.executable, "-c", _GIN_SCRIPT, str(GIN_FILE), "MODEL_DIR = '/tmp/unused'", "VOCAB_SIZE = 61",
       "NUM_PARTITIONS = 2"],
      capture_output=True, text=True, cwd=REPO, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["model"] == "flax_xalign.interop.t5x.XAlignT5xModel"
  assert out["objectives"] == {"mlm": 1.0, "tlm": 1.0}
  assert out["vocab_size"] == 61 and out["num_partitions"] == 2
  assert out["languages"] == ["en", "grc"]  # languages_of(MIXTURE_OR_TASK_NAME)
  assert [tuple(r) for r in out["rules"]] == list(partitioning.logical_axis_rules())
  assert out["task"] == "bible_grc_en_mlm_tlm" and out["lengths"] == {"tokens": 128}
  assert out["module"] == "flax_xalign.tasks" and out["eval_split"] == "validation"
  assert out["total_steps"] == 1000 and out["optimizer"] == "OptaxWrapper"
  schedule = optimizer_lib.learning_rate_schedule(optimizer_lib.OptimizerConfig(learning_rate=5e-4,
                                                                               warmup_steps=100), 1000)
  np.testing.assert_allclose(out["learning_rates"], [float(schedule(s)) for s in (0, 50, 100, 600)], rtol=1e-6)
