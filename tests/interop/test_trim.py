"""Vocabulary trimming: segmentation of the corpus, hidden states and logits are unchanged; the command
`xalign trim` (the contract tier: a smoke run and bad input as one `error:` line)."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
import seqio
import sentencepiece as spm

from flax_xalign.cli import trim as trim_cli
from flax_xalign.errors import UserError
from flax_xalign.interop import trim
from flax_xalign.interop.model_dir import write_model_dir
from flax_xalign.runs import Run
from flax_xalign.models.encoder import Encoder
from flax_xalign.objectives.model import PretrainingModel
from tests import testlib
from tests.hardening import harness


@pytest.fixture(scope="module")
def big_model(tmp_path_factory, tiny_corpus):
  """An 'imported' model whose unigram vocabulary was trained on more text than tiny_en uses."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  import random

  root = tmp_path_factory.mktemp("trim")
  rng = random.Random(3)
  words = ["".join(rng.choice("zqxjkvwyfgh") for _ in range(rng.randint(3, 7))) for _ in range(400)]
  extra = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(600)]
  sentences = [line.strip() for line in open(tiny_corpus["files"][("en", "train")], encoding="utf-8")] + extra
  path = vocab.train_sentencepiece(sentences, vocab_size=120, model_path=root / "big.model", model_type="unigram")
  vocabulary = seqio.SentencePieceVocabulary(str(path), extra_ids=0)
  config = testlib.tiny_encoder_config(vocab_size=120, num_languages=0, dropout_rate=0.0)
  model = PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
  params = nn.meta.unbox(model.init(jax.random.key(9), batch=1, length=8))
  params["mlm_head"]["output_bias"] = jax.random.normal(jax.random.key(1), (120,))  # Non-trivial bias.
  model_dir = root / "model"
  write_model_dir(str(model_dir), config=config, params=params, vocabulary=vocabulary, languages=["en"],
                  notice="weights licence")
  return model_dir


def _encode_all(model, params, rows):
  """Hidden states [n, length, embed] and MLM logits of `rows` (id lists), in one padded batch.

  One jitted call per model: applying the encoder op by op to each row of its own length compiled every
  op again per length (the test took ~100 s). Padding is segment 0, which attention never reads, so the
  real positions are what each row gives on its own.
  """
  length = max(map(len, rows))
  ids, segments = np.zeros((len(rows), length), np.int32), np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)], segments[i, :len(row)] = row, 1
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), ids.shape)

  @jax.jit
  def encode(params, ids, segments):
    out = model.encoder.apply({"params": params}, ids, lang_ids=None, positions=positions, segment_ids=segments,
                              deterministic=True)
    return out.hidden, model.encoder.apply({"params": params}, out.hidden, method=Encoder.mlm_logits)

  hidden, logits = encode(params, ids, segments)
  return np.asarray(hidden), np.asarray(logits)


def test_trim_keeps_segmentation_states_and_logits(big_model, tmp_path, tiny_corpus):
  output = tmp_path / "trimmed"
  summary = trim.trim_model_dir(str(big_model), "tiny_en", str(output), verbose=False)
  assert 5 < summary["pieces_after"] < summary["pieces_before"] == 120
  old, new = Run.open(str(big_model)), Run.open(str(output))
  old_model, old_params, old_run = old.model, old.params(), old.spec
  new_model, new_params, new_run = new.model, new.params(), new.spec
  assert new_run.model.vocab_size == summary["pieces_after"]
  assert new_run.vocabulary.specials == old_run.vocabulary.specials.__class__(
      **{**old_run.vocabulary.specials.as_dict(), "end_regular": None})  # Same specials; ids below 5 kept.
  assert (output / "NOTICE").read_text() == "weights licence"
  old_vocab, new_vocab = old.vocabulary(), new.vocabulary()
  old_sp = spm.SentencePieceProcessor(model_proto=old_vocab.sp_model)
  keep = np.asarray([old_sp.piece_to_id(new_vocab.tokenizer.id_to_piece(i)) for i in range(new_vocab.vocab_size)])
  texts = list(trim.corpus_texts("tiny_en"))[:20]
  old_rows, new_rows = [old_vocab.encode(t) for t in texts], [new_vocab.encode(t) for t in texts]
  for old_ids, new_ids in zip(old_rows, new_rows):
    np.testing.assert_array_equal(keep[new_ids], old_ids)
  old_hidden, old_logits = _encode_all(old_model, old_params, old_rows)
  new_hidden, new_logits = _encode_all(new_model, new_params, new_rows)
  for i, ids in enumerate(old_rows):
    n = len(ids)
    np.testing.assert_array_equal(new_hidden[i, :n], old_hidden[i, :n])
    np.testing.assert_allclose(new_logits[i, :n], old_logits[i, :n][:, keep], rtol=1e-6, atol=1e-6)
  # Text the corpus never used is absent.
  pieces = [new_vocab.tokenizer.id_to_piece(i) for i in range(new_vocab.vocab_size)]
  corpus_letters = set(open(tiny_corpus["files"][("en", "train")], encoding="utf-8").read())
  foreign = set("zqxjkvwyfgh") - corpus_letters  # Letters only the extra words use.
  assert foreign and not foreign & set("".join(p for p in pieces if not p.startswith("<")))


