"""The `cooc` asset: a brute-force count of the corpus the test writes, files, options, exact resume.

The reference is the definition of the table written out here in plain
Python (see flax_xalign/assets/cooc.py and data/cooc.py): every ordered pair
(x_i, x_j), i < j, j - i = d <= n, within one side of one example, weighs
c_lang / (d + 1) in X[a, b] and in X[b, a]; c_lang = C_ref / C_lang with
C_lang the tokens of language lang. The resume test trains with a small
objective whose loss reads the table through `ops.cooc_lookup`, so every
logged step says which table it trained with.
"""

import collections
import json
import math
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm

from flax_xalign.assets import check_fingerprint, registry
from flax_xalign.assets import cooc as cooc_asset
from flax_xalign.data import cooc as cooc_data
from flax_xalign.errors import UserError
from flax_xalign.objectives import base as objectives_base
from flax_xalign.ops import cooc_lookup
from flax_xalign.run_spec import RunSpec
from flax_xalign.tasks import cooc_input
from flax_xalign.training.checkpoints import CheckpointConfig
from flax_xalign.training.optimizer import OptimizerConfig
from flax_xalign.training.pretrain import pretrain
from tests.testlib import tiny_encoder_config

STEPS = 4


def _run(task="tiny_mix", options=None, **changes):
  from flax_xalign.training.data import resolve_task

  data = resolve_task(task)
  return RunSpec(task=task, languages=data.languages, task_feature_lengths={"tokens": 19},
                 task_definitions=data.definitions, vocabulary=data.vocabulary_spec,
                 model=tiny_encoder_config(vocab_size=data.vocabulary_spec.size), objectives={"mlm": 1.0},
                 asset_options={"cooc": dict(options or {})}, **changes)


def _sequences(tiny_corpus):
  """(lang, ids) of every side of every train example of tiny_mix: en, de, then both sides of de_en."""
  sp = spm.SentencePieceProcessor(model_file=tiny_corpus["vocab"])
  files = tiny_corpus["files"]
  out = []
  for lang in ("en", "de"):
    with open(files[(lang, "train")], encoding="utf-8") as f:
      out += [(lang, sp.encode(line.strip())) for line in f if line.strip()]
  with open(files[("de_en", "train")], encoding="utf-8") as f:
    for line in f:
      if line.strip():
        de, en = line.rstrip("\n").split("\t")
        out += [("de", sp.encode(de.strip())), ("en", sp.encode(en.strip()))]
  return out


def _brute_force(sequences, *, window, reference, drop_diagonal):
  """{(a, b): X} from the definition, in float64."""
  tokens = collections.Counter()
  counts = collections.defaultdict(collections.Counter)  # lang -> (d, a, b) -> raw count
  for lang, ids in sequences:
    ids = [i for i in ids if i != 0]
    tokens[lang] += len(ids)
    for i in range(len(ids)):
      for j in range(i + 1, min(i + window, len(ids) - 1) + 1):
        counts[lang][(j - i, ids[i], ids[j])] += 1
  if reference not in tokens:
    reference = min(tokens)
  table = collections.defaultdict(float)
  for lang in sorted(counts):
    c = tokens[reference] / tokens[lang]
    for (d, a, b), n in counts[lang].items():
      table[(a, b)] += c * n / (d + 1)
      table[(b, a)] += c * n / (d + 1)
  return {k: v for k, v in table.items() if v > 0 and not (drop_diagonal and k[0] == k[1])}


def _as_dict(value):
  indptr, indices, log_x = (np.asarray(value[k]) for k in ("indptr", "indices", "log_x"))
  rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
  return {(int(a), int(b)): float(x) for a, b, x in zip(rows, indices, log_x)}


