"""flax_xalign: JAX/Flax pretraining of cross-lingual encoders with explicit alignment.

Importing the package changes nothing in the process (no environment
variables, import hooks or exception hooks). The commands set the process up
themselves (`flax_xalign.cli.setup_process`: TF/libtpu quieting, log filters,
Orbax noise hooks); a notebook or script that wants the same calls it first.
"""

__version__ = "0.1.0"
