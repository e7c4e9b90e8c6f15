"""MLM train-step throughput: our Trainer step vs Hugging Face XLM-R in PyTorch.

Both sides train the same encoder configuration (the `small` preset by default:
6 layers, embed 512, 8 heads x 64, MLP 2048, vocab 16000, dropout 0.1) on the
same random batches, in one process, alternating ours / peer for `--rounds`
rounds. Each round runs `--warmup` untimed steps and then `--steps` timed ones;
tokens/s counts batch * length per step on both sides and the medians over the
rounds are compared.

* Ours is exactly the step `flax_xalign.training.trainer.Trainer` runs: masking
  on device (15%, 80/10/10), encoder, MLM logits only at the masked slots,
  AdamW with global-norm clipping, jitted with donated state.
* The peer is `transformers.XLMRobertaForMaskedLM` with `torch.optim.AdamW`,
  `clip_grad_norm_(1.0)` and the same masking done on CPU each step (labels
  -100 elsewhere). HF computes logits at every position: that is the peer as
  users run it.

Both use the same number of CPU threads (`--threads`, default: the cores this
process may run on): `torch.set_num_threads` for the peer; for XLA the process
is pinned to that many cores and `NPROC` (which sizes XLA's intra-op pool) is
set before jax is imported. A large fp32 matmul in JAX gives the machine's
practical peak, against which our useful model FLOP/s (matmul FLOPs from
`flax_xalign.models.flops.train_flops_per_step`) are reported.

The last printed line is one JSON object; it is also written to
bench/results/train_throughput.json.

  python bench/train_throughput.py            # full run (a few minutes)
  python bench/train_throughput.py --quick    # smoke run (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        "train_throughput.json")
# Special ids of our vocabularies (docs/INTERFACES.md); masking uses <mask>=4
# and never picks ids below 5.
_PAD_ID, _EOS_ID, _BOS_ID, _MASK_ID, _NUM_SPECIAL = 0, 1, 3, 4, 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=5,
                      help="A/B rounds (ours then peer in each).")
  parser.add_argument("--steps", type=int, default=4,
                      help="timed steps per side per round")
  parser.add_argument("--warmup", type=int, default=1,
                      help="untimed steps per side per round")
  parser.add_argument("--size", default="small",
                      help="encoder preset: tiny, small, base, large")
  parser.add_argument("--vocab", type=int, default=16000)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=128)
  parser.add_argument("--dropout", type=float, default=0.1,
                      help="hidden and attention dropout on both sides")
  parser.add_argument("--threads", type=int, default=0,
                      help="CPU threads for both sides (0: all usable cores)")
  parser.add_argument("--matmul_size", type=int, default=2048)
  parser.add_argument("--skip_peer", action="store_true",
                      help="time ours only (no torch needed); ratio is null")
  parser.add_argument("--quick", action="store_true",
                      help="smoke run: tiny preset, batch 2 x 16, vocab 1000, "
                      "2 rounds of 2 steps without warm-up, 256 matmul")
  parser.add_argument("--output", default=_RESULTS)
  args = parser.parse_args(argv)
  if args.quick:
    args.size, args.vocab, args.batch, args.length = "tiny", 1000, 2, 16
    args.rounds, args.steps, args.warmup, args.matmul_size = 2, 2, 0, 256
  if args.length + 2 > 514:
    parser.error("--length must be <= 512 (XLM-R position table)")
  return args


def _configure_threads(threads: int) -> int:
  """Pins the process to `threads` cores and sizes XLA's pool; before jax."""
  usable = sorted(os.sched_getaffinity(0))
  threads = threads or len(usable)
  if threads > len(usable):
    raise SystemExit(f"--threads={threads} but only {len(usable)} cores usable")
  os.sched_setaffinity(0, usable[:threads])
  # XLA's CPU client sizes its intra-op (Eigen) thread pool from NPROC when it
  # is set, else from the affinity mask; set both so they agree.
  os.environ["NPROC"] = str(threads)
  return threads


