"""Two processes on this machine run the real entry point, as the hosts of a TPU pod do.

Each process gets its own fake CPU devices (XLA_FLAGS) and joins the job through
`JAX_COORDINATOR_ADDRESS` / `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID`
(flax_xalign/train.py); arrays cross processes with jax's gloo CPU collectives.
Checked here: both processes train, a SIGTERM at the same step on both saves one
checkpoint (state from both processes, the data iterator of each process, the
run's metadata, metrics and config from the chief only), a second launch
resumes, and the losses of steps 1..6 equal those of one process holding all
four devices. The data split into two shards (`data_shards=2`) makes the global
batch the same rows in both cases (training/data.py); with the default (one
shard per host) one process and two would train on different batches.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from flax_xalign.errors import UserError
from tests import testlib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH_TIMEOUT_S = 300  # Per launch; generous because CI machines may be busy.
COMPARED = ("loss", "mlm", "tlm", "learning_rate", "grad_norm", "tokens")

PROBE = """
import sys
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
import jax.numpy as jnp
from jax.experimental import multihost_utils
total = multihost_utils.process_allgather(jnp.array([jax.process_index() + 1.0])).sum()
assert jax.process_count() == 2 and jax.device_count() == 2 * jax.local_device_count(), jax.devices()
assert float(total) == 3.0, total
"""

# Imported by the gin file of the runs (`import mp_hooks`): a step callback
# that sends SIGTERM to chosen processes after a step, as a preemption would.
HOOKS = """
import os
import signal
import time

import gin
import jax


@gin.configurable
def sigterm_at_step(step, processes=None, delay_s=0.0):
  def callback(current, metrics):
    if current == step and (processes is None or jax.process_index() in processes):
      os.kill(os.getpid(), signal.SIGTERM)
    if current >= step and delay_s:
      time.sleep(delay_s)  # Time for a preemption notice to reach every process.
  return callback