@pytest.mark.parametrize("options", [{}, {"window": 1, "drop_diagonal": True}, {"reference_language": "de"}])
def test_build_matches_a_brute_force_count(tiny_corpus, options):
  run = _run(options=options)
  asset = registry.create("cooc", run)
  value = asset.build(run)
  assert {k: (v.dtype, v.ndim) for k, v in value.items()} == {
      "indptr": (np.int32, 1), "indices": (np.int32, 1), "log_x": (np.float32, 1)}
  assert value["indptr"].shape == (run.vocabulary.size + 1,)
  settings = cooc_asset.settings_of(options)
  expected = _brute_force(_sequences(tiny_corpus), window=settings.window, reference=settings.reference_language,
                          drop_diagonal=settings.drop_diagonal)
  found = _as_dict(value)
  assert sorted(found) == sorted(expected)
  keys = sorted(expected)
  np.testing.assert_allclose([found[k] for k in keys], [math.log(expected[k]) for k in keys], rtol=1e-6, atol=1e-6)
  diagonal = [k for k in expected if k[0] == k[1]]
  assert bool(diagonal) != bool(settings.drop_diagonal)  # "the the" pairs are there unless dropped.
  # The jitted lookup on the device value answers the same as the dict.
  rows = np.array([a for a, _ in keys[:500]] + [0, 1, 2], np.int32)
  cols = np.array([b for _, b in keys[:500]] + [0, 1, 2], np.int32)
  out = jax.jit(cooc_lookup.lookup_table)(value, rows, cols)
  assert np.asarray(out.found)[:500].all()
  np.testing.assert_array_equal(np.asarray(out.log_x)[:500], [found[k] for k in keys[:500]])
  assert asset.info["window"] == settings.window
  text = asset.describe(value)
  assert f"{len(found):,} pairs" in text and f"±{settings.window}" in text and "MB" in text


@pytest.fixture(scope="module")
def built(tiny_corpus):
  run = _run()
  asset = registry.create("cooc", run)
  return run, asset, asset.build(run)


def test_files_round_trip_and_fingerprint(built, tmp_path):
  run, asset, value = built
  asset.save(str(tmp_path), value)
  assert sorted(os.listdir(tmp_path)) == ["cooc.json", "cooc.npz"]
  reader = registry.create("cooc", run)
  loaded = reader.load(str(tmp_path))
  for key in value:
    assert loaded[key].dtype == value[key].dtype
    np.testing.assert_array_equal(loaded[key], value[key])
  reader.check(loaded, run)
  fingerprint = reader.fingerprint(loaded)
  assert fingerprint == asset.fingerprint(value)
  assert fingerprint["corpus"] and fingerprint["sha256"] and asset.refresh_every == 0 and asset.on_device
  assert asset.logical_axes(value) == {"indptr": (None,), "indices": (None,), "log_x": (None,)}  # Replicated.


def _edit_npz(path, edit):
  with np.load(path) as data:
    arrays = {k: np.array(data[k]) for k in data.files}
  edit(arrays)
  with open(path, "wb") as f:
    np.savez(f, **arrays)


def test_hand_edited_files_are_refused(built, tmp_path):
  run, asset, value = built
  recorded = asset.fingerprint(value)
  asset.save(str(tmp_path), value)
  npz = str(tmp_path / "cooc.npz")

  def bump(arrays):
    arrays["log_x"][3] += 0.5

  _edit_npz(npz, bump)
  reader = registry.create("cooc", run)
  edited = reader.load(str(tmp_path))
  with pytest.raises(UserError, match="is not the one the run manifest records"):
    check_fingerprint(reader, edited, recorded, where=str(tmp_path))

  def unsort(arrays):  # Swap two columns of a row with several entries: the binary search would miss them.
    row = int(np.argmax(np.diff(arrays["indptr"])))
    start = int(arrays["indptr"][row])
    arrays["indices"][start], arrays["indices"][start + 1] = arrays["indices"][start + 1], arrays["indices"][start]

  asset.save(str(tmp_path), value)
  _edit_npz(npz, unsort)
  with pytest.raises(UserError, match="not strictly increasing"):
    registry.create("cooc", run).load(str(tmp_path))
  # The manifest's corpus fingerprint is part of the asset's fingerprint.
  asset.save(str(tmp_path), value)
  manifest = json.loads((tmp_path / "cooc.json").read_text(encoding="utf-8"))
  manifest[cooc_asset.CORPUS_KEY] = "0" * 64
  (tmp_path / "cooc.json").write_text(json.dumps(manifest), encoding="utf-8")
  reader = registry.create("cooc", run)
  with pytest.raises(UserError, match="is not the one the run manifest records"):
    check_fingerprint(reader, reader.load(str(tmp_path)), recorded, where=str(tmp_path))


