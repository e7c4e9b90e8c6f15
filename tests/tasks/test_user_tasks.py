"""Tests for user-registered tasks (tasks/user.py): validation and registry."""

import pytest
import seqio

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.tasks import user


def _build(name, split="train"):
  return pipeline.get_dataset(name, split=split, feature_lengths={"tokens": 13},
                              batch_size=2, seed=0)


@pytest.fixture(scope="module")
def model(toy_corpus):
  return str(toy_corpus[1])


def test_text_and_tsv_tasks_register_idempotently(toy_corpus, model):
  root, _ = toy_corpus
  text = user.TextTask(name="u_en", files={"train": str(root / "en*.txt")},
                       lang="en", vocabulary_path=model)
  assert text.register() is text and text.register() is text
  tsv = user.TsvBitextTask(name="u_de_en", files={"train": [
      str(root / "de_en.tsv")]}, lang_a="de", lang_b="en",
                           vocabulary_path=model).register()
  assert tasks.languages_of("u_en") == ("en",)
  assert tasks.languages_of(tsv.name) == ("de", "en")
  mix = user.AlphaMixture(name="u_mix", tasks=["u_de_en", "u_en"], alpha=0.5)
  mix.register()
  mix.register()
  assert tasks.languages_of("u_mix") == ("de", "en")
  assert tasks.get_vocabulary("u_mix").vocab_size == 61
  mixture = seqio.get_mixture_or_task("u_mix")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"u_en": 340 ** 0.5, "u_de_en": 120 ** 0.5})
  ds, languages = _build("u_mix")
  assert languages == ("de", "en") and next(iter(ds))["tokens"].shape == (2, 13)
  with pytest.raises(errors.UserError, match="different definition"):
    user.TextTask(name="u_en", files={"train": str(root / "de.txt")},
                  lang="en", vocabulary_path=model).register()


def _write(tmp_path, name, data):
  path = tmp_path / name
  path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
  return str(path)


@pytest.mark.parametrize("kind,content,message", [
    ("tsv", "a\tb\n\nc\td\te\n", r"pairs.tsv:3: expected 2 tab-separated "
     r"columns, found 3"),
    ("tsv", "a\tb\nno tab here\n", r"pairs.tsv:2: expected 2 tab-separated "
     r"columns, found 1"),
    ("tsv", "a\tb\nc\t \n", r"pairs.tsv:2: column 2 is empty"),
    ("text", "\n  \n\n", r"corpus is empty"),
    ("text", b"fine\n\xff\xfe broken\n", r"lines.txt:2: not valid UTF-8"),
])
def test_malformed_files_name_file_and_line(tmp_path, model, kind, content,
                                            message):
  name = f"u_bad_{kind}_{abs(hash(content)) % 10**8}"
  if kind == "tsv":
    path = _write(tmp_path, "pairs.tsv", content)
    user.TsvBitextTask(name=name, files={"train": path}, lang_a="de",
                       lang_b="en", vocabulary_path=model).register()
  else:
    path = _write(tmp_path, "lines.txt", content)
    user.TextTask(name=name, files={"train": path}, lang="en",
                  vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=message):
    _build(name)


def test_missing_files_and_globs(tmp_path, model):
  user.TextTask(name="u_missing", files={"train": str(tmp_path / "no.txt")},
                lang="en", vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=r"file .*no.txt does not exist"):
    _build("u_missing")
  user.TextTask(name="u_noglob", files={"train": str(tmp_path / "*.txt")},
                lang="en", vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=r"glob .*\*.txt matches no file"):
    _build("u_noglob")
  path = _write(tmp_path, "ok.txt", "hello world\n")
  user.TextTask(name="u_badvocab", files={"train": path}, lang="en",
                vocabulary_path=str(tmp_path / "none.model")).register()
  with pytest.raises(errors.UserError, match="none.model does not exist"):
    _build("u_badvocab")
  with pytest.raises(errors.UserError, match="no split 'validation'"):
    _build("u_missing", split="validation")


def test_unknown_names_suggest_close_matches(model):
  with pytest.raises(errors.UserError) as info:
    pipeline.get_dataset("bible_en_mlmm", split="train",
                         feature_lengths={"tokens": 13}, batch_size=1, seed=0)
  assert "Did you mean 'bible_en_mlm'" in str(info.value)
  assert "TextTask" in str(info.value)
  with pytest.raises(errors.UserError, match="Did you mean 'u_en'"):
    user.AlphaMixture(name="u_mix2", tasks=["u_enn"]).register()
  with pytest.raises(errors.UserError, match="alpha=0"):
    user.AlphaMixture(name="u_mix3", tasks=["bible_en_mlm"], alpha=0).register()
  with pytest.raises(errors.UserError, match="different vocabularies"):
    user.AlphaMixture(name="u_mix4", tasks=["u_en", "bible_en_mlm"]).register()
  with pytest.raises(errors.UserError, match="not a valid task"):
    user.TextTask(name="bad name!", files={"train": "x"}, lang="en",
                  vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match="must map split names"):
    user.TextTask(name="u_nofiles", files={}, lang="en",
                  vocabulary_path=model).register()
