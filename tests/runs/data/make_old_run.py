"""Writes a tiny run with the code of d0e6acf (before issue 22), for tests/runs/test_old_run.py."""
import json, os, random, shutil, sys
import numpy as np
import jax
sys.path.insert(0, "/tmp/old")
import flax_xalign
assert flax_xalign.__file__.startswith("/tmp/old/"), flax_xalign.__file__
from tests import testlib
from flax_xalign.data import vocab
from flax_xalign.tasks import user
from flax_xalign.training.pretrain import pretrain
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig

out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True)
data = os.path.join(out, "data"); os.makedirs(data)
rng = random.Random(0)
files = {}
for split, n in (("train", 120), ("validation", 30)):
  pairs = testlib.sentences(rng, n)
  for lang, col in (("en", 0), ("de", 1)):
    path = os.path.join(data, f"{lang}.{split}.txt")
    open(path, "w", encoding="utf-8").write("\n".join(p[col] for p in pairs) + "\n")
    files[(lang, split)] = path
  tsv = os.path.join(data, f"de_en.{split}.tsv")
  open(tsv, "w", encoding="utf-8").write("\n".join(f"{d}\t{e}" for e, d in pairs) + "\n")
  files[("de_en", split)] = tsv
model = vocab.train_sentencepiece([l for (k, s), f in files.items() if k != "de_en" for l in open(f, encoding="utf-8")],
                                  vocab_size=83, model_path=os.path.join(data, "spm.model"), model_type="bpe")
tasks = [
    user.TextTask(name="old_en", files={s: files[("en", s)] for s in ("train", "validation")}, lang="en", vocabulary_path=str(model)),
    user.TextTask(name="old_de", files={s: files[("de", s)] for s in ("train", "validation")}, lang="de", vocabulary_path=str(model)),
    user.TsvBitextTask(name="old_de_en", files={s: files[("de_en", s)] for s in ("train", "validation")}, lang_a="de", lang_b="en", vocabulary_path=str(model)),
    user.AlphaMixture(name="old_mix", tasks=("old_en", "old_de", "old_de_en")),
]
model_dir = os.path.join(out, "run")
result = pretrain(model_dir=model_dir, mixture_or_task_name="old_mix", task_feature_lengths={"tokens": 19},
                  batch_size=4, train_steps=2, encoder=testlib.tiny_encoder_config(),
                  objectives={"mlm": 1.0, "tlm": 1.0}, optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
                  checkpoint=CheckpointConfig(every_steps=2, keep=2, async_save=False), log_every=1, seed=5,
                  user_tasks=tasks)
flat = {"/".join(k): np.asarray(v) for k, v in
        __import__("flax").traverse_util.flatten_dict(jax.device_get(result.state.params)).items()}
np.savez_compressed(os.path.join(out, "params_step2.npz"), **flat)
json.dump({"written_by": "flax_xalign d0e6acf (before issue 22)", "data_root": data}, open(os.path.join(out, "ORIGIN.json"), "w"))
print("ok", model_dir)
