"""`xalign cooc` in-process (the contract tier): counting a task and text files, --inspect,
and one error per bad input."""

import json

import numpy as np
import pytest
import sentencepiece as spm

from flax_xalign.cli import cooc as command
from flax_xalign.data import cooc

pytestmark = pytest.mark.contract


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, toy_corpus):
  """cli_en: 50 English lines of the toy corpus as a registered task; the same lines as a text file."""
  from flax_xalign.tasks import user

  root = tmp_path_factory.mktemp("cooc_cli")
  source, model = toy_corpus
  lines = [line for line in (source / "en.txt").read_text().splitlines() if line.strip()][:50]
  (root / "en.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  user.TextTask(name="cli_en", files={"train": str(root / "en.txt")}, lang="en", vocabulary_path=str(model)).register()
  return {"root": root, "model": str(model), "lines": lines}


def test_counting_a_task_writes_the_table_and_manifest(corpus, tmp_path, capsys):
  out = tmp_path / "table"
  assert command.main(["--task=cli_en", "--window=2", f"--output={out}"]) == 0
  printed = capsys.readouterr().out
  assert "tokens/s" in printed and "wrote" in printed
  info = json.loads((out / "cooc.json").read_text())
  sp = spm.SentencePieceProcessor(model_file=corpus["model"])
  assert info["tokens"] == {"en": sum(len(sp.encode(line.strip())) for line in corpus["lines"])}
  assert info["window"] == 2 and info["source"]["task"] == "cli_en" and info["sequences"] == 50
  table = cooc.load_table(str(out))
  assert table.info == info and table.indices.size == info["nnz"]

  # The same lines as a text file give the same table (and fingerprint).
  text_out = tmp_path / "text"
  assert command.main([f"--text={corpus['root'] / 'en.txt'}:en", f"--vocabulary={corpus['model']}",
                       f"--output={text_out}"]) == 0
  text = cooc.load_table(str(text_out))
  assert text.info["corpus_fingerprint"] == info["corpus_fingerprint"]
  assert text.log_x.tobytes() == table.log_x.tobytes() and text.indices.tobytes() == table.indices.tobytes()
  # Both record the vocabulary they were counted with, as a run's manifest hashes it (a run with another
  # vocabulary of the same size refuses the table: tests/assets/test_cooc_asset.py).
  from flax_xalign.data.vocab.fingerprint import model_sha256
  from flax_xalign.data.vocab.sentencepiece import load_vocabulary

  expected = model_sha256(load_vocabulary(corpus["model"]))
  assert info["source"][cooc.VOCABULARY_KEY] == expected
  assert text.info["source"][cooc.VOCABULARY_KEY] == expected
  capsys.readouterr()

  # --inspect by piece and by id: the top pairs of the row, X descending.
  busiest = int(np.argmax(np.diff(table.indptr)))
  piece = sp.id_to_piece(busiest)
  for token in (piece, str(busiest)):
    assert command.main([f"--inspect={out}", f"--token={token}", "--top=3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"token {busiest} {piece!r}")
    rows = [line.split() for line in lines[2:]]
    expected = table.top_pairs(busiest, 3)
    assert [int(r[1]) for r in rows] == [b for b, _ in expected]
    assert [float(r[-2]) for r in rows] == [pytest.approx(x, abs=1e-4) for _, x in expected]
  # The text table knows its vocabulary from the manifest.
  assert command.main([f"--inspect={text_out}", f"--token={piece}", "--top=2"]) == 0
  assert capsys.readouterr().out.startswith(f"token {busiest} {piece!r}")


@pytest.mark.parametrize("argv, match", [
    (["--task=cli_no_such_task", "--output=OUT"], "Unknown task"),
    (["--task=cli_en"], "--output=DIR is missing"),
    (["--task=cli_en", "--window=0", "--output=OUT"], "--window must be"),
    ([], "count either a task"),
    (["--text=missing.txt:en", "--vocabulary=MODEL", "--output=OUT"], "does not exist"),
    (["--text=EN", "--output=OUT"], "--text needs --vocabulary"),
    (["--inspect=OUT"], "needs --token"),
    (["--inspect=OUT", "--token=3"], "cooc.npz does not exist"),
])
def test_bad_input_is_one_user_error(corpus, tmp_path, capsys, argv, match):
  argv = [a.replace("OUT", str(tmp_path / "out")).replace("MODEL", corpus["model"])
          .replace("EN", str(corpus["root"] / "en.txt") + ":en") for a in argv]
  assert command.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and match in err and "Traceback" not in err


def test_inspect_unknown_piece_and_id_outside_the_vocabulary(corpus, tmp_path, capsys):
  out = tmp_path / "t"
  assert command.main([f"--text={corpus['root'] / 'en.txt'}:en", f"--vocabulary={corpus['model']}",
                       f"--output={out}"]) == 0
  capsys.readouterr()
  assert command.main([f"--inspect={out}", "--token=qqqzzz"]) == 2
  assert "is not a piece" in capsys.readouterr().err
  assert command.main([f"--inspect={out}", "--token=100000"]) == 2
  assert "outside the table's vocabulary" in capsys.readouterr().err
