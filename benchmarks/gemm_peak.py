"""This host's sustained matmul rate, and how close a BERT forward comes to it.

gemm_peak() times torch.matmul on the GEMMs of a BERT layer ([tokens, hidden] x [hidden, 3*hidden | hidden |
intermediate] and [tokens, intermediate] x [intermediate, hidden], weights transposed as nn.Linear stores them)
and on one large square GEMM, in the calling thread setting, best of a few repeats: the rate a model made of
these GEMMs could at most reach here. forward_flops() counts a BertForQuestionAnswering forward analytically,
so that achieved GFLOP/s = forward_flops / time, and fraction_of_peak says what share of the peak that is.

    python benchmarks/gemm_peak.py --precision fp32 bf16       # the peak alone, BERT-base shapes, batch 4 x 384
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from bertrecipe.model.bert import BertConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SQUARE = 2048  # a large square GEMM, the shape a matmul library is tuned for


@dataclass(frozen=True)
class Peak:
    precision: str
    gflops: float  # the best of the shapes: the peak a model's GEMMs can reach here
    by_shape: dict[str, float]  # "MxNxK" -> GFLOP/s


def bert_gemm_shapes(config: BertConfig, tokens: int, square: int = SQUARE) -> list[tuple[int, int, int]]:
    """(m, n, k) of the dense GEMMs of one layer for `tokens` rows, and a large square one."""
    h, i = config.hidden_size, config.intermediate_size
    return [(tokens, 3 * h, h), (tokens, h, h), (tokens, i, h), (tokens, h, i), (square, square, square)]


def gemm_gflops(m: int, n: int, k: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """GFLOP/s of the fastest of `repeats` [m, k] x [k, n] matmuls, after one untimed warm-up."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)  # nn.Linear's layout: the GEMM reads it transposed
    torch.matmul(a, w.t())
    best = float("inf")
    for _ in range(repeats):
        tick = time.perf_counter()
        torch.matmul(a, w.t())
        best = min(best, time.perf_counter() - tick)
    return 2 * m * n * k / best / 1e9


def gemm_peak(config: BertConfig, tokens: int, precision: str, repeats: int = 5, square: int = SQUARE) -> Peak:
    by_shape = {f"{m}x{n}x{k}": gemm_gflops(m, n, k, DTYPES[precision], repeats)
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
    args = parser.parse_args()
    for precision in args.precision:
        print(peak_line(gemm_peak(BertConfig(), args.tokens, precision, args.repeats)), flush=True)


if __name__ == "__main__":
    main()
