"""TensorFlow Datasets sources: pretraining text, bitext, and XTREME evaluation sets.

Pretraining (the seqio tasks of `tasks/tfds.py` read these):

===================  =====================================  ==========================
dataset              what one TFDS example becomes          split map (ours -> TFDS)
===================  =====================================  ==========================
wiki40b/<lang>       one example per paragraph              train, validation, test
c4/multilingual      one example per non-empty line         train -> <lang>,
                     (mC4; the config's splits are                validation -> <lang>-validation
                     languages)
para_crawl/en<xx>    (xx, en) sentence pair                 train
opus/<subset>        (de, en) sentence pair                 train
ted_multi_translate  (xx, en) when the talk sentence has    train, validation, test
                     both languages, else skipped
===================  =====================================  ==========================

`TextSource` names one of them for one language (or pair); `to_text` maps its
raw TFDS examples to the `{"text"}` / `{"text", "text_b"}` dicts that
`tasks.registry.tokenize_and_tag` reads, in tf ops only (the trainer checkpoints
its iterator). `PreparedTfdsSource` is seqio's `TfdsDataSource` that never
downloads (`read_only`) and, when the dataset is not prepared in its data
directory, raises one `UserError` naming the `tfds build` command instead of
TFDS's traceback. Nothing here touches the disk until a dataset is read.

Evaluation readers return the types of `flax_xalign.data.sources.readers`, so the
zero-shot harness takes TFDS data and users' files alike:

* `load_xnli(lang, split)`: `SentencePairExample`s with labels `entailment`,
  `neutral`, `contradiction` (validation/test from `xnli`; train from
  `xtreme_xnli`, XTREME's translate-train set, English included);
* `load_pawsx(lang, split)`: `SentencePairExample`s with labels `0`/`1` as in
  PAWS-X's TSV files (`paws_x_wiki`: train, validation, test);
* `load_wikiann(lang, split)`: `TaggedSentence`s with BIO tags (`O`, `B-PER`, ...);
* `load_xtreme_pos(lang, split)`: `TaggedSentence`s with UPOS tags (UD 2.5;
  TFDS's `dev` split is our `validation`);
* `load_tatoeba(lang)`: `TranslationPair(source, target)`, `lang` -> English,
  row i of the sources translating row i of the targets (TFDS calls its only
  split `train`; it is XTREME's test set).
"""

import dataclasses
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import seqio
import tensorflow as tf
import tensorflow_datasets as tfds

from flax_xalign import errors
from flax_xalign.data.sources.readers import SentencePairExample
from flax_xalign.data.sources.readers import TaggedSentence

MONOLINGUAL = ("wiki40b", "c4")
BITEXT = ("para_crawl", "ted_multi_translate", "opus")
# Large Beam datasets: `tfds build` needs a Beam runner (see _build_hint).
_BEAM = ("wiki40b", "c4")
_WIKI40B_PARAGRAPH = "_START_PARAGRAPH_"
_WIKI40B_NEWLINE = "_NEWLINE_"
# Our (ISO 639-1) code -> the dataset's own, where they differ.
_CODE_ALIASES = {"wiki40b": {"zh": "zh-cn"}, "ted_multi_translate": {"zh": "zh-cn"}}


class TranslationPair(NamedTuple):
  """One retrieval pair: `source` (the asked language) translates `target` (English)."""
  source: str
  target: str


@dataclasses.dataclass(frozen=True)
class TextSource:
  """One TFDS dataset read as text of one language or one language pair.

  Attributes:
    dataset: the builder name, e.g. "wiki40b".
    config: its config ("de", "multilingual", "ende"), "" if it has none.
    version: the version the installed TFDS code builds ("1.3.0").
    splits: (our split, the TFDS split) pairs.
    kind: how an example becomes text: "paragraphs" (wiki40b markup), "lines",
      "translation" (a Translation feature) or "variable" (TED's
      TranslationVariableLanguages).
    lang: our code of the text (side a); `field` is the dataset's code.
    lang_b: our code of side b of a pair, "" when monolingual.
    field: the TFDS feature (or translation language) of side a.
    field_b: the translation language of side b.
  """
  dataset: str
  config: str
  version: str
  splits: Tuple[Tuple[str, str], ...]
  kind: str
  lang: str
  lang_b: str = ""
  field: str = "text"
  field_b: str = ""

  @property
  def tfds_name(self) -> str:
    """`name[/config]:version`, as seqio wants it."""
    config = f"/{self.config}" if self.config else ""
    return f"{self.dataset}{config}:{self.version}"

  @property
  def builder_name(self) -> str:
    return f"{self.dataset}/{self.config}" if self.config else self.dataset


# ------------------------------------------------------------------ catalogue


