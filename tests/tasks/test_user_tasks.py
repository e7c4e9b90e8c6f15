"""Tests for user-registered tasks (tasks/user.py): validation and registry."""

import json
import os
import subprocess
import sys

import pytest
import seqio

from flax_xalign import errors
from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.tasks import user


def _build(name, split="train"):
  provider, languages, _ = tasks.resolve(name)
  ds = pipeline.get_dataset(provider, languages=languages, split=split,
                            feature_lengths={"tokens": 13}, batch_size=2,
                            seed=0)
  return ds, languages


@pytest.fixture(scope="module")
def model(toy_corpus):
  return str(toy_corpus[1])


def _register_u_tasks(root, model):
  """u_en, u_de_en (idempotent: later tests may run alone)."""
  text = user.TextTask(name="u_en", files={"train": str(root / "en*.txt")},
                       lang="en", vocabulary_path=model).register()
  tsv = user.TsvBitextTask(name="u_de_en", files={"train": [
      str(root / "de_en.tsv")]}, lang_a="de", lang_b="en",
                           vocabulary_path=model).register()
  return text, tsv


def test_text_and_tsv_tasks_register_idempotently(toy_corpus, model):
  root, _ = toy_corpus
  text, tsv = _register_u_tasks(root, model)
  assert text.register() is text and text.register() is text
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


def test_a_glob_match_that_is_no_file_is_an_error_not_a_dropped_shard(tmp_path, model):
  import os

  shards = tmp_path / "shards"
  shards.mkdir()
  _write(shards, "a.txt", "hello world\n")
  os.symlink(shards / "gone.txt", shards / "b.txt")  # dangling: its target does not exist
  user.TextTask(name="u_dangling", files={"train": str(shards / "*.txt")}, lang="en",
                vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=r"b.txt \(from .*\*.txt\) is a symbolic link to nothing"):
    _build("u_dangling")
  os.remove(shards / "b.txt")
  os.mkfifo(shards / "c.txt")
  user.TextTask(name="u_fifo", files={"train": str(shards / "*.txt")}, lang="en", vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=r"c.txt .* is not a regular file \(a FIFO"):
    _build("u_fifo")
  os.remove(shards / "c.txt")
  os.symlink(shards / "d.txt", shards / "e.txt")
  os.symlink(shards / "e.txt", shards / "d.txt")  # a loop
  user.TextTask(name="u_loop", files={"train": str(shards / "*.txt")}, lang="en", vocabulary_path=model).register()
  with pytest.raises(errors.UserError, match=r"d.txt .* symbolic link to nothing .*loop"):
    _build("u_loop")


def test_a_file_that_cannot_be_read_is_an_error_before_training(tmp_path, model, monkeypatch):
  import os

  _write(tmp_path, "a.txt", "hello world\n")
  user.TextTask(name="u_unreadable", files={"train": str(tmp_path / "a.txt")}, lang="en",
                vocabulary_path=model).register()
  real_access = os.access  # chmod 000 does not stop root: deny the read the way it would for anyone else.
  monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).endswith("a.txt") else real_access(p, mode))
  with pytest.raises(errors.UserError, match=r"a.txt .* cannot be read \(permission denied\)"):
    _build("u_unreadable")


def test_unknown_names_suggest_close_matches(model):
  with pytest.raises(errors.UserError) as info:
    tasks.resolve("bible_en_mlmm")
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


def test_sizes_override_counts(model, toy_corpus):
  root, _ = toy_corpus
  _register_u_tasks(root, model)
  user.TextTask(name="u_sized_en", files={"train": str(root / "en.txt")},
                lang="en", vocabulary_path=model).register()
  user.AlphaMixture(name="u_sized", tasks=("u_sized_en", "u_de_en"),
                    alpha=0.5, sizes={"u_de_en": 1000}).register()
  mixture = seqio.get_mixture_or_task("u_sized")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"u_sized_en": 300 ** 0.5,
                                 "u_de_en": 1000 ** 0.5})
  with pytest.raises(errors.UserError, match="not one of its tasks"):
    user.AlphaMixture(name="u_sized2", tasks=("u_sized_en",),
                      sizes={"u_en": 5}).register()
  with pytest.raises(errors.UserError, match="positive integer"):
    user.AlphaMixture(name="u_sized3", tasks=("u_sized_en",),
                      sizes={"u_sized_en": 0}).register()


