"""The GPU bundle's pieces that need no training: grids, step planning, the size limit, the folder's safety,
the host's checks of a bundle and of its results (the end-to-end proof: tests/cli/test_gpu_bundle_run.py)."""

import dataclasses
import json
import os

import pytest

from flax_xalign.errors import UserError
from flax_xalign.experiments.gpu import builder, folders, results, runner
from flax_xalign.experiments.gpu import bundle as bundle_lib
from flax_xalign.experiments.gpu import grids as gpu_grids


def _grid(**overrides):
  caches = {"a": gpu_grids.CacheSpec(task="t_a", length=100, rows=10),
            "b": gpu_grids.CacheSpec(task="t_b", length=50, rows=10)}
  warm = gpu_grids.Experiment(name="warmup", family="fa", objective="head_warmup", gin_files=())
  rows = (gpu_grids.Experiment(name="x", family="fa", objective="mlm", gin_files=(), start="warmup", cost=1.0),
          gpu_grids.Experiment(name="y", family="fa", objective="tcs", gin_files=(), start="warmup", cost=2.0),
          gpu_grids.Experiment(name="z", family="fb", objective="so", gin_files=(), cost=1.5))
  fields = dict(name="g", description="", start="tiny", caches=caches, suite_sizes={}, warmup=warm, warmup_steps=5,
                families=(gpu_grids.Family(name="fa", cache="a", batch_size=8, share=0.75, max_steps=10_000,
                                           min_steps=1),
                          gpu_grids.Family(name="fb", cache="b", batch_size=4, share=0.25, max_steps=100,
                                           min_steps=1)),
                experiments=rows, budget_s=100.0)
  fields.update(overrides)
  return gpu_grids.Grid(**fields).check()


def _row(name, family, **fields):
  return bundle_lib.Row(**{**dict(name=name, family=family, objective="mlm", gin_files=(), bindings=(), start="start",
                                  seed=0, cost=1.0, metrics=(), assets=""), **fields})


def _bundle(**changes):
  """A Bundle of one family and one row (what `write_bundle` writes; `changes` replace fields)."""
  fields = dict(
      grid="tiny", budget_s=100.0, created="2026-12-01T00:00:00+00:00", work="/w", languages=("de",),
      start=bundle_lib.Start(kind="model_dir", path="caches"),
      caches={"a": bundle_lib.Cache(task="t_a", length=100, rows=10, eval_rows=0, links=False, path="caches")},
      common_bindings=("EncoderConfig.dropout_rate = 0.0",),
      families=(gpu_grids.Family(name="fa", cache="a", batch_size=8, share=1.0, max_steps=10, min_steps=1,
                                 bindings=("OptimizerConfig.learning_rate = 5e-5",)),),
      warmup=_row("warmup", "fa"), warmup_steps=5,
      experiments=(_row("x", "fa", gin_files=("experiments/code_switch/tcs.gin",), bindings=("SEED = 1",)),),
      gin={"experiments/code_switch/tcs.gin": "train.objectives = {'mlm': 1.0, 'tcs': 1.0}\n"},
      alignment_peers=None, parts={}, bytes=0, files={})
  fields.update(changes)
  return bundle_lib.Bundle(**fields)


def test_plan_steps_by_hand():
  # Warm-up: 8 x 100 = 800 slots a step at 10 steps/s. Family fa (same shape): costs 1 + 2 = 3 warm-up steps a
  # step; 0.75 x 200 s x 0.8 = 120 s -> 120 x 10 / 3 = 400 steps. Family fb: 4 x 50 = 200 slots, a quarter
  # of the warm-up's, cost 1.5 / 4 = 0.375; 0.25 x 200 x 0.8 = 40 s -> 40 x 10 / 0.375 = 1066, over max 100.
  plan = gpu_grids.plan_steps(_grid(), warmup_steps_per_s=10.0, train_budget_s=200.0, safety=0.8)
  assert plan["fa"] == {"steps": 400, "seconds": pytest.approx(120.0), "cost": pytest.approx(3.0), "capped": ""}
  assert plan["fb"]["steps"] == 100 and plan["fb"]["capped"] == "max_steps"
  assert plan["fb"]["cost"] == pytest.approx(0.375)
  slow = gpu_grids.plan_steps(_grid(), warmup_steps_per_s=0.01, train_budget_s=200.0)
  assert slow["fa"] == {"steps": 1, "seconds": pytest.approx(120.0), "cost": pytest.approx(3.0), "capped": "min_steps"}


