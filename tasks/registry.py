"""Shared machinery of the seqio tasks: in-memory sources, tokenising, metadata.

Every task registered here reads its text through a *loader*, a picklable
callable `loader(split) -> {"text": [...]}` (plus `"text_b"` for bitext) that
runs when a dataset is built, never at import time, so bad files fail with a
clear `UserError` only when they are used. The loader's lists become a
`tf.data.Dataset.range(n)` that is shuffled over the whole split (seeded,
reshuffled each epoch) and mapped through `tf.gather` on constant tensors:
pure tf.data, so the trainer can checkpoint the iterator. A loader may also
define `num_examples(split) -> int`, a cheaper count than `len(loader(split))`.

Task outputs follow docs/INTERFACES.md: `tokens`, `tokens_b` (int32 [n], no
specials), `lang`, `lang_b` (tf.string scalars, `lang_b == ""` when
monolingual).

Names are looked up here first and then in seqio's own registries, so a plain
`seqio.Task` or `seqio.Mixture` that a user registered directly with seqio
works too; `resolve(name, languages)` gives the trainer the provider, the
sorted language list and the vocabulary in one call. Plain tasks do not know
their languages: the run names them (`languages_of(name, override)`).

Mixtures built here sample task i with rate n_i ** alpha, n_i = number of
training examples of task i (XLM's alpha-sampling; alpha = 0.7 by default),
counted by the cheapest source that knows it (`num_train_examples`) or given
explicitly (`sizes=`).

`describe(name)` writes the user-defined tasks and mixtures behind a name as
JSON-serialisable definitions; `register_described` registers them again in
another process (the run manifest uses the pair).

The machinery lives in four modules, re-exported here (the names tasks,
tests and users know are `registry.<name>`): `loaders` (in-memory sources,
tokenising), `tables` (the registered tasks and mixtures, `register_task`,
lookups by name), `mixtures` (rates, `register_mixture`) and `describe`
(`describe`, `register_described`, `PythonModule`).
"""

# pylint: disable=unused-import
from .describe import _KINDS, PythonModule, describe, register_described  # noqa: F401
from .loaders import (  # noqa: F401
    DEFAULT_MAX_LINE_CHARS,
    Loader,
    check_tokens,
    cut_long_lines,
    in_memory_dataset,
    output_features,
    tokenize_and_tag,
)
from .mixtures import DEFAULT_ALPHA, alpha_rate, num_train_examples, register_mixture  # noqa: F401
from .tables import (  # noqa: F401
    _MIXTURES,
    _TASKS,
    MixtureInfo,
    Provider,
    TaskInfo,
    get_provider,
    get_vocabulary,
    language_pairs,
    languages_of,
    register_task,
    registered_names,
    resolve,
    task_names,
    text_loader,
    unknown_name_error,
)
