"""tests/scheduling.py: files longest first (by hand-made durations), and the Makefile lets xdist follow that order."""

import json
import re

from tests import scheduling


def test_files_go_longest_first_and_keep_their_own_order():
  ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "c.py::t3", "d.py::t1"]
  durations = {"a.py::t1": 1.0, "a.py::t2": 2.0,  # a: 3.0
               "b.py::t1": 10.0,  # b: 10.0
               "c.py::t2": 2.5}  # c: 0.2 + 2.5 + 0.2 = 2.9 (two tests it does not list)
  assert scheduling.DEFAULT_S == 0.2
  assert scheduling.longest_files_first(ids, durations) == [
      "b.py::t1", "a.py::t1", "a.py::t2", "c.py::t1", "c.py::t2", "c.py::t3", "d.py::t1"]
  # No durations: the collection order; equal sums: the collection order too.
  assert scheduling.longest_files_first(ids, {}) == ["c.py::t1", "c.py::t2", "c.py::t3", "a.py::t1", "a.py::t2",
                                                     "b.py::t1", "d.py::t1"]
  assert scheduling.longest_files_first(["x.py::a", "y.py::b"], {"x.py::a": 1, "y.py::b": 1}) == ["x.py::a", "y.py::b"]


def test_durations_file_round_trips_and_bad_files_are_ignored(tmp_path):
  path = tmp_path / "durations.json"
  scheduling.write({"b.py::t": 2.0, "a.py::t": 1.5}, path)
  assert list(json.loads(path.read_text())) == ["a.py::t", "b.py::t"]  # Sorted: small diffs when refreshed.
  assert scheduling.load(path) == {"a.py::t": 1.5, "b.py::t": 2.0}
  path.write_text("{not json")
  assert scheduling.load(path) == {}
  assert scheduling.load(tmp_path / "missing.json") == {}
  shipped = scheduling.load()
  assert shipped and all("::" in k and v >= scheduling.KEPT_S for k, v in shipped.items())


def test_the_makefile_turns_xdists_own_reordering_off():
  makefile = (scheduling.DURATIONS.parents[1] / "Makefile").read_text()
  xdist = re.search(r"^XDIST := (.*)$", makefile, re.M).group(1)
  assert "--dist loadfile" in xdist and "--no-loadscope-reorder" in xdist, xdist
