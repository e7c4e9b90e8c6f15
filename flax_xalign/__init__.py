"""flax_xalign: JAX/Flax pretraining of cross-lingual encoders with explicit alignment."""

__version__ = "0.1.0"