def test_bpe_models_and_unknown_tasks_are_refused(big_model, tmp_path, tiny_corpus):
  bpe = open(tiny_corpus["vocab"], "rb").read()  # The tiny corpus vocabulary is BPE.
  with pytest.raises(UserError, match="only unigram"):
    trim.kept_ids(bpe, ["the house"])
  with pytest.raises(UserError, match="Unknown task"):
    trim.trim_model_dir(str(big_model), "no_such_task", str(tmp_path / "x"), verbose=False)
  assert trim_cli.main([f"--checkpoint={big_model}", "--task=no_such_task", f"--output={tmp_path / 'y'}"]) == 2


def test_normalised_forms_and_import_then_trim(big_model, tmp_path, tiny_corpus):
  import shutil

  from flax_xalign.tasks import user

  path = tmp_path / "greek.txt"
  path.write_text("Ἐν ἀρχῇ ἦν ὁ λόγος\n", encoding="utf-8")
  user.TextTask(name="trim_greek", files={"train": str(path)}, lang="grc",
                vocabulary_path=tiny_corpus["vocab"]).register()
  assert list(trim.corpus_texts("trim_greek")) == ["Ἐν ἀρχῇ ἦν ὁ λόγος"]
  assert list(trim.corpus_texts("trim_greek", normalizers=("nfd_strip_marks",))) == [
      "Ἐν ἀρχῇ ἦν ὁ λόγος", "Εν αρχη ην ο λογος"]
  # --trim_vocab_to: the import goes to a scratch dir beside the output, which is removed afterwards.
  out = tmp_path / "out" / "trimmed"
  summary = trim.import_trimmed(lambda scratch: shutil.copytree(big_model, scratch), str(out), "tiny_en")
  assert summary["pieces_after"] < 120 and sorted(p.name for p in out.parent.iterdir()) == ["trimmed"]
  with pytest.raises(UserError, match="Unknown task"):
    trim.import_trimmed(lambda scratch: pytest.fail("imported before the task was checked"), str(out), "nope")


# ------------------------------------------------------------ the command (contract tier)


@pytest.mark.contract
def test_trim_command_writes_the_trimmed_model_dir_and_prints_the_summary(big_model, tmp_path, capsys):
  output = tmp_path / "trimmed"
  assert trim_cli.main([f"--model_dir={big_model}", "--task=tiny_en", f"--output={output}", "--splits=train"]) == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["pieces_before"] == 120 and 5 < summary["pieces_after"] < 120
  assert Run.open(str(output)).spec.model.vocab_size == summary["pieces_after"]


@pytest.mark.contract
@pytest.mark.parametrize("case", ["bpe_vocabulary", "unknown_task", "missing_model_dir", "unknown_normaliser"])
def test_trim_command_refuses_bad_input(case, big_model, shared_run, tmp_path, capfd):
  output = tmp_path / "out"
  argv, keywords = {
      # The shared run's vocabulary is BPE (tests/shared_run.py): trimming keeps only unigram models exact.
      "bpe_vocabulary": ([f"--model_dir={shared_run['dir']}", "--task=tiny_en"], ("only unigram",)),
      "unknown_task": ([f"--model_dir={big_model}", "--task=no_such_task"], ("no_such_task",)),
      "missing_model_dir": ([f"--model_dir={tmp_path / 'typo'}", "--task=tiny_en"], ("typo",)),
      "unknown_normaliser": ([f"--model_dir={big_model}", "--task=tiny_en", "--normalize=nope"], ("nope",)),
  }[case]
  outcome = harness.run_main(capfd, "trim", [*argv, f"--output={output}"])
  harness.assert_user_error(outcome, *keywords, model_dir=output, before=None)