def test_grid_checks_refuse_what_cannot_run():
  with pytest.raises(ValueError, match="shares sum"):
    _grid(families=(gpu_grids.Family(name="fa", cache="a", batch_size=8, share=0.5, max_steps=9, min_steps=1),
                    gpu_grids.Family(name="fb", cache="b", batch_size=8, share=0.4, max_steps=9, min_steps=1)))
  bad = gpu_grids.Experiment(name="q", family="fa", objective="mlm", gin_files=(), start="nowhere")
  with pytest.raises(ValueError, match="unknown 'nowhere'"):
    _grid(experiments=(bad,))
  with pytest.raises(UserError, match="--grid='huge' is not a grid; choose from science, science2, tiny"):
    gpu_grids.grid_named("huge")


def test_the_science_grid_is_the_issues_grid():
  grid = gpu_grids.SCIENCE
  debian = [(e.objective, e.seed) for e in grid.experiments if e.family == "debian"]
  assert sorted(debian) == sorted((o, s) for o in ("mlm", "tcs", "scs", "scs_vocab", "gc") for s in (0, 1))
  assert all(e.start == "warmup" for e in grid.experiments if e.family == "debian")
  assert "OptimizerConfig.trainable = ['mlm_head']" in grid.warmup.bindings
  assert sorted(e.objective for e in grid.experiments if e.family == "xlm_align") == [
      "xlm_align_links", "xlm_align_self", "xlm_align_union"]
  so = grid.family("so")
  assert so.min_steps >= 2 * 1200 and [e.start for e in grid.experiments if e.family == "so"] == ["start"]
  assert grid.caches[grid.family("xlm_align").cache].links and grid.caches[so.cache].links
  assert all(e.metrics for e in grid.experiments)


def test_the_science2_grid_is_issue_49s_grid_v2():
  grid = gpu_grids.SCIENCE_V2
  mix = [(e.objective, e.seed) for e in grid.experiments if e.family == "xlm_align_mix"]
  assert sorted(mix) == sorted((o, s) for o in ("mlm_tlm", "xlm_align_self") for s in (0, 1))
  spec = grid.caches[grid.family("xlm_align_mix").cache]
  assert spec.task == gpu_grids.BIBLE_MIX_TASK and spec.task.endswith("_grc_en_mlm_tlm")  # MLM rows are in it.
  rows = {e.name: e for e in grid.experiments}
  assert "DwaConfig.label_source = 'self'" in rows["xlm_align_self_s0"].bindings
  assert rows["mlm_tlm_s1"].gin_files == ("objectives/mlm_tlm.gin",)  # The -DWA control: no DWA term.
  debian = [(e.objective, e.seed) for e in grid.experiments if e.family == "debian"]
  assert sorted(debian) == [("gc", 0), ("gc", 1), ("mlm", 0), ("mlm", 1)]  # The same seeds for both.
  bible = [e for e in grid.experiments if e.family != "debian"]
  assert all("word_alignment_modes" in e.metrics for e in bible) and "word_alignment_modes" in grid.metrics()
  parts = gpu_grids.estimate_bytes(grid)
  assert sum(parts.values()) <= 56 * builder.MIB, {k: round(v / builder.MIB, 1) for k, v in parts.items()}


def test_the_size_limit_names_the_biggest_part(tmp_path):
  (tmp_path / "caches").mkdir()
  (tmp_path / "caches" / "c").write_bytes(b"x" * 700_000)
  (tmp_path / "start").mkdir()
  (tmp_path / "start" / "w").write_bytes(b"x" * 400_000)
  budget = builder.Budget(str(tmp_path), limit_mib=1.0)
  assert budget.add("start") == 400_000
  with pytest.raises(UserError, match=r"would be 1\.0 MiB, over --max_mib=1; its biggest part is caches \(0\.7 MiB\)"):
    budget.add("caches")


