"""Corpus readers: the embedded Bible, Debian packages, TFDS, text/TSV/CoNLL-U files, lexicons."""
