"""The global co-occurrence table of MLM-GC (Ai & Fang 2023, §3.2): the `cooc` asset.

X[a, b] is the distance-weighted, language-balanced count of token b within
±`window` positions of token a over the run's corpus (definitions and the
counter: `flax_xalign.data.cooc`). The asset is static (`refresh_every` 0):
it is counted once when a run starts, or read from a directory written by
`xalign cooc` (or its Beam pipeline), and saved with MODEL_DIR
and every checkpoint step, so a resumed run uses exactly the table it started
with and never recounts.

Options (`train.asset_options = {'cooc': {...}}`):

* `window` (2): n of the ±n window;
* `reference_language` ('en'): c_lang = C_ref / C_lang; a corpus without it
  uses its first language in sorted order (the table's manifest says which);
* `split` ('train'): the split of the run's task that is counted (not used
  with `path`);
* `drop_diagonal` (False): True leaves out X[a, a] ("the the" pairs);
* `path` (''): a directory with `cooc.npz` + `cooc.json` to use instead of
  counting; it must have been counted with the run's vocabulary (its sha256,
  recorded in the manifest's source, and size), languages, window, reference
  language and diagonal rule.

Value (device arrays; the objective calls `ops.cooc_lookup.lookup_table`):

    indptr  int32   [V + 1]  CSR row offsets over the centre token a
    indices int32   [nnz]    context tokens b, strictly increasing within a row
    log_x   float32 [nnz]    log X[a, b] (X > 0; absent pairs are X = 0)

Placement: replicated on every device (the default logical axes, all None).
The lookup is a binary search with data-dependent positions into `indices`,
so a sharded table would need its shards gathered (or a collective per step)
anyway; replicated, every device answers its own batch shard's queries
locally. Tens of millions of entries are 8 bytes each (a 30M-entry table
over a 250k vocabulary is ~0.24 GB per device), which TPU and GPU HBM hold
beside the model; nnz must stay below 2**31 (int32 offsets).

Files: `cooc.npz` (indptr int64, indices, log_x) and `cooc.json` (the
manifest: window, weights, c_lang, tokens per language, corpus fingerprint,
source), the format of `data.cooc.save_table`, readable with
`xalign cooc --inspect=DIR --token=PIECE`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from flax_xalign import storage
from flax_xalign.assets import lang_vocab, registry
from flax_xalign.assets.base import Asset, Value, content_hash
from flax_xalign.data import cooc as cooc_data
from flax_xalign.errors import UserError

if TYPE_CHECKING:
  from flax_xalign.run_spec import RunSpec

FILES = (cooc_data.TABLE_FILE, cooc_data.MANIFEST_FILE)
OPTIONS = ("window", "reference_language", "split", "drop_diagonal", "path")
DEFAULT_WINDOW = cooc_data.DEFAULT_WINDOW
DEFAULT_REFERENCE_LANGUAGE = cooc_data.DEFAULT_REFERENCE_LANGUAGE
DEFAULT_SPLIT = "train"
CORPUS_KEY = "corpus_fingerprint"  # The manifest's sha256 of the counted corpus (data.cooc.fingerprint).
_INT32_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class CoocSettings:
  """The `cooc` options of a run, validated (see the module docstring)."""

  window: int = DEFAULT_WINDOW
  reference_language: str = DEFAULT_REFERENCE_LANGUAGE
  split: str = DEFAULT_SPLIT
  drop_diagonal: bool = False
  path: str = ""


def settings_of(options: Mapping[str, Any]) -> CoocSettings:
  """CoocSettings from `asset_options['cooc']`; one UserError per bad option."""
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise UserError(f"unknown cooc option(s) {unknown}; it takes {', '.join(map(repr, OPTIONS))} "
                    "(e.g. asset_options={'cooc': {'window': 2}}).")
  window = options.get("window", DEFAULT_WINDOW)
  if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
    raise UserError(f"cooc option 'window' must be an integer >= 1 (n of the ±n window; the paper: 2), "
                    f"got {window!r}.")
  reference = options.get("reference_language", DEFAULT_REFERENCE_LANGUAGE)
  if not isinstance(reference, str) or not reference:
    raise UserError(f"cooc option 'reference_language' must be a language code such as 'en', got {reference!r}.")
  split = options.get("split", DEFAULT_SPLIT)
  if not isinstance(split, str) or not split:
    raise UserError(f"cooc option 'split' must be a split name such as 'train', got {split!r}.")
  drop_diagonal = options.get("drop_diagonal", False)
  if not isinstance(drop_diagonal, (bool, np.bool_)):
    raise UserError(f"cooc option 'drop_diagonal' must be True or False, got {drop_diagonal!r}.")
  path = options.get("path", "") or ""
  if not isinstance(path, str):
    raise UserError(f"cooc option 'path' must be a directory written by `xalign cooc` (or '' to "
                    f"count the run's task), got {path!r}.")
  return CoocSettings(window=int(window), reference_language=reference, split=split,
                      drop_diagonal=bool(drop_diagonal), path=path)


# ---------------------------------------------------------------- tables <-> values


def device_value(indptr: np.ndarray, indices: np.ndarray, log_x: np.ndarray, *, where: str) -> Value:
  """The asset value of CSR arrays, checked: int32 offsets, sorted unique columns per row, finite values.

  Raises:
    UserError: an empty table, nnz >= 2**31, or arrays that are not a CSR
      table (named by `where`).
  """
  indptr, indices, log_x = np.asarray(indptr), np.asarray(indices), np.asarray(log_x)
  if indptr.ndim != 1 or indptr.size < 2 or indices.ndim != 1 or log_x.shape != indices.shape:
    raise UserError(f"{where}: not a CSR table (indptr {indptr.shape}, indices {indices.shape}, log_x "
                    f"{log_x.shape}); rebuild it with `xalign cooc`.")
  nnz = indices.size
  if nnz == 0:
    raise UserError(f"{where}: the co-occurrence table is empty (no token pair within the window): the corpus has "
                    "no sequence of two or more tokens, or the split is empty. Count a task with text in it.")
  if nnz >= _INT32_LIMIT:
    raise UserError(f"{where}: {nnz:,} entries do not fit the lookup's int32 offsets (< 2**31). Use a smaller "
                    "window or vocabulary, or drop rare pairs before loading.")
  vocab_size = indptr.size - 1
  steps = np.diff(indptr.astype(np.int64))
  if indptr[0] != 0 or indptr[-1] != nnz or (steps < 0).any():
    raise UserError(f"{where}: indptr must rise from 0 to nnz = {nnz:,} (it goes {int(indptr[0])} .. "
                    f"{int(indptr[-1])}); the file was cut or edited.")
  if indices.min() < 0 or indices.max() >= vocab_size:
    raise UserError(f"{where}: token ids outside [0, {vocab_size}); the file was cut or edited.")
  row_start = np.zeros(nnz, bool)
  row_start[indptr[:-1][steps > 0]] = True
  if (np.diff(indices.astype(np.int64))[~row_start[1:]] <= 0).any():
    raise UserError(f"{where}: the columns of a row are not strictly increasing, which the lookup's binary "
                    "search needs; rebuild the table with `xalign cooc`.")
  if not np.isfinite(log_x).all():
    raise UserError(f"{where}: log_x has non-finite entries; rebuild the table.")
  return {"indptr": indptr.astype(np.int32), "indices": indices.astype(np.int32),
          "log_x": log_x.astype(np.float32)}


def table_languages(info: Mapping[str, Any]) -> tuple[str, ...]:
  """The languages a table counted (sorted; those with at least one token)."""
  if info.get("languages") is not None:
    return tuple(sorted(info["languages"]))
  return tuple(sorted(code for code, n in dict(info.get("tokens", {})).items() if n))


def corpus_fingerprint(info: Mapping[str, Any] | None) -> str | None:
  return str(info[CORPUS_KEY]) if info and info.get(CORPUS_KEY) else None


def check_info(info: Mapping[str, Any], *, run: RunSpec, settings: CoocSettings, where: str,
               all_languages: bool) -> None:
  """UserError naming every way a table's manifest does not fit the run's vocabulary, languages and options.

  Args:
    all_languages: also require every language of the run to be in the table
      (for tables given by `path`; a table counted for the run may lack a
      language that has no tokens in the split).
  """
  problems = []
  if int(info.get("vocab_size", -1)) != run.vocabulary.size:
    problems.append(f"vocabulary size {info.get('vocab_size')} (this run: {run.vocabulary.size})")
  counted_with = dict(info.get("source") or {}).get(cooc_data.VOCABULARY_KEY)
  if counted_with and run.vocabulary.sha256 and counted_with != run.vocabulary.sha256:
    # Same size, other pieces: its rows are other tokens (tables written before the hash was kept pass).
    problems.append(f"ids of another vocabulary (sha256 {counted_with[:12]}…; this run's "
                    f"{run.vocabulary.file}: {run.vocabulary.sha256[:12]}…)")
  if int(info.get("window", -1)) != settings.window:
    problems.append(f"window {info.get('window')} (this run's option 'window': {settings.window})")
  if bool(info.get("drop_diagonal", False)) != settings.drop_diagonal:
    problems.append(f"drop_diagonal {info.get('drop_diagonal')} (this run: {settings.drop_diagonal})")
  languages = table_languages(info)
  extra = sorted(set(languages) - set(run.languages))
  missing = sorted(set(run.languages) - set(languages)) if all_languages else []
  if extra or missing:
    problems.append(f"languages {list(languages)} (this run: {list(run.languages)})")
  if languages and "reference_language" in info:
    expected = settings.reference_language if settings.reference_language in languages else min(languages)
    if info["reference_language"] != expected:
      problems.append(f"reference language {info['reference_language']!r} (this run: {expected!r})")
  if problems:
    raise UserError(f"the co-occurrence table in {where} does not belong to this run: it has "
                    f"{'; '.join(problems)}. Count it for this run (`xalign cooc --task="
                    f"{run.task} --window={settings.window} --output=DIR`), set the cooc options to match it, or "
                    "leave out the option 'path' (the run then counts its task).")


# ---------------------------------------------------------------- the asset


class Cooc(Asset):
  """`cooc` (see the module docstring)."""

  name = "cooc"
  files = FILES
  refresh_every = 0
  on_device = True

  def __init__(self, *, settings: CoocSettings, task: str, log: Callable[[str], Any] | None = print):
    self.settings = settings
    self.task = task
    self._log = log
    # The manifest (cooc.json) of the value built or loaded last: saved beside it, checked, fingerprinted.
    self.info: dict[str, Any] | None = None

  def _from_table(self, table: Any, *, where: str) -> Value:
    value = device_value(table.indptr, table.indices, table.log_x, where=where)
    self.info = dict(table.info)
    return value

  def build(self, run: RunSpec) -> Value:
    settings = self.settings
    if settings.path:
      if not all(storage.exists(os.path.join(settings.path, f)) for f in FILES):
        raise UserError(f"cooc option 'path': {settings.path} has no {' and '.join(FILES)}; write them with "
                        f"`xalign cooc --task={run.task} --window={settings.window} "
                        f"--output={settings.path}`.")
      table = cooc_data.load_table(settings.path)
      check_info(table.info, run=run, settings=settings, where=settings.path, all_languages=True)
      return self._from_table(table, where=settings.path)
    lang_vocab.ensure_registered(run)
    # Imported here: the task registry (TensorFlow, seqio, every task family)
    # is needed only when a table is counted, not when one is loaded.
    from flax_xalign.tasks import cooc_input

    table = cooc_input.count_task(run.task, split=settings.split, languages=run.languages, window=settings.window,
                                  reference_language=settings.reference_language,
                                  drop_diagonal=settings.drop_diagonal, log=self._log)
    where = f"the count of {run.task}:{settings.split}"
    check_info(table.info, run=run, settings=settings, where=where, all_languages=False)
    return self._from_table(table, where=where)

  def save(self, directory: str, value: Value) -> None:
    if self.info is None:
      raise ValueError("Cooc.save needs the manifest of the value: build or load it with this asset first")
    table = cooc_data.CoocTable(indptr=np.asarray(value["indptr"]).astype(np.int64),
                                indices=np.asarray(value["indices"], np.int32),
                                log_x=np.asarray(value["log_x"], np.float32), info=dict(self.info))
    cooc_data.save_table(directory, table)

  def load(self, directory: str) -> Value:
    table = cooc_data.load_table(directory)
    return self._from_table(table, where=os.path.join(directory, FILES[0]))

  def check(self, value: Value, run: RunSpec) -> None:
    check_info(self.info or {}, run=run, settings=self.settings, where=os.path.join("MODEL_DIR", FILES[1]),
               all_languages=False)
    if np.shape(value["indptr"])[0] != run.vocabulary.size + 1:
      raise UserError(f"{FILES[0]} has {np.shape(value['indptr'])[0] - 1} rows but this run's vocabulary has "
                      f"{run.vocabulary.size} ids; remove it (it is recounted) or use a new MODEL_DIR.")

  def fingerprint(self, value: Value) -> dict[str, Any]:
    return {"version": self.version, "sha256": content_hash(value), "corpus": corpus_fingerprint(self.info)}

  def describe(self, value: Value) -> str:
    nnz = int(np.shape(value["indices"])[0])
    vocab_size = int(np.shape(value["indptr"])[0]) - 1
    megabytes = sum(np.asarray(v).nbytes for v in value.values()) / 2**20
    info = self.info or {}
    window = info.get("window", self.settings.window)
    origin = f"from {self.settings.path}" if self.settings.path else f"counted on {self.task}:{self.settings.split}"
    return (f"cooc: {nnz:,} pairs over {vocab_size:,} ids (window ±{window}, {nnz / max(vocab_size, 1):.1f} per "
            f"row), {megabytes:,.1f} MB on each device, {origin}")


@registry.register("cooc")
def _cooc(run: RunSpec) -> Asset:
  return Cooc(settings=settings_of(run.options_of("cooc")), task=run.task)
