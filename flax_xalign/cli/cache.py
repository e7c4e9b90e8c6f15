r"""Writes a task's rows once as a packed dataset (ArrayRecord shards + manifest) to train from without TensorFlow.

  xalign cache --task=bible_grc_en_mlm_tlm --split=train --output=cache/bible \
      --length=512 [--examples=N | --epochs=E] [--seed=0] [--pair_layout=restart]
  xalign cache --task=bible_grc_en_mlm_tlm --split=validation --output=cache/bible --length=512
  python -m flax_xalign.train ... --gin.train.data=\"cache:cache/bible\"
  xalign cache --gin_file=my_run.gin --output=cache/mine   # the run's own task and settings
  xalign cache --gin_file=my_run.gin --output=gs://bucket/cache   # written locally, then uploaded

With gin flags (--gin_file, --gin.NAME=VALUE, --gin_search_paths) the run's
settings fill in what is not given as a flag: the task (MIXTURE_OR_TASK_NAME,
with the tasks its `train.user_tasks` define), the row length, languages, pair
layout and seed, so the cache fits that run.

The rows are the seqio pipeline's own (tokenised, feature-converted, packed),
so seqio stays the one task registry; each split goes to OUTPUT/<split>/.
Training reads OUTPUT/train (and OUTPUT/<eval_split> for evaluation during
training, when built). `--examples N` writes the first N rows of the endless
shuffled stream (a mixture keeps its sampling rates); `--epochs E` (default 1)
writes E passes (a mixture is then read task by task, every row once per pass,
rates aside). README "Packed datasets".

A bucket (`--output=gs://BUCKET/FOLDER`): the split is written into a local
temporary folder as above, then uploaded, its manifest last
(`flax_xalign.data.packed.upload`); runs read it as `cache:gs://BUCKET/FOLDER`,
staged on each host's disk (`flax_xalign.data.packed.staging`).

Word links: the rows also carry `link_groups` (the tasks' given word links,
what DWA / SO with label_source 'links', 'intersection' or 'union' read) with
`--links`, and by default when a task behind the name was given links
(`TsvBitextTask(links=...)`, e.g. eflomal's) or the gin run's objectives read
them; `--no-links` leaves them out. docs/data.md "Packed datasets".
"""

from __future__ import annotations

import atexit
import functools
import signal
import sys
from collections.abc import Sequence
from typing import Any

from flax_xalign.cli import common
from flax_xalign.cli import cache_flags
from flax_xalign.training import cache_job


def _gin_flags(rest: list[str]) -> Any:
  from flax_xalign.cli import gin_cli

  return gin_cli.parse_args(rest, description=__doc__.splitlines()[0], prog="xalign cache")


def parse_args(argv: Sequence[str]) -> Any:
  """The flags (`cache_flags.parse_flags`: every flag of the job; `args.gin`, the gin flags or None)."""
  return cache_flags.parse_flags(argv, prog="xalign cache", description=__doc__.splitlines()[0], gin_flags=_gin_flags)


def _fill_from_gin(gin_args: Any, job: cache_job.CacheJob) -> cache_job.CacheJob:
  """Registers the gin run's user tasks and takes its settings for every flag left unset."""
  from flax_xalign.cli import gin_cli

  return cache_job.fill_from_bindings(job, gin_cli.train_bindings(gin_args))


def run(args: Any) -> None:
  from flax_xalign.cli._process import setup_process

  fill = functools.partial(_fill_from_gin, args.gin) if args.gin is not None else None
  cache_job.write_cache(cache_flags.job_of(args), fill=fill, worker_setup=setup_process)


def _ignore_ctrl_c() -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: Sequence[str] | None = None) -> int:
  code = common.main_of(parse_args, run, argv)
  # The work is over (the split is in place, or refused, or interrupted). The interpreter's teardown takes
  # seconds (TensorFlow's and JAX's objects) after it has given SIGINT its default action back: a Ctrl-C then
  # killed the process silently (status -2) after a complete write. Ignored from the exit handlers on (the
  # last registered runs first; a caller in-process keeps its own handler), the exit status stays the truth.
  atexit.unregister(_ignore_ctrl_c)
  atexit.register(_ignore_ctrl_c)
  return code


if __name__ == "__main__":
  sys.exit(main())
