"""bench/gpu_profile.py and bench/profile_table.py: the classifier, the HLO parser and the shares on hand-made
input (hand-computed answers), the matmul table's shapes against the standard FLOP count written out by
hand, and one CPU run of the real entry point (subprocess tier) in a Python that refuses TensorFlow."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import profile_table  # pylint: disable=wrong-import-position
from profile_table import HloOp, OpEvent, classify  # pylint: disable=wrong-import-position


@pytest.mark.parametrize("name, expected", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "matmul"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("MemcpyH2D", "host"),
    ("Memset", "host"),
    ("loop_add_multiply_fusion", "elementwise"),
    ("input_reduce_fusion_3", "elementwise"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "other"),
])
def test_kernel_names_without_hlo_are_classified_by_pattern(name, expected):
  assert classify(name) == expected


@pytest.mark.parametrize("op, expected", [
    (HloOp("gemm_fusion_dot.3", "fusion", scope="jit(step)/jvp(Encoder)/layers/mlp/wi/dot_general",
           has_dot=True), "matmul"),
    (HloOp("fusion.12", "fusion", scope="jit(step)/jvp(Encoder)/layers/attention/bqhd,bkhd->bhqk/dot_general",
           has_dot=True, batched_dot=True), "attention"),
    # The q/k/v projections live under the attention scope but are plain (unbatched) matmuls.
    (HloOp("fusion.13", "fusion", scope="jit(step)/jvp(Encoder)/layers/attention/query/dot_general",
           has_dot=True), "matmul"),
    (HloOp("custom-call.7", "custom-call", target="__cudnn$fmhaSoftmaxBackward"), "attention"),
    (HloOp("custom-call.8", "custom-call", target="__cublas$lt$matmul", has_dot=True), "matmul"),
    (HloOp("loop_multiply_fusion.4", "fusion", scope="jit(step)/optimizer/mul"), "optimizer"),
    (HloOp("loop_multiply_fusion.5", "fusion", scope="jit(step)/transpose(jvp(Encoder))/layers/mlp/gelu"),
     "elementwise"),
    (HloOp("copy.3", "copy"), "other"),
    (HloOp("dynamic-update-slice.2", "dynamic-update-slice"), "other"),
])
def test_hlo_ops_are_classified_by_their_dots_and_scope(op, expected):
  assert classify(op.name, op) == expected


_HLO = """HloModule jit_train_step, entry_computation_layout={(f32[8,16]{1,0}, f32[16,4]{1,0})->f32[8,4]{1,0}}

%fused_dot (param_0: f32[8,16], param_1: f32[16,4]) -> f32[8,4] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,4]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,4]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(train_step)/jvp(Encoder)/layers/mlp/wi/dot_general"}
}

%fused_bmm (p0: bf16[3,5,7], p1: bf16[3,7,2]) -> bf16[3,5,2] {
  %p0 = bf16[3,5,7]{2,1,0} parameter(0)
  %p1 = bf16[3,7,2]{2,1,0} parameter(1)
  %bmm = bf16[3,5,2]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, metadata={op_name="jit(train_step)/jvp(Encoder)/layers/attention/bqk/dot_general"}
  ROOT %scaled = bf16[3,5,2]{2,1,0} multiply(%bmm, %bmm)
}

%body (arg_tuple.1: (s32[], /*index=1*/f32[8,4])) -> (s32[], f32[8,4]) {
  %arg_tuple.1 = (s32[], f32[8,4]{1,0}) parameter(0)
  %gte = f32[8,4]{1,0} get-tuple-element(%arg_tuple.1), index=1
  ROOT %t = (s32[], f32[8,4]{1,0}) tuple(%gte, %gte)
}

