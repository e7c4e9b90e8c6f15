"""The GPU bundle: a grid of experiments that trains and scores in one call on a borrowed GPU host without
TensorFlow, seqio or gin (docs/gpu_bundle.md).

`grids` (the grids, as data, and how their steps are sized) is read by `builder` (with `parts` and `folders`:
what a build makes and where it writes), which writes a `bundle.Bundle` (the plan and the parts, typed; the one
pair `write_bundle` / `read_bundle`). On the host `runner` runs what a Bundle says (with `start`, `children`
and `results`: the start weights, the child processes, what is reported), never a grid looked up by name. The
commands `xalign gpu_bundle` and `xalign gpu_run` (cli/) parse the flags and call in; what a build runs through
gin they pass in (`builder.GinEdge`).
"""
