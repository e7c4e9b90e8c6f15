"""seqio tasks over TensorFlow Datasets: wiki40b, mC4 and bitext, alpha-mixed.

    TfdsTasks(prefix="xl", languages=("de", "en", "fr", "sw"),
              vocabulary_path="/models/spm.model", data_dir="gs://bucket/tfds",
              monolingual=("wiki40b", "c4"), bitext=("para_crawl", "ted_multi_translate")
              ).register()

registers, for each language that the dataset has (`flax_xalign.data.sources.tfds`
says what one TFDS example becomes):

==================================  ==========================================
name                                examples
==================================  ==========================================
{prefix}_wiki40b_{lang}             wiki40b paragraphs (MLM)
{prefix}_mc4_{lang}                 c4/multilingual (mC4) lines (MLM)
{prefix}_para_crawl_{lang}_{pivot}  para_crawl/en{lang} pairs (TLM)
{prefix}_ted_{lang}_{pivot}         ted_multi_translate pairs (TLM)
{prefix}_opus_{subset}_de_en        opus/{subset}, German-English (TLM)
{prefix}_mlm_tlm                    all of them, rate n_i ** alpha
==================================  ==========================================

Outputs follow `tasks.registry` (`tokens`, `tokens_b`, `lang`, `lang_b`): side a
of a pair is `lang`, side b the `pivot` (English), each tokenised on its own.
Codes are ours (ISO 639-1; "zh" reads wiki40b's and TED's "zh-cn"); a name
replaces "-" by "_". A language a dataset lacks is skipped (wiki40b has no
Swahili, para_crawl only EU languages); a language no selected dataset has
is an error.

Mixing rates use n_i = the TFDS split info's count of the task's training
split, read when the mixture is first sampled: articles for wiki40b, documents
for mC4 (one example per paragraph or line, so both contribute more examples
than n_i), pairs for para_crawl, and all TED sentences (a pair needs both
languages, so fewer are used). Give `sizes={task: n}` to weigh otherwise.

Registration reads nothing (gin may register before any data exists). The
first dataset, count or shard listing of an unprepared dataset raises one
`UserError` naming the `tfds build` command and the data directory; nothing is
ever downloaded.

The XTREME evaluation sets are readers, not tasks: `tfds_sources.load_xnli`,
`load_pawsx`, `load_wikiann`, `load_xtreme_pos`, `load_tatoeba`.
"""

import dataclasses
import functools
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import seqio

from flax_xalign import errors
from flax_xalign.data.sources import tfds as tfds_sources
from . import registry
from . import user

MIXTURE_SUFFIX = "mlm_tlm"


@dataclasses.dataclass(frozen=True)
class TfdsTextLoader:
  """A registry loader over one TFDS source (counts from split info, text by reading)."""
  source: tfds_sources.TextSource
  data_dir: Optional[str]

  def _tfds_split(self, split: str) -> str:
    splits = dict(self.source.splits)
    if split not in splits:
      raise errors.UserError(
          f"{self.source.builder_name} has no split {split!r} here; it has {', '.join(splits)}.")
    return splits[split]

  def num_examples(self, split: str) -> int:
    return tfds_sources.split_size(self.source.tfds_name, self._tfds_split(split), self.data_dir)

  def __call__(self, split: str) -> Dict[str, List[str]]:
    """The whole split as text lists (what tools reading raw text, e.g. vocabulary trimming, use)."""
    source = tfds_sources.PreparedTfdsSource(self.source, self.data_dir)
    dataset = tfds_sources.to_text(source.get_dataset(split, shuffle=False), source=self.source)
    columns: Dict[str, List[str]] = {}
    for example in dataset.as_numpy_iterator():
      for key, value in example.items():
        columns.setdefault(key, []).append(value.decode("utf-8"))
    return columns or {"text": []}


def _register_task(name: str, source: tfds_sources.TextSource, *, data_dir: Optional[str],
                   vocabulary: seqio.Vocabulary, normalize: str, spec: "TfdsTasks") -> None:
  """`registry.register_task` over a streamed TFDS split (idempotent)."""
  registry.register_task(
      name, loader=TfdsTextLoader(source, data_dir), vocabulary=vocabulary, lang=source.lang,
      lang_b=source.lang_b or None, definition=(spec, name), spec=spec, normalize=normalize,
      text_preprocessors=[functools.partial(tfds_sources.to_text, source=source)],
      source=tfds_sources.PreparedTfdsSource(source, data_dir))


def _name(*parts: str) -> str:
  return re.sub(r"[^\w]", "_", "_".join(parts))


def _strings(owner: str, field: str, value, *, empty_ok: bool = False) -> Tuple[str, ...]:
  values = (value,) if isinstance(value, str) else value
  if not isinstance(values, Sequence) or not all(isinstance(v, str) and v for v in values) or (
      not values and not empty_ok):
    raise errors.UserError(
        f"{owner}: {field} must be a list of non-empty strings, e.g. ['de', 'fr']; got {value!r}.")
  return tuple(dict.fromkeys(values))


