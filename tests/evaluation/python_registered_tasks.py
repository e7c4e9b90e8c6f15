"""Tasks registered in Python, the way a user's own module would (no TextTask spec).

Importing it registers them when FLAX_XALIGN_TEST_PY_TASKS holds
'{"train": path, "validation": path, "vocab": path}' (how a fresh evaluation
process finds them); tests call `register` directly.
"""

import functools
import json
import os

from flax_xalign.tasks import registry

TASK = "py_registered_en"
TASK_B = "py_registered_en_b"
MIXTURE = "py_registered_mix"
ENV = "FLAX_XALIGN_TEST_PY_TASKS"


def _read(files, split):
  with open(files[split], encoding="utf-8") as f:
    return {"text": [line.strip() for line in f if line.strip()]}


def register(train, vocab, validation=None):
  from flax_xalign.tasks import user

  files = {"train": train, "validation": validation or train}
  for name in (TASK, TASK_B):
    registry.register_task(name, loader=functools.partial(_read, files), vocabulary=user._vocabulary(vocab),
                           lang="en", splits=["train", "validation"], definition=(name, train, vocab))
  registry.register_mixture(MIXTURE, [TASK, TASK_B])


if os.environ.get(ENV):
  register(**json.loads(os.environ[ENV]))
