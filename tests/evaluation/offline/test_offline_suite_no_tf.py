"""`score` in a child Python where TensorFlow, tensorflow_text, seqio and conllu are absent (tests/no_tf_site),
as on the GPU bundle's host: every metric comes back, with the numbers of the in-process scoring, and none
of those packages (nor gin) was imported."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.evaluation.offline.suite_testlib import assert_filled, close

pytestmark = pytest.mark.subprocess


CHILD = textwrap.dedent("""
    import json, sys
    from flax_xalign.runs import Run
    from flax_xalign.evaluation.offline.scoring import score
    result = score(Run.open(sys.argv[1]), sys.argv[2], progress=lambda line: None)
    print("RESULT " + json.dumps(result))
    print("GIN " + ("IMPORTED" if "gin" in sys.modules else "ABSENT"))
    """)


def test_score_runs_where_tensorflow_and_seqio_are_absent(shared_run, suite, scored):
  from tests import no_tf_site

  code = CHILD + no_tf_site.CHECK + "\n"
  done = subprocess.run([sys.executable, "-c", code, str(shared_run["dir"]), suite["dir"]], env=no_tf_site.env(),
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])
  assert "ABSENT OK" in lines and "GIN ABSENT" in lines, done.stdout[-2000:]
  assert [line.split()[0] for line in lines if line.split()[0] in ("RESULT", "ABSENT")] == ["RESULT", "ABSENT"]
  assert_filled(result)
  close(result["bli"], json.loads(json.dumps(scored["bli"])), "child.bli")
  close(result["word_alignment"]["test"], json.loads(json.dumps(scored["word_alignment"]["test"])), "child.wa")
