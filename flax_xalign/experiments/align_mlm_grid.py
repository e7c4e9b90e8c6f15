"""`python -m flax_xalign.experiments.align_mlm_grid`: kept as an alias of
`flax_xalign.cli.experiments.align_mlm_grid`."""

import sys

from flax_xalign.cli.experiments.align_mlm_grid import (  # noqa: F401  (old import paths)
    DEFAULT_TRANSFORMS, OBJECTIVES, TASK_TITLES, TASKS, correlations, evaluate_run, format_table, main,
    parse_args, plot, pretrain_run, task_data)

if __name__ == "__main__":
  sys.exit(main())
