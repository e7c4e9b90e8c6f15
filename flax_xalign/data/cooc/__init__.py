"""The global co-occurrence table of MLM-GC (Ai & Fang 2023, §3.2): exact counts, then the weighted table.

Definitions (every counter, the Beam pipeline and the `cooc` asset share them):

* A *sequence* is one side of one example: `tokens` in language `lang`, and
  for bitext `tokens_b` in `lang_b` as a separate sequence. Pairs never cross
  sequences. Every id given is counted (unpacked seqio outputs hold no padding
  and no special ids).
* Window n: in a sequence x_0 .. x_{L-1}, every i < j with d = j - i <= n is
  one ordered occurrence (a = x_i, b = x_j, d). The raw counts
  C[lang, d, a, b] are exact int64, so shards merge in any order
  (`PairCounts.merge`).
* Distance weight 1 / (d + 1): next to the centre token c/2, at distance n
  c/(n+1), the centre itself 0 (the paper's [c/(n+1), .., c/2, 0, c/2, ..,
  c/(n+1)]). "the the" at distance >= 1 counts, on the diagonal X[a, a]
  (GloVe's behaviour); `drop_diagonal=True` removes X[a, a].
* c_lang = C_ref / C_lang, C_lang = tokens of language lang counted; the
  reference is `reference_language` ('en'), or, when the corpus has none, its
  first language in sorted order (the manifest and the log say so).
* X[a, b] = sum_lang c_lang * sum_{d=1..n} (C[lang,d,a,b] + C[lang,d,b,a]) / (d+1),
  in float64 and in a fixed order (languages sorted, d ascending; each term is
  c_lang * (integer sum / (d + 1))), so X is symmetric and X[a, a] gets
  2 C[lang, d, a, a] / (d + 1). Stored pre-logged: log_x = float32(log X) for
  X > 0 as CSR rows a (the centre token w_t), columns b ascending.

Modules: `counting` (the raw counts C and the `PairCounter` core),
`table` (finalise C into the CSR table, save, load, summary), `sources`
(sequences of seqio task objects and text files). Counting takes sequences;
reading a registered task or mixture by name lives with the tasks
(`flax_xalign.tasks.cooc_input`: `count_task`, `task_batches`,
`task_sequences`), and the Apache Beam pipeline is `flax_xalign.data.cooc.beam`.
"""

from flax_xalign.data.cooc.counting import (
    DEFAULT_WINDOW,
    PairCounter,
    PairCounts,
    count_sequences,
    empty_counts,
)
from flax_xalign.data.cooc.sources import (
    batches_of_members,
    encoder_of,
    member_batches,
    progress_logger,
    split_by_language,
    text_sequences,
)
from flax_xalign.data.cooc.table import (
    DEFAULT_REFERENCE_LANGUAGE,
    MANIFEST_FILE,
    TABLE_FILE,
    VERSION,
    VOCABULARY_KEY,
    WEIGHTS,
    CoocTable,
    finalize,
    fingerprint,
    load_table,
    reference_of,
    save_table,
    summary,
)

__all__ = [
    "DEFAULT_REFERENCE_LANGUAGE", "DEFAULT_WINDOW", "MANIFEST_FILE", "TABLE_FILE", "VERSION", "VOCABULARY_KEY", "WEIGHTS",
    "CoocTable", "PairCounter", "PairCounts", "batches_of_members", "count_sequences", "empty_counts",
    "encoder_of", "finalize", "fingerprint", "load_table", "member_batches", "progress_logger",
    "reference_of", "save_table", "split_by_language", "summary", "text_sequences",
]
