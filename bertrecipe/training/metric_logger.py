"""Run logs in NVIDIA dllogger's JSON-lines format (docs/interfaces.md, section 4), a readable copy on stdout,
and TensorBoard scalars when `tensorboard` is installed. Only the main process writes.

Nothing is created when a MetricLogger is built: the JSON file opens with the first record written and the
TensorBoard event file with the first scalar, so an entry point that refuses its inputs before logging leaves
no file behind. Unusable paths (a folder where the file goes, a read-only or unwritable folder or file) are
refused at construction (check_log_paths), before any work. A write that fails later (a full disk) is an
InputError naming the file and errno's text; the records written before it stay whole in the file."""
from __future__ import annotations

import io
import itertools
import json
import math
import os
import socket
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional, Union

from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable_file, check_writable_folder

Step = Union[str, list, tuple]
_EVENT_FILES = itertools.count()  # event files of one process made in the same second get different names


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    return value


def check_log_paths(json_path: Optional[str | Path], tensorboard_dir: Optional[str | Path] = None,
                    json_flag: str = "--json-summary") -> None:
    """Refuses, with one line, a JSON log path that is a folder, lies under a file or cannot be written (an
    unwritable file, an unwritable or read-only folder), and a TensorBoard folder that is a file, lies under one
    or cannot be written to. Creates nothing; entry points call it with their other checks."""
    if json_path:
        check_writable_file(json_path, json_flag)
    if tensorboard_dir:
        check_writable_folder(tensorboard_dir, "the TensorBoard folder")


def _append(fd: int, data: bytes) -> None:
    """Appends `data` whole or not at all: after a failed write (a full disk) the file is cut back to its size
    before, so that it ends with its last complete record."""
    start = os.fstat(fd).st_size
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass
        raise


class MetricLogger:
    """`log(step, data)` with step "PARAMETER", [epoch, global_step] or [] (final summary);
    `metadata(metric, {"unit": ...})` declares a metric. InputError (see check_log_paths) for unusable paths;
    the files themselves are created with the first record."""

    def __init__(
        self,
        json_path: Optional[str | Path],
        enabled: bool = True,
        printer: Callable[[str], None] = print,
        tensorboard_dir: Optional[str | Path] = None,
    ) -> None:
        self.enabled = enabled
        self.start = time.time()
        self.printer = printer
        self._json_path = Path(json_path) if json_path and enabled else None
        self._tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir and enabled else None
        self._file = None
        self._tensorboard = None
        if enabled:
            check_log_paths(self._json_path, self._tensorboard_dir)

    def _stamp(self) -> dict[str, str]:
        now = time.time()
        return {
            "timestamp": f"{now}",
            "datetime": datetime.now().astimezone().isoformat(),
            "elapsedtime": f"{now - self.start}",
        }

    def _write(self, record: dict[str, Any]) -> None:
        if self._json_path is None:
            return
        try:
            if self._file is None:
                self._json_path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self._json_path, "ab", buffering=0)  # appended to, as dllogger does
            _append(self._file.fileno(), ("DLLL " + json.dumps(record) + "\n").encode("utf-8"))
        except OSError as error:
            raise InputError(f"{self._json_path}: cannot write the JSON log ({error.strerror})") from None

    def metadata(self, metric: str, metadata: dict[str, Any]) -> None:
        if not self.enabled:
            return
        stamp = self._stamp()
        self._write({"timestamp": stamp["timestamp"], "elapsedtime": stamp["elapsedtime"],
                     "datetime": stamp["datetime"], "type": "METADATA", "metric": metric, "metadata": metadata})

    def log(self, step: Step, data: dict[str, Any], echo: bool = True) -> None:
        if not self.enabled:
            return
        data = {key: _jsonable(value) for key, value in data.items()}
        step = list(step) if isinstance(step, tuple) else step
        self._write({**self._stamp(), "type": "LOG", "step": step, "data": data})
        if echo:
            where = "PARAMETER" if step == "PARAMETER" else ("summary" if step == [] else f"step {tuple(step)}")
            shown = " ".join(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}" for k, v in data.items())
            self.printer(f"DLL {datetime.now():%Y-%m-%d %H:%M:%S} - {where} {shown}")
        if self._tensorboard_dir is not None and isinstance(step, list) and step:
            scalars = {key: value for key, value in data.items() if isinstance(value, (int, float))}
            writer = self._open_tensorboard() if scalars else None
            if writer is not None:
                writer.add_scalars(scalars, step[-1])

    def _open_tensorboard(self) -> Optional["EventFile"]:
        """The event file, made at the first scalar; None without tensorboard installed."""
        if self._tensorboard is None:
            try:
                self._tensorboard = EventFile(self._tensorboard_dir)
            except ImportError:  # optional: only when tensorboard is installed
                self._tensorboard_dir = None
        return self._tensorboard

    def close(self) -> None:
        try:
            if self._file is not None:
                self._file.close()
            if self._tensorboard is not None:
                self._tensorboard.close()
        finally:
            self._file = self._tensorboard = None
            self._json_path = self._tensorboard_dir = None  # closed for good: a late record creates nothing


class EventFile:
    """TensorBoard scalars in an event file of `folder`, written at once in the calling thread: torch's
    SummaryWriter writes from a thread of its own, whose failure (a full disk) is a traceback on stderr and
    reaches the caller only at a later call. Readers (TensorBoard, EventAccumulator) see the same records.
    ImportError without tensorboard; InputError naming the folder or file when it cannot be written."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event, self._summary, self._record_writer = Event, Summary, RecordWriter
        # SummaryWriter's naming: TensorBoard finds event files by "tfevents" in their names.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_EVENT_FILES)}"
        self.path = folder / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab", buffering=0)
        except OSError as error:
            raise InputError(f"{folder}: cannot write the TensorBoard folder ({error.strerror})") from None
        self._add(Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add_scalars(self, scalars: dict[str, float], step: int) -> None:
        values = [self._summary.Value(tag=key, simple_value=float(value)) for key, value in scalars.items()]
        self._add(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))

    def _add(self, event: Any) -> None:
        record = io.BytesIO()
        self._record_writer(record).write(event.SerializeToString())  # TFRecord framing: length, CRCs
        try:
            _append(self._file.fileno(), record.getvalue())
        except OSError as error:
            raise InputError(f"{self.path}: cannot write the TensorBoard events ({error.strerror})") from None

    def close(self) -> None:
        self._file.close()


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a dllogger JSON-lines file (lines without the DLLL prefix are ignored). A last line without
    its newline is a record still being appended (a reader of a live run's log) or cut off by a crash: not read."""
    records = []
    text = Path(path).read_text(encoding="utf-8")
    for line in text[:text.rfind("\n") + 1].splitlines():
        if line.startswith("DLLL "):
            records.append(json.loads(line[5:]))
    return records
