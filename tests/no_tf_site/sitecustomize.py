"""Makes this interpreter look like the bare GPU host: TensorFlow, tensorflow_text, seqio and conllu absent.

Put this folder first on PYTHONPATH (`tests/no_tf_site.env(...)`): Python imports `sitecustomize` at start-up,
and a `None` in `sys.modules` makes both `import tensorflow` fail (ModuleNotFoundError) and
`importlib.util.find_spec("tensorflow")` answer None, as on a host that never installed them. (A meta-path
finder that raises would not do: libraries probe with `find_spec` and would see the package as present.)
"""

import sys

ABSENT = ("tensorflow", "tensorflow_text", "seqio", "conllu")

for _name in ABSENT:
  sys.modules[_name] = None
