"""Vocabularies: SentencePiece, WordPiece, special ids, text normalisers."""
