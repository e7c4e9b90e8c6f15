"""Every lever of the train step in one GPU call: tokens/s and MFU per setting, the PyTorch peer beside them.

Each setting runs bench/gpu_train_step.py in a Python of its own: XLA reads XLA_FLAGS once, when jax starts,
and JAX takes most of the card's memory, so a flag or a peer cannot share a process with another setting.
A lever is the baseline's flags plus its own (a later flag wins) and/or XLA flags; the baseline is the
fastest configuration known (runs/nvidia_gpu.gin: cuDNN attention, layers unrolled, dropout 0, bf16),
XLM-R base at 64 x 512. Every row gets tokens/s, MFU by models/flops.py's standard count (model FLOPs on
real tokens / step time / --peak_tflops, gpu_train_step.py's figure) and its ratio to the baseline's
tokens/s. The peer rows are HF XLMRobertaForMaskedLM at its best (torch.compile + sdpa + bf16 autocast +
fused AdamW), with the LM head on the masked slots (the work ours does) and at every position (as HF ships
it).

Levers run in the order given, each with at most --child_timeout_s and never past --time_limit_s (a lever
that would start with less than --min_child_s left is skipped); levers.txt and levers.json are rewritten
in --out after every lever, so a call cut short still leaves what it measured.

  PYTHONPATH=. python bench/gpu_levers.py --out=$OUT --time_limit_s=420              # one H100/H200 call
  PYTHONPATH=. python bench/gpu_levers.py --size=tiny --vocab=1000 --batch=2 --length=16 --attention=einsum \
      --steps=2 --warmup=1 --levers=baseline,mu_bf16 --out=/tmp/levers                 # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclasses.dataclass(frozen=True)
class Lever:
  """One setting: gpu_train_step.py flags on top of the baseline's, XLA flags, and which side it times."""

  name: str
  what: str
  args: tuple[str, ...] = ()
  xla_flags: tuple[str, ...] = ()
  side: str = "ours"  # "ours" or "peer"


LEVERS = (
    Lever("baseline", "ours with the baseline's flags (the head line; by default cuDNN attention, layers "
          "unrolled, dropout 0, bf16, AdamW moments in float32)"),
    Lever("peer_best_masked", "HF at its best, LM head on the masked slots only (like for like)",
          ("--peer=best", "--peer_logits=masked"), side="peer"),
    Lever("mu_bf16", "AdamW's first moment in bf16 (OptimizerConfig.mu_dtype)", ("--mu_dtype=bfloat16",)),
    Lever("xla_no_triton_gemm", "XLA: every GEMM to cuBLAS, none to Triton",
          xla_flags=("--xla_gpu_enable_triton_gemm=false",)),
    Lever("xla_lhs", "XLA: latency-hiding scheduler", xla_flags=("--xla_gpu_enable_latency_hiding_scheduler=true",)),
    Lever("xla_no_cmd_buffer", "XLA: no command buffers (CUDA graphs)",
          xla_flags=("--xla_gpu_enable_command_buffer=",)),
    Lever("batch128", "batch 128", ("--batches=128",)),
    Lever("remat_dots", "remat: save the dots, recompute the rest (EncoderConfig.remat_policy)", ("--remat=dots",)),
    Lever("peer_best", "HF at its best, logits at every position (as HF ships it)", ("--peer=best",), side="peer"),
    Lever("len256_batch128", "length 256, batch 128 (the same tokens per step)", ("--length=256", "--batches=128")),
    Lever("baseline_again", "the baseline again (drift over the call)"),
    Lever("peer_plain", "HF eager, logits at every position (the peer of the 2026-11-26 results, dropout 0 here)",
          side="peer"),
)
BY_NAME = {lever.name: lever for lever in LEVERS}


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--levers", default=",".join(BY_NAME), help=f"comma-separated, run in this order: "
                      f"{', '.join(BY_NAME)}")
  parser.add_argument("--size", default="base")
  parser.add_argument("--vocab", type=int, default=250_002)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--peer_batch", type=int, default=None, help="the peer rows' batch (default --batch)")
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--attention", default="cudnn", choices=("einsum", "xla", "cudnn"))
  parser.add_argument("--scan", action="store_true", help="scan the layers (the baseline unrolls them)")
  parser.add_argument("--steps", type=int, default=10, help="timed steps per lever")
  parser.add_argument("--warmup", type=int, default=2, help="untimed steps per lever (the first compiles)")
  parser.add_argument("--peak_tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
  parser.add_argument("--out", default=os.environ.get("OUT") or "bench/results/gpu_levers")
  parser.add_argument("--time_limit_s", type=float, default=420.0)
  parser.add_argument("--child_timeout_s", type=float, default=180.0)
  parser.add_argument("--min_child_s", type=float, default=30.0, help="no lever starts with less time left")
  parser.add_argument("--dry_run", action="store_true", help="print each lever's command and XLA_FLAGS, run none")
  args = parser.parse_args(argv)
  unknown = [n for n in args.levers.split(",") if n not in BY_NAME]
  if unknown:
    parser.error(f"unknown lever(s) {unknown}; known: {', '.join(BY_NAME)}")
  return args


def baseline_args(args) -> list[str]:
  """gpu_train_step.py's flags for the baseline (both sides); a lever's own flags come after them."""
  out = [f"--size={args.size}", f"--vocab={args.vocab}", f"--batches={args.batch}", f"--length={args.length}",
         "--dtype=bfloat16", "--dropout=0", f"--attention={args.attention}", f"--steps={args.steps}",
         f"--warmup={args.warmup}", f"--peak_tflops={args.peak_tflops}"]
  return out if args.scan else out + ["--no_scan"]


def child_command(lever: Lever, args) -> tuple[list[str], dict[str, str]]:
  """(argv, environment changes) of the lever's child process."""
  argv = [sys.executable, os.path.join(HERE, "gpu_train_step.py"), *baseline_args(args)]
  if lever.side == "peer":
    argv += ["--skip_ours"] + ([f"--batches={args.peer_batch}"] if args.peer_batch else [])
  else:
    argv += ["--skip_peer"]
  argv += list(lever.args)
  env = {"PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
         "PYTHONUNBUFFERED": "1"}
  if lever.xla_flags:
    env["XLA_FLAGS"] = " ".join(p for p in (os.environ.get("XLA_FLAGS", ""), *lever.xla_flags) if p)
  return argv, env


def run_child(argv, env, timeout):
  """Runs one child in its own process group; (returncode or None on timeout, stdout, stderr, seconds)."""
  start = time.monotonic()
  proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True)
  try:
    out, err = proc.communicate(timeout=timeout)
    code = proc.returncode
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # Its own group: the compiler workers torch.compile started go too.
    out, err = proc.communicate()
    code = None
  return code, out, err, time.monotonic() - start


