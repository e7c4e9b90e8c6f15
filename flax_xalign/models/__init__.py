"""The encoder network: config, Flax module, logical axes and FLOP counts."""

from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.models.encoder import EncoderOutput

__all__ = ["Encoder", "EncoderConfig", "EncoderOutput"]
