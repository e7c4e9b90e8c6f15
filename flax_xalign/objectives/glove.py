"""Old path of MLM-GC: re-exports `flax_xalign.objectives.gc` (the module is named as registered)."""

from flax_xalign.objectives.gc import *  # noqa: F401,F403
from flax_xalign.objectives.gc import TABLE_DEFAULT_WINDOW, neighbour_pairs, output_scores  # noqa: F401
