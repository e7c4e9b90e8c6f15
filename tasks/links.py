"""Word alignments that travel with bitext: Pharaoh links -> per-word link groups -> per-subword groups.

A training pair may come with word links from elsewhere (a statistical
aligner's Pharaoh output, manual gold), for DWA's `label_source` and the
other alignment objectives. Links ride through seqio, packing and the cache
as one integer per token, so they survive every layout:

* per pair, the links' connected components (words as nodes) are numbered
  1, 2, ...; a word takes its component's number, an unlinked word 0
  (`link_groups`);
* after tokenising, every subword takes its word's number, found by counting
  word-initial pieces (`▁`) — one per whitespace-separated word, which
  SentencePiece guarantees when it splits on whitespace; a text whose count
  disagrees (a word that normalises to nothing, a cut line) keeps no groups;
* on device, source subword i and target subword j are linked when their
  numbers are equal and non-zero in the same packed pair.

That last step reads a component as complete: a-x, b-x, b-y also links a-y.
Symmetrised links are mostly one-to-one or one-to-many, so this adds few
links (`component_closure_stats` measures it on a file); manual gold given
as groups (the Bible's) is exact.
"""

from typing import Dict, FrozenSet, List, Sequence, Tuple

import numpy as np

from flax_xalign import errors
from flax_xalign.fileio import utf8_lines

Link = Tuple[int, int]


def read_pharaoh(path: str, *, task: str, split: str) -> List[FrozenSet[Link]]:
  """One frozenset of (i, j) word links per line of a Pharaoh file (`i-j`, 0-indexed; `i?j` possible)."""
  alignments = []
  for number, line in utf8_lines(path):
    links = set()
    for item in line.split():
      left, sep, right = item.replace("?", "-").partition("-")
      if not sep or not left.isdigit() or not right.isdigit():
        raise errors.UserError(
            f"Task {task!r}, split {split!r}: {path}:{number}: {item!r} is not a Pharaoh link; write "
            "'i-j' pairs of 0-indexed word positions (source-target), separated by spaces.")
      links.add((int(left), int(right)))
    alignments.append(frozenset(links))
  return alignments


def word_groups(links: FrozenSet[Link], num_a: int, num_b: int) -> Tuple[List[int], List[int]]:
  """(group of each side-a word, group of each side-b word): link components numbered 1.. in order, 0 alone."""
  parent = list(range(num_a + num_b))

  def find(x: int) -> int:
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  for i, j in links:
    parent[find(i)] = find(num_a + j)
  linked = {i for i, _ in links} | {num_a + j for _, j in links}
  numbers: Dict[int, int] = {}
  groups = []
  for node in range(num_a + num_b):
    if node in linked:
      groups.append(numbers.setdefault(find(node), len(numbers) + 1))
    else:
      groups.append(0)
  return groups[:num_a], groups[num_a:]


def group_columns(texts: Sequence[str], texts_b: Sequence[str], alignments: Sequence[FrozenSet[Link]], *,
                  task: str, split: str, path: str) -> Dict[str, List[str]]:
  """The loader's `groups`/`groups_b` columns: space-separated word groups per text (UserError on a bad link)."""
  if len(alignments) != len(texts):
    raise errors.UserError(
        f"Task {task!r}, split {split!r}: {path} has {len(alignments)} lines but the split has {len(texts)} "
        "pairs; write one Pharaoh line per pair (an empty line for a pair without links), in the pairs' order.")
  columns: Dict[str, List[str]] = {"groups": [], "groups_b": []}
  for number, (a, b, links) in enumerate(zip(texts, texts_b, alignments), 1):
    num_a, num_b = len(a.split()), len(b.split())
    bad = next(((i, j) for i, j in links if i >= num_a or j >= num_b), None)
    if bad is not None:
      raise errors.UserError(
          f"Task {task!r}, split {split!r}: {path}:{number}: link {bad[0]}-{bad[1]} is outside the pair "
          f"({num_a} source and {num_b} target words); links are 0-indexed word positions of the TSV "
          "line's whitespace-separated words.")
    ga, gb = word_groups(links, num_a, num_b)
    columns["groups"].append(" ".join(map(str, ga)))
    columns["groups_b"].append(" ".join(map(str, gb)))
  return columns


def component_closure_stats(alignments: Sequence[FrozenSet[Link]]) -> Dict[str, int]:
  """{"links": given, "closure": links the groups imply}: what reading components as complete adds."""
  given = implied = 0
  for links in alignments:
    if not links:
      continue
    num_a = max(i for i, _ in links) + 1
    num_b = max(j for _, j in links) + 1
    ga, gb = word_groups(links, num_a, num_b)
    given += len(links)
    implied += sum(1 for x in ga if x for y in gb if y == x)
  return {"links": given, "closure": implied}


def word_start_table(vocabulary) -> np.ndarray:
  """bool [V]: the piece begins a word (SentencePiece's `▁`)."""
  import sentencepiece as spm

  processor = spm.SentencePieceProcessor(model_file=vocabulary.sentencepiece_model_file)
  return np.asarray([processor.id_to_piece(i).startswith("\u2581") for i in range(processor.get_piece_size())])


def subword_groups_tf(tokens, groups_text, starts_table):
  """int32 [n]: each subword's word group, from a text's tokens and its `groups` string (tf ops).

  All zeros when the word-initial pieces do not number exactly the groups' words.
  """
  import tensorflow as tf

  groups = tf.strings.to_number(tf.strings.split(groups_text), tf.int32)
  starts = tf.cast(tf.gather(starts_table, tokens), tf.int32)
  word = tf.cumsum(starts) - 1
  fits = tf.logical_and(tf.equal(tf.reduce_sum(starts), tf.size(groups)), tf.reduce_all(word >= 0))
  safe = tf.clip_by_value(word, 0, tf.maximum(tf.size(groups) - 1, 0))
  looked_up = tf.gather(tf.concat([groups, [0]], 0), safe)
  return tf.where(fits, looked_up, tf.zeros_like(tokens))
