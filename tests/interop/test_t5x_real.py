"""flax_xalign.interop.t5x under real t5x (`make test-t5x`; the environment is tools/make_t5x_venv.sh's).

t5x is not on PyPI: tools/make_t5x_venv.sh installs its source snapshot (and airio's, jestimator's) into
.venv-t5x, layered over .venv. Every test here is marked `t5x`; the module skips where t5x is missing.

* `python -m t5x.train` with gin_configs/t5x/pretrain.gin (+ a tiny-size gin file) trains a few steps
  on the Bible mixture the gin file names, evaluates, and writes Orbax checkpoints.
* In-process, with t5x's own pieces (`utils.get_dataset`, `TrainStateInitializer`, `Trainer`,
  `OptaxWrapper`, the Orbax checkpoint manager, `get_infer_fn`): the step-1 loss and update equal
  an independent `PretrainingModel` + optax on the same batch and initial parameters; a checkpoint
  restored by t5x drives our `Encoder` to the in-memory parameters' output; score/predict run
  through t5x's inference function.
"""

import functools
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("t5x")

import flax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=wrong-import-position
import optax  # pylint: disable=wrong-import-position
import seqio  # pylint: disable=wrong-import-position
import tensorflow as tf  # pylint: disable=wrong-import-position
from flax import traverse_util  # pylint: disable=wrong-import-position
from t5x import checkpoints as t5x_checkpoints  # pylint: disable=wrong-import-position
from t5x import optimizers as t5x_optimizers  # pylint: disable=wrong-import-position
from t5x import partitioning as t5x_partitioning  # pylint: disable=wrong-import-position
from t5x import train_state as t5x_train_state  # pylint: disable=wrong-import-position
from t5x import trainer as t5x_trainer  # pylint: disable=wrong-import-position
from t5x import utils as t5x_utils  # pylint: disable=wrong-import-position

from flax_xalign.data.feature_converter import MODEL_FEATURE_KEYS  # pylint: disable=wrong-import-position
from flax_xalign.interop import t5x as xalign_t5x  # pylint: disable=wrong-import-position
from flax_xalign.models.encoder import Encoder  # pylint: disable=wrong-import-position
from flax_xalign.objectives.model import PretrainingModel  # pylint: disable=wrong-import-position
from flax_xalign.training import optimizer as optimizer_lib  # pylint: disable=wrong-import-position
from flax_xalign.training import partitioning  # pylint: disable=wrong-import-position
from tests.testlib import TINY_ENCODER, tiny_encoder_config  # pylint: disable=wrong-import-position

# t5x's own deprecation warnings (its `with mesh:` under jax 0.10) are not ours to act on.
pytestmark = [pytest.mark.t5x, pytest.mark.filterwarnings("ignore::DeprecationWarning:t5x.*")]

REPO = pathlib.Path(__file__).resolve().parents[2]
TASK = "bible_grc_en_mlm_tlm"  # What gin_configs/t5x/pretrain.gin trains on.
B, L = 3, 13  # batch, row length (odd, distinct)
OBJECTIVES = {"mlm": 1.0, "tlm": 1.0}
TRAIN_STEPS = 3


def _tasks():
  import flax_xalign.tasks as tasks  # pylint: disable=g-import-not-at-top
  return tasks


# ---------------------------------------------------------------- a. python -m t5x.train

_TINY_GIN = """
from __gin__ import dynamic_registration
import __main__ as train_script
from flax_xalign.models import config as xalign_config

xalign_config.EncoderConfig:
{encoder}
train_script.train.eval_steps = 1
"""


def _events(directory):
  """{tag: [(step, value)]} of the scalar summaries t5x's metric writer left in `directory`."""
  out = {}
  for path in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for value in event.summary.value:
        if value.metadata.plugin_data.plugin_name == "scalars":
          out.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
  return out