def lever_rows(lever: Lever, code, out, err, wall_s, timeout) -> list[dict]:
  """The table rows of one child's result (one per batch it timed), or one row saying why there are none."""
  base = {"lever": lever.name, "side": lever.side, "what": lever.what, "args": list(lever.args),
          "xla_flags": list(lever.xla_flags), "wall_s": wall_s}
  lines = (out or "").strip().splitlines()
  try:
    result = json.loads(lines[-1]) if lines else None
  except json.JSONDecodeError:
    result = None
  if code is None:
    status = f"timeout after {timeout:.0f} s"
  elif code != 0 or not isinstance(result, dict) or not result.get("rows"):
    status = f"exit {code}: {(err or '').strip()[-300:]}"
  else:
    rows = []
    for row in result["rows"]:
      side = row.get(lever.side, {})
      rows.append(dict(base, device=result.get("device"), batch=row["batch"], length=row["length"],
                       status=side.get("error", "ok"),
                       **{k: side[k] for k in ("step_s", "tokens_per_s", "mfu", "warmup_s", "loss", "settings")
                          if k in side}))
    return rows
  return [dict(base, status=status, log_tail=((out or "")[-1500:] + (err or "")[-1500:]))]


def add_ratios(rows: list[dict]) -> dict:
  """Adds `vs_baseline` (tokens/s over the first good baseline row's) to every timed row; returns the summary."""
  base = next((r for r in rows if r["lever"] == "baseline" and r.get("tokens_per_s")), None)
  summary = {"baseline_tokens_per_s": base and base["tokens_per_s"], "baseline_mfu": base and base["mfu"]}
  for r in rows:
    if base and r.get("tokens_per_s"):
      r["vs_baseline"] = r["tokens_per_s"] / base["tokens_per_s"]
      if r["side"] == "peer":
        summary[f"ours_over_{r['lever']}"] = base["tokens_per_s"] / r["tokens_per_s"]
  return summary


