"""This host's sustained matmul rate, and how close a BERT forward comes to it.

gemm_peak() times torch.matmul on the GEMMs of a BERT layer ([tokens, hidden] x [hidden, 3*hidden | hidden |
intermediate] and [tokens, intermediate] x [intermediate, hidden], weights transposed as nn.Linear stores them)
and on one large square GEMM, in the calling thread setting, best of a few repeats: the rate a model made of
these GEMMs could at most reach here. On a GPU (--device cuda) each repeat is timed with CUDA events over enough
back-to-back calls to last about 10 ms. tf32 is fp32 tensors with TF32 matmuls (float32 matmul precision
"high", meant for CUDA GPUs). forward_flops() counts a BertForQuestionAnswering forward analytically, so that
achieved GFLOP/s = forward_flops / time, and fraction_of_peak says what share of the peak that is.

    python -m benchmarks.gemm_peak --precision fp32 bf16       # the peak alone, BERT-base shapes, batch 4 x 384
    python -m benchmarks.gemm_peak --device cuda --precision bf16 fp16 tf32 --square 8192
"""
from __future__ import annotations

import argparse
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from bertrecipe.model.bert import BertConfig

# tf32: float32 tensors whose matmuls run in TF32 (matmul_precision); bf16 and fp16 are autocast's dtypes.
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
AUTOCAST = ("bf16", "fp16")
SQUARE = 2048  # a large square GEMM, the shape a matmul library is tuned for
CUDA_REPEAT_SECONDS = 0.01  # one timed repeat on a GPU: long enough that launch gaps and event resolution vanish


@dataclass(frozen=True)
class Peak:
    precision: str
    gflops: float  # the best of the shapes: the peak a model's GEMMs can reach here
    by_shape: dict[str, float]  # "MxNxK" -> GFLOP/s


def bert_gemm_shapes(config: BertConfig, tokens: int, square: int = SQUARE) -> list[tuple[int, int, int]]:
    """(m, n, k) of the dense GEMMs of one layer for `tokens` rows, and a large square one."""
    h, i = config.hidden_size, config.intermediate_size
    return [(tokens, 3 * h, h), (tokens, h, h), (tokens, i, h), (tokens, h, i), (square, square, square)]


def is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: str) -> None:
    """Waits for the device's queued work, so that a host clock read next counts it (a no-op on a CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """fp32 matmuls in TF32 for "tf32", in full fp32 otherwise; the setting before is restored."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def precision_context(device: str, precision: str) -> Iterator[None]:
    """The code inside runs at `precision` on `device`: fp32, tf32 (matmul_precision), or bf16/fp16 autocast."""
    autocast = (torch.autocast(torch.device(device).type, dtype=DTYPES[precision]) if precision in AUTOCAST
                else contextlib.nullcontext())
    with matmul_precision(precision), autocast:
        yield


def seconds_per_call(run: Callable[[], object], device: str, calls: int = 1) -> float:
    """Seconds per call of `calls` back-to-back calls: CUDA events on a GPU (the kernels' time, the host's
    launches overlapped as in training), perf_counter on a CPU."""
    if is_cuda(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    tick = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - tick) / calls


def gemm_gflops(m: int, n: int, k: int, precision: str, repeats: int = 5, device: str = "cpu") -> float:
    """GFLOP/s of the fastest of `repeats` [m, k] x [k, n] matmuls at `precision`, after one untimed warm-up; on
    a GPU each repeat averages as many calls as fill CUDA_REPEAT_SECONDS."""
    g = torch.Generator(device).manual_seed(0)
    a = torch.randn(m, k, generator=g, device=device).to(DTYPES[precision])
    w = torch.randn(n, k, generator=g, device=device).to(DTYPES[precision])  # nn.Linear's layout: read transposed
    with matmul_precision(precision):
        torch.matmul(a, w.t())  # warm-up: the library picks its kernel (and a GPU loads it)
        if is_cuda(device):
            once = seconds_per_call(lambda: torch.matmul(a, w.t()), device)
            calls = min(1000, math.ceil(CUDA_REPEAT_SECONDS / max(once, 1e-7)))
        else:
            calls = 1
        best = min(seconds_per_call(lambda: torch.matmul(a, w.t()), device, calls) for _ in range(repeats))
    return 2 * m * n * k / best / 1e9


def gemm_peak(config: BertConfig, tokens: int, precision: str, repeats: int = 5, square: int = SQUARE,
              device: str = "cpu") -> Peak:
    by_shape = {f"{m}x{n}x{k}": gemm_gflops(m, n, k, precision, repeats, device)
                for m, n, k in bert_gemm_shapes(config, tokens, square)}
    return Peak(precision, max(by_shape.values()), by_shape)


def forward_flops(config: BertConfig, batch: int, seq: int) -> int:
    """Multiply-adds x 2 of a BertForQuestionAnswering forward on [batch, seq] without padding.

    Counted, per layer: the fused Q/K/V projection, attention scores Q K^T and context P V, the attention
    output projection, the two FFN GEMMs; then the QA head (hidden -> 2). Not counted: embedding look-ups,
    bias adds, softmax, GELU, layer norm, residual adds (O(tokens * hidden) each, no GEMM), the same in both
    models. Both models do exactly these GEMMs on full windows (the peer's separate Q, K, V add up the same).
    """
    tokens, h, i = batch * seq, config.hidden_size, config.intermediate_size
    dense = 2 * tokens * h * (3 * h + h + 2 * i)  # QKV, output, FFN up and down
    attention = 2 * 2 * batch * seq * seq * h  # scores and context, over all heads (heads x head_dim = hidden)
    return config.num_hidden_layers * (dense + attention) + 2 * tokens * h * 2


def fraction_of_peak(flops: float, seconds: float, peak_gflops: float) -> tuple[float, float]:
    """(achieved GFLOP/s, its fraction of the peak) for `flops` done in `seconds`."""
    achieved = flops / seconds / 1e9
    return achieved, achieved / peak_gflops


def peak_line(peak: Peak) -> str:
    shapes = ", ".join(f"{shape} {rate:.0f}" for shape, rate in peak.by_shape.items())
    return f"{peak.precision} GEMM peak {peak.gflops:.0f} GFLOP/s ({shapes}), {torch.get_num_threads()} threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", nargs="+", default=["fp32"], choices=list(DTYPES))
    parser.add_argument("--tokens", type=int, default=4 * 384, help="GEMM rows: batch x sequence length")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--square", type=int, default=SQUARE, help="side of the large square GEMM")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    for precision in args.precision:
        peak = gemm_peak(BertConfig(), args.tokens, precision, args.repeats, args.square, args.device)
        print(peak_line(peak), flush=True)


if __name__ == "__main__":
    main()
