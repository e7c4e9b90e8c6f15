"""The experiments as library code: the paper drivers' work (train a grid of runs, score them, write the
tables), the GPU grids, the bundle that carries one to a borrowed machine, and its runner.

Above `interop/` and below `cli/`: nothing here parses flags, imports gin or imports a command; a command
of `cli/experiments/` (or `cli/gpu_bundle.py`, `cli/gpu_run.py`) parses its flags and calls in with typed
arguments. Where a driver must train a run through gin it is handed the edge's trainer as a callable
(`harness.Trainer`).
"""
