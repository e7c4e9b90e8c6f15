"""The hash that names a vocabulary: sha256 of the file it is read from.

The run manifest records it (`VocabularySpec.sha256`, `assets.vocabulary`);
tables counted over token ids (the co-occurrence table) record it too, so a
table counted with another vocabulary of the same size is refused rather
than read as the wrong ids.
"""

from __future__ import annotations

import hashlib
from typing import Any


def model_sha256(vocabulary: Any) -> str | None:
  """sha256 (hex) of a seqio vocabulary's SentencePiece model or WordPiece vocab.txt; None if it has no file."""
  if getattr(vocabulary, "kind", "sentencepiece") == "wordpiece":
    data = getattr(vocabulary, "model_bytes", None)
  else:
    data = getattr(vocabulary, "sp_model", None)
  return hashlib.sha256(bytes(data)).hexdigest() if data else None

