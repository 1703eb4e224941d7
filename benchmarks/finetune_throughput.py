#!/usr/bin/env python3
"""SQuAD-shaped fine-tuning and inference throughput: our BertForQuestionAnswering against transformers'.

Both run in this process on the same batch (seq 384 windows, some padded), the same precision and the same
optimizer (AdamW): a training step is forward, backward and optimizer step; inference is a no-grad forward in
eval mode. Reported: sequences per second (median step time) and our speed-up over the peer.

    python benchmarks/finetune_throughput.py                            # BERT-base, batch 4, bf16
    python benchmarks/finetune_throughput.py --config large --precision fp32 bf16 --steps 5
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model import BertConfig, BertForQuestionAnswering  # noqa: E402
from optimization import build_adamw  # noqa: E402

Batch = tuple[torch.Tensor, ...]


def make_batch(config: BertConfig, batch: int, seq: int, seed: int = 0) -> Batch:
    """[CLS] query [SEP] document [SEP] shaped windows: 24 query tokens, a quarter of the rows padded."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g)
    token_type_ids = (torch.arange(seq) > 24).long().expand(batch, seq).contiguous()
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[::4, seq * 2 // 3 :] = 0  # last windows of long contexts are shorter
    start = torch.randint(26, seq // 2, (batch,), generator=g)
    end = start + torch.randint(0, 10, (batch,), generator=g)
    return input_ids, token_type_ids, attention_mask, start, end


def ours(config: BertConfig) -> torch.nn.Module:
    return BertForQuestionAnswering(config)


def peer(config: BertConfig) -> torch.nn.Module:
    import transformers

    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "extra"})
    return transformers.BertForQuestionAnswering(hf_config)


def train_step(model: torch.nn.Module, batch: Batch, is_peer: bool) -> Callable[[], None]:
    model.train()
    optimizer = build_adamw(model, 3e-5)
    input_ids, token_type_ids, attention_mask, start, end = batch

    def step() -> None:
        if is_peer:
            loss = model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                         start_positions=start, end_positions=end).loss
        else:
            loss = model(input_ids, token_type_ids, attention_mask, start, end)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def infer_step(model: torch.nn.Module, batch: Batch, is_peer: bool) -> Callable[[], None]:
    model.eval()
    input_ids, token_type_ids, attention_mask, _, _ = batch

    @torch.no_grad()
    def step() -> None:
        if is_peer:
            model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        else:
            model(input_ids, token_type_ids, attention_mask)

    return step


def seconds_per_step(step: Callable[[], None], precision: str, warmup: int, steps: int) -> float:
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    times = []
    with autocast:
        for i in range(warmup + steps):
            tick = time.perf_counter()
            step()
            if i >= warmup:
                times.append(time.perf_counter() - tick)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="base", help="base, large, or a bert_config.json / config.json path")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--precision", nargs="+", default=["bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    presets = {"base": BertConfig(), "large": BertConfig(hidden_size=1024, num_hidden_layers=24,
                                                         num_attention_heads=16, intermediate_size=4096)}
    config = presets.get(args.config) or BertConfig.from_json_file(args.config)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; BERT {args.config}, batch {args.batch}, "
          f"seq {args.seq}")
    batch = make_batch(config, args.batch, args.seq)
    results = []
    for precision in args.precision:
        for phase, build in (("training", train_step), ("inference", infer_step)):
            row = {"phase": phase, "precision": precision, "batch": args.batch, "seq": args.seq}
            for name, make in (("ours", ours), ("peer", peer)):
                torch.manual_seed(0)
                step = build(make(config), batch, name == "peer")
                row[f"{name}_seq_per_s"] = args.batch / seconds_per_step(step, precision, args.warmup, args.steps)
            row["speedup"] = row["ours_seq_per_s"] / row["peer_seq_per_s"]
            results.append(row)
            print(f"{phase} {precision}: ours {row['ours_seq_per_s']:.2f} seq/s, transformers "
                  f"{row['peer_seq_per_s']:.2f} seq/s, speed-up {row['speedup']:.2f}x", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