@pytest.fixture(scope="module")
def t5x_train_child(bible_data_dir, tmp_path_factory):
  """`python -m t5x.train` of pretrain.gin at tiny sizes, started and left running: {proc, model_dir, out, err}.

  `t5x_step` asks for it first, so the child trains (~30 s, one core) while t5x_step and the in-process
  tests run on the other core; `t5x_run` waits for it. Killed at the end if no test waited for it.
  """
  del bible_data_dir  # Sets $FLAX_XALIGN_DATA_DIR (the corpus and its vocabulary), inherited below.
  root = tmp_path_factory.mktemp("t5x_train")
  tiny = root / "tiny.gin"  # The tests' tiny encoder, the same as t5x_step's.
  tiny.write_text(_TINY_GIN.format(encoder="\n".join(f"  {k} = {v!r}" for k, v in TINY_ENCODER.items())))
  model_dir = root / "model"
  vocab_size = _tasks().get_vocabulary(TASK).vocab_size
  command = [
      sys.executable, "-m", "t5x.train", f"--gin_search_paths={REPO / 'gin_configs'}",
      "--gin_file=t5x/pretrain.gin", f"--gin_file={tiny}",
      f"--gin.MODEL_DIR='{model_dir}'", f"--gin.VOCAB_SIZE={vocab_size}", f"--gin.TRAIN_STEPS={TRAIN_STEPS}",
      f"--gin.BATCH_SIZE={B}", f"--gin.TASK_FEATURE_LENGTHS={{'tokens': {L}}}", "--gin.RANDOM_SEED=0",
  ]
  out, err = root / "train.out", root / "train.err"
  with open(out, "w") as stdout, open(err, "w") as stderr:  # Files, not pipes: nothing reads them meanwhile.
    proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, cwd=REPO,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
  yield {"proc": proc, "model_dir": model_dir, "out": out, "err": err}
  if proc.poll() is None:
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def t5x_run(t5x_train_child):
  """The `python -m t5x.train` run of pretrain.gin at tiny sizes, finished: (MODEL_DIR, completed process)."""
  child = t5x_train_child["proc"]
  try:
    child.wait(timeout=600)
  except subprocess.TimeoutExpired:
    child.kill()
    child.wait()
  proc = subprocess.CompletedProcess(child.args, child.returncode, t5x_train_child["out"].read_text(),
                                     t5x_train_child["err"].read_text())
  assert proc.returncode == 0, proc.stderr[-5000:]
  return t5x_train_child["model_dir"], proc


# test_t5x_train_runs_pretrain_gin (t5x_run's) comes after the in-process tests, which run while it trains.


# ---------------------------------------------------------------- t5x's pieces, in-process


@functools.lru_cache(maxsize=None)
def _reference(vocab_size):
  """Our PretrainingModel, built without the adapter, and its jitted loss + gradient and eval forward."""
  model = PretrainingModel(encoder=Encoder(tiny_encoder_config(vocab_size=vocab_size)), objectives=OBJECTIVES)
  value_and_grad = jax.jit(jax.value_and_grad(functools.partial(model.loss_fn, assets={}, train=True),
                                              has_aux=True))

  @jax.jit
  def forward(params, batch, key):
    ctx = model.forward(params, batch, key, train=False)
    return ctx.logits, ctx.masked.targets, ctx.masked.weights

  return value_and_grad, forward


@pytest.fixture(scope="module")
def t5x_step(t5x_train_child, bible_data_dir, tmp_path_factory):
  """One train step of t5x's Trainer on a batch from t5x's get_dataset, with everything around it."""
  del t5x_train_child, bible_data_dir  # (the t5x.train child started first: it trains meanwhile)
  tasks = _tasks()
  vocab_size = tasks.get_vocabulary(TASK).vocab_size
  tx, schedule = optimizer_lib.make_optimizer(optimizer_lib.OptimizerConfig(learning_rate=1e-2, warmup_steps=0),
                                              total_steps=10)
  model = xalign_t5x.XAlignT5xModel(tiny_encoder_config(vocab_size=vocab_size), objectives=OBJECTIVES,
                                    languages=tasks.languages_of(TASK),
                                    optimizer_def=t5x_optimizers.OptaxWrapper(tx))
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1,
                                                 logical_axis_rules=partitioning.logical_axis_rules())
  cfg = t5x_utils.DatasetConfig(mixture_or_task_name=TASK, task_feature_lengths={"tokens": L}, split="train",
                                batch_size=B, shuffle=False, seed=0, pack=True, module="flax_xalign.tasks")
  ds = t5x_utils.get_dataset(cfg, 0, 1, model.FEATURE_CONVERTER_CLS)
  batches = list(ds.take(2).as_numpy_iterator())
  initializer = t5x_utils.TrainStateInitializer(
      optimizer_def=model.optimizer_def, init_fn=model.get_initial_variables,
      input_shapes={k: (B, *v.shape[1:]) for k, v in ds.element_spec.items()},
      input_types={k: v.dtype for k, v in ds.element_spec.items()}, partitioner=partitioner)
  init_rng, trainer_rng = jax.random.split(jax.random.PRNGKey(0))
  state = initializer.from_scratch(init_rng)
  initial_params = jax.device_get(state.params)  # The step donates the state.
  trainer = t5x_trainer.Trainer(model=model, train_state=state, partitioner=partitioner, eval_names=[],
                                summary_dir=None, train_state_axes=initializer.train_state_axes,
                                rng=trainer_rng, learning_rate_fn=schedule, num_microbatches=None)
  # t5x computes the merged clu metrics into clu.values (Scalar for Average).
  summary = {k: v.value for k, v in trainer.train(iter(batches[:1]), 1, start_step=0).result().items()}
  trainer.close()
  return dict(model=model, tx=tx, partitioner=partitioner, initializer=initializer, batch=batches[0],
              next_batch=batches[1], initial_params=initial_params, trainer_rng=trainer_rng, summary=summary,
              state=trainer.train_state, vocab_size=vocab_size, tmp=tmp_path_factory.mktemp("t5x_ckpt"))


