"""`python -m flax_xalign.train`: the pretraining entry point, kept at its contract path.

The command lives in `flax_xalign.cli.train`; this module re-exports it.
"""

import sys

from flax_xalign.cli.train import (MULTIHOST_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV,  # noqa: F401  (old paths)
                                   distributed_settings, enable_compilation_cache, main,
                                   maybe_initialize_distributed)

if __name__ == "__main__":
  sys.exit(main())
