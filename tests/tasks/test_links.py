"""Word links given with bitext (`TsvBitextTask(links=...)`): components, per-subword groups, rows.

The expected groups are computed independently: each word tokenised on its own with the Python
SentencePiece processor (as the word aligner does), never from the task's own tf ops.
"""

import numpy as np
import pytest
import sentencepiece as spm

from flax_xalign import tasks
from flax_xalign.data import pipeline
from flax_xalign.errors import UserError
from flax_xalign.tasks import links as links_lib
from flax_xalign.tasks import user

L = 101  # Long enough that no pair of the 61-piece (mostly single-character) vocabulary is cut.
PAIRS = [("der hund sieht die katze", "the dog sees the cat"),
         ("das haus", "the house is old"),
         ("ein alter fluss läuft", "an old river runs")]
LINKS = ["0-0 1-1 2-2 3-3 4-4", "0-0 0-1 1-1", ""]


def test_word_groups_are_link_components_by_hand():
  ga, gb = links_lib.word_groups(frozenset({(0, 1), (1, 1), (2, 2)}), 4, 3)
  assert (ga, gb) == ([1, 1, 2, 0], [0, 1, 2])
  assert links_lib.word_groups(frozenset(), 2, 1) == ([0, 0], [0])
  # a-x, b-x, b-y read as a complete component also links a-y: one link more than given.
  assert links_lib.component_closure_stats([frozenset({(0, 0), (1, 0), (1, 1)})]) == {"links": 3, "closure": 4}


def _expected_groups(processor, text, word_groups):
  return [g for word, g in zip(text.split(), word_groups) for _ in processor.encode(word)]


@pytest.fixture(scope="module")
def linked_task(tmp_path_factory, toy_corpus):
  root, model = toy_corpus
  data = tmp_path_factory.mktemp("links")
  (data / "pairs.tsv").write_text("".join(f"{a}\t{b}\n" for a, b in PAIRS), encoding="utf-8")
  (data / "pairs.links").write_text("".join(f"{line}\n" for line in LINKS), encoding="utf-8")
  user.TsvBitextTask(name="links_de_en", files={"train": str(data / "pairs.tsv")}, lang_a="de", lang_b="en",
                     vocabulary_path=str(model), links={"train": str(data / "pairs.links")}).register()
  user.TextTask(name="links_en", files={"train": str(root / "en_dev.txt")}, lang="en",
                vocabulary_path=str(model)).register()
  return data, model


def _rows(name, **kwargs):
  provider, languages, _ = tasks.resolve(name)
  args = dict(split="train", feature_lengths={"tokens": L}, batch_size=1, seed=0, shuffle=False, num_epochs=1,
              pack=False, links=True)
  args.update(kwargs)
  return [{k: v[0] for k, v in b.items()}
          for b in pipeline.get_dataset(provider, languages=languages, **args).as_numpy_iterator()]


def test_rows_carry_each_subwords_word_group(linked_task):
  _, model = linked_task
  processor = spm.SentencePieceProcessor(model_file=str(model))
  rows = _rows("links_de_en")
  assert len(rows) == len(PAIRS)
  for row, (a, b), line in zip(rows, PAIRS, LINKS):
    pairs = frozenset(tuple(map(int, item.split("-"))) for item in line.split())
    ga, gb = links_lib.word_groups(pairs, len(a.split()), len(b.split()))
    side_a = row["pair_side"] == 1
    side_b = row["pair_side"] == 2
    # <s> a </s> <s> b </s>: specials carry no group.
    np.testing.assert_array_equal(row["link_groups"][side_a][1:-1], _expected_groups(processor, a, ga))
    np.testing.assert_array_equal(row["link_groups"][side_b][1:-1], _expected_groups(processor, b, gb))
    assert row["link_groups"][side_a][[0, -1]].tolist() == [0, 0]
    assert row["link_groups"][side_b][[0, -1]].tolist() == [0, 0]
    assert not row["link_groups"][row["segment_ids"] == 0].any()