def test_the_output_folder_is_replaced_only_when_this_command_wrote_it(tmp_path):
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("a user's file")
  with pytest.raises(UserError, match="GPU bundle written by xalign gpu_bundle"):
    folders.check_output(str(mine), overwrite=True, inputs={})
  with pytest.raises(UserError, match="not a GPU bundle written by xalign gpu_bundle"):
    folders.prepare_output(str(mine))
  assert (mine / "notes.txt").read_text() == "a user's file"
  bundle = folders.prepare_output(folders.check_output(str(tmp_path / "b"), overwrite=False, inputs={}))
  (tmp_path / "b" / "old").write_text("old part")
  with pytest.raises(UserError):
    folders.check_output(bundle, overwrite=False, inputs={})
  folders.prepare_output(folders.check_output(bundle, overwrite=True, inputs={}))
  assert os.listdir(bundle) == [folders.MARKER]
  with pytest.raises(UserError, match="--debian_data"):  # Never into (or around) what it reads.
    folders.check_output(str(tmp_path), overwrite=True, inputs={"--debian_data": str(tmp_path / "b")})


def test_the_host_refuses_a_folder_that_is_no_bundle_and_a_damaged_file(tmp_path):
  with pytest.raises(UserError, match="is not a GPU bundle.*xalign gpu_bundle"):
    bundle_lib.read_bundle(str(tmp_path))
  (tmp_path / "caches").mkdir()
  (tmp_path / "caches" / "shard").write_bytes(b"12345")
  bundle_lib.write_bundle(str(tmp_path), _bundle(files={"caches/shard": 5}))
  assert bundle_lib.read_bundle(str(tmp_path)).files == {"caches/shard": 5}
  (tmp_path / "caches" / "shard").write_bytes(b"123")
  with pytest.raises(UserError, match=r"bundle file caches/shard is damaged \(3 bytes, the bundle wrote 5\)"):
    bundle_lib.read_bundle(str(tmp_path))


def test_results_with_a_missing_field_or_a_failed_row_are_reported():
  full = {f: 1 for f in results.ROW_FIELDS}
  assert results.check_results({"rows": [{**full, "name": "a", "scores": {"bli": 1}}]}) == []
  problems = results.check_results({"rows": [{**full, "name": "a", "scores": {}},
                                             {**full, "name": "b", "steps_done": None,
                                              "scores": {"error": "training failed"}}]})
  assert problems == ["a: scores", "b: steps_done", "b: training failed"]


def test_train_argv_gives_each_experiment_its_familys_shape_and_the_bundles_cache(tmp_path):
  bundle = _bundle(caches={"a": bundle_lib.Cache(task="t_a", length=100, rows=10, eval_rows=0, links=False,
                                                 path="caches/a")})
  experiment = bundle.experiments[0]
  argv = runner.train_flags("/b", bundle, experiment, model_dir="/w/runs/x", init_dir="/w/runs/warmup",
                            start_dir="/w/start", steps=40)
  assert argv[:3] == ["--gin_file=runs/pretrain.gin", "--gin_file=/w/start/model.gin",
                      "--gin_file=experiments/code_switch/tcs.gin"]
  for flag in ("--gin.MODEL_DIR='/w/runs/x'", "--gin.MIXTURE_OR_TASK_NAME='t_a'", "--gin.train.data='cache:/b/caches/a'",
               "--gin.TASK_FEATURE_LENGTHS={'tokens': 100}", "--gin.BATCH_SIZE=8", "--gin.TRAIN_STEPS=40",
               "--gin.EVAL_EVERY=0", "--gin.SEED=1", "--gin.OptimizerConfig.learning_rate=5e-5",
               "--gin.INIT_FROM_CHECKPOINT='/w/runs/warmup'", "--gin.train.init_from_checkpoint=%INIT_FROM_CHECKPOINT"):
    assert flag in argv, (flag, argv)
  # The experiment's own bindings come last, so they win over the family's.
  assert argv.index("--gin.SEED=1") > argv.index("--gin.OptimizerConfig.learning_rate=5e-5")


def test_assets_carried_xz_compressed_arrive_byte_for_byte(tmp_path):
  import lzma

  table = os.urandom(1000) + bytes(5000)
  (tmp_path / "bundle" / "assets" / "gc").mkdir(parents=True)
  (tmp_path / "bundle" / "assets" / "gc" / "cooc.npz.xz").write_bytes(lzma.compress(table))
  (tmp_path / "bundle" / "assets" / "gc" / "cooc.json").write_text("{}")
  run_dir = tmp_path / "run"
  copied = runner.copy_assets(str(tmp_path / "bundle"), "gc", str(run_dir))
  assert copied == ["cooc.json", "cooc.npz"]
  assert (run_dir / "cooc.npz").read_bytes() == table and sorted(os.listdir(run_dir)) == ["cooc.json", "cooc.npz"]
  (run_dir / "cooc.json").write_text('{"edited": 1}')  # A file already in MODEL_DIR is never replaced.
  assert runner.copy_assets(str(tmp_path / "bundle"), "gc", str(run_dir)) == []
  assert (run_dir / "cooc.json").read_text() == '{"edited": 1}'


