"""`xalign align` in-process (the contract tier), on the session's shared MODEL_DIR
(tests/shared_run.py) and, for --bible_gold, a random tiny encoder over the Bible vocabulary."""

import pytest

from flax_xalign.cli import align as align_main
from flax_xalign.evaluation.word_alignment import aer
from tests.evaluation.test_word_align import DE, EN
from tests.hardening.harness import tree_digest

pytestmark = pytest.mark.contract

PAIRS = [(DE[5:9], EN[6:8]), (DE[:6], EN[:6]), (DE[9:12], EN[10:13])]


@pytest.fixture(scope="module")
def checkpoint(shared_run):
  """The session's shared MODEL_DIR (tests/shared_run.py): 4 steps on the tiny de/en corpus, 2 layers."""
  return shared_run["dir"]


@pytest.fixture
def pairs_file(tmp_path):
  path = tmp_path / "pairs.tsv"
  path.write_text("".join(f"{' '.join(a)}\t{' '.join(b)}\n" for a, b in PAIRS), encoding="utf-8")
  return path


def _expect_error(capsys, code, *needles):
  assert code == 2
  err = capsys.readouterr().err
  assert [line for line in err.splitlines() if line.startswith("error:")], err
  assert "Traceback" not in err
  for needle in needles:
    assert needle in err, (needle, err)


def test_align_writes_pharaoh_and_scores_against_gold(tmp_path, checkpoint, pairs_file, capsys):
  out = tmp_path / "out" / "links.txt"
  gold = tmp_path / "gold.txt"
  gold.write_text("0-0 1-1\n0-0 1?1\n\n")
  code = align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={out}",
                          "--layer=2", "--method=sinkhorn", f"--gold={gold}", "--batch_size=4"])
  assert code == 0, capsys.readouterr().err
  text = capsys.readouterr().out
  assert "(de -> en)" in text and "sinkhorn layer 2: P " in text and "AER" in text
  predicted = aer.read_pharaoh(str(out))
  assert len(predicted) == len(PAIRS) and all(p.sure for p in predicted)
  for (a, b), p in zip(PAIRS, predicted):
    assert all(i < len(a) and j < len(b) for i, j in p.sure)
  assert sorted(x.name for x in out.parent.iterdir()) == ["links.txt"]  # No temporary file left.


def test_sweep_prints_table_writes_plot_and_best_links(tmp_path, checkpoint, pairs_file, capsys):
  out = tmp_path / "links.txt"
  gold = tmp_path / "gold.naacl"
  gold.write_text("1 1 1\n2 1 1 S\n2 2 2 P\n3 3 3\n")
  code = align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={out}",
                          f"--gold={gold}", "--gold_format=naacl", "--sweep", "--similarity=cosine",
                          "--batch_size=4"])
  assert code == 0, capsys.readouterr().err
  text = capsys.readouterr().out
  assert "aligner settings: encoding=" in text and "similarity=cosine (as passed)" in text
  assert "| method | layer | P | R | F1 | AER |" in text
  for method in ("argmax", "itermax", "sinkhorn"):
    assert f"| {method} | 2 |" in text
  assert (tmp_path / "links_layers.png").stat().st_size > 1000
  assert len(aer.read_pharaoh(str(out))) == len(PAIRS)


@pytest.mark.parametrize("bad, where", [("ein haus the house", ":2:"), ("a\tb\tc", ":2:"),
                                        ("das haus\t  ", ":2:"), ("", ":2:")])
def test_malformed_input_line_is_one_error(tmp_path, checkpoint, bad, where, capsys):
  path = tmp_path / "bad.tsv"
  path.write_text(f"das haus\tthe house\n{bad}\nder hund\tthe dog\n", encoding="utf-8")
  out = tmp_path / "out.txt"
  code = align_main.main([f"--checkpoint={checkpoint}", f"--input={path}", f"--output={out}"])
  _expect_error(capsys, code, f"bad.tsv{where}", "source words<TAB>target words")
  assert not out.exists()


def test_other_bad_input(tmp_path, checkpoint, pairs_file, capsys):
  out = str(tmp_path / "out.txt")
  base = [f"--input={pairs_file}", f"--output={out}"]
  _expect_error(capsys, align_main.main([f"--checkpoint={tmp_path / 'nope'}", *base]), "no checkpoint")
  assert not (tmp_path / "nope").exists()
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", *base, "--sweep"]), "pass --gold")
  gold = tmp_path / "short.txt"
  gold.write_text("0-0\n")
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", *base, f"--gold={gold}"]),
                "has 1 entries but", "3 pairs")
  gold.write_text("1-1\n1-1\n1-1 40-1\n")  # a link past the last source word of pair 3
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", *base, f"--gold={gold}"]),
                "entry 3: link 40-1 lies outside the pair")
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", *base, "--layer=7"]),
                "layer 7 is outside 0..2")
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", *base, "--src_lang=fr"]),
                "'fr' is not one of the checkpoint's languages")
  assert not (tmp_path / "out.txt").exists()


def test_align_a_checkpoint_made_by_train(checkpoint, tmp_path, pairs_file, capsys):
  before = tree_digest(checkpoint)
  out = tmp_path / "links.txt"
  assert align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={out}"]) == 0
  assert "(de -> en)" in capsys.readouterr().out
  assert len(aer.read_pharaoh(str(out))) == len(PAIRS)
  assert tree_digest(checkpoint) == before  # The command only reads the run.


