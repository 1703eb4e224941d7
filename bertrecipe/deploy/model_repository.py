"""A Triton Inference Server model repository entry: the model exported (ONNX, fp32 or int8, or TorchScript),
checked against PyTorch on real inputs before anything is written, and its config.pbtxt (what triton/deployer.py
writes)."""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from google.protobuf import text_format
from torch import nn
from tritonclient.grpc import model_config_pb2

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.onnx_export import export_onnx, output_names
from bertrecipe.deploy.quantization import quantized_bytes
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


@dataclass(frozen=True)
class Agreement:
    """How far an export's outputs lie from PyTorch's on the same inputs."""

    max_difference: float  # largest |export - PyTorch| over all outputs
    largest_logit: float  # largest |PyTorch output|: the scale an int8 export's difference is judged against

    @property
    def relative(self) -> float:
        return self.max_difference / self.largest_logit if self.largest_logit > 0 else self.max_difference


def agreement(module: nn.Module, run: Callable[[Sequence[np.ndarray]], list[np.ndarray]],
              inputs: tuple[np.ndarray, ...]) -> Agreement:
    """|export - PyTorch| over all outputs, at the full batch and length and at a smaller batch and a shorter
    length (which exercises the dynamic axes)."""
    n, length = inputs[0].shape
    shorter = max(8, int(inputs[2][: max(1, n // 2)].sum(axis=1).max()))  # still covers every real token
    worst, largest = 0.0, 0.0
    for rows, cols in ((slice(None), slice(None)), (slice(0, max(1, n // 2)), slice(0, min(length, shorter)))):
        arrays = [np.ascontiguousarray(a[rows, cols]) for a in inputs]
        with torch.no_grad():
            expected = [t.numpy() for t in module(*(torch.from_numpy(a) for a in arrays))]
        got = run(arrays)
        worst = max(worst, *(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True)))
        largest = max(largest, *(float(np.abs(e).max()) for e in expected))
    return Agreement(worst, largest)


def export_model(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, fmt: str, task: str, opset: int,
                 int8: bool) -> None:
    """The model file of the entry; int8: the fp32 ONNX export quantized (deploy.quantization), the fp32 file
    left in a scratch folder that is removed."""
    if fmt == "torchscript":
        export_torchscript(module, example, path)
    elif not int8:
        export_onnx(module, example, path, task, opset)
    else:
        with tempfile.TemporaryDirectory(prefix="fp32-") as scratch:
            fp32 = Path(scratch) / "model.onnx"
            export_onnx(module, example, fp32, task, opset)
            path.write_bytes(quantized_bytes(fp32.read_bytes(), "the fp32 export"))


def check_agreement(found: Agreement, fmt: str, tolerance: float, int8_tolerance: Optional[float]) -> None:
    """Prints the difference; InputError above the tolerance (int8: int8_tolerance, a share of the largest
    logit, since int8 weights move every logit a little)."""
    if int8_tolerance is None:
        print(f"max abs difference {fmt} vs PyTorch: {found.max_difference:.3g} (tolerance {tolerance:g})")
        if not found.max_difference <= tolerance:
            raise InputError(f"{fmt} export differs from PyTorch by {found.max_difference:.3g} > --tolerance "
                             f"{tolerance:g}; nothing written")
        return
    print(f"max abs difference int8 {fmt} vs PyTorch fp32: {found.max_difference:.3g}, {found.relative:.3g} of the "
          f"largest logit {found.largest_logit:.3g} (tolerance {int8_tolerance:g})")
    if not found.relative <= int8_tolerance:
        raise InputError(f"int8 {fmt} export differs from PyTorch by {found.relative:.3g} of the largest logit > "
                         f"--int8_tolerance {int8_tolerance:g}; nothing written")


def deploy(module: nn.Module, inputs: tuple[np.ndarray, ...], repository: Path, name: str, version: int, fmt: str,
           task: str, num_labels: int, settings: TritonSettings, tolerance: float,
           opset: int = 17, int8_tolerance: Optional[float] = None) -> tuple[Path, float]:
    """Exports `module` (a TritonSignature in eval mode), checks it, writes the model repository entry. With
    int8_tolerance (fmt "onnx" only) the entry is the int8 model (deploy.quantization), checked against that share
    of the largest logit. Returns (model folder, max abs difference). Raises InputError above the tolerance,
    writing nothing."""
    platform, filename = PLATFORMS[fmt]
    model_dir = repository / name
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=model_dir))
    try:
        example = tuple(torch.from_numpy(a[:2]) for a in inputs)
        export_model(module, example, staging / filename, fmt, task, opset, int8_tolerance is not None)
        found = agreement(module, runner_for(staging / filename, fmt), inputs)
        check_agreement(found, fmt, tolerance, int8_tolerance)
        target = model_dir / str(version)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    config = config_pbtxt(name, platform, task, num_labels, settings)
    write_atomic(model_dir / "config.pbtxt", lambda f: f.write(config.encode("utf-8")))
    return model_dir, found.max_difference