def _builder_cls(dataset: str):
  try:
    return tfds.builder_cls(dataset)
  except Exception as e:  # TFDS raises DatasetNotFoundError or ValueError.
    raise errors.UserError(
        f"tensorflow_datasets {tfds.__version__} has no dataset {dataset!r} ({e}); "
        "upgrade tensorflow-datasets or pick another dataset.") from e


def _configs(dataset: str) -> Dict[str, Any]:
  return {c.name: c for c in getattr(_builder_cls(dataset), "BUILDER_CONFIGS", ())}


def _version(dataset: str, config: str) -> str:
  """The version the installed code builds (read from code, not the disk)."""
  cls = _builder_cls(dataset)
  version = getattr(_configs(dataset).get(config), "version", None) or cls.VERSION
  return str(version)


def dataset_code(dataset: str, lang: str) -> str:
  """The dataset's own code for our language code `lang`."""
  return _CODE_ALIASES.get(dataset, {}).get(lang, lang)


def monolingual_languages(dataset: str) -> Tuple[str, ...]:
  """Dataset codes with monolingual text in `dataset` (wiki40b or c4)."""
  if dataset == "wiki40b":
    return tuple(_configs(dataset))
  if dataset == "c4":
    return tuple(_configs(dataset)["multilingual"].languages)
  raise errors.UserError(
      f"{dataset!r} is not a monolingual text source; use one of {', '.join(MONOLINGUAL)}.")


def monolingual_source(dataset: str, lang: str) -> Optional[TextSource]:
  """The `dataset` text of language `lang` (None if it has none)."""
  code = dataset_code(dataset, lang)
  if code not in monolingual_languages(dataset):
    return None
  if dataset == "wiki40b":
    splits = tuple((s, s) for s in ("train", "validation", "test"))
    return TextSource("wiki40b", code, _version("wiki40b", code), splits, "paragraphs", lang)
  splits = (("train", code), ("validation", f"{code}-validation"))
  return TextSource("c4", "multilingual", _version("c4", "multilingual"), splits, "lines", lang)


def bitext_source(dataset: str, lang: str, pivot: str = "en") -> Optional[TextSource]:
  """(lang, pivot) sentence pairs of a bitext dataset (None if it has none).

  `dataset` is "para_crawl", "ted_multi_translate" or "opus/<subset>" (OPUS
  in TFDS is German-English only: medical, law, koran, IT, subtitles).
  """
  name, _, subset = dataset.partition("/")
  if name not in BITEXT:
    raise errors.UserError(
        f"{dataset!r} is not a bitext source; use para_crawl, ted_multi_translate or "
        f"opus/<subset> (subsets {', '.join(_configs('opus'))}).")
  code, pivot_code = dataset_code(name, lang), dataset_code(name, pivot)
  if name == "para_crawl":
    config = pivot_code + code
    if pivot != "en" or config not in _configs(name):
      return None
    return TextSource(name, config, _version(name, config), (("train", "train"),), "translation",
                      lang, pivot, field=code, field_b=pivot_code)
  if name == "opus":
    if subset not in _configs(name):
      raise errors.UserError(
          f"{dataset!r}: OPUS in TFDS has the subsets {', '.join(_configs(name))}; "
          "name one as opus/<subset>.")
    if {lang, pivot} != {"de", "en"}:
      return None
    return TextSource(name, subset, _version(name, subset), (("train", "train"),), "translation",
                      lang, pivot, field=code, field_b=pivot_code)
  languages = _module_languages(name)
  if code not in languages or pivot_code not in languages or code == pivot_code:
    return None
  splits = tuple((s, s) for s in ("train", "validation", "test"))
  return TextSource(name, "", _version(name, ""), splits, "variable", lang, pivot,
                    field=code, field_b=pivot_code)


def _module_languages(dataset: str) -> Tuple[str, ...]:
  """The languages a config-less multilingual builder's module lists (code, not disk).

  TED and XNLI keep all languages in one config and list them only in their
  module's `_LANGUAGES`; reading it avoids building `DatasetInfo`.
  """
  module = sys.modules[_builder_cls(dataset).__module__]
  return tuple(module._LANGUAGES)  # pylint: disable=protected-access


# -------------------------------------------------------------- text mapping


def wiki40b_paragraphs(text: tf.Tensor) -> tf.Tensor:
  """The paragraphs of one wiki40b article: tf.string [] -> tf.string [n].

  Wiki40b marks structure with lines `_START_ARTICLE_`, `_START_SECTION_`,
  `_START_PARAGRAPH_`; a paragraph is the line after its marker, with its own
  line breaks written `_NEWLINE_` (they become spaces: one example per
  paragraph).
  """
  lines = tf.strings.split(text, "\n")
  follows_marker = tf.equal(lines[:-1], _WIKI40B_PARAGRAPH)
  paragraphs = tf.boolean_mask(lines[1:], follows_marker)
  return tf.strings.regex_replace(paragraphs, _WIKI40B_NEWLINE, " ")


