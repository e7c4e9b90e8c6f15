"""Where one train step's time goes, in one call: a profile of the real step and a matmul peak beside it.

Runs `--steps` steps of the step bench/gpu_train_step.py times (value_and_grad of
`PretrainingModel.loss_fn` with masking on device, `make_optimizer`'s AdamW, donated state; the
optimizer update under a `jax.named_scope("optimizer")` so the profile can name it) under
`jax.profiler.trace`, reads the trace back in-process (`jax.profiler.ProfileData`, no TensorFlow),
and joins it with the compiled step's HLO (bench/profile_table.py): the top ops with their share of
the step, FLOPs where the HLO's dots give them and achieved TFLOP/s, and the share of time in
matmul / attention / elementwise / optimizer / host / other.

Beside it, the same call times bf16 `jnp.dot`s of the model's own matmul shapes (per layer: the
q/k/v/out projections tokens x e x a, the MLP tokens x e x m and tokens x m x e, each forward and its
two gradients; the MLM head on the expected predicted slots) and a `--big_matmul`^3 one, so the
step's matmul time is judged against what this card does on these shapes, not only the datasheet.

Writes `--out`/profile.txt (the table, capped at 1 MB) and `--out`/profile.json, prints the table,
and stops before `--time_limit_s` (phases that would not fit are skipped and say so).

  PYTHONPATH=. python bench/gpu_profile.py --model=base --batch=64 --length=512 --steps=20 --out=$OUT
  PYTHONPATH=. python bench/gpu_profile.py --model=tiny --batch=2 --length=16 --steps=2 --vocab=1000 \
      --big_matmul=256 --out=/tmp/prof      # CPU smoke run
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_train_step  # pylint: disable=wrong-import-position
import profile_table  # pylint: disable=wrong-import-position
from train_throughput import make_batches  # pylint: disable=wrong-import-position

MAX_TEXT_BYTES = 1 << 20


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="base", help="encoder preset: tiny, small, base, large")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=250_002, help="vocabulary size (XLM-R's by default)")
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--steps", type=int, default=20, help="profiled steps")
  parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first (the first compiles)")
  parser.add_argument("--attention", default="einsum", choices=("einsum", "xla", "cudnn"))
  parser.add_argument("--dropout", type=float, default=None, help="override the preset's dropout rates")
  parser.add_argument("--no_scan", action="store_true", help="EncoderConfig.scan_layers=False (layers unrolled)")
  parser.add_argument("--big_matmul", type=int, default=8192, help="side of the square peak matmul")
  parser.add_argument("--matmul_reps", type=int, default=10)
  parser.add_argument("--peak_tflops", type=float, default=None,
                      help="datasheet peak (default: models/flops.py's for this device, if known)")
  parser.add_argument("--top", type=int, default=40, help="ops in the table")
  parser.add_argument("--out", default=os.environ.get("OUT") or "bench/results/gpu_profile")
  parser.add_argument("--time_limit_s", type=float, default=420.0)
  args = parser.parse_args(argv)
  if args.steps < 1 or args.batch < 1 or args.length < 2:
    parser.error("--steps, --batch must be >= 1 and --length >= 2")
  return args


def build_step(config, host_batch):
  """gpu_train_step.py's jitted train step (the update under its optimizer scope), its state, the device
  batch and the base RNG."""
  import jax

  step_fn, state, base_rng = gpu_train_step.build_step(config, host_batch["tokens"].shape[1])
  return step_fn, state, jax.device_put(host_batch), base_rng


def device_events(profile, module_prefix: str):
  """The op events of the step's module: GPU stream kernels if a device plane has them, else CPU thunks.

  Events carry the HLO instruction in their `hlo_op` stat; device events without one (a copy, a
  memset) keep their kernel name. Returns (events, where they were read from).
  """
  found = {}
  for plane in profile.planes:
    on_device = plane.name.startswith("/device:")
    if not (on_device or plane.name.startswith("/host:CPU")):
      continue
    for line in plane.lines:
      if on_device and not line.name.startswith("Stream"):
        continue  # Derived lines (XLA Ops, Steps) repeat the stream events.
      for ev in line.events:
        stats = dict(ev.stats)
        op, module = stats.get("hlo_op"), str(stats.get("hlo_module", ""))
        if op is None and not on_device:
          continue
        if module and not module.startswith(module_prefix):
          continue
        name = str(op) if op is not None else ev.name
        found.setdefault(plane.name, []).append(
            profile_table.OpEvent(name, ev.start_ns / 1e3, ev.duration_ns / 1e3))
  device = [p for p in found if p.startswith("/device:")]
  plane = device[0] if device else next(iter(found), None)
  return (found[plane] if plane else []), plane


def profile_step(args, config, host, deadline):
  """Compiles, warms up and profiles the step; returns a dict of results (and the summary)."""
  import jax
  from jax.profiler import ProfileData

  step_fn, (params, opt_state, step), batch, rng = build_step(config, host)
  t0 = time.perf_counter()
  compiled = step_fn.lower(params, opt_state, step, batch, rng).compile()
  compile_s = time.perf_counter() - t0
  hlo_text = compiled.as_text()
  module = hlo_text.split("\n", 1)[0].split()[1].rstrip(",") if hlo_text.startswith("HloModule") else "jit_"
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  xla_flops = float(cost.get("flops", 0.0)) if isinstance(cost, dict) else None
  times = []
  for _ in range(args.warmup):
    t = time.perf_counter()
    params, opt_state, step, metrics = compiled(params, opt_state, step, batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t)
  per_step = statistics.median(times) if times else 0.0
  steps = args.steps
  if per_step and time.monotonic() + per_step * steps * 3 > deadline:  # tracing slows steps; keep room
    steps = max(1, int((deadline - time.monotonic()) / (per_step * 3)))
  logdir = tempfile.mkdtemp(prefix="gpu_profile_")
  with jax.profiler.trace(logdir):
    t = time.perf_counter()
    for _ in range(steps):
      params, opt_state, step, metrics = compiled(params, opt_state, step, batch, rng)
    jax.block_until_ready(metrics)
    wall_s = time.perf_counter() - t
  (xplane,) = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
  events, plane = device_events(ProfileData.from_file(xplane), module)
  summary = profile_table.summarize(events, profile_table.parse_hlo(hlo_text), steps=steps, wall_us=wall_s * 1e6)
  return {"module": module, "plane": plane, "compile_s": compile_s, "warm_step_s": per_step,
          "steps_profiled": steps, "wall_s": wall_s, "events": len(events), "xla_cost_flops": xla_flops,
          "loss": float(metrics["loss"]), "trace_dir": logdir}, summary


def matmul_shapes(config, *, tokens: int, predictions: float, batch: int, length: int):
  """(label, m, k, n, count per step, batch) of the step's matmuls: forward, input grad, weight grad."""
  e, a, m, v, L = config.embed_dim, config.attention_dim, config.mlp_dim, config.vocab_size, config.num_layers
  p = max(1, int(round(predictions)))
  shapes = []
  for label, rows, k, n, count in (("q/k/v/out", tokens, e, a, 4 * L), ("mlp in", tokens, e, m, L),
                                   ("mlp out", tokens, m, e, L), ("head dense", p, e, e, 1),
                                   ("head vocab", p, e, v, 1)):
    shapes += [(f"{label} fwd", rows, k, n, count, 0), (f"{label} dgrad", rows, n, k, count, 0),
               (f"{label} wgrad", k, rows, n, count, 0)]
  # Attention's batched matmuls, [batch·heads] at once: QK^T and probs·V forward and two gradients
  # each, all 2·T·T·d FLOPs per row, timed as the QK^T shape.
  shapes.append(("attention QK^T", length, config.head_dim, length, 6 * L, batch * config.num_heads))
  return shapes


