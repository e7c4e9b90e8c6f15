"""`xalign import_hf` and `export_hf` in-process (the contract tier): MODEL_DIRs that
evaluation and the aligner accept, exports that transformers loads (model and tokenizer), and bad input as
one `error:` line; one test starts the real command line (subprocess tier)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from flax_xalign.evaluation.word_alignment import word_align
from flax_xalign.cli import export_hf as export_hf_cli
from flax_xalign.cli import import_hf
from flax_xalign.interop import export_hf, hf
from flax_xalign.runs import Run
from tests.interop.conftest import SENTENCES
from tests.interop.test_hf import TOLERANCE, batch_of, layer_diffs, max_diff, ours, theirs

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.contract

PAIR = ("der große Hund sieht das Haus".split(), "the big dog sees the house".split())


def run_main(module, argv, capsys):
  rc = module.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return rc, out, err


def assert_progress(out, tool, stages):
  lines = [line for line in out.splitlines() if line.startswith(f"{tool}: ")]
  assert len(lines) == stages + 1, out  # one per stage, then "done in"
  assert all(line.endswith(" s)") for line in lines[:-1]) and lines[-1].startswith(f"{tool}: done in"), out


def assert_loads_and_aligns(model_dir, params, languages):
  handle = Run.open(str(model_dir))
  loaded, run, step = handle.params(), handle.spec, handle.step
  assert step == 0 and run.languages == languages
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  aligner, _, _ = word_align.load_aligner(handle, batch_size=2)
  (links,) = aligner.align([PAIR], layer=1)
  assert links and all(0 <= i < 6 and 0 <= j < 6 for i, j in links)
  return run


def test_import_xlmr_then_evaluate_align_and_export(tiny_xlmr_dir, tmp_path, capsys):
  model_dir, exported = tmp_path / "model", tmp_path / "hf"
  rc, out, err = run_main(import_hf, ["--source", tiny_xlmr_dir, "--output", model_dir,
                                      "--languages=de,en", "--language_pair=de,en"], capsys)
  assert rc == 0, err
  assert_progress(out, "import_hf", 4)
  assert "tokenizer agrees with transformers on 5 samples" in out
  hf_config, state, _ = hf.load_hf_directory(tiny_xlmr_dir)
  params, _ = hf.params_from_hf(state, hf.encoder_config_from_hf(hf_config), layout="xlmr")
  run = assert_loads_and_aligns(model_dir, params, ("de", "en"))
  assert run.language_pairs == (("de", "en"),)
  specials = run.vocabulary.specials
  assert (specials.bos, specials.pad, specials.eos, specials.unk) == (0, 1, 2, 3)
  origin = json.loads((model_dir / "origin.json").read_text())
  assert origin["layout"] == "xlmr" and origin["initialised_not_imported"] == []

  rc, out, err = run_main(export_hf_cli, ["--model_dir", model_dir, "--output", exported, "--layout=xlmr"], capsys)
  assert rc == 0, err
  assert_progress(out, "export_hf", 4)
  assert sorted(os.listdir(exported)) == ["config.json", "model.safetensors", "sentencepiece.bpe.model",
                                          "tokenizer.json", "tokenizer_config.json"]
  original = transformers.AutoTokenizer.from_pretrained(tiny_xlmr_dir)
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
  for text in SENTENCES:
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
  tokens, mask = batch_of([original(s)["input_ids"] for s in SENTENCES], original.pad_token_id)
  reference = transformers.AutoModelForMaskedLM.from_pretrained(tiny_xlmr_dir).eval()
  model = transformers.AutoModelForMaskedLM.from_pretrained(exported).eval()
  (_, want), (_, got) = theirs(reference, tokens, mask), theirs(model, tokens, mask)
  assert max_diff(got, want, mask) == 0.0


def test_import_minilm_then_evaluate_align_and_export(minilm_dir, tmp_path, capsys):
  model_dir, exported = tmp_path / "model", tmp_path / "hf"
  rc, out, err = run_main(import_hf, ["--source", minilm_dir, "--output", model_dir, "--languages=en,de"],
                          capsys)
  assert rc == 0, err
  assert_progress(out, "import_hf", 4)
  assert "initialised 5 parameters the checkpoint lacks" in out
  assert "tokenizer agrees with transformers" in out
  assert sorted(p.name for p in model_dir.iterdir()) == ["NOTICE", "checkpoints", "model.gin", "origin.json",
                                                         "vocabulary.txt"]
  assert (model_dir / "vocabulary.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()
  assert "Apache" in (model_dir / "NOTICE").read_text()
  origin = json.loads((model_dir / "origin.json").read_text())
  assert origin["initialised_not_imported"][0] == "mlm_head/norm/bias"
  hf_config, state, _ = hf.load_hf_directory(minilm_dir)
  params, _ = hf.params_from_hf(state, hf.encoder_config_from_hf(hf_config), layout="bert")
  run = assert_loads_and_aligns(model_dir, params, ("de", "en"))
  assert run.vocabulary.kind == "wordpiece" and run.vocabulary.lower_case

  rc, out, err = run_main(export_hf_cli, ["--checkpoint", model_dir, "--output", exported, "--layout=bert"], capsys)
  assert rc == 0, err
  assert sorted(os.listdir(exported)) == ["NOTICE", "config.json", "model.safetensors", "tokenizer_config.json",
                                          "vocab.txt"]
  original = transformers.AutoTokenizer.from_pretrained(minilm_dir)
  tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
  for text in SENTENCES:
    assert tokenizer(text)["input_ids"] == original(text)["input_ids"]
  tokens, mask = batch_of([original(s)["input_ids"] for s in SENTENCES], original.pad_token_id)
  want, _ = theirs(transformers.BertModel.from_pretrained(minilm_dir).eval(), tokens, mask)
  got, _ = theirs(transformers.AutoModel.from_pretrained(exported).eval(), tokens, mask)
  assert max(layer_diffs(got, want, mask)) == 0.0


def test_our_own_vocabulary_exports_in_fairseq_order(tmp_path, capsys):
  """A model of ours (pad 0, </s> 1, <unk> 2, <s> 3, <mask> 4) read by transformers' XLM-R classes."""
  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.data.vocab.specials import special_tokens_of
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.encoder import Encoder
  from tests.testlib import tiny_encoder_config

  vocabulary = vocab.load_vocabulary(vocab.train_sentencepiece(
      [s for pair in _pairs() for s in pair], vocab_size=59, model_path=tmp_path / "spm.model"))
  config = tiny_encoder_config(vocab_size=59, num_languages=0, num_heads=3, head_dim=8, dropout_rate=0.0)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(np.float32),
                        jax.device_get(_unboxed(Encoder(config).init_variables(jax.random.key(0)))))
  write_model_dir(str(tmp_path / "model"), config=config, params=params, vocabulary=vocabulary,
                  languages=["de", "en"])
  rc, out, err = run_main(export_hf_cli, ["--model_dir", tmp_path / "model", "--output", tmp_path / "hf",
                                      "--layout=xlmr"], capsys)
  assert rc == 0, err
  assert "embedding rows re-ordered to fairseq ids" in out and "warning" not in out
  tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
  model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
  perm = export_hf.fairseq_permutation(special_tokens_of(vocabulary), 59)
  texts = ["the big dog sees the house", "das Haus sieht den Hund"]
  hf_rows = [tokenizer(t)["input_ids"] for t in texts]
  our_rows = [[3, *vocabulary.encode(t), 1] for t in texts]
  assert [[int(perm[i]) for i in row] for row in hf_rows] == our_rows
  hf_tokens, mask = batch_of(hf_rows, tokenizer.pad_token_id)
  our_tokens, _ = batch_of(our_rows, 0)
  hidden, logits = ours(params, config, our_tokens, mask)
  their_hidden, their_logits = theirs(model, hf_tokens, mask)
  diffs, logit_diff = layer_diffs(hidden, their_hidden, mask), max_diff(logits[..., perm], their_logits, mask)
  print(f"our vocabulary exported in fairseq order: hidden {diffs}, MLM logits {logit_diff}")
  assert max(diffs) < TOLERANCE and logit_diff < TOLERANCE


