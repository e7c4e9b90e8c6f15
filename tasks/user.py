"""Register your own data without writing Python: frozen dataclasses for gin.

    TextTask(name="my_de_mlm", files={"train": "/data/de/*.txt"}, lang="de",
             vocabulary_path="/data/spm.model").register()
    TextTask(name="my_grc_mlm", files={"train": "/data/grc/*.txt"}, lang="grc",
             vocabulary_path="/models/e5/vocabulary.model",
             normalize="nfd_strip_marks").register()
    TsvBitextTask(name="my_de_en_tlm", files={"train": "/data/de_en.tsv"},
                  lang_a="de", lang_b="en",
                  vocabulary_path="/data/spm.model").register()
    AlphaMixture(name="my_mix", tasks=("my_de_mlm", "my_de_en_tlm"),
                 alpha=0.7).register()

In gin, build them with `@TextTask()` etc. and hand the list to `register_all`
(the entry point calls it before looking up MIXTURE_OR_TASK_NAME).

* `TextTask`: one sentence or document per line (UTF-8); blank lines are
  skipped; monolingual MLM examples.
* `TsvBitextTask`: one pair per line, exactly two tab-separated, non-empty
  columns (side A, side B); blank lines are skipped; TLM examples.
* `files` maps a split name to a glob (or a list of globs); matches are read in
  sorted order.
* `vocabulary_path`: a SentencePiece model with the five special tokens, ours
  (`xalign vocab`) or an imported model's
  `vocabulary.model` (e.g. XLM-R's layout, `<s>`=0 and `<pad>`=1); its ids are
  read from the model (`flax_xalign.data.vocab.specials.special_tokens_of`).
* `normalize`: a text normaliser applied before tokenising, one of
  `flax_xalign.data.vocab.normalize.NORMALIZERS`: "" (none), "nfd_strip_marks"
  (drop diacritics, e.g. polytonic Greek), "nfkc", "lower". Align such a model
  with the same `--normalize`.
* `max_line_chars` (default `registry.DEFAULT_MAX_LINE_CHARS`, 20,000): a
  line (each side of a TSV pair) longer than this is cut to its first
  `max_line_chars` characters before tokenising. A row keeps only its first
  L - 2 tokens, and 20,000 characters hold more than 1,024 tokens, so the cut
  loses nothing a row of up to 1,024 tokens would keep; it stops one huge
  line (a whole book on one line) from costing minutes to tokenise. Cut lines
  are counted and reported in one `warning:` line per task and split. None
  never cuts.
* `AlphaMixture`: samples its tasks with rates n ** alpha, n = the number of
  training examples of each task (a file task counts its non-empty lines; a
  plain seqio task, registered directly with seqio, reports
  `num_input_examples("train")`). `sizes={"task": n}` gives counts explicitly,
  e.g. for a plain task whose source does not know its size.

Paths are made absolute at registration (relative to the working directory),
so `flax_xalign.tasks.describe` can hand the definitions to another process.

Nothing is read at registration. Files are checked when a dataset is built:
a missing file, a glob matching nothing, an empty corpus, a corpus none of
whose lines yields a token (e.g. only control characters), bad UTF-8 or a
malformed TSV row stop with a `UserError` naming the file (and line).
"""

import dataclasses
import glob
import os
import stat
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from flax_xalign import errors, storage
from flax_xalign.fileio import utf8_lines
from flax_xalign.data.vocab import normalize as normalize_lib
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from . import links as links_lib
from . import registry

Globs = Union[str, Sequence[str]]


def _normalise_files(task: str, files: Mapping[str, Globs]
                     ) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
  if not isinstance(files, Mapping) or not files:
    raise errors.UserError(
        f"Task {task!r}: files must map split names to globs, e.g. "
        "{'train': '/data/train.txt', 'validation': '/data/dev.txt'}; got "
        f"{files!r}.")
  result = []
  for split, globs in sorted(files.items()):
    globs = (globs,) if isinstance(globs, str) else tuple(globs)
    if not globs or not all(isinstance(g, str) and g for g in globs):
      raise errors.UserError(
          f"Task {task!r}: split {split!r} needs a file path or glob, got "
          f"{files[split]!r}.")
    result.append((str(split), tuple(_absolute(g) for g in globs)))
  return tuple(result)


def _normalise_links(task: str, links: Optional[Mapping[str, str]],
                     files: Tuple[Tuple[str, Tuple[str, ...]], ...]) -> Tuple[Tuple[str, str], ...]:
  if not links:
    return ()
  splits = [split for split, _ in files]
  if not isinstance(links, Mapping) or not all(isinstance(p, str) and p for p in links.values()):
    raise errors.UserError(
        f"Task {task!r}: links must map split names to Pharaoh files, e.g. {{'train': '/data/train.links'}}; "
        f"got {links!r}.")
  unknown = sorted(set(links) - set(splits))
  if unknown:
    raise errors.UserError(
        f"Task {task!r}: links names split(s) {', '.join(map(repr, unknown))} that files= does not have "
        f"({', '.join(splits)}).")
  return tuple((str(split), _absolute(path)) for split, path in sorted(links.items()))


