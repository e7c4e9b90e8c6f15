r"""Import a Hugging Face BERT or XLM-R directory as a MODEL_DIR.

  xalign import_hf --source=DIR --output=MODEL_DIR \
      [--languages=grc,en] [--language_pair=grc,en]

DIR is what `save_pretrained` writes: config.json, model.safetensors (or
pytorch_model.bin, read with torch), and the tokenizer: `vocab.txt` (BERT
WordPiece, casing from tokenizer_config.json's `do_lower_case`) or
`sentencepiece.bpe.model` (XLM-R; rebuilt so SentencePiece's ids are the
model's, see `flax_xalign.interop.hf`). MODEL_DIR is a normal run directory
(`flax_xalign.interop.model_dir`): evaluation, the aligner and
INIT_FROM_CHECKPOINT read it unchanged. A checkpoint without an MLM head gets
one initialised here (listed in origin.json). --languages are recorded in the
manifest (the model has no language embeddings; they name the aligner's
sides); --language_pair is the aligner's default (source, target), by default
the two languages when exactly two are given. With transformers installed,
the vocabulary is checked against transformers' own tokenizer on a sample.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Callable, Sequence

from flax_xalign.data.sources.wheels import sha256_of
from flax_xalign.errors import UserError
from flax_xalign.interop.progress import Progress

# Checks the rebuilt vocabulary against transformers' tokenizer (when installed).
TOKENIZER_SAMPLES = (
    "The quick brown fox jumps over the lazy dog.",
    "In the beginning was the Word, and the Word was with God.",
    "Ἐν ἀρχῇ ἦν ὁ λόγος, καὶ ὁ λόγος ἦν πρὸς τὸν θεόν.",
    "Im Anfang war das Wort, und das Wort war bei Gott.",
    "unbelievably   spaced\ttext, numbers 1234 and symbols (#42)!",
)
_LICENSE_FILES = ("NOTICE", "LICENSE", "LICENSE.txt", "LICENSE.md")


def _notice(source: str) -> str | None:
  texts = []
  for name in _LICENSE_FILES:
    path = os.path.join(source, name)
    if os.path.isfile(path):
      with open(path, encoding="utf-8", errors="replace") as f:
        texts.append(f"--- {name} (from {os.path.abspath(source)}) ---\n{f.read()}")
  return "\n".join(texts) or None


def _check_tokenizer(source: str, vocabulary: Any) -> str:
  """One line on how the vocabulary compares with transformers' tokenizer of `source`."""
  from flax_xalign.interop import hf

  try:
    import transformers  # noqa: F401  (only to know whether the check can run)
  except ImportError:
    return "tokenizer check skipped (transformers is not installed)"
  try:
    mismatches = hf.compare_with_transformers(source, vocabulary, list(TOKENIZER_SAMPLES))
  except Exception as e:  # A tokenizer transformers cannot load is not ours to judge.
    return f"tokenizer check skipped (transformers could not load the tokenizer: {str(e)[:120]})"
  if mismatches:
    text, ours, theirs = mismatches[0]
    return (f"warning: the vocabulary tokenises {len(mismatches)} of {len(TOKENIZER_SAMPLES)} samples unlike "
            f"transformers, e.g. {text!r}: {ours[:12]} vs {theirs[:12]}")
  return f"tokenizer agrees with transformers on {len(TOKENIZER_SAMPLES)} samples"


def import_hf(source: str, output: str, *, languages: Sequence[str] = (),
              language_pairs: Sequence[tuple[str, str]] = (), seed: int = 0, vocab_pad_multiple: int = 1,
              log: Callable[[str], None] = print) -> dict[str, Any]:
  """Converts HF directory `source` and writes it as the new MODEL_DIR `output`.

  `vocab_pad_multiple` > 1 writes a padded vocabulary (`EncoderConfig.vocab_pad_multiple`,
  zero rows past the last token), for runs that shard `vocab` over a 'model' axis.

  Returns:
    {"run": the manifest, "fresh": names initialised here, "seconds": {stage: s}}.
  """
  from flax_xalign.interop import hf
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.runs.checkpoints import find_latest_step

  if find_latest_step(output) is not None:  # Before any work; write_model_dir checks again.
    raise UserError(f"{output} already holds checkpoints; import into a new MODEL_DIR.")
  progress = Progress("import_hf", log)

  hf_config, state, layout = hf.load_hf_directory(source)
  progress.step("read", f"read {source}: {hf_config.get('model_type')} ({layout} layout), {len(state)} tensors, "
        f"{sum(a.size for a in state.values()):,} weights")
  try:
    config = hf.encoder_config_from_hf(hf_config).replace(vocab_pad_multiple=vocab_pad_multiple)
  except ValueError as e:
    raise UserError(f"--vocab_pad_multiple: {e}") from e
  params, fresh = hf.params_from_hf(state, config, layout=layout, seed=seed)
  progress.step("convert", f"converted: {config.num_layers} layers, embed {config.embed_dim}, {config.num_heads} heads, "
        f"mlp {config.mlp_dim}, vocab {config.vocab_size:,}"
        + (f" (padded to {config.padded_vocab_size:,} rows)" if config.padded_vocab_size != config.vocab_size else "")
        + (f"; initialised {len(fresh)} parameters the checkpoint lacks ({', '.join(fresh)})" if fresh else ""))
  weights = next((os.path.join(source, n) for n in hf.WEIGHT_FILES if os.path.isfile(os.path.join(source, n))),
                 None)
  origin = {"format": "huggingface", "source": os.path.abspath(source), "layout": layout,
            "model_type": hf_config.get("model_type"), "architectures": hf_config.get("architectures"),
            "name_or_path": hf_config.get("_name_or_path"), "hf_config": hf_config,
            "initialised_not_imported": fresh}
  if weights:
    origin.update(weights_file=os.path.basename(weights), weights_sha256=sha256_of(weights))
  with tempfile.TemporaryDirectory() as scratch:
    vocabulary = hf.load_hf_vocabulary(source, scratch_dir=scratch)
    origin["tokenizer"] = hf.tokenizer_kind(source)
    progress.step("vocabulary", f"vocabulary: {origin['tokenizer']}, {vocabulary.vocab_size:,} ids; "
          + _check_tokenizer(source, vocabulary))
    run = write_model_dir(output, config=config, params=params, vocabulary=vocabulary, languages=languages,
                          language_pairs=language_pairs, origin=origin, notice=_notice(source),
                          task_feature_lengths={"tokens": min(config.num_positions, 512)})
  progress.step("write", f"wrote {output}")
  log(f"import_hf: done in {progress.total():.1f} s")
  return {"run": run, "fresh": fresh, "seconds": progress.seconds}