def _nonempty(texts: tf.Tensor) -> tf.Tensor:
  texts = tf.strings.strip(texts)
  return tf.boolean_mask(texts, tf.strings.length(texts) > 0)


def to_text(dataset: tf.data.Dataset, *, source: TextSource) -> tf.data.Dataset:
  """seqio preprocessor: raw TFDS examples -> `{"text"}` or `{"text", "text_b"}`.

  Empty texts (and pairs with an empty side) are dropped, so every example
  has at least one token.
  """
  if source.kind in ("paragraphs", "lines"):
    split = wiki40b_paragraphs if source.kind == "paragraphs" else (
        lambda text: tf.strings.split(text, "\n"))
    return dataset.flat_map(lambda ex: tf.data.Dataset.from_tensor_slices(
        {"text": _nonempty(split(ex[source.field]))}))
  if source.kind == "translation":
    pairs = dataset.map(lambda ex: {"text": tf.strings.strip(ex[source.field]),
                                    "text_b": tf.strings.strip(ex[source.field_b])})
  elif source.kind == "variable":
    def pick(ex):
      languages, texts = ex["translations"]["language"], ex["translations"]["translation"]
      first = lambda code: tf.concat([tf.boolean_mask(texts, tf.equal(languages, code)), [""]], 0)[0]
      return {"text": tf.strings.strip(first(source.field)),
              "text_b": tf.strings.strip(first(source.field_b))}
    pairs = dataset.map(pick)
  else:
    raise ValueError(f"unknown TextSource kind {source.kind!r}")
  return pairs.filter(lambda ex: tf.logical_and(tf.strings.length(ex["text"]) > 0,
                                                tf.strings.length(ex["text_b"]) > 0))


# ------------------------------------------------------- prepared datasets


def _build_hint(builder_name: str, data_dir: Optional[str]) -> str:
  flag = f" --data_dir={data_dir}" if data_dir else ""
  hint = f"`tfds build {builder_name}{flag}` on a machine with internet access"
  if builder_name.split("/")[0] in _BEAM:
    hint += (" (a Beam dataset: add --beam_pipeline_options=... to run it on a Beam cluster, "
             "e.g. Dataflow; c4/multilingual is several TB)")
  return hint


def prepared_builder(builder_name: str, data_dir: Optional[str] = None):
  """The TFDS builder of a prepared dataset.

  Args:
    builder_name: `name[/config][:version]`.
    data_dir: the TFDS data directory; None is TFDS's default
      ($TFDS_DATA_DIR or ~/tensorflow_datasets).

  Raises:
    UserError: unknown dataset or config, or not prepared under `data_dir`;
      the message gives the `tfds build` command.
  """
  plain = builder_name.split(":")[0]
  try:
    builder = tfds.builder(builder_name, data_dir=data_dir)
  except Exception as e:  # Unknown name/config/version: several TFDS types.
    raise errors.UserError(
        f"TFDS cannot make a builder for {builder_name!r} ({type(e).__name__}: {e}); check "
        "the dataset, config and version names (`tfds.list_builders()`).") from e
  if not builder.is_prepared():
    raise errors.UserError(
        f"TFDS dataset {builder_name!r} is not prepared in {builder.data_path} (data_dir "
        f"{data_dir or 'TFDS default: $TFDS_DATA_DIR or ~/tensorflow_datasets'}). Prepare it "
        f"with {_build_hint(plain, data_dir)}, then copy the data directory here or point "
        "data_dir= at it.")
  return builder


def split_size(builder_name: str, split: str, data_dir: Optional[str] = None) -> int:
  """Examples of a prepared split, from the dataset's split info (nothing read)."""
  builder = prepared_builder(builder_name, data_dir)
  if split not in builder.info.splits:
    raise errors.UserError(
        f"TFDS dataset {builder_name!r} has no split {split!r}; it has "
        f"{', '.join(sorted(builder.info.splits))}.")
  return int(builder.info.splits[split].num_examples)


class PreparedTfdsSource(seqio.TfdsDataSource):
  """seqio's TFDS source, read-only, with a `UserError` for unprepared data."""

  def __init__(self, source: TextSource, data_dir: Optional[str] = None):
    super().__init__(tfds_name=source.tfds_name, tfds_data_dir=data_dir,
                     splits=dict(source.splits), caching_permitted=False, read_only=True)
    self._text_source = source
    self._data_dir = data_dir

  def _check(self) -> None:
    prepared_builder(self._text_source.tfds_name, self._data_dir)

  def get_dataset(self, *args, **kwargs) -> tf.data.Dataset:
    self._check()
    return super().get_dataset(*args, **kwargs)

  def num_input_examples(self, split: str) -> Optional[int]:
    self._check()
    return super().num_input_examples(split)

  def list_shards(self, split: str) -> Sequence[str]:
    self._check()
    return super().list_shards(split)


