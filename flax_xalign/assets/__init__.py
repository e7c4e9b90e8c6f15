"""Run-scoped arrays objectives need: build, refresh, save, load, fingerprint.

See `base.Asset` for the protocol, `registry` for the asset names a run can
require, `runtime.RunAssets` for how the trainer holds and refreshes them, and
`python -m flax_xalign.assets --gin_file=...` (the same flags as training) to
build a run's assets into MODEL_DIR without training.
"""

from flax_xalign.assets.base import Asset, Value, check_fingerprint, content_hash
from flax_xalign.assets.registry import Unavailable, register

__all__ = ["Asset", "Unavailable", "Value", "check_fingerprint", "content_hash", "register"]
