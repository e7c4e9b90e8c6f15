"""Hugging Face BERT / XLM-R import and export, against transformers' PyTorch forward.

The reference is transformers' own model (eval mode) on the same ids, never
our code: all-MiniLM-L6-v2 (real weights, BertModel, WordPiece), a tiny random
XLMRobertaForMaskedLM with a SentencePiece vocabulary trained here, and a tiny
random BertForMaskedLM (the BERT MLM head). Every layer's hidden states and
the MLM logits must agree within 1e-4 (max abs); re-importing an export must
give bit-identical parameters.
"""

import functools
import json

import jax
import numpy as np
import pytest

from flax_xalign.errors import UserError
from flax_xalign.interop import hf
from flax_xalign.models.encoder import Encoder
from tests.interop.conftest import SENTENCES, TINY_SPM_PIECES, randomize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4


@functools.partial(jax.jit, static_argnames=("config",))
def _encode(params, tokens, segment_ids, *, config):
  positions = jax.numpy.broadcast_to(jax.numpy.arange(tokens.shape[1]), tokens.shape)
  encoder = Encoder(config)
  out = encoder.apply({"params": params}, tokens, lang_ids=None, positions=positions, segment_ids=segment_ids,
                      deterministic=True, return_all_hidden=True)
  logits = encoder.apply({"params": params}, out.hidden, method=Encoder.mlm_logits)
  return out.all_hidden, logits


def batch_of(rows, pad):
  """[n, length] ids padded with `pad`, and the 0/1 mask of real tokens."""
  length = max(map(len, rows))
  tokens = np.full((len(rows), length), pad, np.int32)
  mask = np.zeros_like(tokens)
  for i, row in enumerate(rows):
    tokens[i, :len(row)], mask[i, :len(row)] = row, 1
  return tokens, mask


def ours(params, config, tokens, mask):
  hidden, logits = _encode(params, tokens, mask, config=config)
  return [np.asarray(h) for h in hidden], np.asarray(logits)


def theirs(model, tokens, mask):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens, dtype=torch.long), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  logits = out.logits.numpy() if hasattr(out, "logits") else None
  return [h.numpy() for h in out.hidden_states], logits


def max_diff(a, b, mask):
  """Max abs difference over the real (unpadded) tokens."""
  keep = mask.astype(bool)
  return float(np.max(np.abs(np.asarray(a)[keep] - np.asarray(b)[keep])))


def layer_diffs(ours_hidden, their_hidden, mask):
  assert len(ours_hidden) == len(their_hidden)
  return [max_diff(a, b, mask) for a, b in zip(ours_hidden, their_hidden)]


def assert_same_params(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape, path
    np.testing.assert_array_equal(x, y, err_msg=str(path))


def save_hf(directory, hf_config, state):
  import safetensors.numpy

  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(hf_config))
  safetensors.numpy.save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
  return directory


# --- all-MiniLM-L6-v2: real weights -------------------------------------------------


@pytest.fixture(scope="module")
def minilm(minilm_dir):
  hf_config, state, layout = hf.load_hf_directory(minilm_dir)
  config = hf.encoder_config_from_hf(hf_config)
  params, fresh = hf.params_from_hf(state, config, layout=layout)
  tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
  tokens, mask = batch_of([tokenizer(s)["input_ids"] for s in SENTENCES], tokenizer.pad_token_id)
  reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
  return dict(config=config, params=params, fresh=fresh, layout=layout, state=state, tokens=tokens, mask=mask,
              reference=theirs(reference, tokens, mask)[0])


def test_minilm_config_and_fresh_head(minilm):
  config = minilm["config"]
  assert minilm["layout"] == "bert"
  assert (config.num_layers, config.embed_dim, config.num_heads, config.head_dim, config.mlp_dim) == (
      6, 384, 12, 32, 1536)
  assert (config.vocab_size, config.num_token_types, config.position_offset) == (30522, 2, 0)
  assert config.layer_norm_epsilon == 1e-12 and config.max_positions == 512
  # A BertModel has no MLM head: initialised here and listed.
  assert minilm["fresh"] == ["mlm_head/norm/bias", "mlm_head/norm/scale", "mlm_head/output_bias",
                             "mlm_head/transform/bias", "mlm_head/transform/kernel"]
  head = minilm["params"]["mlm_head"]
  np.testing.assert_array_equal(head["norm"]["scale"], 1.0)
  np.testing.assert_array_equal(head["output_bias"], 0.0)
  assert 0.01 < head["transform"]["kernel"].std() < 0.03  # initializer_range 0.02