def test_batches_from_t5x_get_dataset_are_our_features(t5x_step):
  batch = t5x_step["batch"]
  assert set(batch) == set(MODEL_FEATURE_KEYS)
  assert all(v.shape == (B, L) and v.dtype == np.int32 for v in batch.values())
  assert (batch["segment_ids"] > 0).sum() > B and set(np.unique(batch["lang_ids"])) <= {0, 1, 2}


# ---------------------------------------------------------------- b. the loss t5x trains is ours


def _flat(params):
  return traverse_util.flatten_dict(jax.device_get(params), sep="/")


def test_t5x_step_one_loss_and_update_are_ours(t5x_step):
  params, batch = t5x_step["initial_params"], t5x_step["batch"]
  value_and_grad, _ = _reference(t5x_step["vocab_size"])
  # t5x's Trainer: dropout_rng = fold_in(trainer rng, step); value_and_grad(model.loss_fn).
  (loss, metrics), grads = value_and_grad(params, batch, jax.random.fold_in(t5x_step["trainer_rng"], 0))
  summary = t5x_step["summary"]
  print(f"step-1 loss: t5x {summary['loss']!r}, PretrainingModel {float(loss)!r}")
  np.testing.assert_allclose(summary["loss"], float(loss), rtol=1e-6)
  for key in ("mlm", "tlm", "mlm_accuracy", "tokens"):
    np.testing.assert_allclose(summary[key], float(metrics[key]), rtol=1e-6, err_msg=key)
  assert summary["mlm"] > 0 and summary["tlm"] > 0  # The batch has both streams.
  # The update t5x applied is our optimizer's (clip, AdamW, decay mask) on our loss's gradient.
  tx = t5x_step["tx"]
  updates, _ = tx.update(grads, tx.init(params), params)
  expected, got = _flat(optax.apply_updates(params, updates)), _flat(t5x_step["state"].params)
  assert set(got) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
  assert int(t5x_step["state"].step) == 1
  assert not np.allclose(got["token_embed/embedding"], _flat(params)["token_embed/embedding"])


def test_t5x_microbatches_sum_our_gradients(t5x_step):
  """With num_microbatches=k t5x hands the optimiser the *sum* of k gradients of our loss (module docstring)."""
  model, partitioner, params = t5x_step["model"], t5x_step["partitioner"], t5x_step["initial_params"]
  parts = (t5x_step["batch"], t5x_step["next_batch"])
  batch = {key: np.concatenate([part[key] for part in parts]) for key in MODEL_FEATURE_KEYS}
  # SGD with learning rate 1: params_after = params - (the gradient t5x accumulated).
  variables = flax.core.freeze({"params": params,
                                "params_axes": t5x_step["initializer"].global_train_state_shape.params_axes})
  state = t5x_train_state.FlaxOptimTrainState.create(t5x_optimizers.OptaxWrapper(optax.sgd(1.0)), variables)
  trainer = t5x_trainer.Trainer(model=model, train_state=state, partitioner=partitioner, eval_names=[],
                                summary_dir=None, train_state_axes=partitioner.get_mesh_axes(state),
                                rng=t5x_step["trainer_rng"], learning_rate_fn=lambda step: 1.0,
                                num_microbatches=len(parts))
  trainer.train(iter([batch]), 1, start_step=0).result()
  trainer.close()
  after = _flat(trainer.train_state.params)
  accumulated = {name: value - after[name] for name, value in _flat(params).items()}
  # Ours: our loss's gradient on each microbatch, summed. t5x's loop body splits the step key but carries
  # the unsplit one to the next microbatch, so every microbatch gets the same key (the same masking draws).
  value_and_grad, _ = _reference(t5x_step["vocab_size"])
  _, key = jax.random.split(jax.random.fold_in(t5x_step["trainer_rng"], 0))
  grads = [_flat(value_and_grad(params, part, key)[1]) for part in parts]
  for name, value in accumulated.items():
    np.testing.assert_allclose(value, grads[0][name] + grads[1][name], rtol=1e-4, atol=2e-6, err_msg=name)


