"""notebooks/evaluate.ipynb runs top to bottom on tiny models (nbclient, a kernel on this interpreter).

Two fixtures stand in for the notebook's real models: an "imported" tiny encoder
with random weights (written by `write_model_dir` with the Bible SentencePiece
vocabulary, its MLM head listed as freshly initialised) and a 2-step ALIGN-MLM
run on a synthetic language. The notebook reads its parameters from
XALIGN_EVAL_* environment variables.
"""

import json
import pathlib
import sys

import pytest

from tests.testlib import tiny_encoder_config, tree_snapshot

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "evaluate.ipynb"
KERNEL = "flax-xalign-test"
V = 211  # The synthetic language's natural vocabulary, as in tests/tasks.
MAX_PAIRS = 8
IMPORTED, SYNTHETIC = "imported", "synthetic ALIGN-MLM"


def test_committed_notebook_has_no_outputs_and_a_parameters_cell():
  notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
  code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
  assert all(c["outputs"] == [] and c["execution_count"] is None for c in code), "clear the notebook's outputs"
  assert "parameters" in code[0]["metadata"].get("tags", [])


def test_report_helpers_refuse_bad_parameters_before_loading_anything(tmp_path, monkeypatch):
  from flax_xalign.errors import UserError
  from flax_xalign.evaluation.word_alignment import report
  monkeypatch.setenv("XALIGN_EVAL_X", "[1, 2]")
  monkeypatch.setenv("XALIGN_EVAL_Y", "/tmp/eval")
  assert report.env_override("XALIGN_EVAL_X", None) == [1, 2]
  assert report.env_override("XALIGN_EVAL_Y", None) == "/tmp/eval"
  assert report.env_override("XALIGN_EVAL_UNSET", 3) == 3
  with pytest.raises(UserError, match="has no checkpoint; make the models with"):
    report.describe_all([("a", str(tmp_path / "missing"))])
  with pytest.raises(UserError, match="repeats the label"):
    report.describe_all([("a", "x"), ("a", "y")])
  with pytest.raises(UserError, match="unknown aligner setting.*simlarity"):
    report.evaluate_alignment(None, settings={"simlarity": "cosine"})
  assert not list(tmp_path.iterdir())
  assert report.optional_evaluation("word_alignment.aer") is not None and report.optional_evaluation("no_such_module") is None
  assert report.slug("XLM-Align (demo)") == "XLM-Align_demo"


@pytest.fixture(scope="module")
def notebook_tools():
  """(nbformat, nbclient); the test skips before any model is built when they are not installed."""
  pytest.importorskip("ipykernel")
  return pytest.importorskip("nbformat"), pytest.importorskip("nbclient")


@pytest.fixture(scope="module")
def imported_dir(tmp_path_factory, bible_data_dir):
  import flax.linen as nn
  import jax

  from flax_xalign.data.vocab import sentencepiece as vocab
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.encoder import Encoder
  from flax_xalign.objectives.model import PretrainingModel

  vocabulary = vocab.load_vocabulary(vocab.bible_vocabulary(data_dir=bible_data_dir))
  config = tiny_encoder_config(vocab_size=vocabulary.vocab_size, num_languages=0, dropout_rate=0.0)
  params = nn.meta.unbox(PretrainingModel(encoder=Encoder(config), objectives={"mlm": 1.0})
                         .init(jax.random.key(3), batch=1, length=8))
  fresh = sorted("/".join(("mlm_head", *(k.key for k in path)))
                 for path, _ in jax.tree_util.tree_leaves_with_path(params["mlm_head"]))
  output = tmp_path_factory.mktemp("notebook_models") / "imported"
  write_model_dir(str(output), config=config, params=params, vocabulary=vocabulary, languages=["grc", "en"],
                  language_pairs=[("grc", "en")], origin={"model": "random tiny encoder", "format": "test fixture",
                                                          "initialised_not_imported": fresh})
  return output


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory, bible_data_dir):
  from flax_xalign.data.transforms.synthetic import SyntheticLanguage
  from flax_xalign.tasks import synthetic
  from flax_xalign.training.checkpoints import CheckpointConfig
  from flax_xalign.training.optimizer import OptimizerConfig
  from flax_xalign.training.pretrain import pretrain

  del bible_data_dir  # $FLAX_XALIGN_DATA_DIR, for the corpus and the Greek vocabulary.
  names = synthetic.register_synthetic(SyntheticLanguage(transforms="trans_inv", vocab_size=V, seed=0))
  output = tmp_path_factory.mktemp("notebook_models") / "align_mlm"
  pretrain(model_dir=str(output), mixture_or_task_name=names["mlm"], task_feature_lengths={"tokens": 19},
           batch_size=6, train_steps=2, encoder=tiny_encoder_config(num_languages=0),
           objectives={"mlm": 1.0, "align": 10.0}, monitors=("align",),
           optimizer=OptimizerConfig(learning_rate=3e-3, warmup_steps=1),
           checkpoint=CheckpointConfig(every_steps=2, keep=1, async_save=False), log_every=1, seed=5)
  return output


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
  """A kernelspec on this interpreter in a private JUPYTER_PATH (nothing installed for the user)."""
  spec = tmp_path / "jupyter" / "kernels" / KERNEL
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "flax_xalign tests", "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
  monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def _text(cell) -> str:
  parts = []
  for output in cell.get("outputs", []):
    if output["output_type"] == "stream":
      parts.append(output["text"])
    elif output["output_type"] in ("display_data", "execute_result"):
      data = output["data"]
      parts.append(data.get("text/markdown") or data.get("text/plain", ""))
  return "".join(parts)


