"""seqio tasks over the LibreOffice help text built from Debian packages.

Build the files first (`xalign debian_data --output=DIR`, see
`flax_xalign.data.sources.debian`), then register, e.g. from gin:

    DebianTasks(data_dir="/data/debian", languages=("de", "fr", "hi")).register()

=========================  ===================================  ======================
name                       examples (one help paragraph each)   languages
=========================  ===================================  ======================
`{prefix}_en`              English paragraphs (MLM)             en
`{prefix}_<lang>`          translated paragraphs (MLM)          lang
`{prefix}_en_<lang>`       English + its translation (TLM;      en, lang
                           tokens = English, tokens_b = lang)
`{prefix}_mlm_tlm`         all of the above, rate n ** alpha    en + languages
`{prefix}_mlm`             the monolingual tasks only (no       en + languages
                           bitext), rate n ** alpha
=========================  ===================================  ======================

`prefix` defaults to `debian_help`, so the mixtures are `debian_help_mlm_tlm` and
`debian_help_mlm` (the latter for continued pretraining on monolingual text only, as the
code-switching and MLM-GC experiments need). Splits are the
builder's (train / validation / test by paragraph-id hash, held out in every language).

All tasks share one SentencePiece model: `vocabulary_path`, or by default a BPE model of
`vocab_size` pieces trained on the training split of every task language the first time a
dataset is built (`help_vocabulary`; cached under DIR/vocab with a manifest of its inputs).
Languages are balanced as for the Bible model: each language's text is repeated
round((C_max / C_l) ** 0.5) times, C = characters (on the full Debian 12 build: Hindi 5
times, Chinese and Japanese twice, the others once; 32k pieces train in ~11 s on 2 cores).

Importing this module registers the default tasks when the default folder
(<data dir>/debian, `flax_xalign.data.sources.paths`) holds a build; otherwise nothing is
registered, and `DebianTasks(...).register()` stops with a UserError naming the builder
command.
"""

import dataclasses
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence

from flax_xalign import errors
from flax_xalign.data.sources import paths
from flax_xalign.data.vocab import sentencepiece as vocab_lib
from flax_xalign.data.sources.debian import SPLITS
from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.fileio import write_atomically

from . import registry, user

DEFAULT_PREFIX = "debian_help"
DEFAULT_VOCAB_SIZE = 32000
VOCAB_ALPHA = 0.5
VOCAB_MODEL_TYPE = "bpe"
# Bump when the vocabulary recipe changes in a way its manifest does not capture.
VOCAB_RECIPE_VERSION = 1
BUILD_COMMAND = "xalign debian_data --output={dir}"



def default_data_dir() -> pathlib.Path:
  return paths.data_dir() / "debian"


def _text_file(data_dir: str, lang: str, split: str) -> str:
  return os.path.join(data_dir, "help", f"{lang}.{split}.txt")


def _bitext_file(data_dir: str, lang: str, split: str) -> str:
  return os.path.join(data_dir, "help_bitext", f"en-{lang}.{split}.tsv")