"""


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(import_dir, *, devices, process=None, num_processes=1, port=None):
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPU_WORKER_HOSTNAMES",
                      "FLAX_XALIGN_MULTIHOST")}
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
             XLA_FLAGS=" ".join(flags + [f"--xla_force_host_platform_device_count={devices}"]),
             PYTHONPATH=os.pathsep.join([str(import_dir), REPO, env.get("PYTHONPATH", "")]))
  if num_processes > 1:
    env.update(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(num_processes),
               JAX_PROCESS_ID=str(process))
  return env


def _launch(tmp_path, argv, *, num_processes, devices, name, import_dir, timeout_s=LAUNCH_TIMEOUT_S):
  """Starts `num_processes` processes of `python <argv>`; returns [(returncode, stdout, stderr)].

  Their output goes to files under `tmp_path` (a pipe could fill and stall a process);
  `import_dir` is put on PYTHONPATH (the gin file's `import mp_hooks`).

  On a timeout every process is killed and the test fails with the tail of each one's output.
  """
  port = _free_port()
  procs = []
  for i in range(num_processes):
    out, err = (open(tmp_path / f"{name}.{i}.{s}", "w+") for s in ("out", "err"))  # noqa: SIM115 (closed below)
    env = _env(import_dir, devices=devices, process=i, num_processes=num_processes, port=port)
    procs.append((subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=out, stderr=err), out, err))
  timed_out = False
  try:
    for proc, _, _ in procs:
      proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    timed_out = True
  finally:
    for proc, _, _ in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  results = []
  for proc, out, err in procs:
    out.seek(0)
    err.seek(0)
    results.append((proc.returncode, out.read(), err.read()))
    out.close()
    err.close()
  if timed_out:
    pytest.fail(f"{name}: no result within {timeout_s} s; killed.\n" + _tails(results))
  return results


def _tails(results):
  return "\n".join(f"--- process {i} (exit {rc})\nstdout: {out[-1500:]}\nstderr: {err[-3000:]}"
                   for i, (rc, out, err) in enumerate(results))


@pytest.fixture(scope="module")
def cross_process_collectives(tmp_path_factory):
  """Skips the module when this jax build cannot join two CPU processes."""
  tmp_path = tmp_path_factory.mktemp("probe")
  script = tmp_path / "probe.py"
  script.write_text(PROBE)
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, str(script), f"localhost:{port}", str(i)], cwd=REPO,
                            env=_env(tmp_path, devices=1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  try:
    outputs = [p.communicate(timeout=120) for p in procs]
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    outputs = [p.communicate() for p in procs]
  if any(p.returncode for p in procs):
    pytest.skip("jax.distributed with cross-process CPU collectives (jax_cpu_collectives_implementation="
                "'gloo') does not work in this jax build:\n" + "\n".join(err[-800:] for _, err in outputs))


@pytest.fixture(scope="module")
def run_gin(tmp_path_factory):
  """A corpus (en text + de-en bitext), its vocabulary, and a gin file for 6 tiny steps."""
  import random

  from flax_xalign.data.vocab import sentencepiece as vocab
  root = tmp_path_factory.mktemp("mp_corpus")
  rng = random.Random(0)
  files = {}
  for split, n in (("train", 400), ("validation", 60)):
    pairs = testlib.sentences(rng, n)
    (root / f"en.{split}.txt").write_text("\n".join(e for e, _ in pairs) + "\n", encoding="utf-8")
    (root / f"de_en.{split}.tsv").write_text("\n".join(f"{d}\t{e}" for e, d in pairs) + "\n", encoding="utf-8")
    files[split] = pairs
  model = vocab.train_sentencepiece([s for pairs in files.values() for p in pairs for s in p], vocab_size=83,
                                    model_path=root / "spm.model", model_type="bpe")
  (root / "mp_hooks.py").write_text(HOOKS)
  en = {s: str(root / f"en.{s}.txt") for s in files}
  tsv = {s: str(root / f"de_en.{s}.tsv") for s in files}
  user_tasks = testlib.user_mixture_gin(scope="mp", en_name="mp_en", pair_name="mp_de_en", mixture_name="mp_mix",
                                        en_files=en, tsv_files=tsv, vocab=model)
  (root / "run.gin").write_text(_RUN_GIN.format(data=user_tasks) + testlib.tiny_encoder_gin())
  return root


_RUN_GIN = textwrap.dedent("""
    import mp_hooks
    include 'runs/pretrain.gin'
    {data}
    TASK_FEATURE_LENGTHS = {{'tokens': 19}}
    BATCH_SIZE = 8
    TRAIN_STEPS = 6
    LOG_EVERY = 1
    CHECKPOINT_EVERY = 3
    EVAL_EVERY = 0
    OptimizerConfig.warmup_steps = 2
    OptimizerConfig.learning_rate = 3e-3
    """)


@pytest.fixture(scope="module")
def cache_run_gin(tmp_path_factory, run_gin):
  """`run_gin`'s folder with a packed cache of its mixture (`xalign cache`, 96 rows) and `cache.gin`, the same
  run reading it: its processes never import seqio or TensorFlow (~12 s of CPU less each, measured), for the
  tests whose subject is not the input pipeline."""
  from flax_xalign.cli import cache as cache_cli

  root = tmp_path_factory.mktemp("mp_cache")
  source = root / "source.gin"  # The run's tasks and lengths, without its step hooks module.
  source.write_text((run_gin / "run.gin").read_text().replace("import mp_hooks\n", ""))
  assert cache_cli.main([f"--gin_file={source}", f"--output={root / 'cache'}", "--examples=96"]) == 0
  data = f"MIXTURE_OR_TASK_NAME = 'mp_mix'\ntrain.data = 'cache:{root / 'cache'}'"
  (run_gin / "cache.gin").write_text(_RUN_GIN.format(data=data) + testlib.tiny_encoder_gin())
  return run_gin


def _train_argv(run_gin, model_dir, *extra, gin_name="run.gin"):
  return ["-m", "flax_xalign.train", f"--gin_file={run_gin / gin_name}", f"--gin.MODEL_DIR='{model_dir}'", *extra]


def _rows(model_dir):
  return [json.loads(line) for line in open(os.path.join(model_dir, "metrics.jsonl"))]


@pytest.mark.slow  # Minutes: two-process jobs of the real entry point.
def test_two_processes_stop_resume_and_match_one_process(tmp_path, run_gin, cross_process_collectives):
  model_dir = tmp_path / "two"
  shards = ["--gin.train.data_shards=2"]
  # Only steps 5 and 6 remain after the signal: each waits 1 s so the preemption notice reaches the
  # coordination service before the run ends (0.05 s was too short once on a loaded CI machine: both
  # processes finished all six steps and exited 0).
  stop = ["--gin.train.step_callback=@sigterm_at_step()", "--gin.sigterm_at_step.step=4",
          "--gin.sigterm_at_step.delay_s=1.0"]

  first = _launch(tmp_path, _train_argv(run_gin, model_dir, *shards, *stop), num_processes=2, devices=2,
                  name="first", import_dir=run_gin)
  assert [rc for rc, _, _ in first] == [128 + signal.SIGTERM] * 2, _tails(first)
  assert "mesh {'data': 4, 'model': 1}" in first[0][1], _tails(first)
  # Both processes must stop after the same step: 4 when each handles its own SIGTERM, a later
  # common step when jax's preemption service agrees on one (multihost_utils.reached_preemption_sync_point).
  stopped = [int(out.split("stopped at step ")[1].split(";")[0]) for _, out, _ in first]
  assert stopped[0] == stopped[1] and 4 <= stopped[0] < 6, _tails(first)
  stop_step = stopped[0]
  assert f"step {stop_step}/6" in first[0][1] and "step 1/6" not in first[1][1], "only the chief prints progress"
  steps = sorted(os.listdir(model_dir / "checkpoints"), key=int)
  assert steps == ["3", str(stop_step)], steps
  iterators = sorted(os.listdir(model_dir / "checkpoints" / str(stop_step) / "data_iterator"))
  assert [d for d in iterators if d.startswith("process_")] == ["process_0", "process_1"], iterators
  assert [r["step"] for r in _rows(model_dir)] == list(range(1, stop_step + 1)), "rows from the chief only"
  for name in ("config.gin", "vocabulary.model", "tensorboard"):
    assert (model_dir / name).exists(), name

  second = _launch(tmp_path, _train_argv(run_gin, model_dir, *shards), num_processes=2, devices=2, name="second",
                   import_dir=run_gin)
  assert [rc for rc, _, _ in second] == [0, 0], _tails(second)
  assert all(f"resumed from {model_dir}/checkpoints/{stop_step}" in out for _, out, _ in second), _tails(second)
  assert max(os.listdir(model_dir / "checkpoints"), key=int) == "6"
  two = {r["step"]: r for r in _rows(model_dir)}
  assert sorted(two) == [1, 2, 3, 4, 5, 6], "metrics.jsonl should read as one run"

  # The reference: one process holding all four devices, the same global batches because the data
  # is split into the same two shards.
  reference_dir = tmp_path / "reference"
  reference = _launch(tmp_path, _train_argv(run_gin, reference_dir, *shards), num_processes=1, devices=4,
                      name="one", import_dir=run_gin)
  assert all(rc == 0 for rc, _, _ in reference), _tails(reference)
  ref = {r["step"]: r for r in _rows(reference_dir)}
  for step in range(1, 7):
    for key in COMPARED:
      np.testing.assert_allclose(two[step][key], ref[step][key], rtol=1e-5, atol=2e-6,
                                 err_msg=f"{key} at step {step}")


@pytest.mark.slow  # Minutes: two-process jobs of the real entry point.
def test_two_processes_read_their_rows_of_a_packed_cache_and_match_one_process(tmp_path, run_gin,
                                                                                cross_process_collectives):
  """From a cache each process reads its half of every global batch: the same run as one process."""
  from flax_xalign.cli import cache as cache_cli

  cache_gin = tmp_path / "cache.gin"  # The run's tasks and lengths, without its step hooks module.
  cache_gin.write_text((run_gin / "run.gin").read_text().replace("import mp_hooks\n", ""))
  assert cache_cli.main([f"--gin_file={cache_gin}", f"--output={tmp_path / 'cache'}", "--examples=96"]) == 0
  data = [f"--gin.train.data='cache:{tmp_path / 'cache'}'"]
  model_dir, reference_dir = tmp_path / "two", tmp_path / "one"
  two = _launch(tmp_path, _train_argv(run_gin, model_dir, *data), num_processes=2, devices=2, name="two",
                import_dir=run_gin)
  assert [rc for rc, _, _ in two] == [0, 0], _tails(two)
  positions = sorted(os.listdir(model_dir / "checkpoints" / "6" / "data_iterator_cache"))
  assert [p for p in positions if p.startswith("process_")] == ["process_0.json", "process_1.json"], positions
  states = [json.loads((model_dir / "checkpoints" / "6" / "data_iterator_cache" / f"process_{i}.json").read_text())
            for i in range(2)]
  assert [s["rows"] for s in states] == [[0, 4], [4, 8]]
  one = _launch(tmp_path, _train_argv(run_gin, reference_dir, *data), num_processes=1, devices=4, name="one",
                import_dir=run_gin)
  assert all(rc == 0 for rc, _, _ in one), _tails(one)
  rows_two, rows_one = ({r["step"]: r for r in _rows(d)} for d in (model_dir, reference_dir))
  assert sorted(rows_two) == sorted(rows_one) == [1, 2, 3, 4, 5, 6]
  for step in range(1, 7):
    for key in COMPARED:
      np.testing.assert_allclose(rows_two[step][key], rows_one[step][key], rtol=1e-5, atol=2e-6,
                                 err_msg=f"{key} at step {step}")


@pytest.mark.slow  # Minutes: two-process jobs of the real entry point.
def test_sigterm_to_one_process_stops_both_at_one_step(tmp_path, cache_run_gin, cross_process_collectives):
  """A preemption notice reaches one host only: every process must still stop after the same step.

  The trainer leaves SIGTERM to jax's preemption service when several
  processes run (docs/MULTIHOST.md); a handler of its own would make the
  signalled process save alone while the other waits in the next step's
  collective (this test then fails on its timeout).
  """
  model_dir = tmp_path / "one_signalled"
  stop = ["--gin.train.step_callback=@sigterm_at_step()", "--gin.sigterm_at_step.step=2",
          "--gin.sigterm_at_step.processes=[1]", "--gin.sigterm_at_step.delay_s=0.1", "--gin.TRAIN_STEPS=40"]
  results = _launch(tmp_path, _train_argv(cache_run_gin, model_dir, *stop, gin_name="cache.gin"), num_processes=2,
                    devices=2, name="one", import_dir=cache_run_gin, timeout_s=90)
  assert [rc for rc, _, _ in results] == [128 + signal.SIGTERM] * 2, _tails(results)
  stopped = {out.split("stopped at step ")[1].split(";")[0] for _, out, _ in results}
  assert len(stopped) == 1 and stopped.pop() in os.listdir(model_dir / "checkpoints"), _tails(results)


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"TPU_WORKER_HOSTNAMES": "t1k-0"}, None),
    ({"TPU_WORKER_HOSTNAMES": "w0,w1"}, {}),
    ({"FLAX_XALIGN_MULTIHOST": "1"}, {}),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, {}),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
     {"coordinator_address": "localhost:9", "num_processes": 2, "process_id": 1}),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:9", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}, None),
])
def test_distributed_settings(environ, expected):
  from flax_xalign.training.distributed import distributed_settings

  assert distributed_settings(environ) == expected


@pytest.mark.parametrize("environ, needle", [
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:9", "JAX_NUM_PROCESSES": "2"}, "JAX_PROCESS_ID"),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:9", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "0 <= "),
    ({"JAX_COORDINATOR_ADDRESS": "localhost:9", "JAX_NUM_PROCESSES": "two", "JAX_PROCESS_ID": "0"}, "integers"),
])
def test_distributed_settings_refuses_half_a_job(environ, needle, capsys):
  from flax_xalign.cli import train
  from flax_xalign.training import distributed

  with pytest.raises(UserError, match=needle):
    distributed.distributed_settings(environ)
  # The entry point turns it into one error line and exit status 2, before jax starts.
  old = dict(os.environ)
  try:
    os.environ.update(environ)
    assert train.main(["--gin.MODEL_DIR='unused'"]) == 2
  finally:
    os.environ.clear()
    os.environ.update(old)
  assert capsys.readouterr().err.startswith("error: ")


def test_data_shards_give_the_rows_of_one_host_per_shard(tiny_corpus):
  """One process reading 2 shards yields, row for row, shard 0's batch then shard 1's."""
  from flax_xalign.data import pipeline
  from flax_xalign.training.data import resolve_task

  # One task rather than the mixture: the sharding is the same, and each of the five pipelines builds faster.
  data = resolve_task("tiny_de_en")
  kwargs = {"feature_lengths": {"tokens": 19}, "seed": 5}
  joined = list(data.dataset(batch_size=6, data_shards=2, **kwargs).take(3).as_numpy_iterator())
  shards = [list(pipeline.get_dataset(data.provider, languages=data.languages, split="train",
                                      feature_lengths={"tokens": 19}, batch_size=3, seed=5, shard_id=i,
                                      num_shards=2, specials=data.vocabulary_spec.specials)
                 .take(3).as_numpy_iterator()) for i in range(2)]
  for step, batch in enumerate(joined):
    for key, value in batch.items():
      assert value.shape == (6, 19)
      np.testing.assert_array_equal(value, np.concatenate([shards[0][step][key], shards[1][step][key]]))
  whole = next(data.dataset(batch_size=6, **kwargs).as_numpy_iterator())  # One shard: another stream.
  assert not np.array_equal(whole["tokens"], joined[0]["tokens"])
  with pytest.raises(UserError, match="data_shards"):
    data.dataset(batch_size=6, data_shards=4, **kwargs)
