"""Getting a run's asset values: built, loaded from files a user built, or restored.

`prepare(...)` decides, for every asset a run needs, where its value comes from:

* resuming: the assets saved with the checkpoint step being resumed (so the run
  continues with exactly them), each checked against the step's fingerprint;
  the copies in MODEL_DIR are checked against the manifest too, since editing
  them would otherwise silently do nothing;
* a new run: files already in MODEL_DIR (written by `xalign assets`
  or by hand), checked against the run; else `build(run)`.

An asset built from another run's parameters (`Asset.source`, the induced
dictionary's) gets that run opened here, `build(run, source=SourceRun)`:
assets never open checkpoints themselves.

It returns the manifest with the assets' initial fingerprints filled in and a
`RunAssets` holding the values. `write(...)` then saves the files into
MODEL_DIR; nothing is written before the whole run is known to be valid.
This is orchestration around the assets (restore, load, build), so it lives
beside `pretrain`, not in `assets/`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Mapping

from flax_xalign.assets.base import Asset, check_fingerprint
from flax_xalign.assets.runtime import RunAssets
from flax_xalign.run_dir import RunDir
from flax_xalign.training import checkpoints
from flax_xalign.training.run_reader import SourceRun

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec


def _load_or_build(asset: Asset, run: "RunSpec", model_dir: str) -> tuple[Any, str]:
  if asset.exists_in(model_dir):
    value = asset.load(model_dir)
    asset.check(value, run)
    return value, f"loaded from {model_dir}"
  start = time.perf_counter()
  source = getattr(asset, "source", None)
  value = asset.build(run, source=SourceRun.open(source)) if source else asset.build(run)
  return value, f"built in {time.perf_counter() - start:.1f} s"


def prepare(run: "RunSpec", assets: Mapping[str, Asset], *, model_dir: str,
            resume: tuple[int, "RunSpec", Mapping[str, Any]] | None = None,
            checkpoint_dir: str | None = None, verbose: bool = True) -> tuple["RunSpec", RunAssets]:
  """Values of every asset of `run`; see the module docstring.

  Args:
    run: the manifest of this invocation (asset fingerprints not yet known).
    assets: name -> Asset, every asset the run needs (vocabulary included).
    model_dir: the run's MODEL_DIR (may not exist yet).
    resume: (step, saved manifest, that step's asset fingerprints) when a
      checkpoint is being resumed.
    checkpoint_dir: MODEL_DIR, to read the step's asset files from.
    verbose: print one line per asset.

  Returns:
    (the manifest with `assets` and `asset_options` as the run keeps them,
     RunAssets with the values).
  """
  values: dict[str, Any] = {}
  fingerprints: dict[str, Any] = {}
  notes: dict[str, str] = {}
  if resume is not None:
    step, saved, step_fingerprints = resume
    kept = {n: a for n, a in assets.items() if n in step_fingerprints}
    values.update(checkpoints.load_step_assets(checkpoint_dir or model_dir, step, kept, step_fingerprints))
    for name, asset in kept.items():
      initial = saved.assets.get(name)
      fingerprints[name] = initial if initial is not None else step_fingerprints[name]
      if initial is not None and asset.exists_in(model_dir):
        check_fingerprint(asset, asset.load(model_dir), initial, where=model_dir)
      notes[name] = f"restored from checkpoint step {step}"
    if saved.asset_options != run.asset_options and verbose:
      print(f"note: the run keeps the assets it was started with (options {dict(saved.asset_options)}); "
            f"this invocation's {dict(run.asset_options)} are ignored", flush=True)
    run = run.replace(asset_options={**run.asset_options, **saved.asset_options})
  for name, asset in assets.items():
    if name in values:
      continue
    values[name], notes[name] = _load_or_build(asset, run, model_dir)
    fingerprints[name] = asset.fingerprint(values[name])
  if verbose:
    for name in sorted(assets):
      print(f"asset {assets[name].describe(values[name])} ({notes[name]})", flush=True)
  run = run.replace(assets=fingerprints)
  run_assets = RunAssets(assets, values, run)
  if resume is not None:
    run_assets.source_step = resume[0]
  return run, run_assets


def write(model_dir: str, run_assets: RunAssets) -> list[str]:
  """Writes every asset whose files are missing from MODEL_DIR (their initial values)."""
  written = []
  values = run_assets.host_values()
  for name in run_assets.names:
    asset = run_assets.assets[name]
    if asset.exists_in(model_dir):
      continue
    if asset.fingerprint(values[name]) != dict(run_assets.run.assets.get(name, {})):
      continue  # A refreshed value is not the run's initial one; the checkpoints hold it.
    asset.save(model_dir, values[name])
    written.extend(RunDir.of(model_dir).file(f) for f in asset.files)
  return written