def test_paths_are_absolute_and_relative_ones_register_the_same(
    toy_corpus, model, monkeypatch):
  root, _ = toy_corpus
  monkeypatch.chdir(root)
  relative = user.TextTask(name="u_rel", files={"train": "en_dev.txt"},
                           lang="en", vocabulary_path=os.path.basename(model))
  relative.register()
  user.TextTask(name="u_rel", files={"train": [str(root / "en_dev.txt")]},
                lang="en", vocabulary_path=model).register()  # Same task.
  (definition,) = tasks.describe("u_rel")
  assert definition["args"]["files"] == {"train": [str(root / "en_dev.txt")]}
  assert definition["args"]["vocabulary_path"] == model


_FRESH_PROCESS = """
import json, sys
from tests import conftest  # Maps flax_xalign.tasks to tasks/ when not installed.
from flax_xalign import tasks
definitions = json.loads(sys.stdin.read())
tasks.register_described(definitions)
tasks.register_described(definitions)  # Idempotent.
mixture = tasks.get_provider("u_mix")
print(json.dumps({
    "languages": tasks.languages_of("u_mix"),
    "tasks": tasks.task_names("u_mix"),
    "rates": {t.name: mixture.get_rate(t) for t in mixture.tasks},
    "described": tasks.describe("u_mix"),
}))
"""


