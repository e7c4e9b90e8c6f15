"""Kept as an alias of `flax_xalign.cli.experiments.harness` (old import path)."""

from flax_xalign.cli.experiments.harness import (Results, bli, finished, logged_train_seconds,  # noqa: F401
                                                 mlm_accuracy, pos_transfer, split_choices, train)
