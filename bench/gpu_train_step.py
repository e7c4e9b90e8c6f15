"""Train-step throughput and MFU on one accelerator: our MLM step vs Hugging Face XLM-R in PyTorch.

Ours is the step training/trainer.py compiles (`jax.value_and_grad(PretrainingModel.loss_fn)` with
masking on device, then the AdamW of `make_optimizer` with global-norm clipping, parameters in float32,
activations in `--dtype`), jitted with donated state, on random full rows; the loop, data pipeline and
checkpoints are left out, so this runs where TensorFlow, seqio, gin and clu are not installed (a GPU
host with jax + flax + optax + torch + transformers; run it from the source tree:
`PYTHONPATH=. python bench/gpu_train_step.py`). The peer is `transformers.XLMRobertaForMaskedLM` of the
same size on the same batches, bf16 autocast, fused torch AdamW and clip_grad_norm_, masking on device;
`--peer=best` adds torch.compile and sdpa attention (its settings are printed and in the JSON).

MFU = model FLOPs per step on the batch's real tokens by the standard count (models/flops.py
`model_train_flops`, what `train` logs as `mfu`: 6·N per token, attention over the row's one 512-token
segment, the MLM head on the expected predicted slots) / step time / `--peak_tflops` (989 = the H100/H200
SXM dense bf16 peak). The rows here are full (no padding), so it is within 0.2% of the all-slot count
earlier results were given in (`flops_per_step_all_slots` in the JSON, for comparing with them). The peer
gets the same model-FLOP count, but by default it computes logits at every position: 1.72 GFLOP of
matmuls per token for XLM-R base against our 0.74, so its hardware does 2.3x the work per token
(`--peer_logits=masked` runs its LM head on the masked slots only, as ours). The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# train_throughput.py (the CPU bench beside this one) makes the batches: this file's folder is on sys.path
# when it runs as a script; the smoke test runs it with runpy, so add the folder here.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import make_batches  # pylint: disable=wrong-import-position


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="base", help="encoder preset: tiny, small, base, large")
  parser.add_argument("--batches", default="64,128", help="comma-separated batch sizes to time")
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=250_002, help="vocabulary size (XLM-R's by default)")
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--remat", default="none", help="EncoderConfig.remat_policy")
  parser.add_argument("--steps", type=int, default=20, help="timed steps per side")
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per side (the first compiles)")
  parser.add_argument("--peak_tflops", type=float, default=989.0)
  parser.add_argument("--skip_peer", action="store_true")
  parser.add_argument("--skip_ours", action="store_true", help="time the peer only (JAX preallocates most of "
                      "the GPU's memory: run the peer in a process of its own)")
  parser.add_argument("--dropout", type=float, default=None, help="override the preset's dropout rates")
  parser.add_argument("--no_scan", action="store_true", help="EncoderConfig.scan_layers=False (layers unrolled)")
  parser.add_argument("--attention", default="einsum", choices=("einsum", "xla", "cudnn"),
                      help="EncoderConfig.attention_implementation (xla/cudnn need --dropout=0)")
  parser.add_argument("--prng", default=None, help="jax_default_prng_impl, e.g. rbg (cheaper random bits)")
  parser.add_argument("--mu_dtype", default=None, choices=("bfloat16", "float32"),
                      help="OptimizerConfig.mu_dtype: AdamW's first moment stored in this dtype (default: the "
                      "parameters')")
  parser.add_argument("--peer", default="plain", choices=PEER_MODES,
                      help="plain: eager, HF's default attention, bf16 autocast, fused AdamW (as before); best: "
                      "torch.compile + sdpa + bf16 autocast + fused AdamW (fused on CUDA only)")
  parser.add_argument("--peer_logits", default="all", choices=PEER_LOGITS,
                      help="all: HF's MLM logits at every position; masked: the LM head on the masked slots only "
                      "(gathered hidden states), the work ours does")
  parser.add_argument("--peer_compile", default="inductor", choices=("inductor", "aot_eager", "eager"),
                      help="torch.compile backend of --peer=best (inductor, the default, is the one that fuses; "
                      "the others only trace, for testing the wiring where inductor's compile is too slow)")
  return parser.parse_args(argv)


OPTIMIZER_SCOPE = "optimizer"  # The name scope of the update (bench/gpu_profile.py classifies ops by it).


def build_step(config, length, optimizer=None):
  """Our jitted train step and its state: (step_fn, (params, opt_state, step), base_rng).

  training/trainer.py's _train_step: value_and_grad of `PretrainingModel.loss_fn` (masking on device), then
  `make_optimizer(optimizer or OptimizerConfig())`'s AdamW under the name scope OPTIMIZER_SCOPE; params and
  optimizer state donated.
  """
  import jax
  import optax

  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from flax_xalign.training.optimizer import OptimizerConfig, make_optimizer

  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  tx, schedule = make_optimizer(optimizer or OptimizerConfig(), 10**6)
  unbox = lambda tree: jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, tree,
                                    is_leaf=lambda x: hasattr(x, "unbox"))
  params = jax.jit(lambda key: unbox(model.init(key, batch=1, length=length)))(jax.random.key(0))
  opt_state = jax.jit(tx.init)(params)

  def train_step(params, opt_state, step, batch, base_rng):  # training/trainer.py's _train_step
    rng = jax.random.fold_in(base_rng, step)
    (_, metrics), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng, {}, train=True)
    with jax.named_scope(OPTIMIZER_SCOPE):
      updates, opt_state = tx.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
    return params, opt_state, step + 1, dict(metrics, learning_rate=schedule(step),
                                             grad_norm=optax.tree.norm(grads))

  state = (params, opt_state, jax.numpy.zeros((), jax.numpy.int32))
  return jax.jit(train_step, donate_argnums=(0, 1)), state, jax.random.key(1)


def time_ours(config, host_batches, *, steps, warmup, optimizer=None):
  import jax

  step_fn, (params, opt_state, step), base_rng = build_step(config, host_batches[0]["tokens"].shape[1], optimizer)
  batches = [jax.device_put(b) for b in host_batches]
  start = time.perf_counter()
  for i in range(warmup):
    params, opt_state, step, metrics = step_fn(params, opt_state, step, batches[i % len(batches)], base_rng)
  jax.block_until_ready(metrics)
  warm_s = time.perf_counter() - start
  times = []
  for i in range(steps):
    t = time.perf_counter()
    params, opt_state, step, metrics = step_fn(params, opt_state, step, batches[i % len(batches)], base_rng)
    jax.block_until_ready(metrics["loss"])
    times.append(time.perf_counter() - t)
  return {"step_s": statistics.median(times), "warmup_s": warm_s, "loss": float(metrics["loss"]),
          "params": int(sum(x.size for x in jax.tree.leaves(params)))}


PEER_MODES = ("plain", "best")
PEER_LOGITS = ("all", "masked")


def peer_loss_module(model, predictions=None):
  """A torch module: (inputs, labels) -> HF XLMRobertaForMaskedLM's MLM loss (mean over labelled slots).

  predictions=None: the model's own forward with `labels`, logits at every position (as HF ships it).
  predictions=P: P slots per row, the row's labelled positions first (topk of the label mask), gathered from
  the encoder's last hidden states before `lm_head`, so the head runs on [batch, P] slots as ours does;
  labels beyond P in a row are dropped (ours keeps `max_predictions_for` slots too). Same loss whenever no
  row has more than P labels.
  """
  import torch

  class PeerLoss(torch.nn.Module):

    def __init__(self):
      super().__init__()
      self.mlm = model

    def forward(self, inputs, labels):
      if predictions is None:
        return self.mlm(input_ids=inputs, labels=labels).loss
      slots = torch.topk((labels != -100).to(torch.float32), predictions, dim=1, sorted=False).indices
      hidden = self.mlm.roberta(input_ids=inputs)[0]
      picked = torch.gather(hidden, 1, slots.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
      logits = self.mlm.lm_head(picked)
      return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               torch.gather(labels, 1, slots).reshape(-1), ignore_index=-100)

  return PeerLoss()


def build_peer(config, *, vocab, mode, logits, length, device, backend="inductor"):
  """The HF peer of `config`'s size: (model, loss module, AdamW, settings dict saying what it runs with).

  mode "plain": eager, HF's default attention, bf16 autocast, AdamW fused on CUDA (the runs of 2026-11-26).
  mode "best": the same with attn_implementation="sdpa" and the loss module under torch.compile(backend).
  logits "masked": the LM head on the masked slots only (`peer_loss_module`), like ours.
  """
  import torch
  import transformers

  from flax_xalign.objectives.masking import max_predictions_for

  best = mode == "best"
  extra = {"attn_implementation": "sdpa"} if best else {}
  hf = transformers.XLMRobertaConfig(
      vocab_size=vocab, hidden_size=config.embed_dim, num_hidden_layers=config.num_layers,
      num_attention_heads=config.num_heads, intermediate_size=config.mlp_dim, hidden_act="gelu",
      hidden_dropout_prob=config.dropout_rate, attention_probs_dropout_prob=config.attention_dropout_rate,
      max_position_embeddings=config.max_positions, type_vocab_size=1, layer_norm_eps=config.layer_norm_epsilon,
      pad_token_id=0, bos_token_id=3, eos_token_id=1, **extra)
  model = transformers.XLMRobertaForMaskedLM(hf).to(device).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                fused=device == "cuda")
  predictions = max_predictions_for(length, 0.15) if logits == "masked" else None
  loss = peer_loss_module(model, predictions)
  settings = {"mode": mode, "compile": f"torch.compile ({backend})" if best else "eager",
              "attn_implementation": getattr(model.config, "_attn_implementation", None),
              "autocast": "bfloat16", "fused_adamw": device == "cuda",
              "logits": ("all positions" if predictions is None else
                         f"masked slots only ({predictions} per row, gathered before lm_head)")}
  return model, loss, optimizer, settings


def time_peer(config, host_batches, *, steps, warmup, vocab, mode="plain", logits="all", backend="inductor"):
  import torch

  device = "cuda" if torch.cuda.is_available() else "cpu"
  length = host_batches[0]["tokens"].shape[1]
  model, loss_module, optimizer, settings = build_peer(config, vocab=vocab, mode=mode, logits=logits,
                                                       length=length, device=device, backend=backend)
  loss_fn = torch.compile(loss_module, backend=backend) if mode == "best" else loss_module
  batches = [torch.from_numpy(b["tokens"]).long().to(device) for b in host_batches]

  def one(tokens):
    chosen = (torch.rand(tokens.shape, device=device) < 0.15) & (tokens >= 5)
    labels = torch.where(chosen, tokens, torch.full_like(tokens, -100))
    u = torch.rand(tokens.shape, device=device)
    inputs = torch.where(chosen & (u < 0.8), torch.full_like(tokens, 4), tokens)
    inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), torch.randint_like(tokens, 5, vocab), inputs)
    with torch.autocast(device, dtype=torch.bfloat16):
      loss = loss_fn(inputs, labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  start = time.perf_counter()
  try:
    one(batches[0])  # The first call compiles (forward and backward).
  except Exception as e:  # pylint: disable=broad-except  (no C compiler for inductor, an unsupported op, ...)
    if mode != "best":
      raise
    note = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    print(f"NOTICE: torch.compile failed on {device} ({note}); the peer runs eager", flush=True)
    settings["compile"] = f"eager (torch.compile failed: {note})"
    torch._dynamo.reset()  # pylint: disable=protected-access
    loss_fn = loss_module
    optimizer.zero_grad(set_to_none=True)
    one(batches[0])
  for i in range(1, warmup):
    one(batches[i % len(batches)])
  sync()
  warm_s = time.perf_counter() - start
  times = []
  for i in range(steps):
    t = time.perf_counter()
    loss = one(batches[i % len(batches)])
    sync()
    times.append(time.perf_counter() - t)
  return {"step_s": statistics.median(times), "warmup_s": warm_s, "loss": float(loss.detach()), "device": device,
          "attn_implementation": settings["attn_implementation"], "settings": settings}


def describe_peer(settings) -> str:
  """One line of what the peer ran with (printed beside its figures)."""
  return (f"peer {settings['mode']}: {settings['compile']}, attention {settings['attn_implementation']}, "
          f"{settings['autocast']} autocast, AdamW {'fused' if settings['fused_adamw'] else 'not fused'}, "
          f"logits at {settings['logits']}")


def main(argv=None):
  args = parse_args(argv)
  if args.skip_ours:  # The peer alone: jax only names the device here, so it must not take the card's memory.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  import jax
  import numpy as np

  from flax_xalign.models import config as config_lib
  from flax_xalign.data.vocab.specials import PROJECT
  from flax_xalign.models.flops import count_tokens, model_train_flops, train_flops_per_step
  from flax_xalign.objectives.masking import max_predictions_for
  from flax_xalign.training.optimizer import OptimizerConfig

  if args.prng:
    jax.config.update("jax_default_prng_impl", args.prng)
  overrides = {} if args.dropout is None else {"dropout_rate": args.dropout, "attention_dropout_rate": args.dropout}
  if args.attention != "einsum":
    overrides["attention_implementation"] = args.attention
  if args.no_scan:
    overrides["scan_layers"] = False
  config = config_lib.preset(args.size, vocab_size=args.vocab, dtype=args.dtype, remat_policy=args.remat,
                             **overrides)
  vocab = config.vocab_size
  print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}; {args.size}: {config.num_layers} layers, "
        f"embed {config.embed_dim}, vocab {vocab}, {args.dtype}, length {args.length}", flush=True)
  rows = []
  for batch in [int(b) for b in args.batches.split(",")]:
    host = make_batches(np.random.default_rng(0), count=4, batch=batch, length=args.length, vocab=vocab)
    flops = sum(model_train_flops(config, count_tokens(b["segment_ids"], mask_rate=0.15,
                                                       eligible=PROJECT.is_regular(b["tokens"])))
                for b in host) / len(host)
    row = {"batch": batch, "length": args.length, "flops_per_step": flops,
           "flops_per_step_all_slots": train_flops_per_step(
               config, batch=batch, length=args.length, num_predictions=max_predictions_for(args.length, 0.15))}
    try:
      if args.skip_ours:
        raise RuntimeError("skipped (--skip_ours)")
      ours = time_ours(config, host, steps=args.steps, warmup=args.warmup,
                       optimizer=OptimizerConfig(mu_dtype=args.mu_dtype))
      row["ours"] = dict(ours, tokens_per_s=batch * args.length / ours["step_s"],
                         mfu=flops / ours["step_s"] / (args.peak_tflops * 1e12))
    except Exception as e:  # pylint: disable=broad-except  (out of memory at a batch: report, go on)
      row["ours"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    if not args.skip_peer:
      try:
        peer = time_peer(config, host, steps=args.steps, warmup=args.warmup, vocab=vocab, mode=args.peer,
                         logits=args.peer_logits, backend=args.peer_compile)
        row["peer"] = dict(peer, tokens_per_s=batch * args.length / peer["step_s"],
                           mfu=flops / peer["step_s"] / (args.peak_tflops * 1e12))
      except Exception as e:  # pylint: disable=broad-except
        row["peer"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    if "tokens_per_s" in row["ours"] and "tokens_per_s" in row.get("peer", {}):
      row["ratio_ours_over_peer"] = row["ours"]["tokens_per_s"] / row["peer"]["tokens_per_s"]
    for side in ("ours", "peer"):
      r = row.get(side)
      if r and "step_s" in r:
        print(f"batch {batch:4d} {side}: step {1000 * r['step_s']:.1f} ms, {r['tokens_per_s']:,.0f} tokens/s, "
              f"MFU {100 * r['mfu']:.1f}%" + (f"; {describe_peer(r['settings'])}" if "settings" in r else ""),
              flush=True)
      elif r:
        print(f"batch {batch:4d} {side}: {r['error']}", flush=True)
    rows.append(row)
  print(json.dumps({"size": args.size, "dtype": args.dtype, "remat": args.remat, "mu_dtype": args.mu_dtype,
                    "dropout": config.dropout_rate,
                    "attention": config.attention_implementation,
                    "scan_layers": config.scan_layers, "prng": args.prng, "device": jax.devices()[0].device_kind,
                    "peak_tflops": args.peak_tflops, "rows": rows}))


if __name__ == "__main__":
  main()
