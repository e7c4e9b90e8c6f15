"""ALIGN-MLM's `align` term: pull dictionary translations together on the input embeddings.

Tang et al., "ALIGN-MLM": L_ALIGN = -(1/|B|) sum_i cos(E[b_i1], E[b_i2]) over
every dictionary pair on the *input* token-embedding table, every step,
whatever is in the batch (as the authors' code does). ALIGN-MLM is
`{'mlm': 1.0, 'align': 10.0}` (α = 10), without language embeddings. Its
monitor is the alignment score (`alignment_all`, `alignment_heldout`), which
also reads the `token_map` asset.

Reads the `dictionary` asset, a step argument (never a constant of the
compiled step, so a refreshed or self-induced dictionary of the same capacity
reuses the program): `pairs` int32 [n, 2] (source id, target id), `mask` bool
[n] (padding rows of a capacity-padded table are False) and `lang_ids` int32
[2] (language ids of the source and target column).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from flax_xalign import ops
from flax_xalign.objectives.base import Assets, LossTerm, ObjectiveBase, StepContext, id_table, register


def embedding_cosine(table: jax.Array, pairs: jax.Array) -> jax.Array:
  """[n] cosine similarity of rows pairs[:, 0] and pairs[:, 1] of `table` [vocab, embed]."""
  a = table[pairs[:, 0]].astype(jnp.float32)
  b = table[pairs[:, 1]].astype(jnp.float32)
  dot = jnp.sum(a * b, axis=-1)
  norms = jnp.sqrt(jnp.sum(a * a, axis=-1) * jnp.sum(b * b, axis=-1))
  return dot / jnp.maximum(norms, 1e-8)


def alignment_score(table: jax.Array, token_map: Any, dictionary: Any | None = None, *,
                    block: int = 1024) -> dict[str, jax.Array]:
  """The ALIGN-MLM alignment score of an embedding table (jit-friendly).

  Args:
    table: [vocab, embed] input token embeddings.
    token_map: the `token_map` asset (`queries`, `targets`, `candidates`).
    dictionary: the `dictionary` asset; its source ids are left out of
      `heldout` (the leak-free score), or None.
    block: query rows per similarity block.

  Returns:
    {"all": share of queries whose cosine nearest candidate is their target,
     "heldout": the same over queries outside the dictionary}.
  """
  nearest = ops.nearest_neighbours(table, token_map["queries"], token_map["candidates"], block=block)
  hit = (nearest == token_map["targets"]).astype(jnp.float32)
  held = jnp.ones_like(hit)
  if dictionary is not None:
    pairs = dictionary["pairs"]
    in_dictionary = id_table(pairs[:, 0], jnp.ones_like(pairs[:, 0]), dictionary["mask"], table.shape[0], 0)
    held = 1.0 - in_dictionary[token_map["queries"]].astype(jnp.float32)
  return {"all": jnp.mean(hit), "heldout": jnp.sum(hit * held) / jnp.maximum(jnp.sum(held), 1.0)}


@dataclasses.dataclass(frozen=True)
class EmbeddingAlignment(ObjectiveBase):
  """The `align` term: minus the mean dictionary cosine on the input embeddings."""

  requires: tuple[str, ...] = ("dictionary",)
  monitor_requires: tuple[str, ...] = ("dictionary", "token_map")

  def __call__(self, ctx: StepContext) -> LossTerm:
    dictionary = ctx.assets["dictionary"]
    table = ctx.params["token_embed"]["embedding"]
    cos = embedding_cosine(table, dictionary["pairs"])
    weights = dictionary["mask"].astype(jnp.float32)
    count = jnp.sum(weights)
    # mean over the table rows, rescaled to the valid ones: for a full table
    # (no padding) this is exactly jnp.mean(cos), bit for bit.
    mean = jnp.mean(cos * weights) * (cos.shape[0] / jnp.maximum(count, 1.0))
    return LossTerm(loss=-mean, metrics={"cosine": mean, "pairs": count})

  def monitor(self, params: Any, assets: Assets) -> dict[str, jax.Array]:
    score = alignment_score(params["token_embed"]["embedding"], assets["token_map"], assets["dictionary"])
    return {f"alignment_{k}": v for k, v in score.items()}


@register("align")
def align() -> EmbeddingAlignment:
  return EmbeddingAlignment()