def _table_rows(text: str, label: str) -> dict[str, list[str]]:
  rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
          if line.startswith(f"| {label} |")]
  return {row[2]: row for row in rows}


@pytest.mark.slow  # nbclient starts a kernel (a fresh Python) that evaluates two models: ~1.5 min of CPU.
def test_notebook_runs_on_an_import_and_a_synthetic_run(notebook_tools, imported_dir, synthetic_dir, kernel_env,
                                                        tmp_path, monkeypatch):
  nbformat, nbclient = notebook_tools
  from flax_xalign.evaluation.word_alignment import report
  from flax_xalign.evaluation.alignment_score import run_alignment
  from flax_xalign.runs import Run

  output_dir = tmp_path / "evaluation"
  settings = {
      "MODEL_DIRS": [[IMPORTED, str(imported_dir)], [SYNTHETIC, str(synthetic_dir)]],
      "MAX_PAIRS": MAX_PAIRS,
      "ALIGNER": {IMPORTED: {"encoding": "separate", "similarity": "cosine", "normalize": "nfd_strip_marks"}},
      "MLM_EVAL": {"batch_size": 4, "max_batches": 2, "baseline_batches": 2},
      "OUTPUT_DIR": str(output_dir),
  }
  for name, value in settings.items():
    monkeypatch.setenv(f"XALIGN_EVAL_{name}", json.dumps(value))
  before = {d: tree_snapshot(d) for d in (imported_dir, synthetic_dir)}

  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(notebook, kernel_name=KERNEL, timeout=300,
                          resources={"metadata": {"path": str(REPO)}}).execute()
  text = {cell["id"]: _text(cell) for cell in notebook.cells if cell["cell_type"] == "code"}

  # 1. What each model is.
  assert f"{IMPORTED}  ({imported_dir}, imported model, step 0)" in text["models"]
  assert "freshly initialised, not imported: mlm_head/" in text["models"]
  assert f"{SYNTHETIC}  ({synthetic_dir}, trained run, step 2)" in text["models"]
  assert "objectives: mlm 1, align 10" in text["models"] and "token_map" in text["models"]
  # 2. Word alignment: one best-layer row per model and method, next to the diagonal reference.
  assert "| (no model) | word i -> i·m/n | diagonal | - |" in text["align"]
  for label, aligner in ((IMPORTED, "separate, cosine, nfd_strip_marks"), (SYNTHETIC, "joint, dot")):
    rows = _table_rows(text["align"], label)
    assert sorted(rows) == ["argmax", "itermax", "sinkhorn"], text["align"]
    assert all(row[1] == aligner for row in rows.values())
  results = json.loads((output_dir / "aer.json").read_text())
  assert {label: r["pairs"] for label, r in results.items()} == {IMPORTED: MAX_PAIRS, SYNTHETIC: MAX_PAIRS}
  assert (output_dir / "aer_layers.png").read_bytes().startswith(b"\x89PNG")
  assert (output_dir / report.slug(IMPORTED) / "aer_layers.png").is_file()
  # 3. The alignment score: the synthetic run's, as the library computes it; not applicable to the import.
  run = Run.open(str(synthetic_dir))
  score = run_alignment(run, run.params())
  assert f"{SYNTHETIC}: {report.format_alignment(score)}" in text["score"]
  assert score["count_all"] == V - 5
  assert f"{IMPORTED}: no token_map asset" in text["score"]
  # 4. BLI / RSIM: run where they exist, else said to be unavailable.
  for name in ("lexicon.bli", "lexicon.rsim"):
    if report.optional_evaluation(name) is None:
      assert f"{name.rpartition('.')[2].upper()}: not available in this version" in text["bli"]
  # 5. Masked-token accuracy of the trained run only.
  assert f"{IMPORTED}: skipped, imported without an MLM head" in text["mlm"]
  assert f"{SYNTHETIC}\nheld-out masked-token accuracy" in text["mlm"]
  assert json.loads((output_dir / report.slug(SYNTHETIC) / "mlm_eval.json").read_text())["step"] == 2
  # The model directories were only read.
  assert {d: tree_snapshot(d) for d in (imported_dir, synthetic_dir)} == before
