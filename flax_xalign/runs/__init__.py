"""Reading finished runs: `Run.open(model_dir)` (handle.py) and the MODEL_DIR layout (`RunDir`).

Sits above `training/` (whose checkpoint items and low-level reads it uses)
and below `evaluation/`, `interop/` and the command-line tools, which read
runs only through it. `RunDir` itself is defined in `flax_xalign/run_dir.py`,
beside the manifest (`run_spec.py`), because training writes that layout.
"""

from flax_xalign.run_dir import RunDir
from flax_xalign.runs.handle import Run

__all__ = ["Run", "RunDir"]
