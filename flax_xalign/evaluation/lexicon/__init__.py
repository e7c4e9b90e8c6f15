"""Lexicon and embedding-space evaluations: BLI (Hit@k, NN and CSLS), RSIM, isomorphism."""
