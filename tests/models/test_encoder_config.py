"""EncoderConfig validation, presets and the model gin files."""

import pathlib

import jax
import jax.numpy as jnp
import pytest

from flax_xalign.models import config as config_lib
from flax_xalign.models.config import EncoderConfig
from flax_xalign.models.encoder import Encoder
from tests.testlib import TINY_ENCODER

_GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin_configs/models"
_SIZES = {k: TINY_ENCODER[k] for k in ("num_layers", "embed_dim", "num_heads", "head_dim", "mlp_dim")}


@pytest.mark.parametrize("field,value", [
    ("num_layers", 0),
    ("embed_dim", -1),
    ("head_dim", 2.5),
    ("vocab_size", 0),
    ("num_languages", -1),
    ("dropout_rate", 1.0),
    ("attention_dropout_rate", -0.1),
    ("layer_norm_epsilon", 0.0),
    ("dtype", "float8"),
    ("param_dtype", "int32"),
    ("remat_policy", "some"),
    ("attention_implementation", "flash"),
])
def test_invalid_values_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    EncoderConfig(**{**_SIZES, field: value})


def test_fused_attention_refuses_what_it_cannot_compute():
  # No dropout on fused probabilities; cuDNN's kernel has no float32 form.
  with pytest.raises(ValueError, match="attention_dropout_rate = 0.0"):
    EncoderConfig(**_SIZES, attention_implementation="xla", attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match="dtype = 'bfloat16'"):
    EncoderConfig(**_SIZES, attention_implementation="cudnn", attention_dropout_rate=0.0)
  assert EncoderConfig(**_SIZES, attention_implementation="cudnn", attention_dropout_rate=0.0,
                       dtype="bfloat16").attention_implementation == "cudnn"


def test_replace_validates_and_keeps_frozen():
  config = EncoderConfig(**_SIZES)
  assert config.replace(vocab_size=61).vocab_size == 61
  with pytest.raises(ValueError, match="num_heads"):
    config.replace(num_heads=0)
  with pytest.raises(AttributeError):
    config.num_layers = 3  # pytype: disable=not-writable
  assert hash(config) == hash(EncoderConfig(**_SIZES))


def test_defaults_are_xlmr_like():
  config = EncoderConfig(**_SIZES)
  assert config.vocab_size is None
  assert config.max_positions == 514
  assert not config.pre_layer_norm
  assert config.layer_norm_epsilon == 1e-5
  assert config.scan_layers
  assert config.compute_dtype == jnp.float32


@pytest.mark.parametrize("name,sizes", [
    ("tiny", (4, 128, 4, 32, 512)),
    ("small", (6, 512, 8, 64, 2048)),
    ("base", (12, 768, 12, 64, 3072)),
    ("large", (24, 1024, 16, 64, 4096)),
])
def test_presets_and_gin_files_agree(name, sizes):
  preset = config_lib.preset(name)
  assert preset == getattr(config_lib, name)()
  assert (preset.num_layers, preset.embed_dim, preset.num_heads,
          preset.head_dim, preset.mlp_dim) == sizes
  assert preset.vocab_size is None
  # Parse without registering: train.py owns the `EncoderConfig` registration.
  parser = pytest.importorskip("gin.config_parser")
  gin_config = pytest.importorskip("gin.config")
  text = (_GIN_DIR / f"{name}.gin").read_text()
  bindings = {}
  for statement in parser.ConfigParser(
      text, gin_config.ParserDelegate(skip_unknown=True)):
    assert statement.selector == "EncoderConfig"
    bindings[statement.arg_name] = statement.value
  assert EncoderConfig(**bindings) == preset


def test_unknown_preset():
  with pytest.raises(ValueError, match="huge"):
    config_lib.preset("huge")


def test_encoder_needs_vocab_size():
  encoder = Encoder(EncoderConfig(**_SIZES))
  with pytest.raises(ValueError, match="vocab_size"):
    encoder.init_variables(jax.random.key(0), (1, 5))


def test_sinusoidal_position_init_matches_formula_and_scale():
  import jax
  import numpy as np

  from flax_xalign.models.encoder import sinusoidal_init

  table = np.asarray(sinusoidal_init(0.02)(jax.random.key(0), (17, 24)))
  assert table.shape == (17, 24)
  # Over many positions each sin/cos column has standard deviation 1/sqrt(2).
  long = np.asarray(sinusoidal_init(0.02)(jax.random.key(0), (4096, 24)))
  np.testing.assert_allclose(long[:, :8].std(), 0.02, rtol=0.1)
  scale = 0.02 * np.sqrt(2.0)
  p, i = 5, 3  # column pair (6, 7) uses frequency 10000 ** (-6 / 24)
  angle = p * 10000.0 ** (-2 * i / 24)
  np.testing.assert_allclose(table[p, 2 * i], scale * np.sin(angle), rtol=1e-5)
  np.testing.assert_allclose(table[p, 2 * i + 1], scale * np.cos(angle), rtol=1e-5)


def test_position_init_is_validated():
  import pytest

  from flax_xalign.models.config import tiny

  with pytest.raises(ValueError, match="position_init"):
    tiny(position_init="rope")


def test_nvidia_gpu_gin_file_gives_a_valid_base_config():
  # runs/nvidia_gpu.gin must stay a combination EncoderConfig accepts (cuDNN needs bf16, no attention dropout).
  parser = pytest.importorskip("gin.config_parser")
  gin_config = pytest.importorskip("gin.config")
  text = (_GIN_DIR.parent / "runs" / "nvidia_gpu.gin").read_text()
  bindings = {}
  for statement in parser.ConfigParser(text, gin_config.ParserDelegate(skip_unknown=True)):
    assert statement.selector == "EncoderConfig"
    bindings[statement.arg_name] = statement.value
  config = config_lib.preset("base", **bindings)
  assert (config.attention_implementation, config.dtype, config.scan_layers) == ("cudnn", "bfloat16", False)
