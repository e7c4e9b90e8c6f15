"""`xalign bli_table` (flax_xalign.cli.experiments.bli_table over flax_xalign.experiments.bli_table) in-process,
contract tier: bad flags and a build without the gold are one `error:` line, before any model is read. Its real run
(multilingual-e5-small on the Debian gold) is docs/results/bli_table1.md; the table formatting is tested here."""

import pytest

from flax_xalign.experiments import bli_table
from tests.hardening import harness

pytestmark = pytest.mark.contract


@pytest.mark.parametrize("flags, keywords", [
    (["--languages=en,de"], ("--languages", "not en")),
    (["--select_min_count=2,x"], ("--select_min_count", "integers")),
], ids=["english_as_source", "selection_not_integers"])
def test_refuses_bad_flags(flags, keywords, tmp_path, capfd):
  (tmp_path / "help").mkdir()
  for name in ("de.train.txt", "en.train.txt"):
    (tmp_path / "help" / name).write_text("Datei\n")
  (tmp_path / "bli").mkdir()
  (tmp_path / "bli" / "de-en.dev.txt").write_text("Datei file\n")
  outcome = harness.run_main(capfd, "bli_table", [f"--model_dir={tmp_path / 'model'}", f"--data_dir={tmp_path}",
                                                  "--languages=de", *flags])
  harness.assert_user_error(outcome, *keywords)


def _data(tmp_path):
  (tmp_path / "help").mkdir()
  for name in ("de.train.txt", "en.train.txt"):
    (tmp_path / "help" / name).write_text("Datei\n")
  (tmp_path / "bli").mkdir()
  (tmp_path / "bli" / "de-en.test.txt").write_text("Datei file\n")


def test_an_output_folder_that_is_not_an_earlier_table_is_refused_untouched(tmp_path, capfd):
  data = tmp_path / "data"
  data.mkdir()
  _data(data)
  mine = tmp_path / "notes"
  mine.mkdir()
  (mine / "todo.txt").write_text("mine\n")
  before = harness.tree_digest(mine)
  outcome = harness.run_main(capfd, "bli_table", [f"--model_dir={tmp_path / 'model'}", f"--data_dir={data}",
                                                  "--languages=de", f"--output={mine}"])
  harness.assert_user_error(outcome, "non-empty folder", "earlier bli_table output", model_dir=mine, before=before)
  for output, words in ((data, ("--output", "--data_dir")), (data / "table", ("lies inside the --data_dir",))):
    before = harness.tree_digest(data)
    outcome = harness.run_main(capfd, "bli_table", [f"--model_dir={tmp_path / 'model'}", f"--data_dir={data}",
                                                    "--languages=de", f"--output={output}"])
    harness.assert_user_error(outcome, *words, model_dir=data, before=before)


def test_missing_gold_names_the_builder(tmp_path, capfd):
  outcome = harness.run_main(capfd, "bli_table", [f"--model_dir={tmp_path / 'model'}", f"--data_dir={tmp_path}",
                                                  "--languages=de"])
  harness.assert_user_error(outcome, "xalign debian_data")


def test_table_puts_the_paper_beside_ours():
  row = {"lang": "de", "nn_hit@1": 0.4, "nn_hit@5": 0.6, "csls_hit@1": 0.5, "csls_hit@5": 0.7, "rsim": 0.55,
         "dictionary": 1000, "covered": 50, "gold_entries": 100, "coverage": 0.5, "queries": 50}
  table = bli_table.format_table([row])
  assert "| de | 50.00 (48.33) | 70.00 (60.86) | 40.00 | 60.00 | 0.55 (0.63) | 1000 (2187) | 50/100 (50.0%) | 50 |" \
      in table
  assert "| avg | 50.00 (48.33) |" in table