def _data_dir(data_dir: Optional[str]) -> Optional[str]:
  if data_dir is None:
    return None
  if not isinstance(data_dir, str) or not data_dir:
    raise errors.UserError(f"TfdsTasks: data_dir must be a directory (or None); got {data_dir!r}.")
  if "://" in data_dir:  # gs://... stays as it is.
    return data_dir
  return os.path.abspath(os.path.expanduser(data_dir))


@dataclasses.dataclass(frozen=True)
class TfdsTasks:
  """Monolingual and bitext TFDS tasks for a list of languages, and their mixture.

  Attributes:
    prefix: name prefix of the tasks; the mixture is `{prefix}_mlm_tlm`.
    languages: our language codes; each needs at least one selected dataset.
    vocabulary_path: a SentencePiece model with the five special tokens.
    data_dir: the TFDS data directory (None: $TFDS_DATA_DIR or
      ~/tensorflow_datasets; gs:// paths work).
    monolingual: "wiki40b" and/or "c4" (its multilingual config).
    bitext: "para_crawl", "ted_multi_translate", "opus/<subset>".
    pivot: side b of every pair (para_crawl and OPUS are English-centred).
    alpha: the mixture's exponent (XLM's 0.7).
    sizes: training-example counts by task name, instead of split info.
    normalize: text normaliser for every side (`flax_xalign.data.vocab.normalize`).
  """
  prefix: str
  languages: Sequence[str]
  vocabulary_path: str
  data_dir: Optional[str] = None
  monolingual: Sequence[str] = tfds_sources.MONOLINGUAL
  bitext: Sequence[str] = ("para_crawl", "ted_multi_translate")
  pivot: str = "en"
  alpha: float = registry.DEFAULT_ALPHA
  sizes: Optional[Mapping[str, int]] = None
  normalize: str = ""

  @property
  def mixture_name(self) -> str:
    return _name(self.prefix, MIXTURE_SUFFIX)

  def sources(self) -> Dict[str, tfds_sources.TextSource]:
    """Task name -> its TFDS source, in mixture order (reads code only, no data).

    Raises:
      UserError: an unknown dataset, or a language no selected dataset has.
    """
    owner = f"TfdsTasks(prefix={self.prefix!r})"
    languages = _strings(owner, "languages", self.languages)
    monolingual = _strings(owner, "monolingual", self.monolingual, empty_ok=True)
    bitext = _strings(owner, "bitext", self.bitext, empty_ok=True)
    found: Dict[str, tfds_sources.TextSource] = {}
    for dataset in monolingual:
      short = {"c4": "mc4"}.get(dataset, dataset)
      for lang in languages:
        source = tfds_sources.monolingual_source(dataset, lang)
        if source is not None:
          found[_name(self.prefix, short, lang)] = source
    for dataset in bitext:
      short = {"ted_multi_translate": "ted"}.get(dataset, dataset.replace("/", "_").lower())
      for lang in languages:
        source = None if lang == self.pivot else tfds_sources.bitext_source(dataset, lang, self.pivot)
        if source is not None:
          found[_name(self.prefix, short, lang, self.pivot)] = source
    covered = {code for s in found.values() for code in (s.lang, s.lang_b)}
    missing = [lang for lang in languages if lang not in covered]
    if missing:
      raise errors.UserError(
          f"{owner}: no selected dataset has {', '.join(missing)} (monolingual="
          f"{list(monolingual)}, bitext={list(bitext)}); drop it from languages or add a "
          "dataset that has it (wiki40b has 41 languages, c4 = mC4 has 101).")
    return found

  def register(self) -> "TfdsTasks":
    """Registers the tasks and their mixture (idempotent); returns self."""
    sources = self.sources()
    first = next(iter(sources))
    sizes = dict(self.sizes) if isinstance(self.sizes, Mapping) else self.sizes
    spec = dataclasses.replace(
        self, languages=tuple(self.languages) if not isinstance(self.languages, str) else (self.languages,),
        monolingual=tuple(self.monolingual), bitext=tuple(self.bitext),
        vocabulary_path=user._vocabulary_path(first, self.vocabulary_path),  # pylint: disable=protected-access
        data_dir=_data_dir(self.data_dir), alpha=float(self.alpha), sizes=sizes,
        normalize=user._normalizer(first, self.normalize))  # pylint: disable=protected-access
    vocabulary = user._vocabulary(spec.vocabulary_path)  # pylint: disable=protected-access
    for name, source in sources.items():
      _register_task(name, source, data_dir=spec.data_dir, vocabulary=vocabulary,
                     normalize=spec.normalize, spec=spec)
    registry.register_mixture(self.mixture_name, list(sources), alpha=spec.alpha, sizes=sizes,
                              definition=(spec, "mixture"), spec=spec)
    return self
