"""The ALIGN-MLM grid driver: argument errors, reporting, and a tiny end-to-end run (slow)."""

import json

import pytest

from flax_xalign.cli.experiments import align_mlm_grid as grid_cli
from flax_xalign.experiments import align_mlm_grid as grid


def _row(objective, transform, alignment, delta):
  return {"objective": objective, "transform": transform, "alignment": alignment, "alignment_heldout": alignment / 2,
          "pos": {"sup": 0.9, "zs": 0.9 - delta, "delta": delta, "natural": 0.9}}


def test_table_and_spearman():
  rows = [_row("mlm", "trans", 0.1, 0.30), _row("align_mlm", "trans", 0.9, 0.05), _row("xlm", "trans", 0.4, 0.2),
          _row("dict_mlm", "trans", 0.3, 0.25)]
  table = grid.format_table(rows, ["pos"])
  assert table.splitlines()[0].startswith("| objective | transform | alignment |")
  assert "| align_mlm | trans | 90.0 | 45.0 | 90.0 | 85.0 | 5.0 |" in table
  rho = grid.correlations(rows, ["pos"])["pos"]
  assert rho["rho"] == pytest.approx(-1.0) and rho["n"] == 4


@pytest.mark.slow
def test_tiny_grid_end_to_end(tmp_path, bible_data_dir):
  out = tmp_path / "grid"
  code = grid_cli.main([f"--model_dir={out}", "--steps=3", "--transforms=trans", "--objectives=mlm,align_mlm",
                        "--tasks=pos", "--finetune_steps=3", "--gin=SYNTHETIC_VOCAB_SIZE=211"])
  assert code == 0
  results = json.loads((out / "results.json").read_text())
  assert [(r["objective"], r["transform"]) for r in results["rows"]] == [("mlm", "trans"), ("align_mlm", "trans")]
  for row in results["rows"]:
    assert row["pos"]["delta"] == pytest.approx(row["pos"]["sup"] - row["pos"]["zs"])
    assert 0.0 <= row["alignment"] <= 1.0
  assert (out / "results.md").read_text().startswith("| objective")
  assert (out / "alignment_vs_delta.png").stat().st_size > 0
  assert (out / "trans" / "align_mlm" / "dictionary.tsv").exists()
