"""`xalign vocab` in-process (the contract tier): a SentencePiece model from text files, and
one `error:` line for bad input. The library it drives is tested in tests/data/test_vocab.py."""

import pytest

from flax_xalign.data.vocab import sentencepiece as vocab
from flax_xalign.data.vocab import specials
from tests.conftest import tiny_sentences
from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.fixture
def text(tmp_path):
  path = tmp_path / "in.txt"
  path.write_text("\n".join(tiny_sentences("en", 200)), encoding="utf-8")
  return path


def test_writes_a_model_with_the_project_specials(text, tmp_path, capfd):
  outcome = harness.run_main(capfd, "vocab", [f"--input={text}", "--vocab_size=45",
                                              f"--output={tmp_path / 'cli'}", "--model_type=bpe"])
  assert outcome.code == 0, outcome.err[-2000:]
  model = vocab.load_vocabulary(tmp_path / "cli.model")
  assert model.vocab_size == 45
  assert specials.special_tokens_of(model) == specials.PROJECT


@pytest.mark.parametrize("flags, keywords", [
    (["--input={missing}", "--vocab_size=45"], ("nope.txt does not exist",)),
    (["--input={text}", "--vocab_size=0"], ("vocab_size=0", "--vocab_size")),
    (["--input={text}", "--vocab_size=45", "--model_type=char2"], ("--model_type", "char2")),
    (["--vocab_size=45"], ("--input",)),
], ids=["missing_input", "no_room_for_pieces", "unknown_model_type", "no_input"])
def test_refuses_bad_input(flags, keywords, text, tmp_path, capfd):
  argv = [f.format(missing=tmp_path / "nope.txt", text=text) for f in flags]
  outcome = harness.run_main(capfd, "vocab", [*argv, f"--output={tmp_path / 'out'}"])
  harness.assert_user_error(outcome, *keywords)
  assert not list(tmp_path.glob("out*"))
