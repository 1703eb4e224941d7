"""Run logs in NVIDIA dllogger's JSON-lines format (docs/interfaces.md, section 4), a readable copy on stdout,
and TensorBoard scalars when `tensorboard` is installed. Only the main process writes.

Nothing is created when a MetricLogger is built: the JSON file opens with the first record written and the
TensorBoard event file with the first scalar, so an entry point that refuses its inputs before logging leaves
no file behind. Unusable paths are refused at construction (check_log_paths), before any work."""
from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional, Union

from bertrecipe.errors import InputError, check_creatable

Step = Union[str, list, tuple]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    return value


def check_log_paths(json_path: Optional[str | Path], tensorboard_dir: Optional[str | Path] = None,
                    json_flag: str = "--json-summary") -> None:
    """Refuses, with one line, a JSON log path that is a folder or lies under a file, and a TensorBoard folder
    that is a file or lies under one. Creates nothing; entry points call it with their other checks."""
    if json_path:
        path = Path(json_path)
        if path.is_dir():
            raise InputError(f"{path}: {json_flag} is a folder; give a file name such as {path / 'dllogger.json'}")
        check_creatable(path, json_flag)
    if tensorboard_dir:
        folder = Path(tensorboard_dir)
        if folder.exists() and not folder.is_dir():
            raise InputError(f"{folder}: the TensorBoard folder exists and is a file; move it or choose another "
                             "output folder")
        check_creatable(folder, "the TensorBoard folder")


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
        if self._file is None and self._json_path is not None:
            self._json_path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._json_path, "a", encoding="utf-8")  # appended to, as dllogger does
        if self._file is not None:
            self._file.write("DLLL " + json.dumps(record) + "\n")
            self._file.flush()

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
            for key, value in scalars.items() if writer is not None else ():
                writer.add_scalar(key, value, step[-1])

    def _open_tensorboard(self) -> Any:
        """The SummaryWriter, made at the first scalar (it creates its event file at once); None without
        tensorboard installed."""
        if self._tensorboard is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: only when tensorboard is installed
                self._tensorboard_dir = None
                return None
            self._tensorboard = SummaryWriter(str(self._tensorboard_dir))
        return self._tensorboard

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        self._json_path = self._tensorboard_dir = None  # closed for good: a late record creates nothing


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a dllogger JSON-lines file (lines without the DLLL prefix are ignored)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("DLLL "):
            records.append(json.loads(line[5:]))
    return records
