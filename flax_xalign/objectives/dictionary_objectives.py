"""Old path of ALIGN-MLM and DICT-MLM: re-exports `objectives.align_mlm` and `objectives.dict_mlm`."""

from flax_xalign.objectives.align_mlm import EmbeddingAlignment, align, alignment_score, embedding_cosine  # noqa: F401
from flax_xalign.objectives.base import id_table  # noqa: F401
from flax_xalign.objectives.dict_mlm import UNTRANSLATABLE, DictionaryMaskedLM, dict_mlm  # noqa: F401