def test_minilm_every_layer_matches_transformers(minilm):
  hidden, _ = ours(minilm["params"], minilm["config"], minilm["tokens"], minilm["mask"])
  diffs = layer_diffs(hidden, minilm["reference"], minilm["mask"])
  print(f"MiniLM max |ours - BertModel| per layer (embeddings, 1..6): {diffs}")
  assert max(diffs) < TOLERANCE, diffs


def test_minilm_unscanned_layers_match_too(minilm):
  config = minilm["config"].replace(scan_layers=False)
  params, _ = hf.params_from_hf(minilm["state"], config, layout="bert")
  assert "layers" not in params and set(params["layers_5"]) == set(minilm["params"]["layers"])
  hidden, _ = ours(params, config, minilm["tokens"], minilm["mask"])
  assert max(layer_diffs(hidden, minilm["reference"], minilm["mask"])) < TOLERANCE


def test_minilm_export_loads_in_transformers_and_round_trips(minilm, tmp_path):
  hf_config, state = hf.hf_state_from_params(minilm["params"], minilm["config"], layout="bert",
                                             specials=None)
  exported = save_hf(tmp_path / "export", hf_config, state)
  model = transformers.AutoModel.from_pretrained(exported).eval()
  assert type(model).__name__ == "BertModel"
  hidden, _ = theirs(model, minilm["tokens"], minilm["mask"])
  diffs = layer_diffs(hidden, minilm["reference"], minilm["mask"])
  print(f"MiniLM export reloaded by AutoModel vs the original BertModel, per layer: {diffs}")
  assert max(diffs) < TOLERANCE, diffs
  again_config, again_state, layout = hf.load_hf_directory(exported)
  config = hf.encoder_config_from_hf(again_config)
  assert config == minilm["config"]
  params, fresh = hf.params_from_hf(again_state, config, layout=layout)
  assert fresh == []  # the export carries the (fresh) MLM head
  assert_same_params(params, minilm["params"])


def test_minilm_wordpiece_vocabulary_tokenises_like_transformers(minilm_dir, tmp_path):
  vocabulary = hf.load_hf_vocabulary(minilm_dir, scratch_dir=str(tmp_path))
  assert vocabulary.lower_case and vocabulary.vocab_size == 30522
  assert hf.compare_with_transformers(str(minilm_dir), vocabulary, list(SENTENCES)) == []


# --- a tiny random XLMRobertaForMaskedLM --------------------------------------------


@pytest.fixture(scope="module")
def xlmr(tiny_xlmr_dir, tmp_path_factory):
  hf_config, state, layout = hf.load_hf_directory(tiny_xlmr_dir)
  config = hf.encoder_config_from_hf(hf_config)
  params, fresh = hf.params_from_hf(state, config, layout=layout)
  vocabulary = hf.load_hf_vocabulary(tiny_xlmr_dir, scratch_dir=str(tmp_path_factory.mktemp("vocab")))
  tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_xlmr_dir)
  tokens, mask = batch_of([tokenizer(s)["input_ids"] for s in SENTENCES], tokenizer.pad_token_id)
  model = transformers.XLMRobertaForMaskedLM.from_pretrained(tiny_xlmr_dir).eval()
  return dict(config=config, params=params, fresh=fresh, layout=layout, state=state, vocabulary=vocabulary,
              tokenizer=tokenizer, tokens=tokens, mask=mask, reference=theirs(model, tokens, mask))


def test_xlmr_config(xlmr):
  config = xlmr["config"]
  assert xlmr["layout"] == "xlmr" and xlmr["fresh"] == []
  assert (config.num_layers, config.embed_dim, config.num_heads, config.head_dim, config.mlp_dim) == (
      2, 24, 3, 8, 40)
  assert (config.num_token_types, config.position_offset, config.max_positions, config.num_positions) == (
      1, 2, 131, 129)
  assert config.layer_norm_epsilon == 1e-5 and config.vocab_size == TINY_SPM_PIECES + 2  # + <pad>, <mask>