def make_batches(rng: Any, *, count: int, batch: int, length: int,
                 vocab: int) -> list[dict[str, Any]]:
  """Random full rows `<s> w... </s>` (ids >= 5, our special ids), no padding.

  Returns host batches with `tokens, lang_ids, segment_ids, positions,
  pair_side`, each int32 [batch, length].
  """
  import numpy as np

  out = []
  for _ in range(count):
    tokens = rng.integers(_NUM_SPECIAL, vocab, size=(batch, length), dtype=np.int32)
    tokens[:, 0], tokens[:, -1] = _BOS_ID, _EOS_ID
    ones = np.ones((batch, length), np.int32)
    out.append({
        "tokens": tokens,
        "lang_ids": ones,
        "segment_ids": ones.copy(),
        "positions": np.broadcast_to(
            np.arange(length, dtype=np.int32), (batch, length)).copy(),
        "pair_side": np.zeros((batch, length), np.int32),
    })
  return out


class OursSide:
  """Our Trainer's jitted train step on the given encoder config."""

  name = "ours (flax_xalign)"

  def __init__(self, config: Any, batches: list[dict[str, Any]], *,
               batch: int, length: int):
    import jax

    from flax_xalign.models.encoder import Encoder
    from flax_xalign.objectives.model import PretrainingModel
    from flax_xalign.training.optimizer import OptimizerConfig
    from flax_xalign.training.partitioning import Partitioner, make_mesh
    from flax_xalign.training.trainer import LoopConfig, Trainer

    self._jax = jax
    model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
    self.trainer = Trainer(
        model=model, optimizer=OptimizerConfig(),
        partitioner=Partitioner(mesh=make_mesh()),
        loop=LoopConfig(train_steps=10**6, batch_size=batch, length=length))
    self.batches = batches
    with self.trainer.mesh_context():
      self.state = self.trainer.init_state()
    self._i = 0

  def run(self, steps: int) -> float:
    """Runs `steps` steps; returns seconds until the last one finished."""
    trainer = self.trainer
    with trainer.mesh_context():
      start = time.perf_counter()
      for _ in range(steps):
        batch = self.batches[self._i % len(self.batches)]
        self._i += 1
        self.state, metrics = trainer.step(self.state, batch)
      self._jax.block_until_ready((self.state, metrics))
      elapsed = time.perf_counter() - start
    self.last_loss = float(metrics["loss"])
    return elapsed


class PeerSide:
  """HF XLMRobertaForMaskedLM + torch AdamW, masking on CPU each step."""

  name = "peer (HF XLM-R, torch)"

  def __init__(self, config: Any, batches: list[dict[str, Any]], *,
               threads: int, dropout: float, vocab: int, seed: int = 0):
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    self._torch = torch
    hf_config = transformers.XLMRobertaConfig(
        vocab_size=vocab, hidden_size=config.embed_dim,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.mlp_dim, hidden_act="gelu",
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        max_position_embeddings=514, type_vocab_size=1,
        layer_norm_eps=config.layer_norm_epsilon,
        initializer_range=config.initializer_std,
        # Our special ids. HF derives positions from the non-pad tokens, so the
        # pad id must be one that never occurs (there is no padding here).
        pad_token_id=_PAD_ID, bos_token_id=_BOS_ID, eos_token_id=_EOS_ID)
    self.model = transformers.XLMRobertaForMaskedLM(hf_config)
    self.model.train()
    self.attn_implementation = getattr(hf_config, "_attn_implementation",
                                       None)
    decay, no_decay = [], []
    for name, param in self.model.named_parameters():
      (no_decay if name.endswith("bias") or "LayerNorm" in name
       else decay).append(param)
    self.optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=5e-4, betas=(0.9, 0.98), eps=1e-6)
    self.vocab = vocab
    self.batches = [torch.from_numpy(b["tokens"]).long() for b in batches]
    self._i = 0

  def _mask(self, tokens: Any) -> tuple[Any, Any]:
    """BERT masking (15%, 80/10/10) of ids >= 5; labels -100 elsewhere."""
    torch = self._torch
    eligible = tokens >= _NUM_SPECIAL
    chosen = (torch.rand(tokens.shape) < 0.15) & eligible
    labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
    u = torch.rand(tokens.shape)
    to_mask = chosen & (u < 0.8)
    to_random = chosen & (u >= 0.8) & (u < 0.9)
    inputs = torch.where(to_mask, torch.full_like(tokens, _MASK_ID), tokens)
    random_ids = torch.randint(_NUM_SPECIAL, self.vocab, tokens.shape)
    inputs = torch.where(to_random, random_ids, inputs)
    return inputs, labels

  def run(self, steps: int) -> float:
    torch = self._torch
    start = time.perf_counter()
    for _ in range(steps):
      tokens = self.batches[self._i % len(self.batches)]
      self._i += 1
      inputs, labels = self._mask(tokens)
      loss = self.model(input_ids=inputs, labels=labels).loss
      loss.backward()
      torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
      self.optimizer.step()
      self.optimizer.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    self.last_loss = float(loss.detach())
    return elapsed


