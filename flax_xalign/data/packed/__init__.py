"""Packed datasets: the seqio pipeline's rows written once as ArrayRecord shards, read back through Grain.

`format` (manifest, record layout, verification), `write` (rows -> a split on
disk), `read` (a split -> checkpointable batches). Reading imports neither
TensorFlow nor seqio; `xalign cache` writes a split.
"""