def help_vocabulary(data_dir: str, languages: Sequence[str], vocab_size: int = DEFAULT_VOCAB_SIZE, *,
                    seed: int = vocab_lib.DEFAULT_SEED) -> pathlib.Path:
  """The SentencePiece model of the help text of `languages` (English included), trained on
  the training split once and cached as DIR/vocab/debian_help_<langs>_bpe<N>.model next to a
  JSON manifest of its inputs (file hashes, balance, trainer options, seed)."""
  languages = sorted(set(languages) | {"en"})
  files = {lang: _text_file(data_dir, lang, "train") for lang in languages}
  inputs = {"recipe_version": VOCAB_RECIPE_VERSION, "alpha": VOCAB_ALPHA, "seed": seed,
            "files": {lang: sha256_of(path) for lang, path in files.items()},
            "trainer": vocab_lib.trainer_options(vocab_size=vocab_size, model_type=VOCAB_MODEL_TYPE)}
  stem = pathlib.Path(data_dir) / "vocab" / f"debian_help_{'_'.join(languages)}_{VOCAB_MODEL_TYPE}{vocab_size}"
  model_path, manifest_path = stem.with_suffix(".model"), stem.with_suffix(".json")
  try:
    if model_path.exists() and json.loads(manifest_path.read_text(encoding="utf-8"))["inputs"] == inputs:
      return model_path
  except (OSError, ValueError, KeyError):
    pass
  print(f"flax_xalign: training the {vocab_size}-piece Debian help SentencePiece model into {model_path} "
        "(once)", flush=True)
  start = time.time()
  texts = {lang: pathlib.Path(path).read_text(encoding="utf-8").splitlines() for lang, path in files.items()}
  chars = {lang: max(1, sum(map(len, lines))) for lang, lines in texts.items()}
  most = max(chars.values())
  repeats = {lang: max(1, round((most / chars[lang]) ** (1.0 - VOCAB_ALPHA))) for lang in texts}
  sentences = [line for lang in languages for line in texts[lang] * repeats[lang]]
  vocab_lib.train_sentencepiece(sentences, vocab_size=vocab_size, model_path=model_path,
                                model_type=VOCAB_MODEL_TYPE, seed=seed)
  manifest = {"inputs": inputs, "built": {"repeats": repeats, "sentences": len(sentences),
                                          "seconds": round(time.time() - start, 1)}}
  write_atomically(manifest_path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
  return model_path


@dataclasses.dataclass(frozen=True)
class HelpVocabularyPath:
  """A `LazyVocabulary` resolver: `help_vocabulary` of a build, trained on first use."""
  data_dir: str
  languages: tuple[str, ...]
  vocab_size: int

  def __call__(self) -> str:
    return str(help_vocabulary(self.data_dir, self.languages, self.vocab_size))


def _built_languages(data_dir: str) -> list[str]:
  manifest_path = os.path.join(data_dir, "manifest.json")
  if not os.path.isfile(manifest_path):
    raise errors.UserError(
        f"No Debian help data in {data_dir} (no manifest.json); build it with "
        f"`{BUILD_COMMAND.format(dir=data_dir)}` (it names the Debian packages to install or unpack).")
  with open(manifest_path, encoding="utf-8") as f:
    help_counts = json.load(f).get("counts", {}).get("help", {})
  return sorted(lang for lang in help_counts if lang != "en")


@dataclasses.dataclass(frozen=True)
class DebianTasks:
  """The help-text tasks of a Debian build (see the module docstring).

  Attributes:
    data_dir: the builder's output folder ("" = <data dir>/debian).
    languages: languages besides English (() = every help language of the build).
    vocabulary_path: a SentencePiece model with the five specials ("" = train one,
      `help_vocabulary`).
    vocab_size: pieces of the trained model (ignored with `vocabulary_path`).
    alpha: the mixture's exponent (rates n ** alpha).
    prefix: names are `{prefix}_en`, `{prefix}_<lang>`, `{prefix}_en_<lang>`, `{prefix}_mlm_tlm`.
    normalize: text normaliser before tokenising (`flax_xalign.data.vocab.normalize`).
  """
  data_dir: str = ""
  languages: Sequence[str] = ()
  vocabulary_path: str = ""
  vocab_size: int = DEFAULT_VOCAB_SIZE
  alpha: float = registry.DEFAULT_ALPHA
  prefix: str = DEFAULT_PREFIX
  normalize: str = ""

  def names(self, languages: Sequence[str]) -> dict[str, str]:
    """kind -> task name: "en", each language, "en_<lang>", "mlm_tlm" and "mlm"."""
    kinds = ["en", *languages, *(f"en_{lang}" for lang in languages), "mlm_tlm", "mlm"]
    return {kind: f"{self.prefix}_{kind}" for kind in kinds}

  def _resolved(self) -> "DebianTasks":
    data_dir = os.path.abspath(os.path.expanduser(self.data_dir or str(default_data_dir())))
    built = _built_languages(data_dir)
    languages = (self.languages,) if isinstance(self.languages, str) else tuple(self.languages)
    languages = tuple(sorted(set(languages or built)))
    absent = [lang for lang in languages if lang not in built]
    if absent or not languages:
      raise errors.UserError(
          f"DebianTasks: {data_dir} has no help text for {absent or 'any language'} (built: "
          f"{', '.join(built) or 'none'}); rebuild with `{BUILD_COMMAND.format(dir=data_dir)} "
          f"--languages={','.join(languages or ['de'])}` or choose from the built languages.")
    for lang in ("en",) + languages:
      for split in SPLITS:
        paths_ = [_text_file(data_dir, lang, split)] + ([] if lang == "en" else [_bitext_file(data_dir, lang, split)])
        for path in paths_:
          if not os.path.isfile(path):
            raise errors.UserError(f"DebianTasks: {path} is missing; rebuild with "
                                   f"`{BUILD_COMMAND.format(dir=data_dir)}`.")
    if not isinstance(self.vocab_size, int) or self.vocab_size <= vocab_lib.NUM_SPECIAL_TOKENS:
      raise errors.UserError(f"DebianTasks: vocab_size={self.vocab_size!r} must be an integer above "
                             f"{vocab_lib.NUM_SPECIAL_TOKENS}.")
    vocabulary_path = (user._vocabulary_path(self.prefix, self.vocabulary_path) if self.vocabulary_path else "")
    return dataclasses.replace(self, data_dir=data_dir, languages=languages, vocabulary_path=vocabulary_path,
                               alpha=float(self.alpha), normalize=user._normalizer(self.prefix, self.normalize))

  def register(self) -> "DebianTasks":
    """Registers the tasks and their mixture (idempotent); returns self.

    Raises:
      UserError: no build in `data_dir` (names the builder command), a language not built,
        a missing file, or a name registered with another definition.
    """
    spec = self._resolved()
    names = self.names(spec.languages)
    vocabulary = (user._vocabulary(spec.vocabulary_path) if spec.vocabulary_path else vocab_lib.LazyVocabulary(
        HelpVocabularyPath(spec.data_dir, spec.languages, spec.vocab_size)))
    common = {"vocabulary": vocabulary, "splits": SPLITS, "spec": spec, "normalize": spec.normalize}

    def files(path_of, lang: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
      return tuple((split, (path_of(spec.data_dir, lang, split),)) for split in sorted(SPLITS))

    for lang in ("en",) + spec.languages:
      name = names[lang]
      loader = user.FileLoader(name, files(_text_file, lang), tsv=False)
      registry.register_task(name, loader=loader, lang=lang, definition=(spec, lang), **common)
    for lang in spec.languages:
      name = names[f"en_{lang}"]
      loader = user.FileLoader(name, files(_bitext_file, lang), tsv=True)
      registry.register_task(name, loader=loader, lang="en", lang_b=lang, definition=(spec, f"en_{lang}"),
                             **common)
    members = [names[kind] for kind in ("en", *spec.languages, *(f"en_{lang}" for lang in spec.languages))]
    registry.register_mixture(names["mlm_tlm"], members, alpha=spec.alpha, definition=(spec, "mlm_tlm"),
                              spec=spec)
    registry.register_mixture(names["mlm"], [names[kind] for kind in ("en", *spec.languages)], alpha=spec.alpha,
                              definition=(spec, "mlm"), spec=spec)
    return self


def register_default() -> bool:
  """Registers `DebianTasks()` if the default folder holds a build; True if it did."""
  if not (default_data_dir() / "manifest.json").is_file():
    return False
  try:
    DebianTasks().register()
  except errors.UserError as e:  # A broken build must not break importing the tasks package.
    print(f"flax_xalign: Debian help tasks not registered: {e}", file=sys.stderr)
    return False
  return True


register_default()