def matmul_gflops(size: int, repeats: int) -> list[float]:
  """GFLOP/s of a jitted fp32 [size, size] @ [size, size], one per repeat."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
  b = jax.random.normal(jax.random.key(2), (size, size), jnp.float32)
  matmul = jax.jit(jnp.dot)
  matmul(a, b).block_until_ready()
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    rates.append(2.0 * size**3 / (time.perf_counter() - start) / 1e9)
  return rates


def _timed_round(side: Any, *, warmup: int, steps: int) -> float:
  if warmup:
    side.run(warmup)
  return side.run(steps)


def run(args: argparse.Namespace) -> dict[str, Any]:
  threads = _configure_threads(args.threads)
  import numpy as np  # jax (imported below) must come after the thread setup

  from flax_xalign.models import config as config_lib
  from flax_xalign.models.flops import train_flops_per_step
  from flax_xalign.objectives.masking import max_predictions_for

  config = config_lib.PRESETS[args.size].replace(
      vocab_size=args.vocab, dropout_rate=args.dropout,
      attention_dropout_rate=args.dropout)
  batches = make_batches(np.random.default_rng(0), count=4, batch=args.batch,
                         length=args.length, vocab=args.vocab)
  tokens_per_step = args.batch * args.length
  flops_per_step = train_flops_per_step(
      config, batch=args.batch, length=args.length,
      num_predictions=max_predictions_for(args.length, 0.15))

  sides: dict[str, Any] = {"ours": OursSide(config, batches, batch=args.batch,
                                            length=args.length)}
  if not args.skip_peer:
    sides["peer"] = PeerSide(config, batches, threads=threads,
                             dropout=args.dropout, vocab=args.vocab)
  # First calls compile (ours) / warm allocators (peer); excluded.
  for side in sides.values():
    side.run(1)

  rates: dict[str, list[float]] = {name: [] for name in sides}
  matmul_rates: list[float] = []
  for r in range(args.rounds):
    matmul_rates += matmul_gflops(args.matmul_size, 3)
    for name, side in sides.items():
      seconds = _timed_round(side, warmup=args.warmup, steps=args.steps)
      rates[name].append(args.steps * tokens_per_step / seconds)
    print(f"round {r + 1}/{args.rounds}: " + "  ".join(
        f"{name} {rates[name][-1]:8.1f} tok/s" for name in sides),
          file=sys.stderr, flush=True)

  ours = statistics.median(rates["ours"])
  peer = statistics.median(rates["peer"]) if "peer" in rates else None
  matmul = statistics.median(matmul_rates)
  ours_gflops = ours / tokens_per_step * flops_per_step / 1e9
  result = {
      "ratio": ours / peer if peer else None,
      "ours_tokens_per_sec": ours,
      "peer_tokens_per_sec": peer,
      "matmul_gflops": matmul,
      "ours_model_gflops": ours_gflops,
      "fraction_of_matmul_peak": ours_gflops / matmul,
      "rounds": args.rounds,
      "steps_per_round": args.steps,
      "warmup_steps_per_round": args.warmup,
      "ours_tokens_per_sec_rounds": rates["ours"],
      "peer_tokens_per_sec_rounds": rates.get("peer"),
      "model_flops_per_step": flops_per_step,
      "matmul_size": args.matmul_size,
      "threads": threads,
      "config": {
          "size": args.size, "num_layers": config.num_layers,
          "embed_dim": config.embed_dim, "num_heads": config.num_heads,
          "head_dim": config.head_dim, "mlp_dim": config.mlp_dim,
          "vocab_size": config.vocab_size, "batch": args.batch,
          "length": args.length, "dropout": args.dropout,
          "scan_layers": config.scan_layers, "dtype": config.dtype,
      },
      "versions": _versions(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "peer_logits": "all positions (HF XLMRobertaForMaskedLM)",
      "ours_logits": "masked positions only",
      "peer_attn_implementation": getattr(sides.get("peer"),
                                          "attn_implementation", None),
      "last_loss": {name: side.last_loss for name, side in sides.items()},
  }
  return result


def _versions() -> dict[str, str]:
  import jax

  versions = {"jax": jax.__version__}
  for module in ("torch", "transformers", "flax"):
    try:
      versions[module] = __import__(module).__version__
    except ImportError:
      pass
  return versions


def print_table(result: dict[str, Any], print_fn: Callable[..., None] = print
                ) -> None:
  cfg = result["config"]
  print_fn(f"MLM train step, {cfg['size']}: {cfg['num_layers']} layers, embed "
           f"{cfg['embed_dim']}, {cfg['num_heads']}x{cfg['head_dim']} heads, "
           f"mlp {cfg['mlp_dim']}, vocab {cfg['vocab_size']}, batch "
           f"{cfg['batch']} x {cfg['length']}, dropout {cfg['dropout']}, "
           f"{result['threads']} CPU threads each")
  print_fn(f"{result['rounds']} alternating rounds x {result['steps_per_round']}"
           f" timed steps (+{result['warmup_steps_per_round']} warm-up)")
  print_fn(f"{'':28s} {'median tok/s':>12s}  {'rounds':s}")
  rows = [("ours (logits at masked)", result["ours_tokens_per_sec"],
           result["ours_tokens_per_sec_rounds"])]
  if result["peer_tokens_per_sec"]:
    rows.append(("peer HF (logits at all)", result["peer_tokens_per_sec"],
                 result["peer_tokens_per_sec_rounds"]))
  for name, median, per_round in rows:
    print_fn(f"{name:28s} {median:12.1f}  "
             + " ".join(f"{x:.0f}" for x in per_round))
  if result["ratio"] is not None:
    print_fn(f"{'ratio ours/peer':28s} {result['ratio']:12.3f}")
  print_fn(f"{'JAX fp32 matmul GFLOP/s':28s} {result['matmul_gflops']:12.1f}"
           f"  ({result['matmul_size']}^3)")
  print_fn(f"{'ours model GFLOP/s':28s} {result['ours_model_gflops']:12.1f}"
           f"  ({result['model_flops_per_step'] / 1e9:.1f} GFLOP/step)")
  print_fn(f"{'fraction of matmul peak':28s} "
           f"{result['fraction_of_matmul_peak']:12.3f}")


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  result = run(args)
  print_table(result)
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  from flax_xalign import fileio

  fileio.write_atomically(args.output, json.dumps(result, indent=2))
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
