"""The co-occurrence table straight from its definition (pure Python), the reference of the counter's tests.

Shared by tests/data/test_cooc.py (the local counter) and tests/data/test_cooc_beam.py (the Beam pipeline).
"""

import collections

import numpy as np


def brute_counts(sequences, window):
  """C[(lang, d, a, b)] and tokens per language, straight from the definition (ordered pairs i < j, j - i <= n)."""
  pairs, tokens = collections.Counter(), collections.Counter()
  for lang, ids in sequences:
    ids = [int(t) for t in ids]
    tokens[lang] += len(ids)
    for i in range(len(ids)):
      for j in range(i + 1, min(i + window, len(ids) - 1) + 1):
        pairs[(lang, j - i, ids[i], ids[j])] += 1
  return pairs, tokens


def brute_table(sequences, languages, window, reference="en", drop_diagonal=False):
  """{(a, b): float32 log X} with X = sum_lang c_lang sum_d (C[l,d,a,b] + C[l,d,b,a]) / (d + 1), fixed order."""
  pairs, tokens = brute_counts(sequences, window)
  present = [code for lang, code in enumerate(languages) if tokens[lang]]
  ref = reference if reference in present else min(present)
  c_lang = {lang: tokens[languages.index(ref)] / tokens[lang] for lang in range(len(languages)) if tokens[lang]}
  cells = {(a, b) for _, _, a, b in pairs} | {(b, a) for _, _, a, b in pairs}
  table = {}
  for a, b in cells:
    if drop_diagonal and a == b:
      continue
    x = 0.0
    for lang in sorted(c_lang, key=lambda i: languages[i]):
      for d in range(1, window + 1):
        s = pairs[(lang, d, a, b)] + pairs[(lang, d, b, a)]
        if s:
          x += c_lang[lang] * (s / (d + 1))
    table[(a, b)] = np.float32(np.log(x))
  return table, ref, {languages[i]: c for i, c in c_lang.items()}


def table_as_dict(table):
  out = {}
  for a in range(table.vocab_size):
    for k in range(table.indptr[a], table.indptr[a + 1]):
      out[(a, int(table.indices[k]))] = table.log_x[k]
  return out
