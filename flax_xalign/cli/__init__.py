"""Every runnable module of flax_xalign, and the one process set-up their `main`s call first.

  train eval align bli retrieval demo             (`python -m flax_xalign.<name>` still works)
  compile_check cooc debian_data assets
  vocab cooc_beam lexicon                         (`python -m flax_xalign.data.<name>` still works)
  import_hf export_hf trim e5_small               (`python -m flax_xalign.interop.<name>` still works)
  experiments.{align_mlm_grid,code_switch,mlm_gc} (`python -m flax_xalign.experiments.<name>` still works)

Commands that read a run take `--model_dir` (`common.add_model_dir_flag`;
the older `--checkpoint` is still accepted); gin commands bind MODEL_DIR.

Each command is `python -m flax_xalign.cli.<name>`; the old module paths are
thin aliases. A command's `main(argv=None) -> int` calls `setup_process()`
first (`_process.py`: TF/libtpu quieting, log filters, Orbax noise hooks) and
then does its work through `common.py`; importing any of these modules changes
nothing in the process.
"""

from flax_xalign.cli._process import setup_process

__all__ = ["setup_process"]