def format_table(rows: list[dict], summary: dict) -> str:
  lines = [f"{'lever':<20} {'side':<4} {'batch':>5} {'len':>4} {'step ms':>9} {'tokens/s':>11} {'MFU':>6} "
           f"{'vs base':>7} {'warm s':>6} {'wall s':>6}  status / what"]
  for r in rows:
    if "tokens_per_s" in r:
      lines.append(f"{r['lever']:<20} {r['side']:<4} {r['batch']:>5} {r['length']:>4} {1e3 * r['step_s']:>9.1f} "
                   f"{r['tokens_per_s']:>11,.0f} {100 * r['mfu']:>5.1f}% {r.get('vs_baseline', 0):>6.2f}x "
                   f"{r.get('warmup_s', 0):>6.1f} {r.get('wall_s', 0):>6.1f}  {r['what']}")
    else:
      lines.append(f"{r['lever']:<20} {r['side']:<4} {r.get('batch', '-'):>5} {r.get('length', '-'):>4} "
                   f"{'-':>9} {'-':>11} {'-':>6} {'-':>7} {'-':>6} {r.get('wall_s', 0):>6.1f}  {r['status'][:200]}")
  for r in rows:
    if r.get("settings"):
      settings = r["settings"]
      lines.append(f"{r['lever']}: {settings['mode']}, {settings['compile']}, attention "
                   f"{settings['attn_implementation']}, {settings['autocast']} autocast, AdamW "
                   f"{'fused' if settings['fused_adamw'] else 'not fused'}, logits at {settings['logits']}")
  for key, value in summary.items():
    if key.startswith("ours_over_"):
      lines.append(f"ours (baseline) / {key[len('ours_over_'):]}: {value:.2f}x tokens/s")
  return "\n".join(lines)


def run_levers(levers, args, *, runner=run_child, clock=time.monotonic, write=None) -> tuple[list[dict], dict]:
  """Runs the levers in order within the time limit; calls write(rows, summary) after each."""
  deadline = clock() + args.time_limit_s - 10.0  # Room to write the files.
  rows: list[dict] = []
  summary: dict = {}
  for lever in levers:
    left = deadline - clock()
    if left < args.min_child_s:
      rows.append({"lever": lever.name, "side": lever.side, "what": lever.what, "args": list(lever.args),
                   "xla_flags": list(lever.xla_flags), "wall_s": 0.0,
                   "status": f"skipped: time limit ({max(left, 0):.0f} s left)"})
    else:
      argv, env = child_command(lever, args)
      timeout = min(args.child_timeout_s, left)
      print(f"[{lever.name}] {' '.join(argv[1:])}" + (f"  XLA_FLAGS={env['XLA_FLAGS']!r}" if lever.xla_flags
                                                      else ""), flush=True)
      rows += lever_rows(lever, *runner(argv, env, timeout), timeout)
      print(f"[{lever.name}] {rows[-1]['status']}, {rows[-1]['wall_s']:.1f} s", flush=True)
    summary = add_ratios(rows)
    if write:
      write(rows, summary)
  return rows, summary


def main(argv=None):
  args = parse_args(argv)
  levers = [BY_NAME[n] for n in args.levers.split(",")]
  if args.dry_run:
    for lever in levers:
      cmd, env = child_command(lever, args)
      print(f"{lever.name}: {' '.join(cmd[1:])}" + (f"  XLA_FLAGS={env['XLA_FLAGS']!r}" if lever.xla_flags else ""))
    return
  os.makedirs(args.out, exist_ok=True)
  started = time.time()

  def write(rows, summary):
    head = (f"levers of the train step, {args.size} {args.batch} x {args.length}, device "
            f"{next((r['device'] for r in rows if r.get('device')), '?')}; MFU = model FLOPs on real tokens "
            f"(models/flops.py standard count) / step time / {args.peak_tflops:g} TFLOP/s; "
            f"{time.time() - started:.0f} s so far\nbaseline: gpu_train_step.py {' '.join(baseline_args(args))}")
    text = head + "\n" + format_table(rows, summary)
    with open(os.path.join(args.out, "levers.txt"), "w") as f:
      f.write(text + "\n")
    with open(os.path.join(args.out, "levers.json"), "w") as f:
      json.dump({"args": vars(args), "baseline_args": baseline_args(args), "summary": summary, "rows": rows}, f,
                indent=1)
    return text

  rows, summary = run_levers(levers, args, write=write)
  print(write(rows, summary), flush=True)
  print(json.dumps(summary))


if __name__ == "__main__":
  main()
