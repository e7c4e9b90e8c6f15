"""One spelling of the run directory across the argparse commands: `--model_dir`, with `--checkpoint` kept."""

import pytest

from flax_xalign.cli import align, bli, common, export_hf, retrieval, trim
from flax_xalign.errors import UserError

# Each command's other required flags, so that only the run-directory flag varies.
REQUIRED = {
    align: ["--output=out.txt"],
    bli: ["--src=de", "--tgt=en"],
    retrieval: [],
    export_hf: ["--output=hf", "--layout=bert"],
    trim: ["--task=t", "--output=o"],
}


@pytest.mark.parametrize("command", list(REQUIRED), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("flag", ["--model_dir", "--checkpoint"])
def test_both_spellings_name_the_run_directory(command, flag):
  args = command.parse_args([f"{flag}=runs/x", *REQUIRED[command]])
  assert args.model_dir == "runs/x" and not hasattr(args, "checkpoint")


@pytest.mark.parametrize("command", list(REQUIRED), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_the_run_directory_is_required(command, capsys):
  with pytest.raises(SystemExit) as e:
    command.parse_args(REQUIRED[command])
  assert e.value.code == 2 and "--model_dir" in capsys.readouterr().err


def test_a_missing_directory_is_named_by_the_canonical_flag(tmp_path):
  assert common.existing_model_dir(str(tmp_path)) == str(tmp_path)
  with pytest.raises(UserError, match=r"^--model_dir .*/nope does not exist"):
    common.existing_model_dir(str(tmp_path / "nope"))
  (tmp_path / "afile").write_text("not a run\n")
  with pytest.raises(UserError, match=r"^--model_dir .*/afile is not a directory"):
    common.existing_model_dir(str(tmp_path / "afile"))


def test_the_commands_options_are_their_flags_less_the_run_directory():
  from flax_xalign.evaluation.lexicon.lexicon_eval import LexiconOptions
  from flax_xalign.evaluation.retrieval import RetrievalOptions

  options = bli.options_of(bli.parse_args(["--checkpoint=d", "--src=de", "--tgt=en", "--layers=all", "--knn=3"]))
  assert options == LexiconOptions(src="de", tgt="en", layers="all", knn=3)
  options = retrieval.options_of(retrieval.parse_args(["--model_dir=d", "--bible=test", "--method=csls"]))
  assert options == RetrievalOptions(bible="test", method="csls")
