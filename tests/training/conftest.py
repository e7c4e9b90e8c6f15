"""A tiny two-language corpus, vocabulary and user tasks for trainer tests."""

import os
import random

import pytest

WORDS_EN = "the a house dog cat sees runs big small red green old new tree river".split()
WORDS_DE = "das ein haus hund katze sieht läuft groß klein rot grün alt neu baum fluss".split()


def _sentences(rng, n):
  pairs = []
  for _ in range(n):
    idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(3, 9))]
    pairs.append((" ".join(WORDS_EN[i] for i in idx), " ".join(WORDS_DE[i] for i in idx)))
  return pairs


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
  """Files, an 83-piece vocabulary and registered tasks `tiny_en`, `tiny_de`, `tiny_de_en`."""
  from flax_xalign.data import vocab
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("tiny_corpus")
  rng = random.Random(0)
  files = {}
  for split, n in (("train", 400), ("validation", 60)):
    pairs = _sentences(rng, n)
    for lang, col in (("en", 0), ("de", 1)):
      path = root / f"{lang}.{split}.txt"
      path.write_text("\n".join(p[col] for p in pairs) + "\n", encoding="utf-8")
      files[(lang, split)] = str(path)
    tsv = root / f"de_en.{split}.tsv"
    tsv.write_text("\n".join(f"{d}\t{e}" for e, d in pairs) + "\n", encoding="utf-8")
    files[("de_en", split)] = str(tsv)
  model = vocab.train_sentencepiece(
      [p for (k, s), f in files.items() if k != "de_en" for p in open(f, encoding="utf-8")],
      vocab_size=83, model_path=root / "spm.model", model_type="bpe")
  tasks = [
      user.TextTask(name="tiny_en", files={s: files[("en", s)] for s in ("train", "validation")},
                    lang="en", vocabulary_path=str(model)),
      user.TextTask(name="tiny_de", files={s: files[("de", s)] for s in ("train", "validation")},
                    lang="de", vocabulary_path=str(model)),
      user.TsvBitextTask(name="tiny_de_en", files={s: files[("de_en", s)] for s in ("train", "validation")},
                         lang_a="de", lang_b="en", vocabulary_path=str(model)),
      user.AlphaMixture(name="tiny_mix", tasks=("tiny_en", "tiny_de", "tiny_de_en")),
  ]
  for t in tasks:
    t.register()
  return {"root": root, "files": files, "vocab": str(model), "tasks": tasks}


@pytest.fixture
def tiny_encoder():
  from flax_xalign.models.config import EncoderConfig

  return EncoderConfig(num_layers=2, embed_dim=24, num_heads=3, head_dim=8, mlp_dim=40,
                       max_positions=32, num_languages=3, dropout_rate=0.1, attention_dropout_rate=0.0)


def tree_snapshot(path):
  """{relative path: (size, mtime_ns)} of every file under `path`."""
  out = {}
  for dirpath, _, names in os.walk(path):
    for name in names:
      full = os.path.join(dirpath, name)
      st = os.stat(full)
      out[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
  return out
