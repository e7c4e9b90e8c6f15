"""Tests for the Debian help tasks (tasks/debian.py) over a tiny build tree written here."""

import json

import pytest
from flax_xalign.tasks import debian, registry

from flax_xalign import errors
from flax_xalign.data.sources import debian as debian_data
from flax_xalign.training.data import resolve_task

WORDS = ("open the dialog", "choose a cell", "insert a chart", "save the file", "close the window")
HINDI = ("संवाद खोलें", "कक्ष चुनें", "चार्ट डालें", "फ़ाइल सहेजें", "विंडो बंद करें")


def tiny_build(root, sizes=(60, 7, 5)):
  """help/{en,hi}.<split>.txt, help_bitext/en-hi.<split>.tsv and a manifest, like the builder's."""
  counts = {}
  for split, size in zip(debian_data.SPLITS, sizes):
    en = [f"{WORDS[i % 5]} {split} {i}" for i in range(size)]
    hi = [f"{HINDI[i % 5]} {split} {i}" for i in range(size)]
    for folder, name, lines in (("help", f"en.{split}.txt", en), ("help", f"hi.{split}.txt", hi),
                                ("help_bitext", f"en-hi.{split}.tsv", [f"{a}\t{b}" for a, b in zip(en, hi)])):
      (root / folder).mkdir(parents=True, exist_ok=True)
      (root / folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    counts[split] = size
  manifest = {"counts": {"help": {"en": {"paragraphs": counts}, "hi": {"paragraphs": counts, "pairs": counts}}}}
  (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
  return root


@pytest.fixture(scope="module")
def build(tmp_path_factory):
  return tiny_build(tmp_path_factory.mktemp("debian_build"))


def test_tasks_yield_batches_and_describe_themselves(build):
  spec = debian.DebianTasks(data_dir=str(build), vocab_size=60, prefix="dtest").register()
  assert spec.register() is spec  # Idempotent.
  data = resolve_task("dtest_mlm_tlm")
  assert data.languages == ("en", "hi") and data.language_pairs == (("en", "hi"),)
  assert registry.task_names("dtest_mlm_tlm") == ("dtest_en", "dtest_hi", "dtest_en_hi")
  batch = next(iter(data.dataset(feature_lengths={"tokens": 17}, batch_size=3, seed=0)))
  assert batch["tokens"].shape == (3, 17) and batch["tokens"].numpy().max() < 60
  # The model was trained on the training files, cached with a manifest of its inputs.
  assert sorted(p.name for p in (build / "vocab").iterdir()) == [
      "debian_help_en_hi_bpe60.json", "debian_help_en_hi_bpe60.model"]
  definitions = registry.describe("dtest_mlm_tlm")
  assert definitions == [{"kind": "DebianTasks", "args": {
      "data_dir": str(build), "languages": ["hi"], "vocabulary_path": "", "vocab_size": 60, "alpha": 0.7,
      "prefix": "dtest", "normalize": ""}}]
  registry.register_described(definitions)  # Equal definition: re-registers idempotently.
  test = resolve_task("dtest_en_hi").dataset(feature_lengths={"tokens": 17}, batch_size=2, seed=0,
                                             split="test", shuffle=False, num_epochs=1)
  assert sum(int(b["tokens"].shape[0]) for b in test) >= 1


def test_mixture_rates_follow_training_sizes(build):
  debian.DebianTasks(data_dir=str(build), vocab_size=60, prefix="drate", alpha=0.5).register()
  mixture = registry.get_provider("drate_mlm_tlm")
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == pytest.approx({"drate_en": 60 ** 0.5, "drate_hi": 60 ** 0.5, "drate_en_hi": 60 ** 0.5})


def test_monolingual_mixture_has_no_bitext(build):
  debian.DebianTasks(data_dir=str(build), vocab_size=60, prefix="dmono").register()
  assert registry.task_names("dmono_mlm") == ("dmono_en", "dmono_hi")
  data = resolve_task("dmono_mlm")
  assert data.languages == ("en", "hi") and data.language_pairs == ()
  mixture = registry.get_provider("dmono_mlm")
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == pytest.approx({"dmono_en": 60 ** 0.7,
                                                                                 "dmono_hi": 60 ** 0.7})
  batch = next(iter(data.dataset(feature_lengths={"tokens": 17}, batch_size=3, seed=0)))
  assert batch["tokens"].shape == (3, 17)


def test_missing_build_and_languages_are_user_errors(tmp_path, build):
  with pytest.raises(errors.UserError, match="xalign debian_data --output="):
    debian.DebianTasks(data_dir=str(tmp_path / "nothing"), prefix="dmiss").register()
  with pytest.raises(errors.UserError, match=r"no help text for \['fr'\].*--languages=fr"):
    debian.DebianTasks(data_dir=str(build), languages=("fr",), prefix="dmiss").register()
  with pytest.raises(errors.UserError, match="vocab_size"):
    debian.DebianTasks(data_dir=str(build), vocab_size=3, prefix="dmiss").register()
  assert "dmiss_mlm_tlm" not in registry.registered_names() and "dmiss_mlm" not in registry.registered_names()
