"""Evaluation from plain files, for a host without TensorFlow or seqio (a GPU bundle).

`suite.write_suite(output_dir, run, ...)` (needs seqio: run it where the data was built) writes the data
every evaluation reads as plain files; `scoring.score(run, suite_dir)` (TF-free) scores a run from them.
docs/evaluation.md ("Scoring without TensorFlow") says what a suite holds.
"""