def _absolute(path: str) -> str:
  return storage.absolute(path)  # (a URL, gs://bucket/corpus/*.txt, is kept: the lines are read through storage)


def _not_readable_as_text(path: str) -> Optional[str]:
  """Why a glob's match cannot be read as a text file (None: a regular file or a folder)."""
  if storage.is_url(path):  # An object is a file: a store has no links, pipes or permission bits to check.
    return None
  if os.path.islink(path) and not os.path.exists(path):
    return "is a symbolic link to nothing (its target is gone, or the links loop)"
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    return f"cannot be read ({e.strerror})"
  if stat.S_ISREG(mode) and not os.access(path, os.R_OK):  # chmod 000: TF would fail mid-training.
    return "cannot be read (permission denied); fix its permissions (chmod +r)"
  if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
    return None
  return "is not a regular file (a FIFO, socket or device)"


def _expand(task: str, split: str, globs: Sequence[str]) -> List[str]:
  paths = []
  for pattern in globs:
    matches = storage.glob(pattern if storage.is_url(pattern) else os.path.expanduser(pattern))
    for match in matches:  # Never drop a shard silently: a match that is no file is an error.
      problem = _not_readable_as_text(match)
      if problem:
        raise errors.UserError(f"Task {task!r}, split {split!r}: {match} (from {pattern}) {problem}; fix or remove "
                               "it, or narrow the files= setting.")
    if not matches:
      kind = "file" if glob.escape(pattern) == pattern else "glob"
      what = "does not exist" if kind == "file" else "matches no file"
      raise errors.UserError(
          f"Task {task!r}, split {split!r}: {kind} {pattern} {what} (working "
          f"directory {os.getcwd()}); fix the path in its files= setting.")
    folders = [m for m in matches if storage.isdir(m)]
    if folders and glob.escape(pattern) == pattern:
      raise errors.UserError(
          f"Task {task!r}, split {split!r}: {pattern} is a folder, not a file; give its files, e.g. "
          f"{os.path.join(pattern, '*.txt')}, in the files= setting.")
    paths.extend(m for m in matches if storage.isfile(m))
    if not paths and folders:
      raise errors.UserError(
          f"Task {task!r}, split {split!r}: {pattern} matches only folders ({folders[0]}, ...); give a glob "
          f"that matches files, e.g. {os.path.join(folders[0], '*.txt')}.")
  return paths


@dataclasses.dataclass(frozen=True)
class FileLoader:
  """Reads and validates a task's files for one split (a registry loader)."""
  task: str
  files: Tuple[Tuple[str, Tuple[str, ...]], ...]
  tsv: bool
  links: Tuple[Tuple[str, str], ...] = ()  # (split, Pharaoh file) of a bitext task's word links.

  def paths(self, split: str) -> List[str]:
    """The split's files, globs expanded (UserError: no such split, or a path matches nothing)."""
    by_split = dict(self.files)
    if split not in by_split:
      raise errors.UserError(
          f"Task {self.task!r} has no files for split {split!r} (it has "
          f"{', '.join(by_split)}); add {split!r} to its files= setting.")
    return _expand(self.task, split, by_split[split])

  def _empty_corpus(self, split: str, paths: Sequence[str]) -> errors.UserError:
    what = f"{paths[0]} holds" if len(paths) == 1 else f"{', '.join(paths) or 'the files'} hold"
    return errors.UserError(
        f"Task {self.task!r}, split {split!r}: {what} only blank lines, so the corpus is empty; "
        "give it at least one line of text.")

  def num_examples(self, split: str) -> int:
    """Non-empty lines of the split's files, streamed (nothing held).

    Only what the count needs is checked (files exist, UTF-8, not empty);
    TSV columns are checked when the dataset is built.
    """
    paths = self.paths(split)
    count = sum(1 for path in paths for _, line in utf8_lines(path) if line.strip())
    if not count:
      raise self._empty_corpus(split, paths)
    return count

  def __call__(self, split: str) -> Dict[str, List[str]]:
    columns = {"text": [], "text_b": []} if self.tsv else {"text": []}
    paths = self.paths(split)
    for path in paths:
      for number, line in utf8_lines(path):
        if not line.strip():
          continue
        if not self.tsv:
          columns["text"].append(line.strip())
          continue
        fields = line.split("\t")
        if len(fields) != 2:
          raise errors.UserError(
              f"{path}:{number}: expected 2 tab-separated columns, found "
              f"{len(fields)}; write one 'side A<TAB>side B' pair per line "
              "with no other tabs.")
        a, b = fields[0].strip(), fields[1].strip()
        if not a or not b:
          raise errors.UserError(
              f"{path}:{number}: column {1 if not a else 2} is empty; every "
              "line needs text on both sides of the tab.")
        columns["text"].append(a)
        columns["text_b"].append(b)
    if not columns["text"]:
      raise self._empty_corpus(split, paths)
    links = dict(self.links).get(split)
    if links:
      alignments = links_lib.read_pharaoh(links, task=self.task, split=split)
      columns.update(links_lib.group_columns(columns["text"], columns["text_b"], alignments,
                                             task=self.task, split=split, path=links))
    return columns


