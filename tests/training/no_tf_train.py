"""`python -m flax_xalign.train` in a process whose import system refuses TensorFlow, tensorflow_text, seqio
and conllu (a bare GPU host has none of them; conllu is only needed to parse CoNLL-U files).

    python -m tests.training.no_tf_train --gin_file=run.gin ...

As a host without them would: an import of one of them fails with ModuleNotFoundError, and each attempt is
printed as `REFUSED IMPORT <name>` (so a caller that swallows the error is still seen). On exit it prints
`TF MODULES: [...]`, the refused packages' modules that were loaded all the same (none, if the finder works).
"""

import importlib.abc
import importlib.machinery
import runpy
import sys

REFUSED = ("tensorflow", "tensorflow_text", "seqio", "conllu")


class _Refuse(importlib.abc.Loader):
  def create_module(self, spec):
    print(f"REFUSED IMPORT {spec.name}", file=sys.stderr, flush=True)
    raise ModuleNotFoundError(f"No module named {spec.name!r} (refused by {__name__})", name=spec.name)

  def exec_module(self, module):  # Never reached: create_module raises.
    raise AssertionError(module)


class _Finder(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in REFUSED:
      return importlib.machinery.ModuleSpec(name, _Refuse())
    return None


def main() -> None:
  sys.meta_path.insert(0, _Finder())
  sys.argv = ["flax_xalign.train", *sys.argv[1:]]
  try:
    runpy.run_module("flax_xalign.train", run_name="__main__")
  finally:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED)
    print(f"TF MODULES: {loaded}", flush=True)


if __name__ == "__main__":
  main()