def test_path_option_loads_a_table_and_checks_it_belongs_to_the_run(built, tmp_path):
  run, asset, value = built
  table_dir = tmp_path / "table"
  asset.save(str(table_dir), value)
  given = _run(options={"path": str(table_dir)})
  reader = registry.create("cooc", given)
  loaded = reader.build(given)
  assert reader.fingerprint(loaded) == asset.fingerprint(value)
  assert f"from {table_dir}" in reader.describe(loaded)
  with pytest.raises(UserError, match=r"window 2 \(this run's option 'window': 3\)"):
    other = _run(options={"path": str(table_dir), "window": 3})
    registry.create("cooc", other).build(other)
  with pytest.raises(UserError, match=r"languages \['de', 'en'\] \(this run: \['en'\]\)"):
    english = _run("tiny_en", options={"path": str(table_dir)})
    registry.create("cooc", english).build(english)
  with pytest.raises(UserError, match="reference language 'en' \\(this run: 'de'\\)"):
    other = _run(options={"path": str(table_dir), "reference_language": "de"})
    registry.create("cooc", other).build(other)
  table = cooc_data.load_table(str(table_dir))  # The same table over one more id (an empty last row).
  cooc_data.save_table(str(table_dir), cooc_data.CoocTable(
      indptr=np.append(table.indptr, table.indptr[-1]), indices=table.indices, log_x=table.log_x,
      info={**table.info, "vocab_size": table.info["vocab_size"] + 1}))
  with pytest.raises(UserError, match=f"vocabulary size {run.vocabulary.size + 1} \\(this run: "
                                      f"{run.vocabulary.size}\\)"):
    registry.create("cooc", given).build(given)
  with pytest.raises(UserError, match="has no cooc.npz and cooc.json"):
    missing = _run(options={"path": str(tmp_path / "nowhere")})
    registry.create("cooc", missing).build(missing)


def test_bad_options_and_tables_are_user_errors(monkeypatch):
  with pytest.raises(UserError, match=r"unknown cooc option\(s\) \['windw'\]"):
    cooc_asset.settings_of({"windw": 2})
  for options, message in (({"window": 0}, "'window' must be an integer >= 1"),
                           ({"window": True}, "'window' must be an integer >= 1"),
                           ({"drop_diagonal": "yes"}, "'drop_diagonal' must be True or False"),
                           ({"reference_language": ""}, "'reference_language' must be a language code"),
                           ({"split": 3}, "'split' must be a split name"),
                           ({"path": 7}, "'path' must be a directory")):
    with pytest.raises(UserError, match=message):
      cooc_asset.settings_of(options)
  assert cooc_asset.settings_of({}) == cooc_asset.CoocSettings(window=2, reference_language="en", split="train",
                                                                drop_diagonal=False, path="")
  indptr, indices, log_x = cooc_lookup.csr_from_pairs({(0, 1): 2.0, (1, 0): 2.0, (2, 2): 1.0}, 3)
  value = cooc_asset.device_value(indptr.astype(np.int64), indices, log_x, where="t")
  assert value["indptr"].dtype == np.int32
  with pytest.raises(UserError, match="t: the co-occurrence table is empty"):
    cooc_asset.device_value(np.zeros(4, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), where="t")
  monkeypatch.setattr(cooc_asset, "_INT32_LIMIT", 3)  # nnz >= 2**31 without allocating 2**31 entries.
  with pytest.raises(UserError, match="do not fit the lookup's int32 offsets"):
    cooc_asset.device_value(indptr, indices, log_x, where="t")


# ---------------------------------------------------------------- exact resume


@objectives_base.register("test_cooc_loss")
class CoocLoss(objectives_base.ObjectiveBase):
  """(h_t . h_k / sqrt(d) - log X[w_t, w_k])^2 over masked t and k = t ± 1 where the table has the pair."""

  requires = ("cooc",)

  def __call__(self, ctx):
    tokens, hidden = ctx.batch["tokens"], ctx.hidden.astype(jnp.float32)
    length = tokens.shape[1]
    slots = ctx.masked.positions
    centre = ctx.masked.targets
    h_t = jnp.take_along_axis(hidden, slots[..., None], axis=1)
    total = count = checksum = 0.0
    for offset in (-1, 1):
      k = jnp.clip(slots + offset, 0, length - 1)
      same = (jnp.take_along_axis(ctx.batch["segment_ids"], k, 1) == ctx.at_predictions("segment_ids"))
      valid = (ctx.masked.weights > 0) & (slots + offset >= 0) & (slots + offset < length) & same
      hit = cooc_lookup.lookup_table(ctx.assets["cooc"], centre, jnp.take_along_axis(tokens, k, 1))
      use = (valid & hit.found).astype(jnp.float32)
      s = jnp.sum(h_t * jnp.take_along_axis(hidden, k[..., None], axis=1), -1) / math.sqrt(hidden.shape[-1])
      total += jnp.sum(use * (s - hit.log_x) ** 2)
      count += jnp.sum(use)
      checksum += jnp.sum(use * hit.log_x)
    return objectives_base.LossTerm(loss=total / jnp.maximum(count, 1.0),
                                    metrics={"checksum": checksum, "pairs": count})


