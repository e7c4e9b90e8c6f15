"""The CPU proof of the GPU bundle (issue 37 part 4): the tiny grid's bundle, built here, runs from its own
run.sh, from a copy of the bundle only, in Pythons where TensorFlow, tensorflow_text and seqio are absent
(tests/no_tf_site), and writes a results JSON with every field of every row filled."""

import json
import shutil
import subprocess
import sys

import pytest

from tests import no_tf_site
from tests.experiments.test_e5_debian_experiment import _tiny_build

ROOT = no_tf_site.ROOT


def _bible_links(folder, *, verses: int = 24):
  """A `xalign eflomal --bible`-shaped folder holding gold links in place of eflomal's: the validation gold's
  first verses as train, the next as validation, the test gold's first verses as test."""
  from flax_xalign.evaluation.word_alignment import aer, word_align

  folder.mkdir(parents=True)
  pairs, sure = word_align.bible_gold("validation", max_pairs=2 * verses)
  test_pairs, test_sure = word_align.bible_gold("test", max_pairs=verses)
  for split, part_pairs, part_sure in (("train", pairs[:verses], sure[:verses]),
                                       ("validation", pairs[verses:], sure[verses:]),
                                       ("test", test_pairs, test_sure)):
    (folder / f"{split}.tsv").write_text("".join(f"{' '.join(a)}\t{' '.join(b)}\n" for a, b in part_pairs),
                                         encoding="utf-8")
    (folder / f"{split}.links").write_text("".join(aer.format_links(s) + "\n" for s in part_sure),
                                           encoding="utf-8")
  return folder


def _params(model_dir):
  from flax_xalign.runs import Run

  return Run.open(str(model_dir)).params()


@pytest.mark.subprocess  # Builds the tiny bundle, then runs it in TF-free children (about 3 min on 2 cores).
def test_the_tiny_bundle_runs_from_its_own_run_sh_without_tensorflow(tmp_path, bible_data_dir):
  build = _tiny_build(tmp_path / "debian")
  links = _bible_links(tmp_path / "bible_links")
  host_work = tmp_path / "host_work"
  made = subprocess.run(  # The start: a 4-layer model the builder initialises (experiments.gpu.parts.tiny_start).
      [sys.executable, "-m", "flax_xalign.cli", "gpu_bundle", "--grid=tiny", f"--output={tmp_path / 'bundle'}",
       f"--debian_data={build}", f"--bible_links={links}", f"--host_work={host_work}", "--wheels=none"],
      capture_output=True, text=True, cwd=ROOT, timeout=900, check=False)
  assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
  bundle = json.loads((tmp_path / "bundle" / "bundle.json").read_text())
  assert set(bundle["parts"]) == {"start", "caches", "assets", "suite", "wheels", "run.sh"}
  # The peers on the suite's test verses: gold links stand in for eflomal's here, so their AER is 0.
  peers = bundle["alignment_peers"]
  assert peers["verses"] == 12 and peers["eflomal"]["aer"] == 0.0 and 0.3 < peers["diagonal"]["aer"] < 1.0

  # The host has the checkout and the bundle, nothing else: not the sources, not the builder's runs.
  host = tmp_path / "host"
  shutil.copytree(tmp_path / "bundle", host / ".gpu")
  start_params = _params(host_work / "start")
  for gone in (build, links, host_work, tmp_path / "bundle", tmp_path / "bundle.work"):
    shutil.rmtree(gone, ignore_errors=True)
  out = tmp_path / "out"
  env = no_tf_site.env(OUT=str(out), BUDGET_S="600", PARALLEL="2", JAX_PLATFORMS="cpu", PYTHON=sys.executable)
  from flax_xalign.data.sources import paths

  env.pop(paths.DATA_DIR_ENV, None)  # Nor the Bible's wheel: the suite carries the verses and gold it scores.
  ran = subprocess.run(["bash", str(host / ".gpu" / "run.sh")], capture_output=True, text=True, env=env,
                       cwd=host, timeout=1200, check=False)
  assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
  assert "ETA" in ran.stdout
  results = json.loads((out / "results.json").read_text())
  from flax_xalign.experiments.gpu.results import check_results

  assert check_results(results) == []
  assert results["alignment_peers"] == peers
  rows = {r["name"]: r for r in results["rows"]}
  assert set(rows) == {"start", "warmup", "debian_tcs_s0", "xlm_align_union", "xlm_align_self_s0"}
  for name in ("debian_tcs_s0", "xlm_align_union", "xlm_align_self_s0"):
    assert rows[name]["steps_done"] == rows[name]["steps_planned"] == 3 and rows[name]["tokens_seen"] > 0
  assert rows["warmup"]["steps_done"] == 3
  debian, bible = rows["debian_tcs_s0"]["scores"], rows["xlm_align_union"]["scores"]
  assert set(debian["metrics"]) == {"bli", "retrieval", "mlm"}
  assert bible["metrics"] == ["word_alignment", "word_alignment_modes"]
  assert set(bible["word_alignment_modes"]) == {"separate/cosine", "joint/dot"}
  assert "sinkhorn_itermax" in bible["word_alignment_modes"]["joint/dot"]["test"]["by_method"]
  mix = rows["xlm_align_self_s0"]["scores"]  # Trained on the Bible's MLM + TLM mixture: MLM had rows.
  assert set(mix["word_alignment_modes"]) == {"separate/cosine", "joint/dot"}
  logged = [json.loads(line) for line in
            (host_work / "runs" / "xlm_align_self_s0" / "metrics.jsonl").read_text().splitlines()]
  assert any(r.get("mlm", 0) > 0 for r in logged) and any(r.get("dwa", 0) > 0 for r in logged), logged
  assert len(debian["bli"]["de"]["test"]["per_layer"]["rsim"]) == 5  # The embedding layer and 4 layers.
  assert {"aer", "layer"} <= set(bible["word_alignment"]["test"]["by_method"]["argmax"])
  assert set(rows["start"]["scores"]["metrics"]) == {"bli", "retrieval", "mlm", "word_alignment",
                                                    "word_alignment_modes"}
  # The warm-up trained the MLM head only: every other parameter is the start's, bit for bit.
  import jax
  import numpy as np

  warm_params = _params(host_work / "runs" / "warmup")
  moved = {k for k in warm_params if not all(np.array_equal(a, b) for a, b in
                                                zip(jax.tree.leaves(warm_params[k]), jax.tree.leaves(start_params[k])))}
  assert moved == {"mlm_head"}, moved
