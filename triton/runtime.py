"""What deployer.py and server.py share: Triton's input names and a runner for an exported model file.

Imports only numpy at top level (onnxruntime or torch when a runner is made), so that server.py runs in the
server environment (triton/requirements-server.txt) without the training stack.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

INPUTS = ("input__0", "input__1", "input__2")  # token ids, segment ids, attention mask


def runner_for(path: Path, fmt: str) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """A function that runs the exported file (fmt "onnx" or "torchscript") on int64 arrays, as Triton's
    backend would."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda arrays: session.run(None, dict(zip(INPUTS, arrays)))
    import torch

    loaded = torch.jit.load(str(path))

    def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            return [t.numpy() for t in loaded(*(torch.from_numpy(a) for a in arrays))]
    return run
