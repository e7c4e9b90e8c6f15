r"""Export a MODEL_DIR as a Hugging Face BERT or XLM-R directory.

  xalign export_hf --model_dir=MODEL_DIR --output=DIR --layout=bert|xlmr

Writes DIR/config.json (a BertForMaskedLM or XLMRobertaForMaskedLM config),
DIR/model.safetensors and the tokenizer files transformers loads
(`AutoModel.from_pretrained(DIR)`, `AutoTokenizer.from_pretrained(DIR)`):

* a SentencePiece vocabulary: `sentencepiece.bpe.model` in fairseq order,
  the same as `tokenizer.json` (so transformers needs neither sentencepiece
  nor protobuf to load it; written when `tokenizers` is installed) and
  tokenizer_config.json naming XLMRobertaTokenizer, whose ids are fixed
  (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, text pieces, `<mask>` last); the
  embedding rows and the MLM output bias are permuted into that order (the
  identity for an imported XLM-R model). transformers reads the model as a
  unigram model, so a BPE SentencePiece model (ours by default on the Bible)
  tokenises differently there: the export says so.
* a WordPiece vocabulary: `vocab.txt` as is and tokenizer_config.json naming
  BertTokenizer with the vocabulary's casing.

The layout chooses the body's conventions (BERT: positions from row 0;
XLM-R: from row pad + 1), the tokenizer follows the vocabulary. A model with
language embeddings or pre-LN layers has no BERT/XLM-R equivalent and is
refused; the DWA pointer projections (a training head) are dropped.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from flax_xalign import storage
from flax_xalign.data.vocab.specials import SpecialTokens
from flax_xalign.errors import UserError
from flax_xalign.interop.progress import Progress


class TokenizerFiles(NamedTuple):
  """The tokenizer of an export.

  Attributes:
    files: file name -> bytes, written into the output directory.
    config: tokenizer_config.json.
    perm: model ids in the exported order (`table[perm]`), or None to keep them.
    specials: the exported ids (they go into config.json).
    note: one line for the user, or "".
  """

  files: dict[str, bytes]
  config: dict[str, Any]
  perm: np.ndarray | None
  specials: SpecialTokens
  note: str


def fairseq_permutation(specials: SpecialTokens, vocab_size: int) -> np.ndarray:
  """Model ids in fairseq order: `<s>`, `<pad>`, `</s>`, `<unk>`, the rest, `<mask>`.

  `table[perm]` re-orders an embedding (or output bias) so that an XLM-R
  tokenizer's ids address it; the identity for an imported XLM-R vocabulary.
  """
  first = [specials.bos, specials.pad, specials.eos, specials.unk]
  taken = set(first) | {specials.mask}
  rest = [i for i in range(vocab_size) if i not in taken]
  return np.asarray(first + rest + [specials.mask], np.int64)


def permute_vocabulary(params: Mapping[str, Any], perm: np.ndarray) -> dict[str, Any]:
  """`params` with the token embedding rows and the MLM output bias taken in `perm` order."""
  out = dict(params)
  out["token_embed"] = {"embedding": np.asarray(params["token_embed"]["embedding"])[perm]}
  head = dict(params["mlm_head"])
  head["output_bias"] = np.asarray(head["output_bias"])[perm]
  out["mlm_head"] = head
  return out


def sentencepiece_model_type(model: bytes) -> str:
  """"unigram", "bpe", "word" or "char"."""
  from flax_xalign.interop import hf

  proto = hf.sentencepiece_proto(model)
  return type(proto.trainer_spec).ModelType.Name(proto.trainer_spec.model_type).lower()


def tokenizer_files(vocabulary: Any, *, max_length: int) -> TokenizerFiles:
  """What transformers needs to load `vocabulary` (a run's seqio vocabulary) as its tokenizer."""
  from flax_xalign.assets.vocabulary import WORDPIECE, kind_of, model_bytes, specials_of
  from flax_xalign.interop import hf, hf_tokenizers

  if kind_of(vocabulary) == WORDPIECE:
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(vocabulary.lower_case),
              "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
              "mask_token": "[MASK]", "model_max_length": max_length}
    return TokenizerFiles({hf.WORDPIECE_FILE: model_bytes(vocabulary)}, config, None,
                          specials_of(vocabulary), "")
  size = int(vocabulary.vocab_size)
  if size != int(getattr(vocabulary, "base", vocabulary).vocab_size):
    raise UserError(f"the run's vocabulary {vocabulary} has more ids than SentencePiece pieces (a doubled "
                    "synthetic-language vocabulary); no Hugging Face tokenizer represents it.")
  specials = specials_of(vocabulary)
  perm = fairseq_permutation(specials, size)
  model = model_bytes(vocabulary)
  kind = sentencepiece_model_type(model)
  note = ("" if kind == "unigram" else
          f"warning: the SentencePiece model is {kind}; transformers' XLMRobertaTokenizer reads it as a "
          "unigram model, so its tokenisation may differ from this run's")
  config = {"tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "mask_token": "<mask>", "model_max_length": max_length}
  exported = SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=size - 1, first_regular=4, end_regular=size - 1)
  fairseq_model = hf.fairseq_order_sentencepiece(model, perm)
  files = {hf.SENTENCEPIECE_FILE: fairseq_model}
  # tokenizer.json lets transformers load the tokenizer without sentencepiece and protobuf.
  as_json = hf_tokenizers.sentencepiece_tokenizer_json(fairseq_model)
  if as_json is not None:
    files[hf_tokenizers.TOKENIZER_JSON] = as_json
  return TokenizerFiles(files, config, None if np.array_equal(perm, np.arange(size)) else perm, exported, note)