# ------------------------------------------------------------------- readers


def _rows(builder_name: str, split: str, data_dir: Optional[str], *,
          aliases: Optional[Dict[str, str]] = None):
  """(builder, numpy examples) of one split; `aliases` maps our split names to TFDS's."""
  builder = prepared_builder(builder_name, data_dir)
  tfds_split = (aliases or {}).get(split, split)
  if tfds_split not in builder.info.splits:
    ours = {v: k for k, v in (aliases or {}).items()}
    raise errors.UserError(
        f"TFDS dataset {builder_name!r} has no split {split!r}; it has "
        f"{', '.join(sorted(ours.get(s, s) for s in builder.info.splits))}.")
  dataset = builder.as_dataset(split=tfds_split, shuffle_files=False)
  return builder, tfds.as_numpy(dataset)


def _str(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _config_for(dataset: str, config: str, lang: str) -> str:
  if config not in _configs(dataset):
    raise errors.UserError(
        f"TFDS dataset {dataset!r} has no language {lang!r}; it has "
        f"{', '.join(sorted(c.split('_')[-1] for c in _configs(dataset)))}.")
  return f"{dataset}/{config}"


def load_xnli(lang: str, split: str = "test", *, data_dir: Optional[str] = None
              ) -> List[SentencePairExample]:
  """XNLI premise/hypothesis pairs of `lang` (validation/test: `xnli`; train: `xtreme_xnli`)."""
  name = "xtreme_xnli" if split == "train" else "xnli"
  languages = _module_languages(name)
  if lang not in languages:
    raise errors.UserError(f"XNLI has no language {lang!r}; it has {', '.join(languages)}.")
  builder, rows = _rows(name, split, data_dir)
  names = builder.info.features["label"].names
  examples = []
  for row in rows:
    hypotheses = dict(zip(map(_str, row["hypothesis"]["language"]),
                          map(_str, row["hypothesis"]["translation"])))
    if lang in hypotheses:
      examples.append(SentencePairExample(_str(row["premise"][lang]), hypotheses[lang],
                                          names[int(row["label"])]))
  return examples


def load_pawsx(lang: str, split: str = "test", *, data_dir: Optional[str] = None
               ) -> List[SentencePairExample]:
  """PAWS-X sentence pairs of `lang` (`paws_x_wiki`), labels "0"/"1" as in its TSV files."""
  _, rows = _rows(_config_for("paws_x_wiki", lang, lang), split, data_dir)
  return [SentencePairExample(_str(r["sentence1"]), _str(r["sentence2"]), str(int(r["label"])))
          for r in rows]


def _tagged(builder_name: str, split: str, data_dir: Optional[str], tag_feature: str,
            aliases: Optional[Dict[str, str]] = None) -> List[TaggedSentence]:
  builder, rows = _rows(builder_name, split, data_dir, aliases=aliases)
  names = builder.info.features[tag_feature].feature.names
  return [TaggedSentence(tuple(map(_str, r["tokens"])), tuple(names[int(t)] for t in r[tag_feature]))
          for r in rows]


def load_wikiann(lang: str, split: str = "test", *, data_dir: Optional[str] = None
                 ) -> List[TaggedSentence]:
  """WikiANN (Rahimi et al. splits) NER sentences of `lang`, BIO tags."""
  return _tagged(_config_for("wikiann", lang, lang), split, data_dir, "tags")


def load_xtreme_pos(lang: str, split: str = "test", *, data_dir: Optional[str] = None
                    ) -> List[TaggedSentence]:
  """XTREME's UD 2.5 POS sentences of `lang`, UPOS tags (split validation = TFDS `dev`)."""
  return _tagged(_config_for("xtreme_pos", f"xtreme_pos_{lang}", lang), split, data_dir, "upos",
                 aliases={"validation": "dev"})


def load_tatoeba(lang: str, *, data_dir: Optional[str] = None) -> List[TranslationPair]:
  """XTREME's Tatoeba pairs, `lang` -> English (row i translates row i)."""
  _, rows = _rows(_config_for("tatoeba", f"tatoeba_{lang}", lang), "train", data_dir)
  return [TranslationPair(_str(r["source_sentence"]).strip(), _str(r["target_sentence"]).strip())
          for r in rows]


READERS: Dict[str, Callable[..., list]] = {
    "xnli": load_xnli, "pawsx": load_pawsx, "wikiann": load_wikiann,
    "xtreme_pos": load_xtreme_pos, "tatoeba": load_tatoeba}
