"""benchmarks/gemm_peak.py: the analytic FLOP count of a BertForQuestionAnswering forward equals what
torch.utils.flop_counter counts on a tiny model, and achieved GFLOP/s and the share of the GEMM peak are
computed as stated. Only tiny GEMMs are timed."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from benchmarks import finetune_throughput
from benchmarks import gemm_peak as gemm_peak_module
from bertrecipe.model.bert import BertConfig, BertForQuestionAnswering
from helpers import ENV, REPO_ROOT

TINY = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
                  max_position_embeddings=64)


@pytest.fixture
def gemm_peak():
    return gemm_peak_module


def cpu_flash_attention_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode knows the GPU SDPA kernels only; the CPU one does the same two batched GEMMs."""
    return sdpa_flop_count(query, key, value)


@pytest.mark.parametrize("batch, seq", [(2, 16), (1, 40)])
def test_forward_flops_equal_the_flop_counter_on_a_tiny_model(gemm_peak, batch, seq) -> None:
    torch.manual_seed(0)
    model = BertForQuestionAnswering(TINY).eval()
    input_ids = torch.randint(0, TINY.vocab_size, (batch, seq))
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_attention_flops})
    with torch.no_grad(), counter:
        model(input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids))
    counts = counter.get_flop_counts()["Global"]
    assert counts[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] > 0  # attention was counted
    assert counter.get_total_flops() == gemm_peak.forward_flops(TINY, batch, seq)


def test_forward_flops_of_bert_base_at_384(gemm_peak) -> None:
    """By hand: 12 x (2 x 384 x 768 x 9216 + 4 x 384^2 x 768) + 2 x 384 x 768 x 2 per sequence, 70.7 GFLOP."""
    forward_flops = gemm_peak.forward_flops
    expected = 12 * (2 * 384 * 768 * 9216 + 4 * 384 * 384 * 768) + 2 * 384 * 768 * 2
    assert forward_flops(BertConfig(), 1, 384) == expected
    assert forward_flops(BertConfig(), 4, 384) == 4 * expected  # no term across sequences


def test_fraction_of_peak(gemm_peak) -> None:
    achieved, fraction = gemm_peak.fraction_of_peak(70e9, 0.5, 200.0)  # 70 GFLOP in 0.5 s on a 200 GFLOP/s host
    assert achieved == pytest.approx(140.0) and fraction == pytest.approx(0.7)


def test_peak_fields_give_each_model_its_share_of_the_runs_precision(gemm_peak) -> None:
    peaks = {"fp32": gemm_peak.Peak("fp32", 100.0, {}), "bf16": gemm_peak.Peak("bf16", 400.0, {})}
    row = finetune_throughput.peak_fields(peaks, "bf16", 50 * 10**9, {"ours": 4.0, "peer": 2.0})
    assert row["gemm_peak_gflops"] == 400.0 and row["gemm_peak_fp32_gflops"] == 100.0
    assert row["ours_gflops"] == pytest.approx(200.0) and row["ours_of_peak"] == pytest.approx(0.5)
    assert row["peer_gflops"] == pytest.approx(100.0) and row["peer_of_peak"] == pytest.approx(0.25)


def test_the_peak_is_the_best_shape_and_names_every_shape(gemm_peak) -> None:
    peak = gemm_peak.gemm_peak(TINY, 64, "fp32", repeats=2, square=64)
    assert list(peak.by_shape) == ["64x96x32", "64x32x32", "64x48x32", "64x32x48", "64x64x64"]
    assert all(rate > 0 for rate in peak.by_shape.values()) and peak.gflops == max(peak.by_shape.values())
    assert "fp32 GEMM peak" in gemm_peak.peak_line(peak)


@pytest.mark.slow
def test_onnxruntime_without_an_fp32_full_window_inference_row_is_refused_before_timing() -> None:
    result = subprocess.run([sys.executable, "-m", "benchmarks.finetune_throughput", "--onnxruntime",
                             "--precision", "fp32", "--phases", "training"],
                            cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--onnxruntime times fp32 inference on full windows only" in result.stderr
    assert result.stdout == ""  # refused before the host line and any timing
