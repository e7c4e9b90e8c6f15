"""Old path of the pretraining model: re-exports `flax_xalign.objectives.model`.

Kept so that code and gin files importing `flax_xalign.objectives.pretraining`
keep working (gin_configs/t5x/pretrain.gin did); new code imports `model`.
"""

from flax_xalign.objectives.model import (  # noqa: F401
    LOSS_NORMALIZATIONS,
    MaskingConfig,
    PretrainingModel,
    combine_terms,
)