def test_the_science_bundle_fits_what_a_device_call_carries():
  # Its caches scaled from the measured bundle (ArrayRecord compresses rows, so their bytes are measured);
  # the start, assets, suite and wheels as measured. Grow a cache or the suite and this fails before a build.
  grid = gpu_grids.SCIENCE
  parts = gpu_grids.estimate_bytes(grid)
  assert sum(parts.values()) <= 56 * builder.MIB, {k: round(v / builder.MIB, 1) for k, v in parts.items()}
  # The estimate reproduces the measured bundle from the rows it was measured with (within 1%).
  measured_caches = {name: dataclasses.replace(spec, rows=grid.measured.rows[name][0],
                                               eval_rows=grid.measured.rows[name][1])
                     for name, spec in grid.caches.items()}
  again = sum(gpu_grids.estimate_bytes(grid, measured_caches).values())
  assert abs(again - grid.measured.total) <= 0.01 * grid.measured.total, (again, grid.measured.total)
  # Twice the Debian cache would not fit.
  bigger = {**grid.caches, "debian": dataclasses.replace(grid.caches["debian"], rows=48_000)}
  assert sum(gpu_grids.estimate_bytes(grid, bigger).values()) > 56 * builder.MIB


def test_rows_start_seed_zero_first_and_the_smallest_families_first():
  specs = gpu_grids.SCIENCE.experiments
  order = [s.name for s in runner.run_order(specs)]
  assert order[0] == "so_links" and order[1:4] == ["xlm_align_self", "xlm_align_links", "xlm_align_union"]
  assert order[4:9] == [f"debian_{o}_s0" for o in ("mlm", "tcs", "scs", "scs_vocab", "gc")]
  assert order[9:] == [f"debian_{o}_s1" for o in ("mlm", "tcs", "scs", "scs_vocab", "gc")]


def test_the_host_shares_the_card_out_unless_the_user_did(monkeypatch):
  """The first H200 run lost 8 of 16 rows to children that each kept their peak beside a driver holding 75%."""
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
  env = runner.child_env(runner.TRAIN_MEMORY / 5)
  assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.140" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in runner.child_env()
  assert runner.TRAIN_MEMORY + runner.SCORE_MEMORY <= 0.9  # Room for CUDA contexts and the driver.
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  assert runner.child_env(0.1)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"


def test_a_bundle_round_trips_through_bundle_json(tmp_path):
  (tmp_path / "caches").mkdir()
  (tmp_path / "caches" / "shard").write_bytes(b"12345")
  bundle = _bundle(files={"caches/shard": 5}, parts={"caches": 5}, bytes=5,
                   alignment_peers={"verses": 12, "eflomal": {"aer": 0.25}})
  bundle_lib.write_bundle(str(tmp_path), bundle)
  again = bundle_lib.read_bundle(str(tmp_path))
  assert again == bundle and isinstance(again.experiments[0], bundle_lib.Row)
  assert isinstance(again.families[0], gpu_grids.Family) and again.experiments[0].gin_files == (
      "experiments/code_switch/tcs.gin",)
  raw = json.loads((tmp_path / "bundle.json").read_text())
  assert (raw["format"], raw["version"]) == (bundle_lib.FORMAT, bundle_lib.VERSION)


@pytest.mark.parametrize("version", [None, 1, 3])
def test_a_bundle_of_another_version_is_one_line_naming_the_rebuild_command(tmp_path, version):
  """Version 1 bundles were dicts the host read by key, their rows run from today's grid: rebuild them."""
  (tmp_path / "caches").mkdir()
  bundle_lib.write_bundle(str(tmp_path), _bundle())
  raw = json.loads((tmp_path / "bundle.json").read_text())
  if version is None:
    del raw["version"]
  else:
    raw["version"] = version
  (tmp_path / "bundle.json").write_text(json.dumps(raw))
  with pytest.raises(UserError) as e:
    bundle_lib.read_bundle(str(tmp_path))
  line = str(e.value)
  assert "\n" not in line and f"this checkout reads version {bundle_lib.VERSION}" in line
  assert f"rebuild it with `xalign gpu_bundle --grid=tiny --output={tmp_path}`" in line
  assert ("no version" if version is None else f"version {version}") in line
