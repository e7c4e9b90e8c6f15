"""Old home of the experiment drivers, kept as aliases: they live in `flax_xalign.cli.experiments`."""