@pytest.mark.parametrize("scan_layers", [True, False])
def test_xlmr_hidden_states_and_mlm_logits_match_transformers(xlmr, scan_layers):
  config = xlmr["config"].replace(scan_layers=scan_layers)
  params, _ = hf.params_from_hf(xlmr["state"], config, layout="xlmr")
  hidden, logits = ours(params, config, xlmr["tokens"], xlmr["mask"])
  their_hidden, their_logits = xlmr["reference"]
  diffs = layer_diffs(hidden, their_hidden, xlmr["mask"])
  logit_diff = max_diff(logits, their_logits, xlmr["mask"])
  print(f"tiny XLM-R (scan_layers={scan_layers}) max |ours - transformers|: hidden per layer {diffs}, "
        f"MLM logits {logit_diff} (logits up to {np.abs(their_logits).max():.2f})")
  assert max(diffs) < TOLERANCE and logit_diff < TOLERANCE


def test_xlmr_export_loads_in_transformers_and_round_trips(xlmr, tmp_path):
  hf_config, state = hf.hf_state_from_params(xlmr["params"], xlmr["config"], layout="xlmr")
  model = transformers.AutoModelForMaskedLM.from_pretrained(save_hf(tmp_path / "x", hf_config, state)).eval()
  assert type(model).__name__ == "XLMRobertaForMaskedLM"
  hidden, logits = theirs(model, xlmr["tokens"], xlmr["mask"])
  their_hidden, their_logits = xlmr["reference"]
  assert max(layer_diffs(hidden, their_hidden, xlmr["mask"])) == 0.0
  assert max_diff(logits, their_logits, xlmr["mask"]) == 0.0
  again, fresh = hf.params_from_hf(state, hf.encoder_config_from_hf(hf_config), layout="xlmr")
  assert fresh == []
  assert_same_params(again, xlmr["params"])
  # Without the prefix (an XLMRobertaModel-style body) the same tree comes back.
  bare = {k.removeprefix("roberta."): v for k, v in state.items()}
  assert_same_params(hf.params_from_hf(bare, xlmr["config"], layout="xlmr")[0], xlmr["params"])


