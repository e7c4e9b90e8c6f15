"""Logical axis names for every parameter and activation of the encoder.

Each axis is named once here; the partitioner's rules table (in
`flax_xalign.training`) maps these names to the `('data', 'model')` mesh.
A name the rules do not mention is replicated, so the table-row axes below
(`positions`, `languages`) and `embed_out` stay replicated unless a run asks
otherwise.

Flax refuses a partition spec that uses one logical name twice, which is why
the square `[embed, embed]` kernel of the MLM transform names its output
`embed_out`.
"""

# Activations.
BATCH = "batch"
LENGTH = "length"

# Model dimensions.
EMBED = "embed"
EMBED_OUT = "embed_out"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
VOCAB = "vocab"
LAYERS = "layers"

# Rows of the learned position and language tables.
POSITIONS = "positions"
LANGUAGES = "languages"

ALL_AXES = (
    BATCH,
    LENGTH,
    EMBED,
    EMBED_OUT,
    MLP,
    HEADS,
    KV,
    VOCAB,
    LAYERS,
    POSITIONS,
    LANGUAGES,
)
