"""Helpers shared by tests: a tiny two-language corpus and directory snapshots."""

import os

WORDS_EN = "the a house dog cat sees runs big small red green old new tree river".split()
WORDS_DE = "das ein haus hund katze sieht läuft groß klein rot grün alt neu baum fluss".split()


def sentences(rng, n):
  """n parallel (en, de) sentences drawn word by word from two aligned lists."""
  pairs = []
  for _ in range(n):
    idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(3, 9))]
    pairs.append((" ".join(WORDS_EN[i] for i in idx), " ".join(WORDS_DE[i] for i in idx)))
  return pairs


def tree_snapshot(path):
  """{relative path: (size, mtime_ns)} of every file under `path`."""
  out = {}
  for dirpath, _, names in os.walk(path):
    for name in names:
      full = os.path.join(dirpath, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out