@pytest.mark.subprocess  # A fresh interpreter is the point: nothing registered but what the definitions say.
def test_describe_round_trips_through_json_in_a_fresh_process(
    toy_corpus, model):
  _register_u_tasks(toy_corpus[0], model)
  user.AlphaMixture(name="u_mix", tasks=["u_de_en", "u_en"], alpha=0.5).register()
  definitions = tasks.describe("u_mix")
  assert [d["kind"] for d in definitions] == [
      "TsvBitextTask", "TextTask", "AlphaMixture"]
  text = json.dumps(definitions)
  assert json.loads(text) == definitions
  tasks.register_described(json.loads(text))  # Same process: a no-op.
  repo = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  result = subprocess.run(
      [sys.executable, "-c", _FRESH_PROCESS], input=text, cwd="/",
      env=dict(os.environ, PYTHONPATH=repo), capture_output=True, text=True,
      check=False, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  fresh = json.loads(result.stdout.strip().splitlines()[-1])
  assert fresh["languages"] == ["de", "en"]
  assert fresh["tasks"] == ["u_de_en", "u_en"]
  assert fresh["rates"] == pytest.approx({"u_en": 340 ** 0.5,
                                          "u_de_en": 120 ** 0.5})
  assert fresh["described"] == definitions


def test_describe_kinds():
  from flax_xalign.tasks import synthetic

  assert tasks.describe("bible_grc_en_mlm_tlm") == []
  assert tasks.describe("bible_en_mlm") == []
  spec = synthetic.SyntheticTasks(transforms="inv", vocab_size=211, seed=3)
  spec.register()
  names = synthetic.names(spec.language())
  expected = [{"kind": "SyntheticTasks", "args": {
      "transforms": "inv", "vocab_size": 211, "overlap": 0.0, "seed": 3,
      "tlm_fraction": 0.25}}]
  for name in names.values():
    assert tasks.describe(name) == expected
  tasks.register_described(json.loads(json.dumps(expected)))
  with pytest.raises(errors.UserError, match="Did you mean 'u_mix'"):
    tasks.describe("u_mixx")
  with pytest.raises(errors.UserError, match="Bad task definition"):
    tasks.register_described([{"kind": "Nope", "args": {}}])
  with pytest.raises(errors.UserError, match="Bad TextTask definition"):
    tasks.register_described([{"kind": "TextTask", "args": {"name": "x"}}])


def _task_examples(name):
  ds = seqio.get_mixture_or_task(name).get_dataset(
      None, split="train", shuffle=False, num_epochs=1)
  return list(ds.as_numpy_iterator())


def test_normalize_strips_marks_before_tokenising(tmp_path, model):
  from flax_xalign.data.vocab import normalize
  from flax_xalign.data.vocab import sentencepiece as vocab_lib
  vocabulary = vocab_lib.load_vocabulary(model)
  lines = ["thé càt sät ön ä mät", "a rëd dög rän tö thë rïver", "the old tree"]
  text = _write(tmp_path, "accented.txt", "\n".join(lines) + "\n")
  tsv = _write(tmp_path, "accented.tsv", "".join(f"{l}\t{l[::-1]}\n" for l in lines))
  user.TextTask(name="u_norm_en", files={"train": text}, lang="en",
                vocabulary_path=model, normalize="nfd_strip_marks").register()
  user.TextTask(name="u_raw_en", files={"train": text}, lang="en",
                vocabulary_path=model).register()
  user.TsvBitextTask(name="u_norm_tsv", files={"train": tsv}, lang_a="de",
                     lang_b="en", vocabulary_path=model,
                     normalize="nfd_strip_marks").register()
  stripped = [normalize.normalize_text(l, "nfd_strip_marks") for l in lines]
  assert stripped[:2] == ["the cat sat on a mat", "a red dog ran to the river"]
  normalised, raw = _task_examples("u_norm_en"), _task_examples("u_raw_en")
  for line, clean, ex, ex_raw in zip(lines, stripped, normalised, raw):
    assert ex["tokens"].tolist() == vocabulary.encode(clean)
    assert ex_raw["tokens"].tolist() == vocabulary.encode(line)
  assert normalised[0]["tokens"].tolist() != raw[0]["tokens"].tolist()
  assert normalised[2]["tokens"].tolist() == raw[2]["tokens"].tolist()
  for clean, ex in zip(stripped, _task_examples("u_norm_tsv")):
    assert ex["tokens"].tolist() == vocabulary.encode(clean)
    assert ex["tokens_b"].tolist() == vocabulary.encode(clean[::-1])
  (definition,) = tasks.describe("u_norm_en")
  assert definition["args"]["normalize"] == "nfd_strip_marks"
  assert tasks.describe("u_raw_en")[0]["args"]["normalize"] == ""
  tasks.register_described(json.loads(json.dumps(tasks.describe("u_norm_tsv"))))
  # A definition written before the option existed means no normaliser.
  legacy = dict(definition["args"], name="u_legacy_en")
  del legacy["normalize"]
  tasks.register_described([{"kind": "TextTask", "args": legacy}])
  assert tasks.describe("u_legacy_en")[0]["args"]["normalize"] == ""
  with pytest.raises(errors.UserError, match=r"Task 'u_norm_bad': normalize='NFD' is not a known"):
    user.TextTask(name="u_norm_bad", files={"train": text}, lang="en",
                  vocabulary_path=model, normalize="NFD").register()
  with pytest.raises(errors.UserError, match="different definition"):
    user.TextTask(name="u_norm_en", files={"train": text}, lang="en",
                  vocabulary_path=model, normalize="lower").register()


# --- Issue 14: token-less corpora, long lines, literal special tokens ---------


@pytest.mark.parametrize("kind,content,normalize", [
    ("text", "\x01\x02\n\x03\n\x7f\x01\n", ""),
    ("tsv", "\x01\t\x02\n\x03\x04\t\x05\n", ""),
    ("text", "\u0301\u0308\n\u0300\n", "nfd_strip_marks"),  # Nothing is left once the marks go.
])
def test_a_corpus_without_a_single_token_is_refused_when_built(tmp_path, model, kind, content, normalize):
  # Before: get_dataset succeeded and the first next() searched forever (the converter filters
  # token-less examples after repeat()).
  name = f"u_tokenless_{kind}_{len(content)}"
  if kind == "tsv":
    path = _write(tmp_path, "pairs.tsv", content)
    user.TsvBitextTask(name=name, files={"train": path}, lang_a="de", lang_b="en",
                       vocabulary_path=model, normalize=normalize).register()
  else:
    path = _write(tmp_path, "lines.txt", content)
    user.TextTask(name=name, files={"train": path}, lang="en", vocabulary_path=model,
                  normalize=normalize).register()
  with pytest.raises(errors.UserError) as info:
    _build(name)
  message = str(info.value)
  assert f"Task {name!r}, split 'train'" in message and path in message
  assert "yields a single token" in message


def test_one_line_with_a_token_is_enough(tmp_path, model):
  path = _write(tmp_path, "mostly_control.txt", "\x01\x02\n" * 50 + "hello\n")
  user.TextTask(name="u_one_token_line", files={"train": path}, lang="en",
                vocabulary_path=model).register()
  ds, _ = _build("u_one_token_line")
  assert next(iter(ds))["tokens"].shape == (2, 13)


def test_long_lines_are_cut_counted_and_reported_once(tmp_path, model, capsys):
  import sentencepiece as spm

  processor = spm.SentencePieceProcessor(model_file=model)  # The reference: SentencePiece itself.
  long_a = " ".join(["river stone blue"] * 10)  # 169 characters.
  long_b = "green " * 20  # 120 characters.
  text = _write(tmp_path, "long.txt", f"short one\n{long_a}\n{long_b}\n")
  tsv = _write(tmp_path, "long.tsv", f"a b\t{long_b}\n{long_a}\tc d\n")
  user.TextTask(name="u_long_text", files={"train": text}, lang="en", vocabulary_path=model,
                max_line_chars=30).register()
  user.TsvBitextTask(name="u_long_tsv", files={"train": tsv}, lang_a="de", lang_b="en",
                     vocabulary_path=model, max_line_chars=30).register()
  got = [ex["tokens"].tolist() for ex in _task_examples("u_long_text")]
  assert got == [processor.encode(line[:30]) for line in ("short one", long_a, long_b.strip())]
  pairs = [(ex["tokens"].tolist(), ex["tokens_b"].tolist()) for ex in _task_examples("u_long_tsv")]
  assert pairs == [(processor.encode("a b"), processor.encode(long_b.strip()[:30])),
                   (processor.encode(long_a[:30]), processor.encode("c d"))]
  _task_examples("u_long_text")  # Built again: no second warning.
  warnings = [l for l in capsys.readouterr().err.splitlines() if l.startswith("warning: ")]
  assert len(warnings) == 2, warnings
  assert "task 'u_long_text', split 'train': 2 lines" in warnings[0] and text in warnings[0]
  assert "longer than 30 characters" in warnings[0] and "max_line_chars" in warnings[0]
  assert "task 'u_long_tsv', split 'train': 2 lines" in warnings[1]


def test_the_default_line_bound_keeps_ordinary_lines_and_rows_whole(tmp_path, model, capsys):
  from flax_xalign.tasks import registry

  assert user.TextTask.max_line_chars == registry.DEFAULT_MAX_LINE_CHARS == 20_000
  line = "the old tree " * 2000  # 26,000 characters: cut, but far more than any row keeps.
  path = _write(tmp_path, "book.txt", line + "\nhello\n")
  user.TextTask(name="u_book", files={"train": path}, lang="en", vocabulary_path=model).register()
  ex = _task_examples("u_book")[0]
  assert len(ex["tokens"]) < len(__import__("sentencepiece").SentencePieceProcessor(
      model_file=model).encode(line.strip()))
  assert "longer than 20000 characters" in capsys.readouterr().err
  user.TextTask(name="u_book_whole", files={"train": path}, lang="en", vocabulary_path=model,
                max_line_chars=None).register()
  assert "warning" not in capsys.readouterr().err
  with pytest.raises(errors.UserError, match="max_line_chars=0 must be a positive number"):
    user.TextTask(name="u_book_zero", files={"train": path}, lang="en", vocabulary_path=model,
                  max_line_chars=0).register()


def test_literal_special_tokens_in_text_are_text(tmp_path):
  import sentencepiece as spm

  from flax_xalign.assets import vocabulary as vocabulary_asset
  from flax_xalign.data.vocab import sentencepiece as vocab_lib
  from flax_xalign.data.vocab.specials import special_tokens_of
  from tests.conftest import tiny_sentences
  from tests.data.test_foreign_vocabulary import rebuild_as_xlmr

  # A corpus with the characters of the special spellings, so that spelling them needs no <unk>.
  corpus = tiny_sentences("en", 200, 5) + ["x < y and y > z / mask pad unk s"] * 20
  ours = vocab_lib.train_sentencepiece(corpus, vocab_size=61, model_path=tmp_path / "ours.model")
  xlmr = tmp_path / "xlmr.model"
  xlmr.write_bytes(rebuild_as_xlmr(ours.read_bytes()))
  line = "a <mask> b <s> c </s> <pad> <unk>"
  path = _write(tmp_path, "specials.txt", line + "\n")
  for tag, model_path in (("ours", ours), ("xlmr", xlmr)):
    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    assert processor.piece_to_id("<mask>") in processor.encode(line)  # SentencePiece's own reading.
    vocabulary = vocab_lib.load_vocabulary(model_path)
    specials = special_tokens_of(vocabulary)
    user.TextTask(name=f"u_literal_{tag}", files={"train": path}, lang="en",
                  vocabulary_path=str(model_path)).register()
    (ex,) = _task_examples(f"u_literal_{tag}")
    batch_encoded = vocabulary.tokenizer.encode([line])[0]  # How the aligner and featurizer encode.
    for ids in (ex["tokens"].tolist(), vocabulary.encode(line), batch_encoded):
      assert all(specials.is_regular(i) for i in ids), (tag, ids)
      assert processor.decode(ids) == line
    # The file, so the vocabulary's manifest hash, is untouched.
    assert vocabulary_asset.spec_of(vocabulary).sha256 == __import__("hashlib").sha256(
        model_path.read_bytes()).hexdigest()
    assert vocabulary.tokenizer.piece_to_id("<mask>") == specials.mask
    assert vocabulary.decode([specials.mask]) == processor.decode([specials.mask]) == "<mask>"