def _pretrain(model_dir, *, callback=None):
  return pretrain(
      model_dir=str(model_dir), mixture_or_task_name="tiny_mix", task_feature_lengths={"tokens": 19},
      batch_size=6, train_steps=STEPS, encoder=tiny_encoder_config(),
      objectives={"mlm": 1.0, "test_cooc_loss": 0.5}, asset_options={"cooc": {"window": 1}},
      optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=2),
      checkpoint=CheckpointConfig(every_steps=2, keep=5, async_save=False),
      log_every=1, seed=7, step_callback=callback)


def _rows(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r for r in rows if "loss" in r}


@pytest.mark.slow  # Four tiny-encoder runs; tests/training/test_loop.py resumes a checkpointed asset.
def test_exact_resume_with_the_table(tiny_corpus, tmp_path, monkeypatch):
  full = tmp_path / "full"
  _pretrain(full)

  def stop_at_3(step, metrics):
    if step == 3:
      os.kill(os.getpid(), signal.SIGTERM)

  resumed = tmp_path / "resumed"
  first = _pretrain(resumed, callback=stop_at_3)
  assert first.interrupted and first.last_step == 3
  assert {"cooc.json", "cooc.npz"} <= set(os.listdir(resumed / "checkpoints" / "2" / "assets"))

  # The resumed run restores the table of its checkpoint: it never counts again.
  def no_recount(*args, **kwargs):
    raise AssertionError("the resumed run counted the corpus again")

  monkeypatch.setattr(cooc_input, "count_task", no_recount)
  # A hand-edited copy in MODEL_DIR is refused before training goes on ...
  npz = str(resumed / "cooc.npz")
  with open(npz, "rb") as f:
    original = f.read()

  def bump(arrays):
    arrays["log_x"][0] += 1.0

  _edit_npz(npz, bump)
  with pytest.raises(UserError, match="was changed after the run wrote it"):
    _pretrain(resumed)
  with open(npz, "wb") as f:
    f.write(original)
  # ... and the restored run continues exactly.
  second = _pretrain(resumed)
  assert second.last_step == STEPS
  a, b = _rows(full), _rows(resumed)
  assert sorted(b) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    for key in ("loss", "mlm", "test_cooc_loss", "test_cooc_loss_checksum", "test_cooc_loss_pairs"):
      np.testing.assert_allclose(b[step][key], a[step][key], rtol=1e-6, err_msg=f"{key} at step {step}")
  assert all(a[s]["test_cooc_loss_pairs"] > 0 for s in a)  # The loss really read the table.


def test_a_table_of_another_vocabulary_of_the_same_size_is_refused(built, tmp_path):
  """The count records its vocabulary's sha256; a run whose vocabulary has other pieces refuses the table."""
  import dataclasses

  run, asset, value = built
  assert asset.info["source"][cooc_data.VOCABULARY_KEY] == run.vocabulary.sha256  # the run manifest's hash
  table_dir = tmp_path / "table"
  asset.save(str(table_dir), value)
  other_pieces = dataclasses.replace(run.vocabulary, sha256="f" * 64)  # same size, another model file
  given = _run(options={"path": str(table_dir)})
  given = dataclasses.replace(given, vocabulary=other_pieces)
  with pytest.raises(UserError, match="ids of another vocabulary"):
    registry.create("cooc", given).build(given)
  reader = registry.create("cooc", given)  # a MODEL_DIR copy is checked the same way on resume
  loaded = reader.load(str(table_dir))
  with pytest.raises(UserError, match="ids of another vocabulary"):
    reader.check(loaded, given)
