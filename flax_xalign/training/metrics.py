"""Where metrics go: `metrics.jsonl`, TensorBoard events and a progress line.

TensorBoard events are written with the `tensorboard` package's own event
writer (no TensorFlow, no clu); where `tensorboard` is not installed (a
training host with JAX only) the run says so once and writes metrics.jsonl
alone.

`metrics.jsonl` holds one JSON object per logged step (`step`, `loss`, one key
per loss term, `learning_rate`, `tokens_per_sec`, ...). On resume, lines from
steps after the restored checkpoint are dropped (they belong to the part of the
interrupted run that is about to be redone), so the file reads as one run. A
line that is not JSON (the torn last line of a run killed mid-write) is
dropped with a warning: it never blocks a resume.

In a bucket (MODEL_DIR=gs://...) an object cannot be appended in place: rows
are kept in memory and uploaded at every checkpoint and at the end
(`flush`), each flush sending only its new rows (`storage.append_object`,
GCS compose), so a preemption loses only rows after the last checkpoint,
which a resume drops and redoes anyway. TensorBoard events go the same way:
each flush writes a new events object (TensorBoard reads every events file
of a folder).
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from flax_xalign import storage
from flax_xalign.errors import UserError, no_space_error
from flax_xalign.fileio import write_atomically
from flax_xalign.models import flops
from flax_xalign.run_dir import RunDir


def peak_flops_per_device(override: float | None = None) -> float | None:
  """The configured peak, else the known bf16 peak of this device kind (None on CPU)."""
  return override or flops.peak_flops_per_device(jax.devices()[0])


def _to_python(value: Any) -> Any:
  if isinstance(value, (np.ndarray, np.generic, jax.Array)):
    value = np.asarray(value).item()
  if isinstance(value, float):
    return round(value, 6)
  return value


def _parse_row(line: str) -> dict | None:
  try:
    row = json.loads(line)
  except ValueError:
    return None
  return row if isinstance(row, dict) else None


class MetricsLogger:
  """Writes metrics on the chief process; prints a progress line."""

  def __init__(self, model_dir: str, *, resume_step: int = 0, total_steps: int | None = None):
    self.is_chief = jax.process_index() == 0
    self.path = RunDir.of(model_dir).metrics
    self.in_bucket = storage.is_url(self.path)
    self._pending: list[str] = []  # Rows not yet uploaded (a bucket only).
    self.total_steps = total_steps
    self._writer = EventWriter(RunDir.of(model_dir).tensorboard) if self.is_chief else None
    if self.is_chief:
      self._truncate_after(resume_step)

  def _truncate_after(self, step: int) -> None:
    if not storage.exists(self.path):
      return
    kept, torn = [], []
    text = storage.read_bytes(self.path).decode("utf-8", errors="replace")
    for number, line in enumerate(io.StringIO(text, newline=None), start=1):  # (lines as `open` gives them)
      if not line.strip():
        continue
      row = _parse_row(line)
      if row is None:
        torn.append(number)
      elif row.get("step", 0) <= step:
        kept.append(line if line.endswith("\n") else line + "\n")
    if torn:
      print(f"warning: dropped {len(torn)} unreadable line(s) of {self.path} (line {', '.join(map(str, torn))}; "
            "a run stopped mid-write leaves a torn last line).", file=sys.stderr, flush=True)
    write_atomically(self.path, "".join(kept))

  def write(self, step: int, scalars: Mapping[str, Any], *, prefix: str = "") -> dict[str, Any]:
    row = {"step": int(step), **{f"{prefix}{k}": _to_python(v) for k, v in scalars.items()}}
    if not self.is_chief:
      return row
    line = json.dumps(row) + "\n"
    if self.in_bucket:
      self._pending.append(line)  # Uploaded at the next checkpoint (`flush`).
    else:
      try:
        with open(self.path, "a") as f:
          f.write(line)
      except OSError as e:
        error = no_space_error(e, self.path)
        if error is None:
          raise
        raise error from e
    self._writer.write_scalars(step, {k: v for k, v in row.items() if k != "step"})
    return row

  def tick(self, step: int, seconds_per_step: float | None) -> None:
    """Rewrites a one-line step counter with an ETA (terminals only).

    Reads nothing from the device, so it never stalls the step pipeline.
    """
    if not (self.is_chief and sys.stdout.isatty()):
      return
    eta = ""
    if seconds_per_step and self.total_steps:
      left = int(seconds_per_step * (self.total_steps - step))
      eta = f"  ETA {left // 60}m{left % 60:02d}s"
    total = f"/{self.total_steps}" if self.total_steps else ""
    print(f"\r  step {step}{total}{eta}   ", end="", flush=True)

  def progress(self, row: Mapping[str, Any], terms: tuple[str, ...]) -> None:
    if not self.is_chief:
      return
    if sys.stdout.isatty():
      print("\r", end="")
    total = f"/{self.total_steps}" if self.total_steps else ""
    parts = [f"step {row['step']}{total}", f"loss {row['loss']:.4f}"]
    parts += [f"{t} {row[t]:.4f}" for t in terms if t in row]
    if "tokens_per_sec" in row:
      parts.append(f"{row['tokens_per_sec']:,.0f} tok/s")
    if row.get("mfu") is not None:
      parts.append(f"MFU {100 * row['mfu']:.1f}%")
    print("  ".join(parts), file=sys.stdout, flush=True)

  def flush(self) -> None:
    if self._pending:
      rows, self._pending = "".join(self._pending), []
      try:
        storage.append_object(self.path, rows.encode("utf-8"))
      except Exception as e:  # noqa: BLE001  (the store's clients raise many classes; all mean the same here)
        raise UserError(f"could not append to {self.path} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                        "the bucket could not be reached. The checkpoints are intact: rerun the same command once "
                        "it is back (a resume rewrites the rows after the step it resumes from).") from None
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    self.flush()
    if self._writer is not None:
      self._writer.close()


class _ObjectPerFlush:
  """A binary file object whose bytes become one new object at each flush (`<name>.<n>`): an events file in a
  bucket, where an object cannot grow."""

  def __init__(self, url: str):
    self.url, self.closed, self._buffer, self._count = url, False, bytearray(), 0

  def write(self, data: bytes) -> None:
    self._buffer += data

  def flush(self) -> None:
    if self._buffer:
      storage.write_object(f"{self.url}.{self._count:05d}", bytes(self._buffer))
      self._buffer.clear()
      self._count += 1

  def close(self) -> None:
    self.flush()
    self.closed = True


class EventWriter:
  """Scalars as TensorBoard events (`events.out.tfevents.*`), written through `tensorboard`'s record writer.

  The record writer is pure Python; `tensorboard`'s EventFileWriter is not
  used because it imports TensorFlow for its file system (seconds of start-up,
  and impossible on a host without TF).
  """

  def __init__(self, directory: str):
    try:
      from tensorboard.compat.proto import event_pb2, summary_pb2
      from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError:
      print(f"note: the tensorboard package is not installed, so no TensorBoard events are written to {directory} "
            "(metrics.jsonl has every logged number)", file=sys.stderr, flush=True)
      self._writer = None
      return
    self._event, self._summary = event_pb2.Event, summary_pb2.Summary
    name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.v2"
    if storage.is_url(directory):
      stream = _ObjectPerFlush(storage.join(directory, name))
    else:
      os.makedirs(directory, exist_ok=True)
      stream = open(os.path.join(directory, name), "ab")  # noqa: SIM115  (closed by close())
    self._writer = RecordWriter(stream)
    self._writer.write(self._event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    if self._writer is None:
      return
    values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if values:
      self._writer.write(self._event(step=int(step), wall_time=time.time(),
                                     summary=self._summary(value=values)).SerializeToString())

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None and not self._writer.closed:
      self._writer.close()


class Throughput:
  """Tokens/s and model FLOP utilisation over a logging interval.

  Each step adds its batch: its real (non-padding) tokens, and its model
  FLOPs by `step_flops`. MFU is model FLOPs on real tokens by the standard
  count (models/flops.py `model_train_flops`) / time / the devices' dense
  bf16 peak; padding slots and masked-out attention add nothing to it.

  Args:
    step_flops: a function of this process's host batch that returns its
      model FLOPs (pretrain passes the count of models/flops.py), or a
      number taken as the model FLOPs of every step over all processes.
    peak_flops: one device's peak FLOP/s (None: no MFU, e.g. on a CPU).
    num_devices: the devices the step runs on.
  """

  def __init__(self, *, step_flops: Callable[[Mapping[str, Any]], float] | float, peak_flops: float | None,
               num_devices: int):
    self.step_flops = step_flops
    self.peak = peak_flops * num_devices if peak_flops else None
    self.reset()

  def reset(self) -> None:
    self._start = time.perf_counter()
    self._steps = 0
    self._tokens = 0.0
    self._flops = 0.0

  def add(self, tokens: float, flops: float) -> None:
    """One step of `tokens` real tokens and `flops` model FLOPs, over all processes."""
    self._steps += 1
    self._tokens += tokens
    self._flops += flops

  def add_batch(self, batch: Mapping[str, Any]) -> None:
    """One step on `batch`, this process's rows (numpy; each process holds as many rows)."""
    processes = jax.process_count()
    tokens = float((np.asarray(batch["segment_ids"]) > 0).sum()) * processes
    flops = self.step_flops(batch) * processes if callable(self.step_flops) else float(self.step_flops)
    self.add(tokens, flops)

  def summary(self) -> dict[str, Any]:
    """Rates since the last reset; empty when no step was timed."""
    if not self._steps:
      return {}
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    flops = self._flops / elapsed
    out = {
        "tokens_per_sec": self._tokens / elapsed,
        "steps_per_sec": self._steps / elapsed,
        "model_tflops_per_sec": flops / 1e12,
    }
    if self.peak:
      out["mfu"] = flops / self.peak
    return out
