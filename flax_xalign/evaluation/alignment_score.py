"""The ALIGN-MLM alignment score of a token-embedding table.

Deshpande et al. 2021 / Tang et al.: for a transliterated synthetic language
every natural token `i` has exactly one counterpart `id_map[i]` in the derived
vocabulary. A natural token scores 1 when, among all derived tokens, its
nearest neighbour by cosine over the *input* embeddings is its counterpart.
The alignment is the mean over natural tokens.

Two numbers are reported: `all` (every translatable natural token: the paper's
number, which includes tokens the training dictionary supervised directly) and
`heldout` (only tokens not in the training dictionary: leak-free). Tokens left
shared by a partial vocabulary overlap are their own counterpart and are not
scored.

Both this module (NumPy in, floats out: notebooks and the evaluation of a
saved run) and the ALIGN objective's jitted monitor
(`objectives.align_mlm.alignment_score`, on the `token_map` and
`dictionary` assets) use the blockwise nearest-neighbour kernel
`ops.nearest_neighbours`: the [V, V] similarity matrix of a 40k vocabulary
never exists at once.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from flax_xalign import ops
from flax_xalign.assets.token_map import token_map_of
from flax_xalign.data.vocab.specials import PROJECT


def _dictionary_value(dictionary: Any) -> dict[str, np.ndarray] | None:
  if dictionary is None:
    return None
  if isinstance(dictionary, Mapping):
    return {"pairs": np.asarray(dictionary["pairs"]), "mask": np.asarray(dictionary["mask"], bool)}
  pairs = np.asarray(dictionary, np.int32).reshape(-1, 2)
  return {"pairs": pairs, "mask": np.ones(len(pairs), bool)}


def score_assets(table: Any, token_map: Mapping[str, Any], dictionary: Any = None, *,
                 block: int = 1024) -> dict[str, float]:
  """Alignment of `table` against a `token_map` asset value, held out of a `dictionary`.

  Args:
    table: [vocab, embed] input token embeddings.
    token_map: `queries`, `targets`, `candidates` (the `token_map` asset).
    dictionary: the training dictionary: the `dictionary` asset value, an
      [n, 2] array of (natural, derived) pairs, or None.
    block: query rows per similarity block.

  Returns:
    {"all", "heldout", "count_all", "count_heldout"}; scores in [0, 1]
    (heldout is NaN when every token is in the dictionary).
  """
  value = _dictionary_value(dictionary)
  queries = np.asarray(token_map["queries"])
  held = np.ones(len(queries), bool)
  if value is not None and len(value["pairs"]):
    held = ~np.isin(queries, value["pairs"][value["mask"], 0])
  if not len(queries):
    return {"all": float("nan"), "heldout": float("nan"), "count_all": 0, "count_heldout": 0}
  nearest = np.asarray(ops.nearest_neighbours(jnp.asarray(table), jnp.asarray(queries),
                                              jnp.asarray(token_map["candidates"]), block=block))
  hit = nearest == np.asarray(token_map["targets"])
  return {
      "all": float(hit.mean()),
      "heldout": float(hit[held].mean()) if held.any() else float("nan"),
      "count_all": int(len(queries)),
      "count_heldout": int(held.sum()),
  }


def alignment_score(table: Any, id_map: np.ndarray, *, dictionary: np.ndarray | None = None,
                    block: int = 1024, first_regular: int = PROJECT.first_regular) -> dict[str, float]:
  """Alignment over all translatable tokens and over those outside `dictionary`.

  Args:
    table: [vocab, embed] input token embeddings (vocab >= max derived id + 1).
    id_map: [V] natural id -> derived id.
    dictionary: optional [n, 2] training dictionary (natural, derived) pairs.
    block: query rows per similarity block.
    first_regular: ids below it are special (never scored).

  Returns:
    {"all", "heldout", "count_all", "count_heldout"} (see `score_assets`).
  """
  return score_assets(table, token_map_of(id_map, first_regular), dictionary, block=block)


def run_alignment(run: Any, params: Any) -> dict[str, float] | None:
  """The alignment score (all / leak-free) of a finished run that has a token map, else None.

  Args:
    run: a `runs.Run`; its `token_map` (and `dictionary`, when the run has
      one) are read from the run's step.
    params: that run's parameters (`run.params()`).
  """
  import jax

  from flax_xalign.models.encoder import token_embedding_table

  if "token_map" not in run.spec.assets:
    return None
  names = ("token_map", "dictionary") if "dictionary" in run.spec.assets else ("token_map",)
  values = run.assets(names)
  table = token_embedding_table(params, run.spec.model)
  return score_assets(np.asarray(jax.device_get(table)), values["token_map"], values.get("dictionary"))