def test_rebuilt_sentencepiece_has_model_ids_and_tokenises_like_transformers(xlmr, tiny_xlmr_dir):
  from flax_xalign.data.vocab.specials import special_tokens_of

  vocabulary, tokenizer = xlmr["vocabulary"], xlmr["tokenizer"]
  processor = vocabulary.tokenizer
  assert [processor.id_to_piece(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
  assert vocabulary.vocab_size == xlmr["config"].vocab_size == len(tokenizer)
  specials = special_tokens_of(vocabulary)
  assert (specials.bos, specials.pad, specials.eos, specials.unk, specials.mask) == (
      tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id,
      tokenizer.mask_token_id) == (0, 1, 2, 3, TINY_SPM_PIECES + 1)
  assert specials.regular_range(vocabulary.vocab_size) == (4, TINY_SPM_PIECES + 1)  # text pieces only
  samples = list(SENTENCES) + ["Ἐν ἀρχῇ  ǅ ﬁ …", "the   house\tsees"]
  assert hf.compare_with_transformers(str(tiny_xlmr_dir), vocabulary, samples) == []
  assert [processor.id_to_piece(int(i)) for i in vocabulary.encode(samples[-1])] == tokenizer.tokenize(samples[-1])


def test_sentencepiece_fairseq_order_round_trips(tiny_xlmr_dir):
  original = (tiny_xlmr_dir / "sentencepiece.bpe.model").read_bytes()
  rebuilt = hf.model_order_sentencepiece(original)
  back = hf.fairseq_order_sentencepiece(rebuilt, np.arange(TINY_SPM_PIECES + 2))
  from sentencepiece import SentencePieceProcessor

  a, b = (SentencePieceProcessor(model_proto=m) for m in (original, back))
  assert [a.id_to_piece(i) for i in range(a.get_piece_size())] == [
      b.id_to_piece(i) for i in range(b.get_piece_size())]
  assert (b.unk_id(), b.bos_id(), b.eos_id(), b.pad_id()) == (0, 1, 2, -1)
  for text in SENTENCES:
    assert a.encode(text) == b.encode(text)
  with pytest.raises(UserError, match="fairseq"):
    hf.model_order_sentencepiece(rebuilt)


def test_our_model_exports_with_positions_rebased(xlmr, tmp_path):
  """A model of ours (positions from row 0, no type table) read by transformers' XLM-R."""
  config = xlmr["config"].replace(num_token_types=0, position_offset=0, max_positions=101)
  params = jax.tree.map(np.asarray, Encoder(config).init_variables(jax.random.key(3))["params"])
  params = jax.tree.map(lambda x: x + np.random.default_rng(0).normal(0, 0.3, x.shape).astype(x.dtype),
                        dict(jax.tree.map(np.asarray, jax.device_get(_unbox(params)))))
  hf_config, state = hf.hf_state_from_params(params, config, layout="xlmr")
  assert hf_config["max_position_embeddings"] == 103 and hf_config["type_vocab_size"] == 1
  model = transformers.AutoModelForMaskedLM.from_pretrained(save_hf(tmp_path / "x", hf_config, state)).eval()
  hidden, logits = ours(params, config, xlmr["tokens"], xlmr["mask"])
  their_hidden, their_logits = theirs(model, xlmr["tokens"], xlmr["mask"])
  diffs = layer_diffs(hidden, their_hidden, xlmr["mask"])
  print(f"our model exported as XLM-R (positions rebased): hidden {diffs}, "
        f"logits {max_diff(logits, their_logits, xlmr['mask'])}")
  assert max(diffs) < TOLERANCE and max_diff(logits, their_logits, xlmr["mask"]) < TOLERANCE


def _unbox(tree):
  import flax.linen as nn

  return nn.unbox(tree)


# --- a tiny random BertForMaskedLM: the BERT MLM head ----------------------------------


@pytest.fixture(scope="module")
def tiny_bert():
  config = transformers.BertConfig(vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                                   intermediate_size=40, max_position_embeddings=17, type_vocab_size=2)
  torch.manual_seed(1)
  model = transformers.BertForMaskedLM(config).eval()
  randomize(model, seed=1)
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  return model, config.to_dict(), state


def test_bert_mlm_head_matches_transformers(tiny_bert):
  model, hf_config, state = tiny_bert
  assert "bert.embeddings.word_embeddings.weight" in state and "cls.predictions.decoder.weight" in state
  config = hf.encoder_config_from_hf(hf_config)
  params, fresh = hf.params_from_hf(state, config, layout="bert")
  assert fresh == []
  rng = np.random.default_rng(0)
  tokens, mask = batch_of([rng.integers(1, 61, n).tolist() for n in (13, 9, 1)], 0)
  hidden, logits = ours(params, config, tokens, mask)
  their_hidden, their_logits = theirs(model, tokens, mask)
  diffs, logit_diff = layer_diffs(hidden, their_hidden, mask), max_diff(logits, their_logits, mask)
  print(f"tiny BertForMaskedLM max |ours - transformers|: hidden {diffs}, MLM logits {logit_diff}")
  assert max(diffs) < TOLERANCE and logit_diff < TOLERANCE
  exported_config, exported = hf.hf_state_from_params(params, config, layout="bert")
  assert hf.params_from_hf(exported, hf.encoder_config_from_hf(exported_config), layout="bert")[1] == []
  assert_same_params(hf.params_from_hf(exported, config, layout="bert")[0], params)


def test_bert_without_mlm_head_gets_a_fresh_one(tiny_bert):
  _, hf_config, state = tiny_bert
  body = {k: v for k, v in state.items() if not k.startswith("cls.")}
  config = hf.encoder_config_from_hf(hf_config)
  params, fresh = hf.params_from_hf(body, config, layout="bert", seed=5)
  assert fresh == ["mlm_head/norm/bias", "mlm_head/norm/scale", "mlm_head/output_bias",
                   "mlm_head/transform/bias", "mlm_head/transform/kernel"]
  expected = jax.eval_shape(lambda: Encoder(config).init_variables(jax.random.key(0)))["params"]
  got = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  assert jax.tree.structure(got) == jax.tree.structure(_unbox(expected))
  again, _ = hf.params_from_hf(body, config, layout="bert", seed=5)
  assert_same_params(again, params)  # deterministic given the seed


def test_refusals_name_the_problem(tiny_bert, xlmr):
  _, hf_config, state = tiny_bert
  config = hf.encoder_config_from_hf(hf_config)
  untied = dict(state, **{"cls.predictions.decoder.weight": state["cls.predictions.decoder.weight"] + 1})
  with pytest.raises(UserError, match="untied"):
    hf.params_from_hf(untied, config, layout="bert")
  with pytest.raises(UserError, match="no place for: classifier.weight"):
    hf.params_from_hf(dict(state, **{"classifier.weight": np.zeros(3)}), config, layout="bert")
  with pytest.raises(UserError, match=r"'encoder.layer.0.intermediate.dense.weight' has shape \[40, 24\]; the config implies \[41, 24\]"):
    hf.params_from_hf(state, config.replace(mlp_dim=41), layout="bert")
  with pytest.raises(UserError, match="another layout"):
    hf.params_from_hf(state, config, layout="xlmr")
  with pytest.raises(UserError, match="no 'encoder.layer.1.output.LayerNorm.bias'"):
    hf.params_from_hf({k: v for k, v in state.items() if "1.output.LayerNorm.bias" not in k}, config,
                      layout="bert")
  for change, match in ((dict(hidden_act="gelu_new"), "exact"), (dict(hidden_act="relu"), "hidden_act"),
                        (dict(position_embedding_type="relative_key"), "absolute"),
                        (dict(model_type="gpt2"), "model_type"), (dict(is_decoder=True), "decoder")):
    with pytest.raises(UserError, match=match):
      hf.encoder_config_from_hf({**hf_config, **change})
  with pytest.raises(UserError, match="language embeddings"):
    hf.hf_state_from_params({}, xlmr["config"].replace(num_languages=2), layout="bert")


def test_bfloat16_and_pytorch_checkpoints_load(tiny_bert, tmp_path):
  import safetensors.torch

  model, hf_config, state = tiny_bert
  (tmp_path / "bf16").mkdir()
  (tmp_path / "bf16" / "config.json").write_text(json.dumps(hf_config))
  safetensors.torch.save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                               if k != "cls.predictions.decoder.weight"},
                              str(tmp_path / "bf16" / "model.safetensors"), metadata={"format": "pt"})
  hf_config, loaded, layout = hf.load_hf_directory(tmp_path / "bf16")
  params, _ = hf.params_from_hf(loaded, hf.encoder_config_from_hf(hf_config), layout=layout)
  assert params["token_embed"]["embedding"].dtype == np.float32
  np.testing.assert_allclose(params["token_embed"]["embedding"], state["bert.embeddings.word_embeddings.weight"],
                             rtol=1e-2, atol=1e-2)
  (tmp_path / "bin").mkdir()
  (tmp_path / "bin" / "config.json").write_text(json.dumps(hf_config))
  torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
  _, loaded, _ = hf.load_hf_directory(tmp_path / "bin")
  for key, value in state.items():
    np.testing.assert_array_equal(loaded[key], value)
  with pytest.raises(UserError, match="no weights"):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config))
    hf.load_hf_directory(tmp_path / "empty")