# ---------------------------------------------------------------- c. t5x checkpoints into our encoder


@functools.lru_cache(maxsize=None)
def _encoder_fn(config):
  return jax.jit(lambda p, b: Encoder(config).apply(
      {"params": p}, b["tokens"], lang_ids=b["lang_ids"], positions=b["positions"],
      segment_ids=b["segment_ids"], deterministic=True).hidden)


def _encode(vocab_size, params, batch):
  """Our Encoder's last hidden states [batch, length, embed] under `params`."""
  return np.asarray(_encoder_fn(tiny_encoder_config(vocab_size=vocab_size))(params, batch))


def _t5x_restore(t5x_step, model_dir, step):
  """Checkpoint `step` of `model_dir`, restored as t5x's train.py restores (Orbax manager over the abstract state)."""
  path = str(model_dir / f"checkpoint_{step}")
  state, manager = t5x_utils.create_checkpoint_manager_and_restore(
      t5x_step["initializer"], t5x_step["partitioner"], t5x_utils.RestoreCheckpointConfig(path=path, mode="specific"),
      path, None, model_dir=str(model_dir), use_orbax=True)
  manager.close()
  assert int(state.step) == step
  return jax.device_get(state.params)


def test_t5x_checkpoint_loads_into_our_encoder(t5x_step):
  state, vocab_size, batch = t5x_step["state"], t5x_step["vocab_size"], t5x_step["batch"]
  model_dir = t5x_step["tmp"] / "model"
  model_dir.mkdir()
  manager = t5x_checkpoints.OrbaxCheckpointManagerInterface(str(model_dir), state, t5x_step["partitioner"], period=1)
  manager.save(state)
  manager.wait_until_finished()
  manager.close()
  assert (model_dir / "checkpoint_1" / "commit_success.txt").is_file(), sorted(os.listdir(model_dir))
  loaded, in_memory = _t5x_restore(t5x_step, model_dir, 1), jax.device_get(state.params)
  flat_loaded, flat_memory = (traverse_util.flatten_dict(p, sep="/") for p in (loaded, in_memory))
  assert set(flat_loaded) == set(flat_memory)
  for name in flat_memory:
    np.testing.assert_array_equal(flat_loaded[name], flat_memory[name], err_msg=name)
  hidden = _encode(vocab_size, loaded, batch)
  assert hidden.shape == (B, L, TINY_ENCODER["embed_dim"]) and np.isfinite(hidden).all()
  np.testing.assert_array_equal(hidden, _encode(vocab_size, in_memory, batch))
  # The trained step, not the initial parameters, came back.
  assert not np.allclose(hidden, _encode(vocab_size, t5x_step["initial_params"], batch))


def test_t5x_train_runs_pretrain_gin(t5x_run):
  model_dir, _ = t5x_run
  train = _events(model_dir / "train")
  losses = [value for _, value in train["loss"]]
  assert train["loss"][-1][0] == TRAIN_STEPS and np.isfinite(losses).all() and losses[-1] > 0, train["loss"]
  # Our metrics, as t5x averaged them over the steps (clu.metrics.Average).
  assert {"mlm", "tlm", "tokens", "mlm_accuracy", "learning_rate"} <= set(train)
  # t5x's training evaluation ran eval_fn on each task of the mixture.
  for task in ("bible_en_mlm", "bible_grc_mlm", "bible_grc_en_tlm", TASK):
    evals = _events(model_dir / "training_eval" / task)
    assert np.isfinite(evals["loss"][-1][1]), (task, evals)
  # Orbax checkpoints before the loop and at the end, finished.
  for step in (0, TRAIN_STEPS):
    assert (model_dir / f"checkpoint_{step}" / "commit_success.txt").is_file(), sorted(os.listdir(model_dir))
  assert "flax_xalign.interop.t5x.XAlignT5xModel" in (model_dir / "config.gin").read_text()


