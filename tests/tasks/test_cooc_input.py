"""Counting a registered task or mixture (`flax_xalign.tasks.cooc_input`) against a brute-force table.

The tasks are tiny user tasks over the toy corpus; the expected table is
counted in plain Python from the same text, encoded here
(`tests/data/cooc_reference.py`).
"""

import pytest
import sentencepiece as spm

from flax_xalign.data import cooc
from flax_xalign.errors import UserError
from flax_xalign.tasks import cooc_input
from tests.data.cooc_reference import brute_table, table_as_dict


@pytest.fixture(scope="module")
def cooc_tasks(tmp_path_factory, toy_corpus):
  """co_en (text), co_de_en (bitext), their mixture co_mix; and the sequences they hold, encoded here."""
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("cooc_corpus")
  source, model = toy_corpus
  en = [line for line in (source / "en.txt").read_text().splitlines() if line.strip()][:60]
  pairs = [line.split("\t") for line in (source / "de_en.tsv").read_text().splitlines() if line.strip()][:40]
  (root / "en.txt").write_text("\n".join(en) + "\n", encoding="utf-8")
  (root / "de_en.tsv").write_text("\n".join(f"{d}\t{e}" for d, e in pairs) + "\n", encoding="utf-8")
  for task in (user.TextTask(name="co_en", files={"train": str(root / "en.txt")}, lang="en", vocabulary_path=str(model)),
               user.TsvBitextTask(name="co_de_en", files={"train": str(root / "de_en.tsv")}, lang_a="de",
                                  lang_b="en", vocabulary_path=str(model)),
               user.AlphaMixture(name="co_mix", tasks=("co_en", "co_de_en"))):
    task.register()
  sp = spm.SentencePieceProcessor(model_file=str(model))
  # Sides are separate sequences: de (index 0) and en (index 1) of each pair never pair with each other.
  sequences = [(1, sp.encode(t.strip())) for t in en]
  sequences += [seq for d, e in pairs for seq in ((0, sp.encode(d.strip())), (1, sp.encode(e.strip())))]
  return {"root": root, "model": str(model), "sequences": sequences, "size": sp.get_piece_size(), "en": en}


def test_count_task_matches_the_brute_force_table_of_the_encoded_text(cooc_tasks):
  lines = []
  table = cooc_input.count_task("co_mix", window=2, log=lines.append)
  expected, _, c_lang = brute_table(cooc_tasks["sequences"], ("de", "en"), 2)
  got = table_as_dict(table)
  assert got.keys() == expected.keys() and all(got[k] == expected[k] for k in expected)
  info = table.info
  assert info["vocab_size"] == cooc_tasks["size"] and info["c_lang"] == c_lang
  assert info["source"]["task"] == "co_mix" and info["source"]["split"] == "train"
  assert info["source"]["examples"] == 100 and info["sequences"] == 140
  assert "tokens/s" in lines[-1] or any("tokens/s" in line for line in lines)
  assert lines[-1].startswith("cooc: 140 sequences")
  # task_sequences streams the same sides (order within a language kept), and only the listed languages.
  streamed = list(cooc_input.task_sequences("co_mix", split="train", languages=("de", "en"), vocab_size=info["vocab_size"]))
  assert sorted((lang, list(ids)) for lang, ids in streamed) == sorted(
      (lang, list(ids)) for lang, ids in cooc_tasks["sequences"])
  only_en = cooc_input.count_task("co_mix", languages=["en"], log=None)
  assert only_en.info["tokens"] == {"en": sum(len(ids) for lang, ids in cooc_tasks["sequences"] if lang == 1)}
  assert only_en.info["source"]["skipped_sides"] == 40


def test_text_sequences_encode_nonblank_lines(cooc_tasks, tmp_path):
  path = tmp_path / "t.txt"
  path.write_text("\n".join(cooc_tasks["en"][:5]) + "\n\n  \n", encoding="utf-8")
  got = list(cooc.text_sequences([str(path)], vocabulary=cooc_tasks["model"], language=1))
  assert [(lang, list(ids)) for lang, ids in got] == [(1, ids) for _, ids in cooc_tasks["sequences"][:5]]
  with pytest.raises(UserError, match="does not exist"):
    list(cooc.text_sequences([str(tmp_path / "missing.txt")], vocabulary=cooc_tasks["model"]))


def test_count_task_bad_input(cooc_tasks):
  with pytest.raises(UserError, match="Unknown"):
    cooc_input.count_task("co_no_such_task", log=None)
  with pytest.raises(UserError, match="window must be"):
    cooc_input.count_task("co_mix", window=0, log=None)
  with pytest.raises(UserError, match="split 'test'"):
    cooc_input.count_task("co_mix", split="test", log=None)
  with pytest.raises(UserError, match="corpus is empty"):
    cooc_input.count_task("co_en", languages=["fr"], log=None)