def time_matmul(m: int, k: int, n: int, *, reps: int, dtype, batch: int = 0) -> float:
  """Seconds per [batch,] [m,k] @ [k,n] in `dtype`: `reps` calls queued back to back, one wait at the end.

  Queuing hides the per-call dispatch (tens of µs, as long as a small matmul on a GPU); the step's
  matmuls run queued the same way inside one program.
  """
  import jax
  import jax.numpy as jnp

  lead = (batch,) if batch else ()
  a = jax.random.normal(jax.random.key(1), lead + (m, k), dtype)
  b = jax.random.normal(jax.random.key(2), lead + (k, n), dtype)
  f = jax.jit(jnp.matmul)
  f(a, b).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a, b)
  out.block_until_ready()
  return (time.perf_counter() - t) / reps


def matmul_table(shapes, *, big: int, reps: int, dtype, deadline):
  rows = []
  for label, m, k, n, count, batch in [(f"{big}^3", big, big, big, 0, 0)] + list(shapes):
    row = {"label": label, "batch": batch, "m": m, "k": k, "n": n, "count_per_step": count}
    if time.monotonic() > deadline:
      rows.append(dict(row, skipped="time limit"))
      continue
    s = time_matmul(m, k, n, reps=reps, dtype=dtype, batch=batch)
    rows.append(dict(row, s=s, tflops=2.0 * max(batch, 1) * m * k * n / s / 1e12))
  return rows


def format_matmuls(rows, summary, peak) -> str:
  lines = [f"{'bf16 matmul':<18} {'batch':>5} {'m':>7} {'k':>7} {'n':>7} {'x/step':>6} {'ms':>9} {'TFLOP/s':>8} "
           f"{'of peak':>8}"]
  for r in rows:
    if "skipped" in r:
      lines.append(f"{r['label']:<18} {r['batch']:>5} {r['m']:>7} {r['k']:>7} {r['n']:>7}  skipped: {r['skipped']}")
      continue
    frac = f"{100 * r['tflops'] * 1e12 / peak:7.1f}%" if peak else "       -"
    lines.append(f"{r['label']:<18} {r['batch']:>5} {r['m']:>7} {r['k']:>7} {r['n']:>7} {r['count_per_step']:>6} "
                 f"{1e3 * r['s']:>9.3f} {r['tflops']:>8.2f} {frac}")
  timed = [r for r in rows if "s" in r and r.get("count_per_step")]
  ideal_us = sum(r["s"] * r["count_per_step"] for r in timed) * 1e6
  measured_us = (summary.shares["matmul"] + summary.shares["attention"]) * summary.step_us
  if timed and measured_us:
    lines.append(f"the step's matmuls alone at these shapes' measured rates: {ideal_us / 1e3:.3f} ms/step; in "
                 f"the profile, matmul + attention ops take {measured_us / 1e3:.3f} ms/step "
                 f"({measured_us / ideal_us:.2f}x the isolated time)")
  return "\n".join(lines)


