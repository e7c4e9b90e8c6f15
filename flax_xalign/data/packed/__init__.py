"""Packed datasets: the seqio pipeline's rows written once as ArrayRecord shards, read back through Grain.

`format` (manifest, record layout, verification), `write` (rows -> a split on
disk), `read` (a split -> checkpointable batches), `parallel` (a split written
by N processes, one seqio shard each) and `beam` (by Apache Beam workers),
`upload` and `staging` (a split in a bucket). Reading imports neither
TensorFlow nor seqio; `xalign cache` writes a split (`training.cache_job`).
"""
