"""A Triton Inference Server model repository entry: the model exported (ONNX or TorchScript), checked against
PyTorch on real inputs before anything is written, and its config.pbtxt (what triton/deployer.py writes)."""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from google.protobuf import text_format
from torch import nn
from tritonclient.grpc import model_config_pb2

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.onnx_export import export_onnx, output_names
from bertrecipe.deploy.serving import INPUTS, runner_for

PLATFORMS = {"onnx": ("onnxruntime_onnx", "model.onnx"), "torchscript": ("pytorch_libtorch", "model.pt")}


@dataclass(frozen=True)
class TritonSettings:
    """What config.pbtxt says beyond the tensors."""

    max_batch_size: int = 8
    dynamic_batching: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    instance_count: int = 1
    instance_kind: str = "KIND_GPU"  # KIND_GPU or KIND_CPU


def model_config(name: str, platform: str, task: str, num_labels: int,
                 settings: TritonSettings) -> model_config_pb2.ModelConfig:
    """Triton's ModelConfig message, filled field by field: a misspelt field or enum label (e.g. an
    instance_kind Triton lacks) raises here instead of reaching the server. Dims exclude the batch axis
    (max_batch_size > 0)."""
    config = model_config_pb2.ModelConfig(name=name, platform=platform, max_batch_size=settings.max_batch_size)
    for tensor in INPUTS:
        config.input.add(name=tensor, data_type=model_config_pb2.TYPE_INT64, dims=[-1])
    for tensor in output_names(task):
        config.output.add(name=tensor, data_type=model_config_pb2.TYPE_FP32,
                          dims=[-1] if task == "squad" else [num_labels])
    config.instance_group.add(count=settings.instance_count, kind=settings.instance_kind)
    if settings.dynamic_batching:
        config.dynamic_batching.SetInParent()  # present even when every field below keeps its default
        config.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_us
    return config


def config_pbtxt(name: str, platform: str, task: str, num_labels: int, settings: TritonSettings) -> str:
    """config.pbtxt: the ModelConfig in protobuf text format, as Triton reads it."""
    return text_format.MessageToString(model_config(name, platform, task, num_labels, settings))


def export_torchscript(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path) -> None:
    with torch.no_grad():
        traced = torch.jit.trace(module, example, check_trace=False)
    traced.save(str(path))


def max_difference(module: nn.Module, run: Callable[[Sequence[np.ndarray]], list[np.ndarray]],
                   inputs: tuple[np.ndarray, ...]) -> float:
    """Largest |export - PyTorch| over all outputs, at the full batch and length and at a smaller batch and a
    shorter length (which exercises the dynamic axes)."""
    n, length = inputs[0].shape
    shorter = max(8, int(inputs[2][: max(1, n // 2)].sum(axis=1).max()))  # still covers every real token
    worst = 0.0
    for rows, cols in ((slice(None), slice(None)), (slice(0, max(1, n // 2)), slice(0, min(length, shorter)))):
        arrays = [np.ascontiguousarray(a[rows, cols]) for a in inputs]
        with torch.no_grad():
            expected = [t.numpy() for t in module(*(torch.from_numpy(a) for a in arrays))]
        got = run(arrays)
        worst = max(worst, *(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True)))
    return worst


def deploy(module: nn.Module, inputs: tuple[np.ndarray, ...], repository: Path, name: str, version: int, fmt: str,
           task: str, num_labels: int, settings: TritonSettings, tolerance: float,
           opset: int = 17) -> tuple[Path, float]:
    """Exports `module` (a TritonSignature in eval mode), checks it, writes the model repository entry.
    Returns (model folder, max abs difference). Raises InputError above the tolerance, writing nothing."""
    platform, filename = PLATFORMS[fmt]
    model_dir = repository / name
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=model_dir))
    try:
        example = tuple(torch.from_numpy(a[:2]) for a in inputs)
        if fmt == "onnx":
            export_onnx(module, example, staging / filename, task, opset)
        else:
            export_torchscript(module, example, staging / filename)
        difference = max_difference(module, runner_for(staging / filename, fmt), inputs)
        print(f"max abs difference {fmt} vs PyTorch: {difference:.3g} (tolerance {tolerance:g})")
        if not difference <= tolerance:
            raise InputError(f"{fmt} export differs from PyTorch by {difference:.3g} > --tolerance {tolerance:g}; "
                             "nothing written")
        target = model_dir / str(version)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    config = config_pbtxt(name, platform, task, num_labels, settings)
    write_atomic(model_dir / "config.pbtxt", lambda f: f.write(config.encode("utf-8")))
    return model_dir, difference
