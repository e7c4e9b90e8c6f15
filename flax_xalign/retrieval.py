r"""Sentence retrieval accuracy of a checkpoint per layer (Tatoeba style, as XTREME / XLM-Align).

  python -m flax_xalign.retrieval --checkpoint=MODEL_DIR (--tsv=FILE | --bible=validation|test) \
      [--src_lang=grc --tgt_lang=en] [--layers=all|0,4,8] [--method=cosine,csls] [--csls_k=10] \
      [--max_pairs=N] [--normalize=nfd_strip_marks] [--max_length=128] [--batch_size=32] [--output=FILE.json]

--tsv is `source<TAB>target` per line (UTF-8; blank lines skipped), line i of
one side the translation of line i of the other. --bible takes the verse pairs
of the embedded Greek-English Bible's held-out books (`data.bible.bitext`:
validation 708 verses, test 885), offline once the corpus is cached; Greek is
the source. Each sentence is the mean of its token states at a layer (0 = the
embedding output), its nearest neighbour on the other side is retrieved by
cosine or CSLS (K = --csls_k), and the accuracy is reported both ways per
layer, with the best layer per method. Identical sentences on one side count
as one: retrieving the other copy is correct (`evaluation.retrieval`).

Reference points in the same run: the bag-of-pieces baseline (piece-count
vectors, cosine and CSLS; no model) and chance (1 / pairs). The model's
language ids come from --src_lang / --tgt_lang (default: the run's language
pair; the Bible's grc, en); models without language embeddings accept any code.
Text is normalised with --normalize before tokenising; use what the model's
training text went through (nfd_strip_marks for the Bible runs and their
multilingual-e5 imports). The last printed line is a JSON object (also written
to --output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from flax_xalign.errors import ArgumentParser, UserError, run_command

BIBLE_SPLITS = ("validation", "test")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
  from flax_xalign.data import normalize
  from flax_xalign.evaluation import retrieval

  parser = ArgumentParser(prog="python -m flax_xalign.retrieval", description=__doc__.splitlines()[0])
  parser.add_argument("--checkpoint", "--model_dir", dest="checkpoint", required=True,
                      help="MODEL_DIR (trained or imported)")
  parser.add_argument("--tsv", default=None, help="source<TAB>target sentence pairs, one per line")
  parser.add_argument("--bible", choices=BIBLE_SPLITS, default=None,
                      help="held-out Greek-English Bible verses instead of --tsv")
  parser.add_argument("--src_lang", default=None, help="language code of the source side")
  parser.add_argument("--tgt_lang", default=None, help="language code of the target side")
  parser.add_argument("--layers", default="all", help="'all' or comma-separated layers (0 = embedding output)")
  parser.add_argument("--method", default=",".join(retrieval.METHODS),
                      help=f"comma-separated subset of {','.join(retrieval.METHODS)}")
  parser.add_argument("--csls_k", type=int, default=retrieval.DEFAULT_CSLS_K, help="K of CSLS")
  parser.add_argument("--max_pairs", type=int, default=None, help="use the first N pairs")
  parser.add_argument("--normalize", choices=normalize.NORMALIZERS, default="",
                      help="text normaliser applied before tokenising")
  parser.add_argument("--max_length", type=int, default=128, help="tokens per sentence, <s> and </s> included")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--output", default=None, help="also write the JSON result here")
  return parser.parse_args(argv)


def read_pairs(path: str) -> list[tuple[str, str]]:
  """`source<TAB>target` lines of a UTF-8 file; UserError naming file:line for a malformed one."""
  from flax_xalign.data.readers import numbered_lines

  pairs = []
  for number, line in numbered_lines(path):
    if not line.strip():
      continue
    fields = line.split("\t")
    if len(fields) != 2:
      raise UserError(f"{path}:{number}: expected source<TAB>target (2 tab-separated fields), found "
                      f"{len(fields)}. Remove tabs inside sentences.")
    pairs.append((fields[0].strip(), fields[1].strip()))
  if not pairs:
    raise UserError(f"{path}: no sentence pairs (expected source<TAB>target lines).")
  return pairs


def _layers(spec: str, num_layers: int) -> list[int]:
  if spec == "all":
    return list(range(num_layers + 1))
  try:
    wanted = sorted({int(x) for x in spec.split(",") if x.strip()})
  except ValueError:
    raise UserError(f"--layers={spec!r}: pass 'all' or comma-separated layer numbers, e.g. 0,4,8.") from None
  bad = [layer for layer in wanted if not 0 <= layer <= num_layers]
  if bad or not wanted:
    raise UserError(f"--layers={spec!r}: layers must lie in 0..{num_layers} (0 = embedding output).")
  return wanted


def _methods(spec: str) -> list[str]:
  from flax_xalign.evaluation import retrieval

  methods = [m.strip() for m in spec.split(",") if m.strip()]
  unknown = [m for m in methods if m not in retrieval.METHODS]
  if unknown or not methods:
    raise UserError(f"--method={spec!r}: use a comma-separated subset of {','.join(retrieval.METHODS)}.")
  return list(dict.fromkeys(methods))


def _language_ids(run, config, src: str, tgt: str) -> tuple[int, int]:
  ids = []
  for code in (src, tgt):
    if code in run.languages:
      ids.append(run.language_id(code))
    elif config.num_languages:
      raise UserError(f"language {code!r} is not one of the checkpoint's languages {list(run.languages)}; pick "
                      "--src_lang and --tgt_lang from that list.")
    else:
      ids.append(0)  # No language embeddings: lang_ids are never read.
  return ids[0], ids[1]


def _sides(args: argparse.Namespace, run) -> tuple[list[tuple[str, str]], str, str, str]:
  """(pairs, source name, src code, tgt code)."""
  from flax_xalign.evaluation.word_align import checkpoint_language_pair

  if (args.tsv is None) == (args.bible is None):
    raise UserError("give exactly one of --tsv=FILE (source<TAB>target lines) and --bible=validation|test.")
  if args.bible:
    from flax_xalign.data import bible

    pairs = [(grc, en) for _, grc, en in bible.bitext(args.bible)]
    default = ("grc", "en")
    source = f"bible:{args.bible}"
  else:
    pairs = read_pairs(args.tsv)
    default = checkpoint_language_pair(run) or (None, None)
    source = args.tsv
  src, tgt = args.src_lang or default[0], args.tgt_lang or default[1]
  if src is None or tgt is None:
    raise UserError(f"cannot tell the languages of {args.tsv} from the checkpoint (languages "
                    f"{list(run.languages)}); pass --src_lang and --tgt_lang.")
  if args.max_pairs is not None:
    if args.max_pairs < 1:
      raise UserError(f"--max_pairs={args.max_pairs} must be at least 1.")
    pairs = pairs[:args.max_pairs]
  return pairs, source, src, tgt


def _row(label: str, scores: dict, methods: Sequence[str]) -> str:
  cells = "".join(f"{100 * scores[m]['src_to_tgt']:>9.2f}{100 * scores[m]['tgt_to_src']:>9.2f}" for m in methods)
  return f"  {label:<16}{cells}"


def run(args: argparse.Namespace) -> dict:
  """Runs the command on parsed `args`; returns the JSON object it prints last."""
  import numpy as np

  from flax_xalign.data import normalize
  from flax_xalign.evaluation import retrieval
  from flax_xalign.runs import Run

  start = time.perf_counter()
  methods = _methods(args.method)
  for name in ("csls_k", "batch_size"):
    if getattr(args, name) < 1:
      raise UserError(f"--{name}={getattr(args, name)} must be at least 1.")
  if not os.path.isdir(args.checkpoint):
    raise UserError(f"--checkpoint {args.checkpoint} is not a directory; pass a MODEL_DIR written by "
                    "python -m flax_xalign.train or an import.")
  handle = Run.open(args.checkpoint)
  model, params, run_spec, step = handle.model, handle.params(), handle.spec, handle.step
  config = model.encoder.config
  layers = _layers(args.layers, config.num_layers)
  pairs, source, src, tgt = _sides(args, run_spec)
  src_id, tgt_id = _language_ids(run_spec, config, src, tgt)
  vocabulary = handle.vocabulary()
  specials = run_spec.vocabulary.specials
  texts = [[normalize.normalize_text(p[side], args.normalize) for p in pairs] for side in (0, 1)]
  print(f"sentence retrieval: {len(pairs):,} pairs {src}->{tgt} from {source}; {args.checkpoint} step {step}, "
        f"layers {layers}, {', '.join(methods)} (K={args.csls_k}), normalize={args.normalize or 'none'}", flush=True)
  vectors, truncated = [], 0
  for side, language in ((0, src_id), (1, tgt_id)):
    stats: dict = {}
    vectors.append(retrieval.sentence_embeddings(
        model, params, vocabulary, texts[side], layers=layers, language=language, batch_size=args.batch_size,
        max_length=args.max_length, specials=specials, stats=stats))
    truncated += stats["truncated"]
  keys = [retrieval.duplicate_keys(texts[side]) for side in (0, 1)]
  common = {"methods": methods, "csls_k": args.csls_k, "src_keys": keys[0], "tgt_keys": keys[1]}
  table = retrieval.sweep(vectors[0], vectors[1], **common)
  ids = [retrieval.encode_sentences(vocabulary, texts[side]) for side in (0, 1)]
  bag_src, bag_tgt = retrieval.bag_of_pieces(*ids)
  bag = retrieval.sweep({0: bag_src}, {0: bag_tgt}, **common)
  baseline = {m: {k: v for k, v in bag["best"][m].items() if k != "layer"} for m in methods}
  chance = 1.0 / len(pairs)

  print(f"  {'accuracy %':<16}" + "".join(f"{m:>18}" for m in methods))
  print(f"  {'':<16}" + f"{src + '->' + tgt:>9}{tgt + '->' + src:>9}" * len(methods))
  for layer in layers:
    print(_row(f"layer {layer}", {m: table["scores"][m][str(layer)] for m in methods}, methods))
  print(_row("bag of pieces", baseline, methods))
  print(f"  {'chance':<16}{100 * chance:>9.2f}  (1 / {len(pairs)} pairs)")
  for m in methods:
    b = table["best"][m]
    print(f"  best {m}: layer {b['layer']}, {src}->{tgt} {100 * b['src_to_tgt']:.2f}%, "
          f"{tgt}->{src} {100 * b['tgt_to_src']:.2f}%")
  duplicates = [int(len(k) - np.unique(k).size) for k in keys]
  if truncated:
    print(f"  {truncated} sentences were cut to --max_length={args.max_length} tokens", flush=True)
  result = {"checkpoint": args.checkpoint, "step": int(step), "source": source, "pairs": len(pairs),
            "src_lang": src, "tgt_lang": tgt, "layers": layers, "methods": methods, "csls_k": args.csls_k,
            "normalize": args.normalize, "max_length": args.max_length, "scores": table["scores"],
            "best": table["best"], "baselines": {"bag_of_pieces": baseline, "chance": chance},
            "duplicates": {"src": duplicates[0], "tgt": duplicates[1]}, "truncated": truncated,
            "seconds": round(time.perf_counter() - start, 2)}
  if args.output:
    from flax_xalign.fileio import write_atomically

    write_atomically(args.output, json.dumps(result, indent=2) + "\n")
  print(json.dumps(result), flush=True)
  return result


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else list(argv))
  from flax_xalign import gin_cli

  gin_cli.quiet_known_noise()
  return run_command(lambda: run(args))


if __name__ == "__main__":
  sys.exit(main())
