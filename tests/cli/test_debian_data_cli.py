"""`xalign debian_data` in-process (the contract tier): the corpora built from a small fake
root of Debian packages (tests/data/test_debian.py's `fake_root`), and one `error:` line for missing
packages and bad flags. The parsers are tested in tests/data/test_debian.py; the real packages' build is
its slow test."""

import json

import pytest

from flax_xalign.data.sources import debian
from tests.data.test_debian import fake_root
from tests.hardening import harness

pytestmark = pytest.mark.contract


def test_builds_the_corpora_of_a_fake_root(tmp_path, capfd):
  root, out = fake_root(tmp_path / "root"), tmp_path / "out"
  outcome = harness.run_main(capfd, "debian_data", [f"--root={root}", f"--output={out}", "--languages=hi"])
  assert outcome.code == 0, outcome.err[-2000:]
  printed = outcome.out.strip().splitlines()
  result = json.loads(printed[-1])
  assert any(line.startswith("hi ") for line in printed)
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["packages"]["libreoffice-help-hi"] == {"version": "4:7.4.7-1+deb12u14",
                                                         "license_file": "LICENSES/libreoffice-help-hi.txt"}
  assert (out / "LICENSES/dict-freedict-eng-hin.txt").read_text() == "licence of dict-freedict-eng-hin\n"
  # 30 translated paragraphs (even ids under 60); 97 and 99 ("Shared words.") untranslated.
  pairs = {s: (out / f"help_bitext/en-hi.{s}.tsv").read_text().splitlines() for s in debian.SPLITS}
  expected = {s: [] for s in debian.SPLITS}
  for i in range(0, 60, 2):
    english = f"{'Calc' if i < 40 else 'Writer'} sentence {i}."
    expected[debian.split_of(f"par_id{i}")].append(f"{english}\tवाक्य {i}।")
  assert pairs == expected
  assert result["counts"]["help"]["hi"]["pairs"] == {s: len(v) for s, v in expected.items()}
  labels = (out / "help_labels/en.train.tsv").read_text().splitlines()
  assert "scalc\tCalc sentence 0." in labels or debian.split_of("par_id0") != "train"
  assert not any(line.endswith("\tShared words.") for line in labels)  # Under two topics.
  english = [line for s in debian.SPLITS for line in (out / f"help/en.{s}.txt").read_text().splitlines()]
  assert sorted(english) == sorted({f"{'Calc' if i < 40 else 'Writer'} sentence {i}." for i in range(60)}
                                   | {"Shared words."})
  assert (out / "gettext/en-hi.tsv").read_text() == "Save\tसहेजें\n"
  assert (out / "dict/en-hi.tsv").read_text() == "able\tसमर्थ\n"


def test_missing_packages_name_the_install_line(tmp_path, capfd):
  outcome = harness.run_main(capfd, "debian_data", [f"--root={tmp_path}", f"--output={tmp_path / 'o'}",
                                                    "--languages=fr"])
  harness.assert_user_error(outcome)
  error = outcome.err
  assert "apt-get install libreoffice-help-en-us libreoffice-help-fr libreoffice-l10n-fr dict-freedict-eng-fra" in error
  assert "dpkg-deb -x" in error and "--root=ROOT" in error


@pytest.mark.parametrize("flags, keywords", [
    (["--root={missing}"], ("--root=", "is not a folder")),
    (["--root={root}", "--languages=xx"], ("Unknown or no languages", "xx")),
    (["--root={root}", "--max_translations=many"], ("--max_translations", "many")),
], ids=["root_not_a_folder", "unknown_language", "max_translations_not_a_number"])
def test_refuses_bad_flags(flags, keywords, tmp_path, capfd):
  argv = [f.format(missing=tmp_path / "nowhere", root=tmp_path) for f in flags]
  outcome = harness.run_main(capfd, "debian_data", [*argv, f"--output={tmp_path / 'out'}"])
  harness.assert_user_error(outcome, *keywords)
  assert not (tmp_path / "out").exists()
