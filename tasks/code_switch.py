"""Code-switched tasks: a registered monolingual task with words swapped by a bilingual dictionary.

    CodeSwitchedTask(name="bible_grc_cs_mlm", source="bible_grc_mlm",
                     dictionary="lexicons/grc-en.txt", rate=0.15).register()
    AlphaMixture(name="grc_cs_en", tasks=("bible_grc_cs_mlm", "bible_en_mlm",
                                          "bible_grc_en_tlm")).register()

In gin (see gin_configs/experiments/code_switched_mixture.gin):

    train.user_tasks = [@CodeSwitchedTask(), @AlphaMixture()]
    CodeSwitchedTask.name = 'bible_grc_cs_mlm'
    CodeSwitchedTask.source = 'bible_grc_mlm'
    CodeSwitchedTask.dictionary = %CODE_SWITCH_DICTIONARY

The task reads the source's text (its loader), swaps each word found in the dictionary with
probability `rate` (`flax_xalign.data.transforms.code_switch`: file formats, matching rules, seeding), then
tokenises it exactly as the source does (its vocabulary, language tag, text normaliser and id maps):
examples stay monolingual MLM examples tagged with the source's language, so a mixture can hold the
source, its code-switched copy, other monolingual tasks and bitext. The source may be any of our
monolingual tasks (TextTask, the embedded or `BibleTasks` Bible tasks, synthetic ones), registered
before this one (list it first in `train.user_tasks`); a plain seqio task exposes no raw text and
cannot be a source. The run manifest describes the source with the task, so both re-register in
another process.
"""

import dataclasses
import functools
import os
from typing import Any

import seqio

from flax_xalign import errors
from flax_xalign.data.transforms import code_switch as code_switch_lib
from . import registry


def _check_source(name: str, source: Any) -> seqio.Task:
  if not isinstance(source, str) or not source:
    raise errors.UserError(
        f"CodeSwitchedTask {name!r}: source must name a registered monolingual task, e.g. "
        f"'bible_grc_mlm'; got {source!r}.")
  provider = registry.get_provider(source)  # UserError with close matches when unknown.
  if isinstance(provider, seqio.Mixture):
    raise errors.UserError(
        f"CodeSwitchedTask {name!r}: source {source!r} is a mixture; code-switch one of its "
        f"monolingual tasks ({', '.join(registry.task_names(source))}) and mix the result.")
  if registry.text_loader(source) is None:
    raise errors.UserError(
        f"CodeSwitchedTask {name!r}: source {source!r} is a plain seqio task, which exposes only "
        "token ids; code-switching needs its raw text: register the text with TextTask.")
  pairs = registry.language_pairs(source)
  if pairs:
    raise errors.UserError(
        f"CodeSwitchedTask {name!r}: source {source!r} is a bitext task ({pairs[0][0]}-"
        f"{pairs[0][1]}), not monolingual; code-switch a monolingual task of the source language.")
  return provider


def _tokenize_options(source: seqio.Task) -> dict[str, Any]:
  """The source's own tokenize_and_tag settings (text normaliser, id maps)."""
  for step in source.preprocessors:
    if isinstance(step, functools.partial) and step.func is registry.tokenize_and_tag:
      return {k: step.keywords[k] for k in ("normalize", "id_maps") if k in step.keywords}
  raise errors.UserError(
      f"Task {source.name!r} is not tokenised by flax_xalign's tokenize_and_tag, so a code-switched "
      "copy cannot tokenise like it; use a TextTask source.")


@dataclasses.dataclass(frozen=True)
class CodeSwitchedTask:
  """A monolingual task whose words are switched by a bilingual dictionary at `rate`.

  Attributes:
    name: the new task's name.
    source: a registered monolingual task of ours (raw text, one language).
    dictionary: a MUSE (`source target`) or bli (`src<TAB>tgt<TAB>score`) dictionary file.
    rate: probability that a word found in the dictionary is switched, in [0, 1].
    seed: the switching draw's seed (with the example's text); another seed, another draw.
    lowercase: look words up lower-cased (the lexicons are lowercase).
  """
  name: str
  source: str
  dictionary: str
  rate: float = 0.15
  seed: int = 0
  lowercase: bool = True

  def register(self) -> "CodeSwitchedTask":
    """Registers the seqio task (idempotent); returns self."""
    where = f"CodeSwitchedTask {self.name!r}"
    if not isinstance(self.dictionary, str) or not self.dictionary:
      raise errors.UserError(f"{where}: dictionary must name a dictionary file; got {self.dictionary!r}.")
    if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not -2**63 <= self.seed < 2**63:
      raise errors.UserError(f"{where}: seed={self.seed!r} must be an integer (a 64-bit one).")
    if not isinstance(self.lowercase, bool):
      raise errors.UserError(f"{where}: lowercase={self.lowercase!r} must be True or False.")
    spec = dataclasses.replace(self, dictionary=os.path.abspath(os.path.expanduser(self.dictionary)),
                               rate=code_switch_lib.check_rate(self.rate, where=where))
    source = _check_source(self.name, self.source)
    if not os.path.isfile(spec.dictionary):
      raise errors.UserError(
          f"{where}: dictionary file {spec.dictionary} does not exist (working directory "
          f"{os.getcwd()}); write one in MUSE format ('source target' per line) or with "
          "`xalign bli --output=...`.")
    options = _tokenize_options(source)
    switch = functools.partial(
        code_switch_lib.code_switch_preprocessor, dictionary_path=spec.dictionary, rate=spec.rate,
        seed=spec.seed, lowercase=spec.lowercase, normalize=options.get("normalize", ""))
    registry.register_task(
        self.name, loader=registry.text_loader(self.source), vocabulary=registry.get_vocabulary(self.source),
        lang=registry.languages_of(self.source)[0], splits=source.splits, definition=spec, spec=spec,
        text_preprocessors=[switch], **options)
    return self

  def required_definitions(self) -> list[dict[str, Any]]:
    """The definitions that re-register the source (`registry.describe` lists them first)."""
    return registry.describe(self.source) or []
