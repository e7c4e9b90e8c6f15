"""Old path of the synthetic-language assets: re-exports `assets.dictionary` and `assets.token_map`."""

from flax_xalign.assets.dictionary import DEFAULT_RATE, SyntheticDictionary  # noqa: F401
from flax_xalign.assets.token_map import TOKEN_MAP_FILE, TokenMap, token_map_of  # noqa: F401