def _vocabulary_path(task: str, path: str) -> str:
  if not isinstance(path, str) or not path:
    raise errors.UserError(
        f"Task {task!r}: vocabulary_path must name a SentencePiece .model file "
        "(train one with `xalign vocab`, or use an imported "
        "model's vocabulary.model).")
  return _absolute(path)


def _vocabulary(path: str) -> vocab_lib.LazyVocabulary:
  return vocab_lib.LazyVocabulary(vocab_lib.FixedPath(path))


def _normalizer(task: str, name: str) -> str:
  return normalize_lib.check_normalizer(name, where=f"Task {task!r}: normalize")


@dataclasses.dataclass(frozen=True)
class TextTask:
  """Monolingual text files, one sentence/document per line (MLM).

  `normalize` names the text normaliser applied before tokenising (see the
  module docstring); "" keeps the text as it is. `max_line_chars`: longer
  lines are cut to their first `max_line_chars` characters (module docstring).
  """
  name: str
  files: Mapping[str, Globs]
  lang: str
  vocabulary_path: str
  normalize: str = ""
  max_line_chars: Optional[int] = registry.DEFAULT_MAX_LINE_CHARS

  def register(self) -> "TextTask":
    """Registers the seqio task (idempotent); returns self."""
    files = _normalise_files(self.name, self.files)
    spec = dataclasses.replace(self, files=dict(files),
                               vocabulary_path=_vocabulary_path(self.name, self.vocabulary_path),
                               normalize=_normalizer(self.name, self.normalize))
    registry.register_task(
        self.name, loader=FileLoader(self.name, files, tsv=False),
        vocabulary=_vocabulary(spec.vocabulary_path),
        lang=self.lang, splits=[split for split, _ in files],
        definition=spec, spec=spec, normalize=spec.normalize,
        max_line_chars=self.max_line_chars)
    return self


@dataclasses.dataclass(frozen=True)
class TsvBitextTask:
  """Tab-separated bitext files, `side A<TAB>side B` per line (TLM).

  `normalize` applies to both sides (see the module docstring), and so does
  `max_line_chars` (each side is cut on its own). `links` maps a split to a
  Pharaoh file of word links for its pairs (`i-j`, 0-indexed positions of the
  whitespace-separated words, one line per non-blank TSV line, in order;
  e.g. eflomal's output), which the alignment objectives can learn from
  (`DwaConfig.label_source`); they travel as `link_groups` (`tasks.links`).
  """
  name: str
  files: Mapping[str, Globs]
  lang_a: str
  lang_b: str
  vocabulary_path: str
  normalize: str = ""
  max_line_chars: Optional[int] = registry.DEFAULT_MAX_LINE_CHARS
  links: Optional[Mapping[str, str]] = None

  def register(self) -> "TsvBitextTask":
    """Registers the seqio task (idempotent); returns self."""
    files = _normalise_files(self.name, self.files)
    links = _normalise_links(self.name, self.links, files)
    spec = dataclasses.replace(self, files=dict(files),
                               vocabulary_path=_vocabulary_path(self.name, self.vocabulary_path),
                               normalize=_normalizer(self.name, self.normalize),
                               links=dict(links) if links else None)
    registry.register_task(
        self.name, loader=FileLoader(self.name, files, tsv=True, links=links),
        vocabulary=_vocabulary(spec.vocabulary_path),
        lang=self.lang_a, lang_b=self.lang_b,
        splits=[split for split, _ in files], definition=spec, spec=spec,
        normalize=spec.normalize, max_line_chars=self.max_line_chars)
    return self


@dataclasses.dataclass(frozen=True)
class AlphaMixture:
  """A mixture of registered tasks sampled with rates n_i ** alpha.

  Attributes:
    name: the mixture's name.
    tasks: our tasks or plain seqio tasks, all with one vocabulary.
    alpha: the exponent (XLM's 0.7; 1 samples in proportion to size).
    sizes: optional training-example counts by task name, used instead of
      counting (needed for a plain seqio task that does not know its size).
  """
  name: str
  tasks: Sequence[str]
  alpha: float = registry.DEFAULT_ALPHA
  sizes: Optional[Mapping[str, int]] = None

  def register(self) -> "AlphaMixture":
    """Registers the seqio mixture (idempotent); returns self."""
    tasks = (self.tasks,) if isinstance(self.tasks, str) else tuple(self.tasks)
    sizes = (dict(self.sizes) if isinstance(self.sizes, Mapping)
             else self.sizes)  # register_mixture refuses anything else.
    spec = dataclasses.replace(self, tasks=tasks, alpha=float(self.alpha),
                               sizes=sizes)
    registry.register_mixture(self.name, tasks, alpha=spec.alpha, sizes=sizes,
                              definition=spec, spec=spec)
    return self


def register_all(definitions: Sequence[Union[TextTask, TsvBitextTask,
                                             AlphaMixture]]) -> None:
  """Registers tasks and mixtures in order (mixtures after their tasks)."""
  for definition in definitions:
    definition.register()
