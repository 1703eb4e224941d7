"""An embedding model's outputs for use elsewhere: the encoder and its pooling as one ONNX graph (input_ids and
input_mask, int64 [batch, sequence], in; unit vectors `embeddings` float32 [batch, hidden] out), run on ONNX
Runtime; and a corpus's embeddings as a safetensors file (tensor `embeddings`) with its ids as JSON beside."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from safetensors.torch import save as safetensors_bytes
from torch import nn

from bertrecipe.common.errors import InputError

INPUTS = ("input_ids", "input_mask")
OUTPUT = "embeddings"
OPSET = 17


def onnx_bytes(model: nn.Module, max_seq_length: int, opset: int = OPSET) -> bytes:
    """The model (an EmbeddingModel: forward(input_ids, input_mask)) as ONNX with dynamic batch and sequence
    axes. The encoder runs dense while it is traced (one static graph, whatever padding the example has)."""
    model = copy.deepcopy(model).cpu().eval()  # the caller's model stays where and as it was
    model.encoder.skip_padding = False
    example = (torch.ones((2, min(8, max_seq_length)), dtype=torch.long),) * 2
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUTS} | {OUTPUT: {0: "batch"}}
    buffer = io.BytesIO()
    torch.onnx.export(model, example, buffer, input_names=list(INPUTS), output_names=[OUTPUT],
                      dynamic_axes=axes, opset_version=opset, dynamo=False)
    return buffer.getvalue()


def open_embedding_session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session of a graph as onnx_bytes writes it; InputError naming the file otherwise."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own types for a bad file
        raise InputError(f"{path}: ONNX Runtime cannot load it ({str(error).splitlines()[0]})") from None
    inputs = tuple(node.name for node in session.get_inputs())
    outputs = tuple(node.name for node in session.get_outputs())
    if inputs != INPUTS or outputs != (OUTPUT,):
        raise InputError(f"{path}: takes {', '.join(inputs)} and gives {', '.join(outputs)}, not an embedding "
                         f"export's {', '.join(INPUTS)} -> {OUTPUT} (run_retrieval.py --export_onnx)")
    return session


def onnx_embeddings(session: Any, ids: np.ndarray, mask: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """[N, H] float32 embeddings of tokenized rows (as embedding.tokenize_texts gives them)."""
    out = []
    for first in range(0, len(ids), batch_size):
        rows = slice(first, first + batch_size)
        feed = {"input_ids": ids[rows].astype(np.int64), "input_mask": mask[rows].astype(np.int64)}
        out.append(session.run([OUTPUT], feed)[0])
    return np.concatenate(out)


def embeddings_safetensors(embeddings: torch.Tensor, pooling: str) -> bytes:
    """The [N, H] float32 embeddings as a safetensors file, its metadata naming the pooling."""
    return safetensors_bytes({OUTPUT: embeddings.float().contiguous()},
                             metadata={"pooling": pooling, "normalized": "true"})


def ids_json(ids: Sequence[str]) -> str:
    """The corpus ids in the rows' order, for the JSON file beside the embeddings."""
    return json.dumps(list(ids), ensure_ascii=False) + "\n"
