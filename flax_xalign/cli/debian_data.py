r"""Builds more-language text, bitext, labels and dictionaries from Debian packages.

  xalign debian_data --output=DIR [--root=/] [--languages=de,fr,es,ru,zh,ja,hi,ar,el] \
      [--sources=help,gettext,dict,bli] [--max_translations=5]

Reads packages already installed (`--root=/`, the default unless $FLAX_XALIGN_DEBIAN_ROOT is
set) or unpacked into a folder without root:

  apt-get download libreoffice-help-en-us libreoffice-help-de ... && \
  for f in *.deb; do dpkg-deb -x "$f" ROOT; done
  xalign debian_data --root=ROOT --output=DIR

It installs nothing: missing packages are named with the exact `apt-get install` line. Languages
and their packages (English is the pivot; `flax_xalign.data.sources.debian.LANGUAGES`):

  help     libreoffice-help-{en-us,de,fr,es,ru,zh-cn,ja,hi}      (no Arabic help in Debian 12)
  gettext  libreoffice-l10n-{de,fr,es,ru,zh-cn,ja,hi,ar}
  dict     dict-freedict-eng-{deu,fra,hin,ara,ell,rus}, trans-de-en, mueller7-dict (en->ru)
  bli      the dict packages + dict-freedict-{deu,fra,ara,ell}-eng (X->en)    (none for es, zh, ja)

Writes under DIR (default <data dir>/debian, see `flax_xalign.data.sources.paths`):

  help/<lang>.<split>.txt             one paragraph per line (en included), split train/validation/test
  help_bitext/en-<lang>.<split>.tsv   English<TAB>translation, aligned by help paragraph id
  help_labels/<lang>.<split>.tsv      topic<TAB>text, 9 topics (sbasic scalc schart sdatabase sdraw
                                      shared simpress smath swriter)
  gettext/en-<lang>.tsv               msgid<TAB>msgstr of the LibreOffice UI catalogues
  dict/en-<lang>.tsv                  English word<TAB>translation (BLI gold)
  gettext/<lang>.txt                  the catalogues' translations, one per line (monolingual text)
  dict/<lang>-en.tsv                  merged X->en lexicon (X->en + inverted en->X), word<TAB>English
  bli/<lang>-en.{dev,test}.txt        MUSE-format gold of a frequency band (`data/sources/debian_bli.py`)
  LICENSES/<package>.txt              each package's Debian copyright file
  manifest.json                       package versions, counts, rules

Rules (splits by paragraph-id hash shared by all languages, untranslated text dropped,
placeholders): `flax_xalign.data.sources.debian`. Prints progress lines, a table of counts per
language, and a last line of JSON. Register tasks over DIR with
`flax_xalign.tasks.debian.DebianTasks(data_dir=DIR)`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from flax_xalign.data.sources import debian

from flax_xalign.data.sources import paths
from flax_xalign.cli import common
from flax_xalign.errors import ArgumentParser, UserError
from flax_xalign.fileio import check_output_folder

ROOT_ENV = "FLAX_XALIGN_DEBIAN_ROOT"


def default_output() -> str:
  return str(paths.data_dir() / "debian")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = ArgumentParser(prog="xalign debian_data", description=__doc__.split("\n")[0])
  parser.add_argument("--output", default=None, help="output folder (default <data dir>/debian)")
  parser.add_argument("--root", default=os.environ.get(ROOT_ENV, "/"),
                      help=f"where the packages are installed or unpacked (default ${ROOT_ENV} or /)")
  parser.add_argument("--languages", default=",".join(debian.DEFAULT_LANGUAGES),
                      help="comma-separated language codes besides English")
  parser.add_argument("--sources", default=",".join(debian.SOURCES), help="comma-separated: help,gettext,dict,bli")
  parser.add_argument("--max_translations", type=int, default=5, help="dictionary translations per English word")
  return parser.parse_args(argv)


def _codes(text: str, what: str) -> list[str]:
  codes = [c.strip() for c in text.split(",") if c.strip()]
  if not codes:
    raise UserError(f"--{what} is empty; give a comma-separated list, e.g. --{what}=de,fr.")
  return codes


def summary_table(manifest: dict) -> str:
  """Counts per language: help paragraphs, bitext pairs and labelled texts (train/validation/
  test), gettext pairs, dictionary pairs."""
  counts = manifest["counts"]
  help_counts, gettext, dictionary = counts.get("help", {}), counts.get("gettext", {}), counts.get("dict", {})

  def splits(entry: dict | None) -> str:
    return "/".join(str(entry[s]) for s in debian.SPLITS) if entry else "-"

  rows = [("lang", "help paragraphs", "help pairs with en", "help labels", "gettext pairs", "dict pairs")]
  for code in ["en"] + list(manifest["languages"]):
    h = help_counts.get(code, {})
    rows.append((code, splits(h.get("paragraphs")), splits(h.get("pairs")), splits(h.get("labels")),
                 str(gettext.get(code, {}).get("pairs", "-")), str(dictionary.get(code, {}).get("pairs", "-"))))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines) + "\n(splits: train/validation/test)"


def run(args: argparse.Namespace) -> dict:
  output = args.output or default_output()
  if args.max_translations < 1:
    raise UserError(f"--max_translations={args.max_translations} must be at least 1.")
  if not os.path.isdir(args.root):
    raise UserError(f"--root={args.root} is not a folder; pass where the packages are installed (/) or "
                    "unpacked with dpkg-deb -x.")
  check_output_folder(output, owned=lambda folder: os.path.isfile(os.path.join(folder, "manifest.json")),
                      what="an earlier debian_data output (manifest.json)")
  print(f"reading Debian packages under {args.root}, writing {output}", flush=True)
  manifest = debian.build(args.root, output, languages=_codes(args.languages, "languages"),
                          sources=_codes(args.sources, "sources"), max_translations=args.max_translations,
                          progress=lambda line: print(line, flush=True))
  print(summary_table(manifest), flush=True)
  result = {"output": os.path.abspath(output), "seconds": manifest["seconds"], "counts": manifest["counts"],
            "packages": {name: entry["version"] for name, entry in manifest["packages"].items()}}
  print(json.dumps(result, ensure_ascii=False), flush=True)
  return result


def main(argv: Sequence[str] | None = None) -> int:
  return common.main_of(parse_args, run, argv)


if __name__ == "__main__":
  sys.exit(main())
