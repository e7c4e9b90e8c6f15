"""Where a step's time goes, from a profile's op events and the compiled HLO: pure Python, no JAX needed.

bench/gpu_profile.py records the events (jax.profiler) and the optimised HLO text of the step; this
module turns them into the table: per op (by HLO instruction name) its time per step, share, FLOPs
per step where the HLO's dots say them (2·M·N·K per dot, summed over a fusion's dots; "-" for
custom calls we cannot count, e.g. cuDNN attention) and achieved TFLOP/s; and the step's share of
time per category (matmul, attention, elementwise, optimizer, host, other).

Shares are over the profiled wall time: each op's summed durations, plus "host" = the part of the
wall time no device op covers (dispatch, Python, transfers). Ops that overlap each other (the CPU
runs independent thunks on several threads) would count twice, so the denominator is
max(wall, Σ op time + host idle) and the shares always sum to 100%.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Iterable, NamedTuple

CATEGORIES = ("matmul", "attention", "elementwise", "optimizer", "host", "other")

# The scope gpu_profile.py's step puts the optimizer update under (jax.named_scope).
OPTIMIZER_SCOPE = "optimizer"  # gpu_train_step.OPTIMIZER_SCOPE (kept free of its imports)


class OpEvent(NamedTuple):
  """One execution of an op on the device: its name (HLO instruction, or kernel), start and length in µs."""

  name: str
  start_us: float
  dur_us: float


@dataclasses.dataclass
class HloOp:
  """What the optimised HLO says of one instruction (module-wide unique name)."""

  name: str
  opcode: str
  target: str = ""  # custom_call_target
  scope: str = ""  # metadata op_name (JAX name stack)
  flops: float | None = None  # per execution; None = unknown
  has_dot: bool = False
  batched_dot: bool = False  # a dot with batch dimensions (attention's QK^T and probs·V)
  calls: tuple[str, ...] = ()


# --- Classification ---------------------------------------------------------------------------------

_ATTENTION_KERNEL = re.compile(r"fmha|flash|attention|sdpa|softmax_bmm", re.I)
_MATMUL_KERNEL = re.compile(r"gemm|cublas|cutlass|matmul|\bdot\b|dot[._]|xmma|wgmma|hmma|sm\d+_xmma", re.I)
_COLLECTIVE_KERNEL = re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|collective", re.I)
_HOST_KERNEL = re.compile(r"memcpy|memset|h2d|d2h|host", re.I)
CONTAINER_OPCODES = ("while", "conditional", "call")
_OTHER_OPCODES = {"copy", "copy-start", "copy-done", "transpose", "while", "conditional", "call", "tuple",
                  "get-tuple-element", "parameter", "constant", "bitcast", "dynamic-slice",
                  "dynamic-update-slice", "gather", "scatter", "all-reduce", "all-gather", "reduce-scatter",
                  "collective-permute", "send", "recv", "infeed", "outfeed", "rng-get-and-update-state",
                  "slice", "pad", "concatenate", "broadcast", "iota", "reshape"}


def classify(name: str, op: HloOp | None = None) -> str:
  """The category of one op: from its HLO when known, else from the (kernel) name's patterns.

  attention: a cuDNN/flash attention call, or a batched dot (or its fusion) under an attention scope;
  matmul: any other dot / gemm; optimizer: anything else under the optimizer scope; elementwise: the
  other fusions and arithmetic (reductions, norms, softmax included); host: transfers; other: data
  movement and control flow.
  """
  if op is None:
    if _COLLECTIVE_KERNEL.search(name):
      return "other"
    if _ATTENTION_KERNEL.search(name):
      return "attention"
    if _MATMUL_KERNEL.search(name):
      return "matmul"
    if _HOST_KERNEL.search(name):
      return "host"
    if re.search(r"fusion|reduce|elementwise|add|mul", name, re.I):
      return "elementwise"
    return "other"
  target, scope = op.target.lower(), op.scope.lower()
  if "cudnn" in target and _ATTENTION_KERNEL.search(target):
    return "attention"
  if op.has_dot:
    return "attention" if op.batched_dot and "attention" in scope else "matmul"
  if OPTIMIZER_SCOPE in scope.split("/"):
    return "optimizer"
  if op.opcode in _OTHER_OPCODES:
    return "other"
  if op.opcode == "custom-call":
    return "matmul" if _MATMUL_KERNEL.search(target) else "other"
  return "elementwise"


# --- The optimised HLO text ---------------------------------------------------------------------------

_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_SHAPE = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_OPCODE = re.compile(r"\s([a-z][\w\-]*)\(")


def _dims(text: str) -> list[int]:
  return [int(d) for d in text.split(",") if d]


def _split_shape_and_rest(rhs: str) -> tuple[str, str]:
  """`(f32[2,3], u8[4]) custom-call(...)` or `f32[2,3]{1,0} dot(...)`: the result type, the rest."""
  if rhs.startswith("("):
    depth = 0
    for i, ch in enumerate(rhs):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        return rhs[:i + 1], rhs[i + 1:]
  head, _, rest = rhs.partition(" ")
  return head, " " + rest


def _dot_flops(result: str, lhs_type: str, attrs: str) -> tuple[float | None, bool]:
  """2 · |result| · Π(lhs contracting sizes), and whether the dot has batch dimensions."""
  out = _SHAPE.search(result)
  lhs = _SHAPE.search(lhs_type)
  contracting = re.search(r"lhs_contracting_dim(?:ension)?s\"?\s*[:=]\s*[\[{]([^\]}]*)[\]}]", attrs)
  batch = re.search(r"lhs_batch_dim(?:ension)?s\"?\s*[:=]\s*[\[{]([^\]}]*)[\]}]", attrs)
  if not (out and lhs and contracting):
    return None, False
  lhs_dims = _dims(lhs.group(2))
  k = math.prod(lhs_dims[int(i.strip(' "'))] for i in contracting.group(1).split(",") if i.strip(' "'))
  batched = bool(batch and batch.group(1).strip(' "'))
  return 2.0 * math.prod(_dims(out.group(2))) * k, batched


def parse_hlo(text: str) -> dict[str, HloOp]:
  """Every instruction of an optimised HLO module's text, by name, with its own and its callees' FLOPs.

  A fusion (or call) owns the dots of the computations it calls: its flops are their sum, so the
  top-level op names a profile reports carry the FLOPs of what they run. Dots are counted as
  2·|result|·Π(contracting sizes) (`dot` instructions and cuBLAS gemm custom calls, whose
  backend_config holds the dimension numbers); convolutions and other custom calls stay unknown.
  """
  ops: dict[str, HloOp] = {}
  members: dict[str, list[str]] = {}
  results: dict[str, str] = {}
  current = None
  for line in text.splitlines():
    if line and not line[0].isspace():  # Computations start at column 0, instructions are indented.
      comp = _COMPUTATION.match(line)
      current = comp.group(1) if comp and line.rstrip().endswith("{") else None
      continue
    inst = _INSTRUCTION.match(line)
    if inst and current is not None:
      name, rhs = inst.group(1), inst.group(2)
      result, rest = _split_shape_and_rest(rhs.strip())
      opcode_match = _OPCODE.search(rest)
      opcode = opcode_match.group(1) if opcode_match else ""
      paren = rest.find("(", opcode_match.end() - 1) if opcode_match else -1
      operands, attrs = (rest[paren:], rest) if paren >= 0 else ("", rest)
      op = HloOp(name=name, opcode=opcode)
      target = re.search(r'custom_call_target="([^"]*)"', attrs)
      op.target = target.group(1) if target else ""
      scope = re.search(r'op_name="([^"]*)"', attrs)
      op.scope = scope.group(1) if scope else ""
      called = re.findall(r"\b(?:calls|to_apply|body|condition|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)", attrs)
      op.calls = tuple(c.strip(" {}%") for group in called for c in group.split(",") if c.strip(" {}%"))
      results[name] = result
      if opcode == "dot" or (opcode == "custom-call" and re.search(r"gemm|matmul", op.target, re.I)):
        # The lhs's type: printed before its name in some dumps, else the type it was defined with.
        first = re.match(r"\(\s*((?:[^,()\[\]{}]|\[[^\]]*\]|\{[^}]*\})*)", operands)
        lhs_text = first.group(1) if first else ""
        lhs_type = lhs_text if _SHAPE.search(lhs_text) else results.get(lhs_text.strip().lstrip("%"), "")
        op.flops, op.batched_dot = _dot_flops(result, lhs_type, attrs)
        op.has_dot = True
      ops[name] = op
      members.setdefault(current, []).append(name)

  def roll_up(op: HloOp, seen: frozenset[str]) -> None:
    # Fusions and calls take on the dots of their computations (a while loop's body ops are profiled
    # on their own, so a while keeps none).
    if op.opcode not in ("fusion", "call", "async-start") or not op.calls:
      return
    total, any_dot, batched, known = 0.0, False, False, True
    for comp in op.calls:
      for member in members.get(comp, ()):
        if member in seen:
          continue
        inner = ops[member]
        roll_up(inner, seen | {member})
        if inner.has_dot:
          any_dot, batched = True, batched or inner.batched_dot
          if inner.flops is None:
            known = False
          else:
            total += inner.flops
        if not op.scope and inner.scope:
          op.scope = inner.scope
        if not op.target and inner.target:
          op.target = inner.target
    op.has_dot, op.batched_dot = any_dot, batched
    op.flops = total if any_dot and known else None

  for name in list(ops):
    roll_up(ops[name], frozenset({name}))
  return ops


# --- Aggregation ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class OpRow:
  name: str
  category: str
  calls_per_step: float
  us_per_step: float
  share: float  # of the step, in [0, 1]
  flops_per_step: float | None
  tflops: float | None  # achieved, over this op's own time


class Summary(NamedTuple):
  rows: list[OpRow]  # every op, longest first
  shares: dict[str, float]  # category -> share, summing to 1
  step_us: float  # the denominator per step (see the module doc)
  wall_us_per_step: float
  busy_us_per_step: float  # union of the op intervals
  op_us_per_step: float  # sum of op durations


def _union_us(events: Iterable[OpEvent]) -> float:
  total, end = 0.0, -math.inf
  for e in sorted(events, key=lambda e: e.start_us):
    lo, hi = max(e.start_us, end), e.start_us + e.dur_us
    if hi > lo:
      total += hi - lo
    end = max(end, hi)
  return total


def summarize(events: list[OpEvent], hlo: dict[str, HloOp], *, steps: int, wall_us: float) -> Summary:
  """The per-op rows and per-category shares of `steps` steps that took `wall_us` in all."""
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  # A while (or conditional, call) is timed around its body's ops, which the profile has too.
  events = [e for e in events if getattr(hlo.get(e.name), "opcode", "") not in CONTAINER_OPCODES]
  per_op: dict[str, list[float]] = {}
  for e in events:
    per_op.setdefault(e.name, []).append(e.dur_us)
  op_us = sum(sum(d) for d in per_op.values())
  busy = _union_us(events)
  idle = max(0.0, wall_us - busy)
  total = max(wall_us, op_us + idle)
  total = total if total > 0 else 1.0
  rows, shares = [], dict.fromkeys(CATEGORIES, 0.0)
  for name, durs in per_op.items():
    op = hlo.get(name)
    category = classify(name, op)
    us = sum(durs)
    flops = None if op is None or op.flops is None else op.flops * len(durs) / steps
    rows.append(OpRow(name=name, category=category, calls_per_step=len(durs) / steps, us_per_step=us / steps,
                      share=us / total, flops_per_step=flops,
                      tflops=None if flops is None or us <= 0 else flops * steps / (us * 1e-6) / 1e12))
    shares[category] += us / total
  # Host idle is whatever is left, so the shares sum to 1 exactly.
  shares["host"] += max(0.0, 1.0 - sum(shares.values()))
  rows.sort(key=lambda r: -r.us_per_step)
  return Summary(rows=rows, shares=shares, step_us=total / steps, wall_us_per_step=wall_us / steps,
                 busy_us_per_step=busy / steps, op_us_per_step=op_us / steps)


def category_flops(summary: Summary) -> dict[str, tuple[float, float]]:
  """category -> (known FLOPs per step, µs per step of the ops whose FLOPs are known)."""
  out: dict[str, tuple[float, float]] = {}
  for r in summary.rows:
    if r.flops_per_step is not None:
      f, t = out.get(r.category, (0.0, 0.0))
      out[r.category] = (f + r.flops_per_step, t + r.us_per_step)
  return out


def _fmt(x: float | None, spec: str) -> str:
  """`x` formatted, or "-" right-aligned to the same width."""
  width = int(re.match(r"\d*", spec).group() or 0)
  return f"{'-':>{width}}" if x is None else format(x, spec)


def format_table(summary: Summary, *, top: int = 40) -> str:
  """The top ops and the category shares as fixed-width text."""
  width = max([len("op")] + [min(len(r.name), 60) for r in summary.rows[:top]])
  lines = [f"{'op':<{width}}  {'category':<11} {'calls':>6} {'ms/step':>9} {'share':>7} {'GFLOP':>10} "
           f"{'TFLOP/s':>8}"]
  for r in summary.rows[:top]:
    lines.append(f"{r.name[:60]:<{width}}  {r.category:<11} {r.calls_per_step:>6.1f} {r.us_per_step / 1e3:>9.3f} "
                 f"{100 * r.share:>6.2f}% {_fmt(None if r.flops_per_step is None else r.flops_per_step / 1e9, '10.3f')} "
                 f"{_fmt(r.tflops, '8.2f')}")
  if len(summary.rows) > top:
    rest = summary.rows[top:]
    lines.append(f"{f'({len(rest)} more ops)':<{width}}  {'':<11} {'':>6} "
                 f"{sum(r.us_per_step for r in rest) / 1e3:>9.3f} {100 * sum(r.share for r in rest):>6.2f}%")
  lines.append("")
  known = category_flops(summary)
  lines.append(f"{'category':<12} {'share':>7} {'ms/step':>9} {'TFLOP/s (ops with FLOPs)':>25}")
  for cat in CATEGORIES:
    f, t = known.get(cat, (0.0, 0.0))
    rate = f / (t * 1e-6) / 1e12 if f and t else None
    lines.append(f"{cat:<12} {100 * summary.shares[cat]:>6.2f}% {summary.shares[cat] * summary.step_us / 1e3:>9.3f} "
                 f"{_fmt(rate, '25.2f')}")
  lines.append(f"{'total':<12} {100 * sum(summary.shares.values()):>6.2f}% {summary.step_us / 1e3:>9.3f}")
  return "\n".join(lines)
