"""Run-scoped arrays objectives need: build, refresh, save, load, fingerprint.

See `base.Asset` for the protocol, `registry` for the asset names a run can
require, `runtime.RunAssets` for how the trainer holds and refreshes them, and
`xalign assets --gin_file=...` (the same flags as training) to
build a run's assets into MODEL_DIR without training.
"""

from flax_xalign.assets.base import Asset, Value, check_fingerprint, content_hash
from flax_xalign.assets.registry import Unavailable, register

# The built-in assets, one module per registered name: importing each
# registers it. A new asset is a module here plus a line below.
from flax_xalign.assets import cooc  # noqa: F401,E402  (cooc)
from flax_xalign.assets import dictionary  # noqa: F401,E402  (dictionary)
from flax_xalign.assets import induced_dictionary  # noqa: F401,E402  (induced_dictionary)
from flax_xalign.assets import lang_vocab  # noqa: F401,E402  (lang_vocab)
from flax_xalign.assets import token_map  # noqa: F401,E402  (token_map)
from flax_xalign.assets import word_starts  # noqa: F401,E402  (word_starts)

__all__ = ["Asset", "Unavailable", "Value", "check_fingerprint", "content_hash", "register"]
