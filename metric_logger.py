"""Run logs in NVIDIA dllogger's JSON-lines format (interfaces.md, section 4), a readable copy on stdout,
and TensorBoard scalars when `tensorboard` is installed. Only the main process writes."""
from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional, Union

Step = Union[str, list, tuple]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN or Infinity
    return value


class MetricLogger:
    """`log(step, data)` with step "PARAMETER", [epoch, global_step] or [] (final summary);
    `metadata(metric, {"unit": ...})` declares a metric."""

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
        self._file = None
        self._tensorboard = None
        if not enabled:
            return
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(json_path, "a", encoding="utf-8")
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional: only when tensorboard is installed
                pass
            else:
                self._tensorboard = SummaryWriter(str(tensorboard_dir))

    def _stamp(self) -> dict[str, str]:
        now = time.time()
        return {
            "timestamp": f"{now}",
            "datetime": datetime.now().astimezone().isoformat(),
            "elapsedtime": f"{now - self.start}",
        }

    def _write(self, record: dict[str, Any]) -> None:
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
        if self._tensorboard is not None and isinstance(step, list) and step:
            for key, value in data.items():
                if isinstance(value, (int, float)):
                    self._tensorboard.add_scalar(key, value, step[-1])

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """All records of a dllogger JSON-lines file (lines without the DLLL prefix are ignored)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("DLLL "):
            records.append(json.loads(line[5:]))
    return records
