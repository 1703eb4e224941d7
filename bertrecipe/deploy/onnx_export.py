"""Fine-tuned models as ONNX files, and SQuAD and GLUE models run on ONNX Runtime, fp32 or int8 (their logits, timed,
the vocab they fit): what triton/deployer.py (the export), inference.py, run_squad.py and run_glue.py --onnx_model
and `python -m benchmarks.finetune_throughput --onnxruntime` share."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.deploy.serving import INPUTS, OUTPUTS
from bertrecipe.finetuning.question_answering import LogitsFunction
from bertrecipe.model.families import encoder_of, is_modern_config
from bertrecipe.tokenization.bpe import BpeVocab
from bertrecipe.tokenization.wordpiece import Vocab, check_vocab_for_model, padded_vocab_size


class TritonSignature(nn.Module):
    """The model with Triton's calling convention: three int64 [B, S] inputs, logits only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        encoder_of(model).skip_padding = False  # one static dense graph, whatever padding the tracing example has

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, input_mask: torch.Tensor):
        if is_modern_config(self.model.config):
            # The modern family has no segment embeddings; a graph input nothing reads is dropped by the
            # exporter, and every client sends three inputs: the ids keep it, unchanged.
            input_ids = input_ids + segment_ids * 0
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


def open_session(path: Path, threads: int = 0) -> Any:
    """An ONNX Runtime CPU session (every graph optimization) of an ONNX file, fp32 or int8; an InputError naming
    the file when ONNX Runtime cannot load it. threads 0: ORT's default, one per physical core."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # ORT raises its own types (NoSuchFile, InvalidProtobuf, ...) for a bad file
        raise InputError(f"{path}: ONNX Runtime cannot load it ({str(error).splitlines()[0]})") from None


def open_qa_session(path: Path, threads: int = 0) -> Any:
    """A session (open_session) of a SQuAD model as export_onnx writes it, e.g. triton/deployer.py --format onnx
    (with or without --int8); an InputError naming the file when it is not one."""
    session = open_session(path, threads)
    inputs = tuple(node.name for node in session.get_inputs())
    outputs = tuple(node.name for node in session.get_outputs())
    if inputs != INPUTS or outputs != OUTPUTS:
        raise InputError(f"{path}: takes {', '.join(inputs)} and gives {', '.join(outputs)}, not a SQuAD export's "
                         f"{', '.join(INPUTS)} -> {', '.join(OUTPUTS)} (triton/deployer.py --format onnx)")
    return session


def open_classifier_session(path: Path, num_labels: int, threads: int = 0) -> Any:
    """A session (open_session) of a GLUE model as export_onnx writes it (triton/deployer.py --task glue) with
    num_labels outputs; an InputError naming the file when it is not one."""
    session = open_session(path, threads)
    inputs = tuple(node.name for node in session.get_inputs())
    outputs = session.get_outputs()
    if inputs != INPUTS or tuple(node.name for node in outputs) != OUTPUTS[:1]:
        raise InputError(f"{path}: takes {', '.join(inputs)} and gives {', '.join(n.name for n in outputs)}, not a "
                         f"GLUE export's {', '.join(INPUTS)} -> {OUTPUTS[0]} (triton/deployer.py --task glue)")
    labels = outputs[0].shape[-1]
    if labels != num_labels:
        raise InputError(f"{path}: gives {labels} logits a row, the task has {num_labels} labels "
                         "(triton/deployer.py --num_labels)")
    return session


def check_vocab_fits(session: Any, path: Path, vocab_size: int) -> None:
    """InputError naming the file when the model cannot embed the vocab's largest id: one two-token run, on which
    ORT's Gather refuses an id past the embeddings (reading the embedding's shape from the file instead means
    parsing all of it: 10 s for BERT-base, against 1.4 s for the session)."""
    import onnxruntime

    ids = np.array([[vocab_size - 1, 0]], dtype=np.int64)
    quiet = onnxruntime.RunOptions()
    quiet.log_severity_level = 4  # the failure becomes our one line, not also ORT's own log line
    try:
        session.run(None, dict(zip(INPUTS, (ids, np.zeros_like(ids), np.ones_like(ids)), strict=True)), quiet)
    except Exception as error:  # ORT's own exception types
        raise InputError(f"{path}: the model cannot embed id {vocab_size - 1} of a {vocab_size}-token vocab file: "
                         f"not this model's vocab ({str(error).splitlines()[0]})") from None


def timed_onnx_outputs(session: Any, arrays: Sequence[np.ndarray], batch_size: int, trim: bool = False
                       ) -> tuple[list[np.ndarray], list[float]]:
    """Every output, float32, of rows given as (token ids, segment ids, mask) [N, L], batch_size rows a run, and
    each run's wall time (seconds) as finetuning.timed_inference reports PyTorch's. trim: each batch is cut to its
    longest row (only for outputs without a sequence axis: GLUE's logits)."""
    ids, segments, mask = (np.asarray(a, dtype=np.int64) for a in arrays)
    names = [node.name for node in session.get_outputs()]
    outputs: list[list[np.ndarray]] = [[] for _ in names]
    latencies = []
    for first in range(0, len(ids), batch_size):
        rows = slice(first, first + batch_size)
        length = max(1, int(mask[rows].sum(axis=1).max())) if trim else ids.shape[1]
        feed = {name: np.ascontiguousarray(a[rows, :length]) for name, a in zip(INPUTS, (ids, segments, mask),
                                                                                strict=True)}
        tick = time.perf_counter()
        result = session.run(names, feed)
        latencies.append(time.perf_counter() - tick)
        for kept, output in zip(outputs, result, strict=True):
            kept.append(np.asarray(output, dtype=np.float32))
    return [np.concatenate(kept) for kept in outputs], latencies


def onnx_qa_logits(session: Any, arrays: Sequence[np.ndarray], batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits, float32 [N, L], of windows given as (token ids, segment ids, mask) [N, L], batch_size
    windows a run."""
    (start, end), _ = timed_onnx_outputs(session, arrays, batch_size)
    return start, end


def check_session_vocab(session: Any, path: Path, vocab: Vocab | BpeVocab, allow_vocab_mismatch: bool) -> None:
    """The exported model must fit the vocab (tokenization.wordpiece.check_vocab_for_model)."""
    check_vocab_for_model(vocab, model_vocab_size=onnx_embedding_rows(session, path, len(vocab)),
                          allow_mismatch=allow_vocab_mismatch)


def onnx_embedding_rows(session: Any, path: Path, vocab_size: int) -> int:
    """The word embeddings of an exported model, found by embedding single ids (onnx_export.check_vocab_fits; its
    weights are not parsed). When the model embeds the vocab's last id but none past the vocab padded to a
    multiple of 8, every count in between fits alike and vocab_size is returned; otherwise the exact count."""
    def embeds(token_id: int) -> bool:
        try:
            check_vocab_fits(session, path, token_id + 1)
        except InputError:
            return False
        return True

    padded = padded_vocab_size(vocab_size)
    if embeds(vocab_size - 1) and not embeds(padded):
        return vocab_size
    low, high = 0, 1  # id low is embedded, id high not: doubled, then halved
    while embeds(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if embeds(middle) else (low, middle)
    return high


def onnx_logits_function(path: Path, vocab: Vocab | BpeVocab, batch_size: int, allow_vocab_mismatch: bool = False
                         ) -> LogitsFunction:
    """The windows' start and end logits from an ONNX Runtime session of a SQuAD export, which must fit the vocab
    (tokenization.wordpiece.check_vocab_for_model)."""
    session = open_qa_session(path)
    check_session_vocab(session, path, vocab, allow_vocab_mismatch)
    return lambda features: onnx_qa_logits(session, (features.input_ids, features.segment_ids,
                                                      features.input_mask), batch_size)