def write_hf_directory(output: str, hf_config: Mapping[str, Any], state: Mapping[str, np.ndarray],
                       tokenizer: TokenizerFiles, *, notice: str | None = None) -> list[str]:
  """Writes config.json, model.safetensors, the tokenizer files and NOTICE; returns the file names."""
  import safetensors.numpy

  from flax_xalign.fileio import makedirs, write_atomically

  makedirs(output, setting="--output")
  write_atomically(os.path.join(output, "config.json"), json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
  # transformers reads safetensors whose metadata names the framework.
  if storage.is_url(output):  # (save_file writes a local file only: the same bytes, one whole object)
    write_atomically(storage.join(output, "model.safetensors"),
                     safetensors.numpy.save(dict(state), metadata={"format": "pt"}))
  else:
    safetensors.numpy.save_file(dict(state), os.path.join(output, "model.safetensors"), metadata={"format": "pt"})
  for name, data in tokenizer.files.items():
    write_atomically(os.path.join(output, name), data)
  write_atomically(os.path.join(output, "tokenizer_config.json"), json.dumps(tokenizer.config, indent=2) + "\n")
  if notice:
    write_atomically(os.path.join(output, "NOTICE"), storage.read_text(notice))
  return sorted(storage.listdir(output))


def export_hf(checkpoint: str, output: str, *, layout: str, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Writes MODEL_DIR `checkpoint` (latest step) as HF directory `output` in `layout`.

  Returns:
    {"hf_config": config.json, "files": names written, "seconds": {stage: s}}.
  """
  import flax.linen as nn
  import jax

  from flax_xalign.interop import hf
  from flax_xalign.runs import Run
  from flax_xalign.runs.checkpoints import find_latest_step

  if find_latest_step(checkpoint) is None:
    raise UserError(f"{checkpoint} holds no checkpoint; pass a MODEL_DIR (trained, or written by "
                    "xalign import_hf).")
  if layout not in hf.LAYOUTS:
    raise UserError(f"--layout must be one of {', '.join(hf.LAYOUTS)}, got {layout!r}.")
  if storage.isdir(output) and storage.listdir(output):
    raise UserError(f"{output} exists and is not empty; export into a new directory.")
  progress = Progress("export_hf", log)

  handle = Run.open(checkpoint)
  run, step, params = handle.spec, handle.step, handle.params()
  config = run.model
  params = jax.tree.map(np.asarray, nn.unbox(params))
  progress.step("read", f"read {checkpoint} step {step}: {config.num_layers} layers, embed {config.embed_dim}, "
        f"vocab {config.vocab_size:,}")
  vocabulary = handle.vocabulary()
  # --trim_vocab_to=TASK goes here: keep only the ids TASK uses (a smaller
  # vocabulary, `config.vocab_size` and the embedding rows cut to match)
  # before the tokenizer files are derived from `vocabulary`.
  tokenizer = tokenizer_files(vocabulary, max_length=min(config.num_positions, 512))
  if tokenizer.perm is not None:
    params = permute_vocabulary(params, tokenizer.perm)
  progress.step("vocabulary", f"tokenizer: {', '.join(tokenizer.files)}"
        + (" (embedding rows re-ordered to fairseq ids)" if tokenizer.perm is not None else "")
        + (f"; {tokenizer.note}" if tokenizer.note else ""))
  hf_config, state = hf.hf_state_from_params(params, config, layout=layout, specials=tokenizer.specials)
  dropped = " (dropped the DWA pointer projections)" if config.pointer_head else ""
  progress.step("convert", f"converted to the {layout} layout: {len(state)} tensors{dropped}")
  source = storage.absolute(checkpoint) if storage.is_url(checkpoint) else os.path.abspath(checkpoint)
  hf_config = {**hf_config, "flax_xalign": {"checkpoint": source, "step": int(step)}}
  notice = handle.dir.notice
  files = write_hf_directory(output, hf_config, state, tokenizer,
                             notice=notice if storage.isfile(notice) else None)
  progress.step("write", f"wrote {output}: {', '.join(files)}")
  log(f"export_hf: done in {progress.total():.1f} s")
  return {"hf_config": hf_config, "files": files, "seconds": progress.seconds}
