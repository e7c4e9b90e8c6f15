"""bench/gpu_levers.py: each lever's child command (its flags after the baseline's, XLA_FLAGS in its own
environment), the table built from children's JSON with a fake runner and clock (ratios by hand, the time
limit, a timeout), the bf16-moment lever's optimizer state, and one CPU run of two real levers (subprocess)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_levers  # pylint: disable=wrong-import-position
import gpu_train_step  # pylint: disable=wrong-import-position


def _args(*extra):
  return gpu_levers.parse_args(["--size=tiny", "--vocab=1000", "--batch=2", "--length=16", "--attention=einsum",
                                "--steps=2", "--warmup=1", *extra])


def test_a_levers_flags_come_after_the_baselines_and_win(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
  args = _args()
  argv, env = gpu_levers.child_command(gpu_levers.BY_NAME["batch128"], args)
  assert argv[1].endswith("bench/gpu_train_step.py") and argv[-2:] == ["--skip_peer", "--batches=128"]
  assert "XLA_FLAGS" not in env  # No flags of its own: the inherited environment is left alone.
  parsed = gpu_train_step.parse_args(argv[2:])  # argparse: the last --batches wins
  assert (parsed.batches, parsed.size, parsed.dropout, parsed.no_scan, parsed.skip_peer) == ("128", "tiny", 0, True,
                                                                                             True)
  argv, env = gpu_levers.child_command(gpu_levers.BY_NAME["xla_lhs"], args)
  assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_enable_latency_hiding_scheduler=true"
  argv, _ = gpu_levers.child_command(gpu_levers.BY_NAME["peer_best_masked"], _args("--peer_batch=1"))
  parsed = gpu_train_step.parse_args(argv[2:])
  assert (parsed.skip_ours, parsed.skip_peer, parsed.peer, parsed.peer_logits, parsed.batches) == (
      True, False, "best", "masked", "1")


def test_unknown_lever_is_one_error(capsys):
  with pytest.raises(SystemExit):
    gpu_levers.parse_args(["--levers=baseline,warp_drive"])
  assert "unknown lever(s) ['warp_drive']" in capsys.readouterr().err


def _child_json(side, tokens_per_s, mfu, batch=2):
  row = {"batch": batch, "length": 16, side: {"step_s": batch * 16 / tokens_per_s, "tokens_per_s": tokens_per_s,
                                              "mfu": mfu, "warmup_s": 1.0, "loss": 7.0}}
  if side == "peer":
    row["peer"]["settings"] = {"mode": "best", "compile": "torch.compile (inductor)", "attn_implementation": "sdpa",
                               "autocast": "bfloat16", "fused_adamw": True, "logits": "masked slots only (3 per row)"}
  return "progress line\n" + json.dumps({"device": "fake", "rows": [row]}) + "\n"


def test_table_ratios_timeout_and_time_limit_with_a_fake_runner():
  levers = [gpu_levers.BY_NAME[n] for n in ("baseline", "peer_best_masked", "mu_bf16", "xla_lhs", "remat_dots")]
  outputs = {"baseline": (0, _child_json("ours", 1000.0, 0.20), "", 30.0),
             "peer_best_masked": (0, _child_json("peer", 400.0, 0.08), "", 50.0),
             "mu_bf16": (0, _child_json("ours", 1100.0, 0.22), "", 30.0),
             "xla_lhs": (None, "compiling...", "", 40.0)}
  seen = []

  def runner(argv, env, timeout):
    name = next(n for n in outputs if n not in seen)
    seen.append(name)
    return outputs[name]

  # Time limit 100 s (90 s after the 10 s kept for writing); the clock reads 0 at the start, then before each lever.
  times = iter([0.0, 0.0, 30.0, 45.0, 55.0, 70.0])
  writes = []
  rows, summary = gpu_levers.run_levers(levers, _args("--time_limit_s=100", "--min_child_s=25"), runner=runner,
                                        clock=lambda: next(times), write=lambda r, s: writes.append(len(r)))
  assert [r["lever"] for r in rows] == ["baseline", "peer_best_masked", "mu_bf16", "xla_lhs", "remat_dots"]
  assert writes == [1, 2, 3, 4, 5]  # The files are rewritten after every lever.
  by = {r["lever"]: r for r in rows}
  assert by["baseline"]["vs_baseline"] == 1.0
  assert by["mu_bf16"]["vs_baseline"] == pytest.approx(1.1) and by["mu_bf16"]["mfu"] == 0.22
  assert by["peer_best_masked"]["vs_baseline"] == pytest.approx(0.4)
  assert summary == {"baseline_tokens_per_s": 1000.0, "baseline_mfu": 0.20,
                     "ours_over_peer_best_masked": pytest.approx(2.5)}
  # xla_lhs started with 35 s left (90 - 55), so its timeout was 35 s; remat_dots had 20 s < 25 s: skipped.
  assert by["xla_lhs"]["status"] == "timeout after 35 s" and "compiling" in by["xla_lhs"]["log_tail"]
  assert by["remat_dots"]["status"] == "skipped: time limit (20 s left)"
  table = gpu_levers.format_table(rows, summary)
  assert "ours (baseline) / peer_best_masked: 2.50x tokens/s" in table
  assert "peer_best_masked: best, torch.compile (inductor), attention sdpa, bfloat16 autocast, AdamW fused" in table
  assert "skipped: time limit" in table and "timeout after 35 s" in table


def test_a_failed_child_keeps_its_error():
  (row,) = gpu_levers.lever_rows(gpu_levers.BY_NAME["xla_lhs"], 1, "", "F0000 Unknown flag --xla_gpu_x\n", 3.0, 60)
  assert row["status"] == "exit 1: F0000 Unknown flag --xla_gpu_x" and "tokens_per_s" not in row
  oom = json.dumps({"device": "gpu",
                    "rows": [{"batch": 128, "length": 512, "ours": {"error": "XlaRuntimeError: OOM"}}]})
  (row,) = gpu_levers.lever_rows(gpu_levers.BY_NAME["batch128"], 0, oom, "", 9.0, 60)
  assert row["status"] == "XlaRuntimeError: OOM" and row["batch"] == 128


def test_bf16_moment_lever_stores_adams_first_moment_in_bf16():
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import optax  # pylint: disable=import-outside-toplevel

  from flax_xalign.errors import UserError  # pylint: disable=import-outside-toplevel
  from flax_xalign.models import config as config_lib  # pylint: disable=import-outside-toplevel
  from flax_xalign.training.optimizer import OptimizerConfig  # pylint: disable=import-outside-toplevel

  config = config_lib.preset("tiny", vocab_size=61)
  _, (params, opt_state, _), _ = gpu_train_step.build_step(config, 13, OptimizerConfig(mu_dtype="bfloat16"))
  (adam,) = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
             if isinstance(s, optax.ScaleByAdamState)]
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.float32)}  # optax keeps nu as the params
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  with pytest.raises(UserError, match="OptimizerConfig.mu_dtype must be None, 'bfloat16' or 'float32', got 'bf16'"):
    OptimizerConfig(mu_dtype="bf16")


@pytest.mark.subprocess  # Two fresh Pythons (one per lever), each a tiny compile: ~1 min on 2 busy cores.
def test_cpu_run_of_two_levers_writes_the_table(tmp_path):
  out = tmp_path / "levers"
  proc = subprocess.run(
      [sys.executable, "bench/gpu_levers.py", "--size=tiny", "--vocab=1000", "--batch=2", "--length=16",
       "--attention=einsum", "--steps=2", "--warmup=1", "--levers=baseline,mu_bf16", f"--out={out}",
       "--time_limit_s=400"],
      cwd=REPO, capture_output=True, text=True, timeout=450, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads((out / "levers.json").read_text())
  base, mu = result["rows"]
  assert (base["lever"], base["status"], mu["lever"], mu["status"]) == ("baseline", "ok", "mu_bf16", "ok")
  assert base["device"] == "cpu" and base["batch"] == 2 and base["length"] == 16
  assert mu["vs_baseline"] == pytest.approx(mu["tokens_per_s"] / base["tokens_per_s"])
  assert base["tokens_per_s"] == pytest.approx(2 * 16 / base["step_s"])
  assert 0 < base["mfu"] < 1e-2  # A CPU against 989 TFLOP/s.
  assert result["summary"]["baseline_tokens_per_s"] == base["tokens_per_s"]
  text = (out / "levers.txt").read_text()
  assert "baseline" in text and "mu_bf16" in text and "AdamW's first moment in bf16" in text
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == result["summary"]
