"""TCS-MLM and SCS-MLM through the real entry point: an MLM base, then both continued from it.

`python -m flax_xalign.train` (in process) with objectives/tcs.gin and
objectives/scs.gin on two monolingual toy streams (en, de): the
`induced_dictionary` is induced from the base checkpoint, the `lang_vocab`
counted from the toy corpus with a toy threshold.
"""

import json
import os

import numpy as np
import pytest

from flax_xalign import train as train_main

from tests.testlib import tiny_encoder_gin


def _gin_file(tmp_path, corpus):
  tag = tmp_path.name.replace("-", "_")
  files = corpus["files"]
  text = f"""
include 'runs/pretrain.gin'
{tiny_encoder_gin()}
cs_en/TextTask.name = '{tag}_en'
cs_en/TextTask.files = {json.dumps({s: files[("en", s)] for s in ("train", "validation")})}
cs_en/TextTask.lang = 'en'
cs_en/TextTask.vocabulary_path = '{corpus["vocab"]}'
cs_de/TextTask.name = '{tag}_de'
cs_de/TextTask.files = {json.dumps({s: files[("de", s)] for s in ("train", "validation")})}
cs_de/TextTask.lang = 'de'
cs_de/TextTask.vocabulary_path = '{corpus["vocab"]}'
AlphaMixture.name = '{tag}_mono'
AlphaMixture.tasks = ['{tag}_en', '{tag}_de']
train.user_tasks = [@cs_en/TextTask(), @cs_de/TextTask(), @AlphaMixture()]
MIXTURE_OR_TASK_NAME = '{tag}_mono'
TASK_FEATURE_LENGTHS = {{'tokens': 19}}
BATCH_SIZE = 6
LOG_EVERY = 1
CHECKPOINT_EVERY = 2
EVAL_EVERY = 0
"""
  path = tmp_path / "run.gin"
  path.write_text(text)
  return str(path)


def _metrics(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if "loss" in r]


def _mlm_base(gin_file, base):
  """A 2-step MLM run, the mono-mPLM the code-switching runs continue."""
  assert train_main.main([f"--gin_file={gin_file}", f"--gin.MODEL_DIR='{base}'", "--gin.TRAIN_STEPS=2",
                          "--gin.train.objectives={'mlm': 1.0}"]) == 0
  return base


def _continue(gin_file, base, name, model_dir, steps, *extra):
  """Exit status of objectives/<name>.gin continued from `base` for `steps` steps."""
  return train_main.main([
      f"--gin_file={gin_file}", f"--gin_file=objectives/{name}.gin", f"--gin.MODEL_DIR='{model_dir}'",
      f"--gin.INIT_FROM_CHECKPOINT='{base}'", f"--gin.TRAIN_STEPS={steps}", "--gin.LANG_VOCAB_MIN_COUNT=3",
      "--gin.OptimizerConfig.warmup_steps=1", *extra])


def test_the_gin_files_configure_each_objective_its_assets_and_the_warm_start(tmp_path, tiny_corpus):
  """The unit-tier part of the runs below: what objectives/{tcs,scs}.gin make of the run's settings."""
  import gin

  from flax_xalign.cli import configurables
  from flax_xalign.cli import gin_cli

  gin_file = _gin_file(tmp_path, tiny_corpus)
  configurables.register()
  for name in ("tcs", "scs"):
    args = gin_cli.parse_args([f"--gin_file={gin_file}", f"--gin_file=objectives/{name}.gin", "--gin.MODEL_DIR='m'",
                               "--gin.INIT_FROM_CHECKPOINT='base'", "--gin.LANG_VOCAB_MIN_COUNT=3"], description="")
    try:
      gin_cli.parse_gin(args)
      config = gin.get_configurable("flax_xalign.train")()
    finally:
      gin.clear_config()
    assert dict(config.objectives) == {"mlm": 1.0, name: 1.0}, name
    assert config.init_from_checkpoint == "base" and config.task_feature_lengths == {"tokens": 19}
    assert config.asset_options["lang_vocab"] == {"min_count": 3}
    options = config.objective_options[name]
    assert (options["min_rate"], options["max_rate"], options["switch_language_ids"]) == (0.10, 0.15, True)
  assert config.objective_options["scs"]["top_k"] == 8
  assert "induced_dictionary" not in config.asset_options  # TCS's alone.


