"""The edge: every command of flax_xalign, the gin edge, and the one process set-up their `main`s call first.

  xalign <command> [flags]              the console script (`xalign.py`; `xalign --help` lists the commands)
  python -m flax_xalign.cli.<command>   the same command
  python -m flax_xalign.train / .eval   the t5x spellings of `train` and `eval` (thin fronts of this folder)

Commands: train eval assets compile_check cache cooc cooc_beam vocab lexicon
debian_data align bli retrieval eflomal import_hf export_hf trim e5_small
demo, and the experiment drivers in `experiments/`. `gin_cli.py` (t5x-style
flags, parsing, the operative config) and `configurables.py` (what gin may
bind) are the gin edge; no module below this folder imports gin or anything
here (tests/test_layering.py).

Commands that read a run take `--model_dir` (`common.add_model_dir_flag`;
the older `--checkpoint` is still accepted); gin commands bind MODEL_DIR.
A command's `main(argv=None) -> int` calls `setup_process()` first
(`_process.py`: TF/libtpu quieting, log filters, Orbax noise hooks) and then
does its work through `common.py` (argparse commands) or `gin_cli.py` (gin
commands: `gin_main`, `train`, `build_assets`); importing any of these
modules changes nothing in the process.
"""

from flax_xalign.cli._process import setup_process

__all__ = ["setup_process"]
