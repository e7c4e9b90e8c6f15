"""The encoder network: config, Flax module, task heads, logical axes and FLOP counts."""

from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from flax_xalign.models.encoder import EncoderOutput
from flax_xalign.models.heads import ClassificationHead
from flax_xalign.models.heads import make_head
from flax_xalign.models.heads import TaggingHead

__all__ = ["ClassificationHead", "Encoder", "EncoderConfig", "EncoderOutput", "TaggingHead",
           "make_head"]
