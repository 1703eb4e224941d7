"""The modern family's whole pre-training loop (run_pretraining.py with a ModernBERT config: loader, dynamic 30 %
masking, packed rows, AdamW, logging) against transformers' ModernBertForMaskedLM + torch.optim.AdamW on the same
data and config, in real (non-padding) tokens per second.

The peer gets its fastest CPU attention (SDPA) and, in turn, each of its two usual inputs: the shards' rows padded
(attention_mask), and run_mlm's grouping (the rows' tokens concatenated and cut into full rows, no padding); its
masking (30 %, 80/10/10) runs inside its timed loop as a collator's would. Shards are made from real text
(../shared/data/books with BERT's uncased vocab, or --text/--vocab) by data/create_pretraining_data.py.

    python -m benchmarks.modern_throughput                   # seq 512, batch 8, bf16 where native, else fp32
    python -m benchmarks.modern_throughput --seq 128 --steps 8
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import torch

from benchmarks.common import (
    REPO,
    SHARED_BOOK,
    SHARED_VOCAB,
    host_threads_line,
    loop_sequences_per_second,
    make_shards,
    middle,
)
from bertrecipe.common.hardware import detect, pick_precisions

MODEL = {"model_type": "modernbert", "vocab_size": 30528, "hidden_size": 256, "num_hidden_layers": 6,
         "num_attention_heads": 4, "intermediate_size": 384, "max_position_embeddings": 1024,
         "local_attention": 128, "pad_token_id": 0}
MASK_RATE = 0.3


def run_loop(folder: Path, config: Path, seq: int, batch: int, steps: int, out: Path, precision: str) -> float:
    """run_pretraining.py's sequences per second (its own final record) on the shards."""
    log = out / f"loop_{seq}.json"
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--input_dir", str(folder), "--config_file",
               str(config), "--output_dir", str(out / f"ckpt_{seq}_{time.monotonic_ns()}"), "--max_seq_length",
               str(seq), "--max_predictions_per_seq", str(int(seq * MASK_RATE) + 1), "--dynamic_masking",
               "--masked_lm_prob", str(MASK_RATE), "--pack_sequences", "--optimizer", "adamw", "--adam_beta2",
               "0.98", "--train_batch_size", str(batch), "--max_steps", str(steps), "--learning_rate", "5e-4",
               "--warmup_proportion", "0.5", "--do_train", "--skip_checkpoint", "--disable_progress_bar",
               "--json-summary", str(log), "--no_cuda"]
    if precision == "bf16":
        command.append("--bf16")
    subprocess.run(command, check=True, capture_output=True)
    return loop_sequences_per_second(log)


def shard_rows(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    with h5py.File(next(folder.glob("*.hdf5"))) as f:
        ids, mask = (torch.from_numpy(f[key][()].astype("int64")) for key in ("input_ids", "input_mask"))
    return ids, mask


def peer_batches(ids: torch.Tensor, mask: torch.Tensor, batch: int, grouped: bool):
    """Batches of (ids, attention_mask) as the peer reads them: padded rows, or run_mlm's full grouped rows."""
    if grouped:
        tokens = ids[mask.bool()]
        seq = ids.shape[1]
        rows = tokens[: len(tokens) // seq * seq].view(-1, seq)
        ids, mask = rows, torch.ones_like(rows)
    for first in range(0, len(ids) - batch + 1, batch):
        yield ids[first: first + batch], mask[first: first + batch]


def peer_tokens_per_second(ids, mask, batch: int, steps: int, precision: str, grouped: bool, sparse: bool) -> float:
    """The peer's real tokens per second; `sparse`: its own option to run the MLM head on the masked tokens only."""
    import transformers

    torch.manual_seed(0)
    special = {"cls_token_id": 101, "sep_token_id": 102, "bos_token_id": 101, "eos_token_id": 102}
    config = transformers.ModernBertConfig(**{k: v for k, v in MODEL.items() if k != "model_type"}, **special,
                                           sparse_prediction=sparse, attn_implementation="sdpa")
    model = transformers.ModernBertForMaskedLM(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                  fused=True)  # what transformers' Trainer picks (adamw_torch_fused)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    generator = torch.Generator().manual_seed(0)
    seconds, tokens = 0.0, 0
    for step, (rows, attention) in enumerate(peer_batches(ids, mask, batch, grouped)):
        if step == steps + 2:
            break
        began = time.perf_counter()
        chosen = (torch.rand(rows.shape, generator=generator) < MASK_RATE) & attention.bool()
        labels = torch.where(chosen, rows, torch.full_like(rows, -100))
        inputs = torch.where(chosen & (torch.rand(rows.shape, generator=generator) < 0.8), 103, rows)
        with autocast:
            loss = model(input_ids=inputs, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= 2:  # two warm-up steps
            seconds += time.perf_counter() - began
            tokens += int(attention.sum())
    return tokens / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each (after two that are not)")
    parser.add_argument("--text", type=Path, default=SHARED_BOOK)
    parser.add_argument("--vocab", type=Path, default=SHARED_VOCAB)
    parser.add_argument("--precision", choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=3, help="every way measured in turns; medians reported")
    args = parser.parse_args()
    host = detect("cpu")
    precision = pick_precisions(host, [args.precision] if args.precision else None, ["bf16"])[0]
    print(f"{host_threads_line(host, precision)}; ModernBERT {MODEL['hidden_size']}x"
          f"{MODEL['num_hidden_layers']}, seq {args.seq}, batch {args.batch}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        folder = make_shards(args.text, args.vocab, args.seq, out)
        config = out / "modern.json"
        config.write_text(json.dumps(MODEL))
        ids, mask = shard_rows(folder)
        tokens_per_row = float(mask.sum(1).float().mean())
        ways = [(grouped, sparse) for grouped, sparse in ((False, False), (True, False), (True, True))]
        measured: dict[str, list[float]] = {}
        for _ in range(args.rounds):  # in turns, so that a busy spell of a shared machine hits every way
            rate = run_loop(folder, config, args.seq, args.batch, args.steps + 2, out, precision) * tokens_per_row
            measured.setdefault("run_pretraining.py (packed, AdamW)", []).append(rate)
            for grouped, sparse in ways:
                name = "transformers + AdamW, " + ("run_mlm grouping" if grouped else "padded rows")
                name += ", sparse_prediction" if sparse else ""
                rate = peer_tokens_per_second(ids, mask, args.batch, args.steps, precision, grouped, sparse)
                measured.setdefault(name, []).append(rate)
    rows = {name: middle(rates) for name, rates in measured.items()}
    loop = rows["run_pretraining.py (packed, AdamW)"]
    print(f"shards: {tokens_per_row:.0f} real tokens a row of {args.seq}")
    print("| way | real tokens/s | ours / this |")
    print("|---|---:|---:|")
    for name, rate in rows.items():
        print(f"| {name} | {rate:,.0f} | {loop / rate:.2f}x |")


if __name__ == "__main__":
    main()
