"""The record of a vocabulary that a run, a cache or an import names: file, hash, sizes, special ids.

It lives with the vocabularies, not in the run manifest (`run_spec`), because
the packed cache's manifest (`data/packed/format.py`) records it too, and
`data/` sits below the run manifest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError

VOCABULARY_KINDS = ("sentencepiece", "wordpiece")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VocabularySpec:
  """The run's vocabulary, as the vocabulary asset recorded it.

  Attributes:
    file: the vocabulary file's name inside the asset directories (MODEL_DIR
      and every checkpoint's `assets/`): `vocabulary.model` for SentencePiece,
      `vocabulary.txt` (BERT's vocab.txt) for WordPiece.
    sha256: hash of that file's bytes.
    size: token ids the model sees (its embedding rows).
    pieces: pieces of the vocabulary (`size` is `factor * pieces`).
    factor: 1, or 2 for the synthetic languages' doubled vocabulary (ids
      >= pieces are the transliterated copies).
    specials: the special ids and the range of regular ids.
    kind: "sentencepiece" or "wordpiece".
    lower_case: a WordPiece vocabulary is uncased (text is lowercased and
      stripped of accents); not in its file, so recorded here. Always False
      for SentencePiece, whose model carries its own normalisation.
  """

  file: str
  sha256: str
  size: int
  pieces: int
  factor: int = 1
  specials: SpecialTokens = SpecialTokens()
  # Defaults keep manifests written before WordPiece support loadable.
  kind: str = "sentencepiece"
  lower_case: bool = False

  def __post_init__(self):
    if self.kind not in VOCABULARY_KINDS:
      raise UserError(f"the run manifest names a {self.kind!r} vocabulary; this flax_xalign reads "
                      f"{', '.join(VOCABULARY_KINDS)} (use the release that wrote it).")

  def fingerprint(self) -> dict[str, Any]:
    """What must match for two runs to share token ids."""
    return {"sha256": self.sha256, "size": self.size, "factor": self.factor,
            "specials": self.specials.as_dict(), "kind": self.kind, "lower_case": self.lower_case}