def test_tokenizer_json_tokenises_like_our_sentencepiece_vocabulary(xlmr, tiny_xlmr_dir, tmp_path):
  """The export's tokenizer.json (read by `tokenizers` alone, and by transformers) splits Greek and English
  words and sentences into our vocabulary's ids."""
  tokenizers = pytest.importorskip("tokenizers")
  from flax_xalign.interop import export_hf

  vocabulary = xlmr["vocabulary"]
  files = export_hf.tokenizer_files(vocabulary, max_length=64)
  assert set(files.files) == {hf.SENTENCEPIECE_FILE, "tokenizer.json"}
  ours = tokenizers.Tokenizer.from_str(files.files["tokenizer.json"].decode("utf-8"))
  words = [w for text in SENTENCES for w in text.split()] + ["Ἐν", "ἀρχῇ", "λόγος", "θεοῦ", "ǅ", "ﬁ", "…"]
  samples = list(SENTENCES) + words + ["Ἐν ἀρχῇ  ǅ ﬁ …", "the   house\tsees", "  padded  "]
  for text in samples:
    assert ours.encode(text, add_special_tokens=False).ids == [int(i) for i in vocabulary.encode(text)], text
  assert ours.encode("λόγος").ids[0] == 0 and ours.encode("λόγος").ids[-1] == 2  # <s> ... </s>
  export_hf.write_hf_directory(str(tmp_path / "tok"), {}, {}, files)
  (tmp_path / "tok" / hf.SENTENCEPIECE_FILE).unlink()  # transformers must need tokenizer.json alone
  loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
  for text in samples:
    assert loaded(text, add_special_tokens=False)["input_ids"] == [int(i) for i in vocabulary.encode(text)], text
  assert loaded.mask_token_id == TINY_SPM_PIECES + 1 and loaded.pad_token_id == 1