ENTRY %main.9 (a: f32[8,16], b: f32[16,4], /*index=2*/c: bf16[3,5,7], d: bf16[3,7,2]) -> f32[8,4] {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,4]{1,0} parameter(1)
  %c = bf16[3,5,7]{2,1,0} parameter(2)
  %d = bf16[3,7,2]{2,1,0} parameter(3)
  %gemm_fusion = f32[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(train_step)/jvp(Encoder)/layers/mlp/wi/dot_general"}
  %attn_fusion = bf16[3,5,2]{2,1,0} fusion(%c, %d), kind=kLoop, calls=%fused_bmm
  %cublas = (f32[8,4]{1,0}, s8[64]{0}) custom-call(f32[8,16]{1,0} %a, f32[16,4]{1,0} %b), custom_call_target="__cublas$gemm", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %adam = f32[8,4]{1,0} multiply(%gemm_fusion, %gemm_fusion), metadata={op_name="jit(train_step)/optimizer/mul"}
  %while.2 = (s32[], f32[8,4]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %out = f32[8,4]{1,0} add(%adam, %adam)
}
"""


def test_hlo_parser_counts_dots_inside_fusions_and_cublas_calls():
  ops = profile_table.parse_hlo(_HLO)
  # 2·M·N·K by hand: [8,16]@[16,4] -> 2·8·4·16 = 1024; batched [3,5,7]@[3,7,2] -> 2·3·5·2·7 = 420.
  assert ops["gemm_fusion"].flops == 1024 and ops["gemm_fusion"].has_dot
  assert ops["cublas"].flops == 1024 and ops["cublas"].target == "__cublas$gemm"
  assert ops["attn_fusion"].flops == 420 and ops["attn_fusion"].batched_dot
  assert ops["attn_fusion"].scope.endswith("attention/bqk/dot_general")  # taken from its dot
  assert ops["adam"].flops is None and not ops["adam"].has_dot
  assert ops["while.2"].calls == ("cond", "body") and ops["while.2"].flops is None
  assert {name: classify(name, op) for name, op in ops.items() if name in
          ("gemm_fusion", "attn_fusion", "cublas", "adam", "out", "gte")} == {
              "gemm_fusion": "matmul", "attn_fusion": "attention", "cublas": "matmul", "adam": "optimizer",
              "out": "elementwise", "gte": "other"}


def test_shares_of_a_hand_made_trace():
  ops = profile_table.parse_hlo(_HLO)
  # Two steps in 100 µs: per step a 20 µs gemm, a 10 µs attention fusion, a 5 µs optimizer op and a
  # MemcpyH2D of 2 µs (no HLO op: a kernel name); a while around them (dropped: its body is profiled).
  events = []
  for base in (0.0, 50.0):
    events += [OpEvent("gemm_fusion", base, 20.0), OpEvent("attn_fusion", base + 20, 10.0),
               OpEvent("adam", base + 30, 5.0), OpEvent("MemcpyH2D", base + 35, 2.0),
               OpEvent("while.2", base, 37.0)]
  summary = profile_table.summarize(events, ops, steps=2, wall_us=100.0)
  # Busy 37 of each 50 µs; the 13 µs idle a step is host time, as is the copy.
  assert summary.shares == pytest.approx({"matmul": 0.40, "attention": 0.20, "elementwise": 0.0,
                                          "optimizer": 0.10, "host": 0.04 + 0.26, "other": 0.0})
  assert sum(summary.shares.values()) == pytest.approx(1.0)
  assert summary.step_us == 50.0 and summary.busy_us_per_step == 37.0
  first = summary.rows[0]
  assert (first.name, first.category, first.calls_per_step, first.us_per_step) == ("gemm_fusion", "matmul", 1, 20)
  assert first.flops_per_step == 1024 and first.tflops == pytest.approx(1024 / 20e-6 / 1e12)
  assert [r.name for r in summary.rows] == ["gemm_fusion", "attn_fusion", "adam", "MemcpyH2D"]
  table = profile_table.format_table(summary)
  assert "gemm_fusion" in table and "100.00%" in table and "while.2" not in table


def test_overlapping_ops_still_sum_to_one():
  # Two 30 µs ops on two threads at once within a 40 µs step: 60 µs of op time, 10 µs idle.
  events = [OpEvent("a_fusion", 0.0, 30.0), OpEvent("b_fusion", 0.0, 30.0)]
  summary = profile_table.summarize(events, {}, steps=1, wall_us=40.0)
  assert summary.step_us == 70.0
  assert summary.shares["elementwise"] == pytest.approx(60 / 70)
  assert summary.shares["host"] == pytest.approx(10 / 70)


def test_matmul_shapes_match_the_standard_count_by_hand():
  import gpu_profile  # pylint: disable=import-outside-toplevel
  from flax_xalign.models import config as config_lib  # pylint: disable=import-outside-toplevel

  config = config_lib.preset("base", vocab_size=250_002)
  batch, length, predictions = 4, 512, 307.2
  shapes = gpu_profile.matmul_shapes(config, tokens=batch * length, predictions=predictions, batch=batch,
                                     length=length)
  flops = {label: 2.0 * max(b, 1) * m * k * n * count for label, m, k, n, count, b in shapes}
  # XLM-R base by hand: 12 layers, e=768, a=768, m=3072, V=250002; n = 2048 tokens, p = 307 slots.
  weights = 6 * 12 * (4 * 768 * 768 + 2 * 768 * 3072) * 2048
  head = 6 * (768 * 768 + 768 * 250_002) * 307
  attention = 12 * 12 * 768 * (4 * 512 * 512)
  assert sum(v for k, v in flops.items() if not k.startswith(("head", "attention"))) == weights
  assert sum(v for k, v in flops.items() if k.startswith("head")) == head
  assert flops["attention QK^T"] == attention


_WITHOUT_TF = """
import importlib.abc, runpy, sys
class Refuse(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "tensorboard", "tensorboard_plugin_profile", "seqio", "gin", "clu"):
      raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)")