def test_t5x_train_checkpoints_load_into_our_encoder(t5x_run, t5x_step):
  """The checkpoints `python -m t5x.train` wrote (same sizes and optimiser structure as t5x_step's)."""
  model_dir, _ = t5x_run
  vocab_size, batch = t5x_step["vocab_size"], t5x_step["batch"]
  first, last = (_encode(vocab_size, _t5x_restore(t5x_step, model_dir, step), batch) for step in (0, TRAIN_STEPS))
  assert np.isfinite(first).all() and np.isfinite(last).all()
  assert not np.allclose(first, last)  # Training moved the parameters.


# ---------------------------------------------------------------- d. score / predict through t5x inference


def _inference_examples(model, count):
  """`count` unpacked validation examples of the mixture, as a chunk of t5x's infer.py (known length)."""
  ds = seqio.get_dataset(TASK, task_feature_lengths={"tokens": L}, dataset_split="validation", shuffle=False,
                         feature_converter=model.FEATURE_CONVERTER_CLS(pack=False), seed=0)
  examples = list(ds.take(count).as_numpy_iterator())
  return tf.data.Dataset.from_tensor_slices({k: np.stack([e[k] for e in examples]) for k in examples[0]})


def _reference_inference(vocab_size, params, examples, keys):
  """Per example: (sum over masked slots of log p(original token), targets, argmax predictions).

  Batch by batch as t5x's infer_fn makes them (B rows, the last padded with copies of the first example),
  masking batch i with keys[i].
  """
  _, forward = _reference(vocab_size)
  rows = examples + [examples[0]] * (-len(examples) % B)
  scores, targets, predicted = [], [], []
  for i, start in enumerate(range(0, len(rows), B)):
    batch = {k: np.stack([r[k] for r in rows[start:start + B]]) for k in MODEL_FEATURE_KEYS}
    logits, tgt, weights = (np.asarray(x) for x in forward(params, batch, keys[i]))
    logits = logits.astype(np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    scores.append((np.take_along_axis(log_probs, tgt[..., None], -1)[..., 0] * weights).sum(-1))
    targets.append(tgt)
    predicted.append(logits.argmax(-1))
  return tuple(np.concatenate(x)[:len(examples)] for x in (scores, targets, predicted))


def test_score_and_predict_run_under_t5x_inference(t5x_step):
  model, state, vocab_size = t5x_step["model"], t5x_step["state"], t5x_step["vocab_size"]
  count = 7  # Not a multiple of B: t5x pads the last batch.
  ds = _inference_examples(model, count)
  examples = list(ds.as_numpy_iterator())
  params = jax.device_get(state.params)

  def infer(step_fn, rng=None):
    fn = t5x_utils.get_infer_fn(step_fn, batch_size=B, train_state_axes=t5x_step["initializer"].train_state_axes,
                                partitioner=t5x_step["partitioner"])
    return fn(ds.enumerate(), state, rng)

  # score_batch takes no rng: every batch masks with EVAL_SEED.
  scored = infer(model.score_batch)
  assert [i for i, _ in scored] == list(range(count))
  scores = np.array([s for _, s in scored])
  eval_keys = [jax.random.PRNGKey(xalign_t5x.EVAL_SEED)] * 3
  want_scores, _, _ = _reference_inference(vocab_size, params, examples, eval_keys)
  assert np.isfinite(scores).all() and (scores <= 0).all() and (scores < 0).sum() >= count - 1
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)

  # predict_batch_with_aux with an rng, as t5x's infer.py calls it: infer_fn splits one key per batch.
  rng, keys = jax.random.PRNGKey(3), []
  for _ in range(3):
    key, rng = jax.random.split(rng)
    keys.append(key)
  predicted, aux = infer(model.predict_batch_with_aux, rng=jax.random.PRNGKey(3))
  assert [i for i, _ in predicted] == list(range(count))
  tokens = np.array([p for _, p in predicted])
  _, want_targets, want_predicted = _reference_inference(vocab_size, params, examples, keys)
  assert tokens.shape == want_predicted.shape and ((tokens >= 0) & (tokens < vocab_size)).all()
  np.testing.assert_array_equal(tokens, want_predicted)
  np.testing.assert_array_equal(np.array(aux["targets"]), want_targets)
  assert set(aux) >= {"targets", "weights", "positions", "log_probs", "lang_ids", "pair_side"}
  log_probs = np.array(aux["log_probs"])
  assert np.isfinite(log_probs).all() and (log_probs <= 0).all()
