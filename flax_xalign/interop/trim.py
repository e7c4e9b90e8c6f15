r"""Vocabulary trimming: keep only the pieces a task's corpus uses.

A multilingual encoder carries a 250k-row embedding table (XLM-R, e5); a
Greek-English corpus uses a few tens of thousands of those pieces. Trimming
keeps the specials and every piece the corpus's segmentation uses, in their
original order, and remaps everything consistently:

* the SentencePiece model is rebuilt with only those pieces (ids renumbered
  by rank; special ids recomputed from the new model);
* the token embedding rows and the MLM output bias are gathered;
* the config's vocabulary size shrinks; nothing else changes.

For a unigram model this cannot change how the corpus is segmented (the
best segmentation of every sentence only uses kept pieces, and removing
pieces only removes other paths); `trim_model_dir` re-encodes the corpus with
the trimmed model and checks it, piece for piece. BPE models (merge order)
are refused: removing a piece can break a merge chain.

  xalign trim --model_dir=runs/e5 --task=bible_grc_en_mlm_tlm \
      --output=runs/e5_bible
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError
from flax_xalign.fileio import makedirs

_SPLITS = ("train", "validation", "test")


def corpus_texts(task: str, splits: Sequence[str] = _SPLITS, *, normalizers: Sequence[str] = ()
                 ) -> Iterable[str]:
  """Text of every example (both sides of pairs) of a registered task or mixture.

  Each text is given as the task tokenises it (after the task's own
  `normalize` option), and once more per extra normaliser in `normalizers`
  (e.g. "nfd_strip_marks" when the model will also read diacritic-free text,
  as the aligner's --normalize does).
  """
  from flax_xalign import tasks
  from flax_xalign.data.vocab import normalize as normalize_lib
  from flax_xalign.tasks import registry

  for name in tasks.task_names(task):
    loader = registry.text_loader(name)
    if loader is None:
      raise UserError(f"{name!r} is a plain seqio task; trimming reads raw text, which only flax_xalign's own "
                      "tasks (TextTask, TsvBitextTask, the embedded corpora) expose.")
    provider = tasks.get_provider(name)
    own = next((getattr(p, "keywords", {}).get("normalize", "") for p in provider.preprocessors
                if "normalize" in getattr(p, "keywords", {})), "")
    forms = list(dict.fromkeys([own, *normalizers]))
    for split in splits:
      if split not in provider.splits:
        continue
      columns = loader(split)
      for column in ("text", "text_b"):
        for text in columns.get(column, ()):
          for form in forms:
            yield normalize_lib.normalize_text(text, form)


def kept_ids(model: bytes, texts: Iterable[str], *, batch: int = 4096) -> np.ndarray:
  """Sorted ids to keep: every non-text piece (specials, user-defined, bytes) and every piece `texts` use."""
  import sentencepiece as spm
  from sentencepiece import sentencepiece_model_pb2 as pb

  from flax_xalign.interop.hf import sentencepiece_proto

  proto = sentencepiece_proto(model)
  if proto.trainer_spec.model_type != pb.TrainerSpec.UNIGRAM:
    raise UserError("only unigram SentencePiece models can be trimmed without changing how text is segmented "
                    f"(this one is {pb.TrainerSpec.ModelType.Name(proto.trainer_spec.model_type)}).")
  processor = spm.SentencePieceProcessor(model_proto=model)
  used = np.zeros(len(proto.pieces), bool)
  used[[i for i, p in enumerate(proto.pieces) if p.type != pb.ModelProto.SentencePiece.NORMAL]] = True
  chunk: list[str] = []
  for text in texts:
    chunk.append(text)
    if len(chunk) == batch:
      used[np.fromiter((i for ids in processor.encode(chunk) for i in ids), np.int64)] = True
      chunk = []
  if chunk:
    used[np.fromiter((i for ids in processor.encode(chunk) for i in ids), np.int64)] = True
  return np.flatnonzero(used)


def trimmed_model(model: bytes, keep: np.ndarray) -> bytes:
  """The SentencePiece model with only the pieces `keep` (sorted ids), special ids remapped."""
  from flax_xalign.interop.hf import sentencepiece_proto

  proto = sentencepiece_proto(model)
  new_id = {int(old): new for new, old in enumerate(keep)}
  pieces = [proto.pieces[int(i)] for i in keep]
  spec = proto.trainer_spec
  for field in ("unk_id", "bos_id", "eos_id", "pad_id"):
    old = getattr(spec, field)
    if old >= 0:
      setattr(spec, field, new_id[old])
  spec.vocab_size = len(pieces)
  del proto.pieces[:]
  proto.pieces.extend(pieces)
  return proto.SerializeToString()


def check_segmentation(model: bytes, new_model: bytes, keep: np.ndarray, texts: Iterable[str]) -> None:
  """Refuses (a bug) a text the trimmed model segments otherwise than the model: the promise of this module."""
  import sentencepiece as spm

  old, new = spm.SentencePieceProcessor(model_proto=model), spm.SentencePieceProcessor(model_proto=new_model)
  for text in texts:
    if not np.array_equal(keep[new.encode(text)], old.encode(text)):
      raise UserError(f"trimming changed the segmentation of {text[:60]!r}; this is a bug, please report it.")


def trim_params(params: dict[str, Any], keep: np.ndarray, vocab_size: int) -> dict[str, Any]:
  """Gathers the vocabulary rows (token embeddings, MLM output bias); refuses other vocab-sized leaves."""
  import jax

  params = jax.tree.map(np.asarray, params)
  out = dict(params)
  out["token_embed"] = {"embedding": params["token_embed"]["embedding"][keep]}
  head = dict(params["mlm_head"])
  head["output_bias"] = head["output_bias"][keep]
  out["mlm_head"] = head
  for path, leaf in jax.tree_util.tree_leaves_with_path(out):
    if vocab_size in np.shape(leaf) and len(keep) != vocab_size:
      raise UserError(f"parameter {jax.tree_util.keystr(path)} has a vocabulary-sized dimension that trimming "
                      "does not know how to remap.")
  return out


def trim_model_dir(checkpoint: str, task: str, output: str, *, splits: Sequence[str] = _SPLITS,
                   normalizers: Sequence[str] = (), verbose: bool = True) -> dict[str, Any]:
  """Writes a trimmed copy of MODEL_DIR `checkpoint` to `output`; returns a summary.

  Raises:
    UserError: not a SentencePiece vocabulary, a BPE model, a plain seqio
      task, or (a bug) a corpus sentence that segments differently after trimming.
  """
  from flax_xalign.data.vocab.sentencepiece import TextVocabulary
  from flax_xalign.interop.model_dir import write_model_dir
  from flax_xalign.models.encoder import with_vocab_rows
  from flax_xalign.runs import Run

  start = time.perf_counter()
  handle = Run.open(checkpoint)
  run, step, params = handle.spec, handle.step, handle.params()
  handle.register_tasks()
  vocabulary = handle.vocabulary()
  if run.vocabulary.factor != 1 or not hasattr(vocabulary, "sp_model"):
    raise UserError(f"{checkpoint}: only plain SentencePiece vocabularies can be trimmed.")
  model = bytes(vocabulary.sp_model)
  texts = list(corpus_texts(task, splits, normalizers=normalizers))
  if not texts:
    raise UserError(f"task {task!r} has no text in splits {list(splits)}.")
  keep = kept_ids(model, texts)
  new_model = trimmed_model(model, keep)
  check_segmentation(model, new_model, keep, texts)
  config = run.model.replace(vocab_size=len(keep))
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "vocabulary.model")
    with open(path, "wb") as f:
      f.write(new_model)
    notice_path = handle.dir.notice
    notice = storage.read_text(notice_path) if storage.exists(notice_path) else None
    params = with_vocab_rows(trim_params(params, keep, run.model.vocab_size), config.padded_vocab_size)
    write_model_dir(output, config=config, params=params,
                    vocabulary=TextVocabulary(path, extra_ids=0), languages=run.languages,
                    language_pairs=run.language_pairs, notice=notice,
                    origin={"trimmed_from": _absolute(checkpoint), "step": int(step), "task": task,
                            "splits": list(splits), "normalizers": list(normalizers),
                            "pieces_before": int(run.model.vocab_size),
                            "pieces_after": int(len(keep))})
  summary = {"pieces_before": int(run.model.vocab_size), "pieces_after": int(len(keep)),
             "sentences": len(texts), "seconds": time.perf_counter() - start, "output": output}
  if verbose:
    print(f"trimmed {summary['pieces_before']:,} -> {summary['pieces_after']:,} pieces "
          f"({summary['sentences']:,} sentences of {task}) in {summary['seconds']:.1f} s -> {output}", flush=True)
  return summary


def _absolute(path: str) -> str:
  return storage.absolute(path) if storage.is_url(path) else os.path.abspath(path)


def import_trimmed(import_into: Callable[[str], Any], output: str, task: str, *,
                   normalizers: Sequence[str] = ()) -> dict[str, Any]:
  """Runs an import into a scratch MODEL_DIR beside `output`, then trims it into `output` (`--trim_vocab_to`)."""
  import shutil

  from flax_xalign import tasks

  tasks.task_names(task)  # An unknown task fails before the import's work.
  if storage.is_url(output):  # The untrimmed import is read once and dropped: it need not travel to the bucket.
    scratch = tempfile.mkdtemp(prefix=storage.basename(output) + ".untrimmed.")
  else:
    parent = os.path.dirname(os.path.abspath(output))
    makedirs(parent, setting="--output")
    scratch = tempfile.mkdtemp(prefix=os.path.basename(os.path.abspath(output)) + ".untrimmed.", dir=parent)
  try:
    import_into(os.path.join(scratch, "model"))
    return trim_model_dir(os.path.join(scratch, "model"), task, output, normalizers=normalizers)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def import_maybe_trimmed(import_into: Callable[[str], Any], output: str, *, trim_vocab_to: str | None,
                         trim_normalize: str = "") -> None:
  """The import commands' `--trim_vocab_to=TASK [--trim_normalize=a,b]`: import, trimmed when asked."""
  if trim_vocab_to:
    import_trimmed(import_into, output, trim_vocab_to,
                   normalizers=tuple(n for n in trim_normalize.split(",") if n))
  else:
    import_into(output)