def test_normalize_flag_strips_marks_from_every_word(tmp_path, checkpoint, pairs_file, capsys):
  from flax_xalign.data.vocab.normalize import normalize_text

  marks = str.maketrans({"a": "à", "e": "é", "u": "ü", "o": "ö"})
  accented, unmarked = tmp_path / "accented.tsv", tmp_path / "unmarked.tsv"
  text = "".join(f"{' '.join(a).translate(marks)}\t{' '.join(b).translate(marks)}\n" for a, b in PAIRS)
  accented.write_text(text, encoding="utf-8")
  unmarked.write_text(normalize_text(text, "nfd_strip_marks"), encoding="utf-8")
  assert "läüft" in accented.read_text(encoding="utf-8") and "lauft" in unmarked.read_text(encoding="utf-8")
  plain, stripped, raw = tmp_path / "plain.txt", tmp_path / "stripped.txt", tmp_path / "raw.txt"
  common = [f"--checkpoint={checkpoint}", "--layer=2", "--method=argmax", "--batch_size=4"]
  assert align_main.main([*common, f"--input={unmarked}", f"--output={plain}"]) == 0
  assert align_main.main([*common, f"--input={accented}", f"--output={stripped}",
                          "--normalize=nfd_strip_marks"]) == 0
  assert align_main.main([*common, f"--input={accented}", f"--output={raw}"]) == 0
  assert stripped.read_text() == plain.read_text()
  assert raw.read_text() != plain.read_text()  # The marks matter without the flag.
  capsys.readouterr()
  with pytest.raises(SystemExit):
    align_main.main([*common, f"--input={pairs_file}", f"--output={plain}", "--normalize=nfd"])
  assert "invalid choice: 'nfd'" in capsys.readouterr().err


@pytest.mark.slow  # Its own model over the Bible vocabulary; every layer and method on all 884 test verses.
def test_bible_gold_option_writes_inputs_and_scores(tmp_path, bible_data_dir, capsys):
  """--bible_gold=test writes the embedded verses and gold beside --output and sweeps against them."""
  import flax.linen as nn
  import jax

  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel
  from tests.testlib import tiny_encoder_config

  vocabulary = vocab.load_vocabulary(vocab.bible_vocabulary())
  config = tiny_encoder_config(vocab_size=vocabulary.vocab_size, num_languages=0, max_positions=260)
  params = nn.meta.unbox(PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
                         .init(jax.random.key(0), batch=1, length=8))
  model_dir = tmp_path / "model"
  write_model_dir(str(model_dir), config=config, params=params, vocabulary=vocabulary, languages=["grc", "en"],
                  language_pairs=[("grc", "en")])
  out = tmp_path / "aer" / "links.txt"
  code = align_main.main([f"--checkpoint={model_dir}", "--bible_gold=test", f"--output={out}", "--sweep",
                          "--encoding=separate", "--normalize=nfd_strip_marks", "--batch_size=32"])
  assert code == 0, capsys.readouterr().err
  printed = capsys.readouterr().out
  assert all(f"| {method} | {layer} |" in printed for method in ("argmax", "itermax", "sinkhorn")
             for layer in range(3))
  lines = (tmp_path / "aer" / "grc_en.test.tsv").read_text(encoding="utf-8").splitlines()
  gold = (tmp_path / "aer" / "grc_en.test.pharaoh").read_text().splitlines()
  assert len(lines) == len(gold) == len(out.read_text().splitlines()) == 884
  assert "CC BY 4.0" in (tmp_path / "aer" / "grc_en.NOTICE").read_text()
  code = align_main.main([f"--checkpoint={model_dir}", "--bible_gold=test", f"--input={tmp_path / 'x.tsv'}",
                          f"--output={out}"])
  _expect_error(capsys, code, "--bible_gold replaces --input")


def test_solver_and_layout_flags(tmp_path, checkpoint, pairs_file, capsys):
  released = tmp_path / "released.txt"
  code = align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={released}",
                          "--layer=2", "--batch_size=4", "--sinkhorn_order=columns_first",
                          "--sinkhorn_extraction=pi_xi", "--pair_layout=continuous", "--mu=1.0",
                          "--sinkhorn_iters=2"])
  assert code == 0, capsys.readouterr().err
  text = capsys.readouterr().out
  assert "continuous pair layout" in text and "columns_first" in text and "pi_xi extraction" in text
  assert len(aer.read_pharaoh(str(released))) == len(PAIRS)
  default = tmp_path / "default.txt"
  assert align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={default}",
                          "--layer=2", "--batch_size=4"]) == 0
  assert "restart pair layout; clamped kernel, rows_first" in capsys.readouterr().out  # The manifest's layout.
  entropic = tmp_path / "entropic.txt"
  assert align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}", f"--output={entropic}",
                          "--layer=2", "--sinkhorn_kernel=entropic", "--no-relative_mu", "--mu=0.5"]) == 0
  capsys.readouterr()
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", f"--input={pairs_file}",
                                         f"--output={default}", "--mu=0"]), "AlignmentSolver.mu must be")


def test_bible_gold_files_never_replace_a_users_file_of_that_name(tmp_path, checkpoint, capsys):
  """`--bible_gold` writes grc_en.<split>.* beside --output: a different file of that name is refused, untouched."""
  mine = tmp_path / "grc_en.test.tsv"
  mine.write_text("my own notes\n")
  _expect_error(capsys, align_main.main([f"--checkpoint={checkpoint}", "--bible_gold=test",
                                         f"--output={tmp_path / 'links.txt'}"]),
                "grc_en.test.tsv exists and is not the embedded test gold")
  assert mine.read_text() == "my own notes\n"