def main(argv=None):
  args = parse_args(argv)
  deadline = time.monotonic() + args.time_limit_s - 20.0  # Room to write the files.
  import jax
  import jax.numpy as jnp
  import numpy as np

  from flax_xalign.data.vocab.specials import PROJECT
  from flax_xalign.models import config as config_lib
  from flax_xalign.models.flops import count_tokens, model_train_flops, peak_flops_per_device

  overrides = {} if args.dropout is None else {"dropout_rate": args.dropout, "attention_dropout_rate": args.dropout}
  if args.attention != "einsum":
    overrides["attention_implementation"] = args.attention
  if args.no_scan:
    overrides["scan_layers"] = False
  config = config_lib.preset(args.model, vocab_size=args.vocab, dtype=args.dtype, **overrides)
  device = jax.devices()[0]
  peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops_per_device(device)
  (host,) = make_batches(np.random.default_rng(0), count=1, batch=args.batch, length=args.length,
                         vocab=config.vocab_size)
  counts = count_tokens(host["segment_ids"], mask_rate=0.15, eligible=PROJECT.is_regular(host["tokens"]))
  model_flops = model_train_flops(config, counts)
  os.makedirs(args.out, exist_ok=True)
  result = {"args": vars(args), "device": device.device_kind, "jax": jax.__version__,
            "model_flops_per_step": model_flops, "peak_flops": peak}
  head = (f"device {device.device_kind}, jax {jax.__version__}; {args.model}: {config.num_layers} layers, embed "
          f"{config.embed_dim}, vocab {config.vocab_size}, {args.dtype}, batch {args.batch} x {args.length}")
  text = [head]
  try:
    prof, summary = profile_step(args, config, host, deadline)
    result["profile"] = prof
    result["shares"] = summary.shares
    result["ops"] = [r.__dict__ for r in summary.rows[:200]]  # (the 200 costliest; the FLOPs of them all:)
    result["ops_flops_per_step"] = sum(r.flops_per_step or 0 for r in summary.rows)
    step_s = prof["wall_s"] / prof["steps_profiled"]
    mfu = model_flops / step_s / peak if peak else None
    result.update(step_s=step_s, mfu=mfu)
    text.append(f"step {1e3 * step_s:.2f} ms under the profiler ({prof['steps_profiled']} steps; "
                f"{1e3 * prof['warm_step_s']:.2f} ms unprofiled), {args.batch * args.length / step_s:,.0f} "
                f"tokens/s, model {model_flops / 1e9:,.1f} GFLOP/step, XLA's count "
                f"{(prof['xla_cost_flops'] or 0) / 1e9:,.1f} GFLOP/step, MFU "
                f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} of {'-' if not peak else f'{peak / 1e12:.0f}'} "
                f"TFLOP/s; events from {prof['plane']} ({prof['events']}), compile {prof['compile_s']:.1f} s")
    text.append("")
    text.append(profile_table.format_table(summary, top=args.top))
  except Exception as e:  # pylint: disable=broad-except  (out of memory: still time the matmuls)
    summary = None
    result["profile"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    text.append(f"profile failed: {result['profile']['error']}")
  _write(args.out, text, result)  # Something on disk even if the matmuls overrun.
  shapes = matmul_shapes(config, tokens=args.batch * args.length, predictions=counts.predictions,
                         batch=args.batch, length=args.length)
  dtype = jnp.bfloat16
  rows = matmul_table(shapes, big=args.big_matmul, reps=args.matmul_reps, dtype=dtype, deadline=deadline)
  result["matmuls"] = rows
  text.append("")
  text.append(format_matmuls(rows, summary, peak) if summary else format_matmuls(
      rows, profile_table.Summary([], dict.fromkeys(profile_table.CATEGORIES, 0.0), 0, 0, 0, 0), peak))
  _write(args.out, text, result)
  print("\n".join(text), flush=True)
  print(json.dumps({k: result[k] for k in ("device", "step_s", "mfu", "shares") if k in result}))


def _write(out, text, result):
  body = "\n".join(text).encode()
  if len(body) > MAX_TEXT_BYTES:
    body = body[:MAX_TEXT_BYTES - 40] + b"\n... (cut at 1 MB)\n"
  with open(os.path.join(out, "profile.txt"), "wb") as f:
    f.write(body)
  with open(os.path.join(out, "profile.json"), "w") as f:
    json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
  main()