def test_both_directions_and_the_continuous_layout_keep_the_links(linked_task):
  straight = _rows("links_de_en")
  both = _rows("links_de_en", both_directions=True)
  assert len(both) == 2 * len(straight)
  for row, swapped in zip(straight, both[1::2]):
    a, b = row["link_groups"][row["pair_side"] == 1], row["link_groups"][row["pair_side"] == 2]
    assert swapped["link_groups"][swapped["pair_side"] == 1].tolist() == b.tolist()
    assert swapped["link_groups"][swapped["pair_side"] == 2].tolist() == a.tolist()
  for row, continuous in zip(straight, _rows("links_de_en", pair_layout="continuous")):
    # `<s> b </s>` becomes `b </s>`: the same groups without side b's opening <s>.
    b = row["link_groups"][row["pair_side"] == 2]
    assert continuous["link_groups"][continuous["pair_side"] == 2].tolist() == b[1:].tolist()


def test_packed_mixture_rows_link_only_inside_pairs(linked_task):
  user.AlphaMixture(name="links_mix", tasks=("links_en", "links_de_en")).register()
  provider, languages, _ = tasks.resolve("links_mix")

  def first(n, **kwargs):
    ds = pipeline.get_dataset(provider, languages=languages, split="train", feature_lengths={"tokens": L},
                              batch_size=1, seed=0, **kwargs)
    return [{k: v[0] for k, v in b.items()} for b, _ in zip(ds.as_numpy_iterator(), range(n))]

  rows = first(40, links=True)
  assert not any(row["link_groups"][(row["pair_side"] == 0) & (row["segment_ids"] > 0)].any() for row in rows)
  assert any(row["link_groups"].any() for row in rows)
  # Without links=True the rows are the five features, as before.
  assert sorted(first(1)[0]) == sorted(["tokens", "lang_ids", "segment_ids", "positions", "pair_side"])


def test_a_text_whose_words_do_not_match_its_pieces_keeps_no_groups(tmp_path, toy_corpus):
  _, model = toy_corpus
  # "\u0301" alone is a word of combining marks that normalising strips to nothing: 3 words, 2 word starts.
  (tmp_path / "p.tsv").write_text("das \u0301 haus\tthe house\nder hund\tthe dog\n", encoding="utf-8")
  (tmp_path / "p.links").write_text("0-0 2-1\n0-0 1-1\n", encoding="utf-8")
  user.TsvBitextTask(name="links_mismatch", files={"train": str(tmp_path / "p.tsv")}, lang_a="de", lang_b="en",
                     vocabulary_path=str(model), normalize="nfd_strip_marks",
                     links={"train": str(tmp_path / "p.links")}).register()
  rows = _rows("links_mismatch")
  assert not rows[0]["link_groups"][rows[0]["pair_side"] == 1].any()  # Dropped, not shifted onto other words.
  assert rows[1]["link_groups"].any()


@pytest.mark.parametrize("links_text, keywords", [
    ("0-0\n", ("has 1 lines", "2 pairs", "one Pharaoh line per pair")),
    ("0-0\n0-x\n", ("p.links:2", "'0-x'", "Pharaoh")),
    ("0-0\n5-0\n", ("p.links:2", "5-0", "outside the pair", "2 source")),
], ids=["line_count", "not_a_link", "out_of_range"])
def test_bad_links_are_one_clear_error(tmp_path, toy_corpus, links_text, keywords):
  _, model = toy_corpus
  (tmp_path / "p.tsv").write_text("das haus\tthe house\nder hund\tthe dog\n", encoding="utf-8")
  (tmp_path / "p.links").write_text(links_text, encoding="utf-8")
  name = f"links_bad_{abs(hash(links_text))}"
  user.TsvBitextTask(name=name, files={"train": str(tmp_path / "p.tsv")}, lang_a="de", lang_b="en",
                     vocabulary_path=str(model), links={"train": str(tmp_path / "p.links")}).register()
  with pytest.raises(UserError) as error:
    _rows(name)
  for keyword in keywords:
    assert keyword in str(error.value), (keyword, str(error.value))


def test_links_must_name_splits_the_task_has(tmp_path, toy_corpus):
  _, model = toy_corpus
  (tmp_path / "p.tsv").write_text("das haus\tthe house\n", encoding="utf-8")
  with pytest.raises(UserError, match="links names split.*'test'.*train"):
    user.TsvBitextTask(name="links_wrong_split", files={"train": str(tmp_path / "p.tsv")}, lang_a="de",
                       lang_b="en", vocabulary_path=str(model), links={"test": "x.links"}).register()
