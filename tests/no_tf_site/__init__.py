"""A `sitecustomize` that hides TensorFlow, tensorflow_text, seqio and conllu from a child Python.

    env = no_tf_site.env()           # os.environ + PYTHONPATH = this folder, the repository root, the old path
    subprocess.run([sys.executable, ...], env=env)

In the child, `importlib.util.find_spec("tensorflow")` is None and `import tensorflow` raises
ModuleNotFoundError, as on the GPU host (no TensorFlow, seqio or gin there).
"""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(FOLDER))
ABSENT = ("tensorflow", "tensorflow_text", "seqio", "conllu")
# A child's check that none of them came in: prints `ABSENT OK` or the names found.
CHECK = ("import importlib.util, sys; found = [n for n in %r if importlib.util.find_spec(n) is not None "
         "or sys.modules.get(n) is not None]; print('ABSENT OK' if not found else f'PRESENT {found}')" % (ABSENT,))


def env(extra_path: str | None = None, **overrides: str) -> dict[str, str]:
  """os.environ with PYTHONPATH = this folder, `extra_path` (else the repository root), the old PYTHONPATH."""
  old = os.environ.get("PYTHONPATH")
  path = os.pathsep.join(filter(None, [FOLDER, extra_path or ROOT, old]))
  return {**os.environ, "PYTHONPATH": path, **overrides}