sys.meta_path.insert(0, Refuse())
sys.argv = ["bench/gpu_profile.py", *sys.argv[1:]]
runpy.run_path("bench/gpu_profile.py", run_name="__main__")
"""


@pytest.mark.subprocess  # A fresh interpreter without TensorFlow; one tiny compile (~30 s on 2 cores).
def test_cpu_run_writes_the_table_and_the_json(tmp_path):
  out = tmp_path / "out"
  proc = subprocess.run(
      [sys.executable, "-c", _WITHOUT_TF, "--model=tiny", "--batch=2", "--length=16", "--vocab=1000", "--steps=2",
       "--warmup=1", "--big_matmul=128", "--matmul_reps=2", f"--out={out}", "--time_limit_s=240"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)})
  assert proc.returncode == 0, proc.stderr[-4000:]
  text = (out / "profile.txt").read_text()
  assert 0 < len(text.encode()) <= 1 << 20
  result = json.loads((out / "profile.json").read_text())
  assert "error" not in result["profile"], result["profile"]
  assert result["profile"]["plane"].startswith("/host:CPU") and result["profile"]["events"] > 0
  assert sum(result["shares"].values()) == pytest.approx(1.0)
  assert result["shares"]["matmul"] > 0 and result["shares"]["optimizer"] > 0
  assert sum(r["share"] for r in result["ops"]) <= 1.0 + 1e-9 and len(result["ops"]) > 10
  # Every dot of the model runs inside a profiled op: the ops' HLO FLOPs add up to at least the model count.
  # (All ops, not the 200 listed: unfused, the tiny model has more, and which are the costliest varies by run.)
  assert result["ops_flops_per_step"] >= 0.9 * result["model_flops_per_step"]
  assert sum(r["flops_per_step"] or 0 for r in result["ops"]) <= result["ops_flops_per_step"]
  assert [r["label"] for r in result["matmuls"]][:2] == ["128^3", "q/k/v/out fwd"]
  assert all(r["tflops"] > 0 for r in result["matmuls"])
  assert "category" in proc.stdout and "total        100.00%" in text