def test_export_refuses_language_embeddings(shared_run, tmp_path, capsys):
  # The shared run (tests/shared_run.py) has language embeddings (num_languages = 3), which neither layout has.
  for layout in ("bert", "xlmr"):
    rc, out, err = run_main(export_hf_cli, ["--model_dir", shared_run["dir"], "--output", tmp_path / layout,
                                            f"--layout={layout}"], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and "language embeddings" in err, err
    assert not os.path.exists(tmp_path / layout)


def test_bad_source_gives_one_error_line(tmp_path, capsys):
  (tmp_path / "no_config").mkdir()
  for source, match in ((tmp_path / "missing", "is not a directory"), (tmp_path / "no_config", "no config.json")):
    rc, _, err = run_main(import_hf, ["--source", source, "--output", tmp_path / "out"], capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: ") and match in err, err
  (tmp_path / "no_config" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  rc, _, err = run_main(import_hf, ["--source", tmp_path / "no_config", "--output", tmp_path / "out"], capsys)
  assert rc == 2 and "model_type 'gpt2' is not supported" in err
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.subprocess
def test_the_import_command_line_refuses_a_missing_source(tmp_path):
  """The real entry point, in a fresh process: the alias module, the exit status and one error line."""
  result = subprocess.run([sys.executable, "-m", "flax_xalign.cli.import_hf", f"--source={tmp_path}/missing",
                           f"--output={tmp_path}/out"], capture_output=True, text=True, check=False,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert result.returncode == 2 and len(errors) == 1 and "is not a directory" in errors[0], result.stderr
  assert not os.path.exists(tmp_path / "out")


def _unboxed(variables):
  import flax.linen as nn

  return nn.unbox(variables)["params"]


def _pairs():
  import random

  from tests import testlib

  return testlib.sentences(random.Random(0), 200)
