"""Fine-tuned models as ONNX files, and a SQuAD model run on ONNX Runtime: what triton/deployer.py (the export),
inference.py --onnx_model and benchmarks/finetune_throughput.py --onnxruntime share."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn

from bertrecipe.errors import InputError
from bertrecipe.serving import INPUTS, OUTPUTS


class TritonSignature(nn.Module):
    """The model with Triton's calling convention: three int64 [B, S] inputs, logits only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        model.bert.skip_padding = False  # one static dense graph, whatever padding the tracing example has

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, input_mask: torch.Tensor):
        outputs = self.model(input_ids, segment_ids, input_mask)
        return tuple(outputs[1:])  # drop the (absent) loss


def output_names(task: str) -> tuple[str, ...]:
    return OUTPUTS if task == "squad" else OUTPUTS[:1]


def export_onnx(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, task: str, opset: int) -> None:
    """ONNX with dynamic batch and sequence axes (TorchScript-based exporter: SDPA becomes plain MatMul/Softmax)."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS}
    for name in output_names(task):
        axes[name] = {0: "batch", 1: "sequence"} if task == "squad" else {0: "batch"}
    torch.onnx.export(module, example, str(path), input_names=list(INPUTS), output_names=list(output_names(task)),
                      dynamic_axes=axes, opset_version=opset, dynamo=False)


def open_qa_session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session (every graph optimization) of a SQuAD model as export_onnx writes it, e.g.
    triton/deployer.py --format onnx; an InputError naming the file when it is not one. threads 0: ORT's default,
    one per physical core."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own types (NoSuchFile, InvalidProtobuf, ...) for a bad file
        raise InputError(f"{path}: ONNX Runtime cannot load it ({str(error).splitlines()[0]})") from None
    inputs = tuple(node.name for node in session.get_inputs())
    outputs = tuple(node.name for node in session.get_outputs())
    if inputs != INPUTS or outputs != OUTPUTS:
        raise InputError(f"{path}: takes {', '.join(inputs)} and gives {', '.join(outputs)}, not a SQuAD export's "
                         f"{', '.join(INPUTS)} -> {', '.join(OUTPUTS)} (triton/deployer.py --format onnx)")
    return session


def embedding_rows(path: Path) -> Optional[int]:
    """The word-embedding rows of an export_onnx file (None when no initializer is named so)."""
    import onnx

    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        if tensor.name.endswith("word_embeddings.weight"):
            return int(tensor.dims[0])
    return None


def check_vocab_fits(path: Path, vocab_size: int) -> None:
    """InputError naming the file when the vocab has ids the model has no embedding for (ORT would fail inside
    its Gather kernel instead)."""
    rows = embedding_rows(path)
    if rows is not None and vocab_size > rows:
        raise InputError(f"{path}: the model embeds {rows} token ids, the vocab file has {vocab_size}: not this "
                         "model's vocab")


def qa_logits(session: Any, arrays: Sequence[np.ndarray], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits, float32 [N, L], of windows given as (token ids, segment ids, mask) [N, L], batch_size
    windows a run."""
    ids, segments, mask = (np.asarray(a, dtype=np.int64) for a in arrays)
    starts, ends = [], []
    for first in range(0, len(ids), batch_size):
        rows = slice(first, first + batch_size)
        start, end = session.run(list(OUTPUTS), dict(zip(INPUTS, (ids[rows], segments[rows], mask[rows]))))
        starts.append(start)
        ends.append(end)
    return np.concatenate(starts), np.concatenate(ends)
