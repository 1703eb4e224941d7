"""Long rows on a CPU: a small modern model (ModernBERT's design: hidden 128, 6 layers, 4 heads, a window of 128)
trains forward and backward on one row of 2,048, 4,096 and 8,192 tokens. Each length runs in a fresh process that
reports the memory its step added (peak resident set, VmHWM, minus the resident set before the step) and the step's
time. Three models: every layer local with the chunked local attention (model/local_attention.py), the same with
local attention through a dense [seq, seq] window bias (what attention costs without the chunks), and ModernBERT's
pattern (a global layer every third).

    python -m benchmarks.long_context
    python -m benchmarks.long_context --lengths 1024 2048 --variants chunked
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time

from benchmarks.common import REPO, benchmark_command, status_bytes

MODEL = {"model_type": "modernbert", "vocab_size": 30528, "hidden_size": 128, "num_hidden_layers": 6,
         "num_attention_heads": 4, "intermediate_size": 192, "max_position_embeddings": 8192,
         "local_attention": 128, "pad_token_id": 0}
VARIANTS = ("chunked", "dense_window", "alternating")


def measure(variant: str, length: int) -> dict:
    """One training step (forward, 30 % of the positions predicted, backward) in this process."""
    import torch

    from bertrecipe.model import local_attention
    from bertrecipe.model.modern import ModernBertForMaskedLM
    from bertrecipe.model.modern_config import ModernBertConfig

    layer_types = None if variant == "alternating" else ["sliding_attention"] * MODEL["num_hidden_layers"]
    config = ModernBertConfig.from_dict({**MODEL, **({"layer_types": layer_types} if layer_types else {})})
    if variant == "dense_window":
        local_attention.Band.worth_it = lambda self: False
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(config).train()
    ids = torch.randint(1000, config.vocab_size, (1, length))
    labels = torch.where(torch.rand(1, length) < 0.3, ids, torch.full_like(ids, -1))
    before = status_bytes("VmRSS")
    began = time.perf_counter()
    model(ids, masked_lm_labels=labels).loss.backward()
    seconds = time.perf_counter() - began
    return {"variant": variant, "length": length, "step_seconds": round(seconds, 3),
            "step_memory_mib": round((status_bytes("VmHWM") - before) / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # variant length: measure in this process
    args = parser.parse_args()
    if args.one:
        import torch
        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.one[0], int(args.one[1]))))
        return
    from bertrecipe.common.hardware import detect, host_line
    print(f"# {host_line(detect('cpu'), 'fp32')}, {args.threads} threads")
    print("| model | tokens | step (s) | step memory (MiB) | memory / previous length |")
    print("|---|---:|---:|---:|---:|")
    for variant in args.variants:
        previous = None
        for length in args.lengths:
            done = subprocess.run(benchmark_command("long_context", "--threads", str(args.threads), "--one", variant,
                                                    str(length)), capture_output=True, text=True, cwd=REPO)
            if done.returncode != 0:
                print(f"| {variant} | {length} | failed: {done.stderr.strip().splitlines()[-1][:80]} | | |")
                continue
            row = json.loads(done.stdout)
            growth = f"{row['step_memory_mib'] / previous:.2f}x" if previous else ""
            previous = row["step_memory_mib"]
            print(f"| {variant} | {length} | {row['step_seconds']} | {row['step_memory_mib']} | {growth} |")


if __name__ == "__main__":
    main()
