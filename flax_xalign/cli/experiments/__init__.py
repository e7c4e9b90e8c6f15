"""Experiment drivers, one module per paper study: runs of the real entry points plus a results table.

  align_mlm_grid   ALIGN-MLM objectives x synthetic languages (Tang et al., Table 3)
  code_switch      TCS-MLM / SCS-MLM (Lu, Lu & Zhang 2023)
  mlm_gc           MLM-GC (Ai & Fang 2023)
  harness          what they share: train (resumable), BLI, MLM accuracy, POS transfer, results.json

They live at the edge, not in the library (STYLE §13): their settings are
gin files in gin_configs/experiments/. `python -m flax_xalign.experiments.<name>`
still runs each (thin aliases); `python -m flax_xalign.cli.experiments.<name>`
is the same command.
"""
