"""Experiment drivers, one module per paper study: runs of the real entry points plus a results table.

  align_mlm_grid   ALIGN-MLM objectives x synthetic languages (Tang et al., Table 3)
  code_switch      TCS-MLM / SCS-MLM (Lu, Lu & Zhang 2023)
  mlm_gc           MLM-GC (Ai & Fang 2023)
  bli_table        Table 1 / Fig. 3 of Lu et al. on real languages (Debian)
  e5_debian        the e5-small-on-Debian setting code_switch and mlm_gc share (+ e5_debian_report)
  harness          what they share: train (resumable), BLI, MLM accuracy, POS transfer, results.json

They live at the edge, not in the library (STYLE §13): their settings are
gin files in gin_configs/experiments/. `xalign <name>` runs each (the same as
`python -m flax_xalign.cli.experiments.<name>`).
"""