@pytest.mark.slow  # Three training runs through the entry point (~25 s); the test above parses the same files.
def test_mlm_base_then_tcs_and_scs_continue_from_it(tmp_path, tiny_corpus):
  gin_file = _gin_file(tmp_path, tiny_corpus)
  base = _mlm_base(gin_file, tmp_path / "mlm")
  for name in ("tcs", "scs"):
    model_dir = tmp_path / name
    code = _continue(gin_file, base, name, model_dir, 3, "--gin.OptimizerConfig.learning_rate=3e-3")
    assert code == 0, name
    rows = _metrics(model_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
      for key in ("loss", "mlm", name, f"{name}_accuracy", f"{name}_switched", f"{name}_eligible"):
        assert np.isfinite(row[key]), (name, key, row)
      assert 0.0 < row[f"{name}_switched"] <= row[f"{name}_eligible"] <= 1.0, row
      np.testing.assert_allclose(row["loss"], row["mlm"] + row[name], rtol=1e-5)
    assert {"tcs": "induced_dictionary.tsv", "scs": "lang_vocab.tsv"}[name] in os.listdir(model_dir)
  assert rows[-1]["scs_candidates"] > 0


@pytest.mark.slow  # Three training runs through the entry point (~30 s).
def test_three_languages_switch_through_a_pivot(tmp_path, tiny_corpus):
  """en, de and a third stream: each other language pairs with English, with its own dictionary to it."""
  files = tiny_corpus["files"]
  german = open(files[("de", "train")], encoding="utf-8").read().split("\n")
  third = tmp_path / "xx.train.txt"  # German words in another order: a third language of the toy vocabulary
  third.write_text("\n".join(" ".join(reversed(line.split())) for line in german[:250] if line) + "\n",
                   encoding="utf-8")
  tag = tmp_path.name.replace("-", "_")
  extra = (f"cs_xx/TextTask.name = '{tag}_xx'\ncs_xx/TextTask.files = {{'train': '{third}'}}\n"
           f"cs_xx/TextTask.lang = 'xx'\ncs_xx/TextTask.vocabulary_path = '{tiny_corpus['vocab']}'\n"
           f"AlphaMixture.tasks = ['{tag}_en', '{tag}_de', '{tag}_xx']\n"
           "train.user_tasks = [@cs_en/TextTask(), @cs_de/TextTask(), @cs_xx/TextTask(), @AlphaMixture()]\n"
           "EVAL_EVERY = 0\nEncoderConfig.num_languages = 4\n")
  gin_file = _gin_file(tmp_path, tiny_corpus)
  with open(gin_file, "a", encoding="utf-8") as f:
    f.write(extra)
  base = _mlm_base(gin_file, tmp_path / "mlm")
  for name in ("tcs", "scs"):
    model_dir = tmp_path / name
    code = _continue(gin_file, base, name, model_dir, 2)
    assert code == 0, name
    rows = _metrics(model_dir)
    assert all(np.isfinite(r[name]) and r[f"{name}_switched"] > 0 for r in rows), rows
    header = open(model_dir / {"tcs": "induced_dictionary.tsv", "scs": "lang_vocab.tsv"}[name], encoding="utf-8").read()
    assert "# pivot: en\n" in header and "# sides: de en@de xx en@xx\n" in header
  dictionary = open(tmp_path / "tcs" / "induced_dictionary.tsv", encoding="utf-8").read().splitlines()
  sides = {line.split("\t")[0] for line in dictionary if not line.startswith("#")}
  assert sides == {"src_lang", "de", "en@de", "xx", "en@xx"}
