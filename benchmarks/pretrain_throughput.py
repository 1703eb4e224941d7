#!/usr/bin/env python3
"""The whole pre-training loop (run_pretraining.py: data loading, logging and all) against transformers'
BertForPreTraining + AdamW on the same batch size and precision, plus the data loader alone.

Shards are made first from real text (../shared/data/books with the standard uncased vocab, or any text and
vocab given with --text/--vocab) by data/create_pretraining_data.py.

    python benchmarks/pretrain_throughput.py                 # BERT-base, seq 128 and 512, batch 8, bf16
                                                             # where native (else fp32; --precision to choose)
    python benchmarks/pretrain_throughput.py --seq 128 --steps 6
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import torch
from model_throughput import MASKED_PER_SEQ, make_batch, peer_step, time_steps

from bertrecipe.common.hardware import detect, host_line, host_record, pick_precisions
from bertrecipe.dataprep.sharding import split_sentences
from bertrecipe.dataprep.text_formatting import book_text
from bertrecipe.model.bert import BertConfig
from bertrecipe.pretraining.data import PretrainingData, StepShape
from bertrecipe.pretraining.shard_schema import find_shards, inspect_shard
from bertrecipe.training.metric_logger import read_log

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))


def make_shards(text: Path, vocab: Path, seq: int, out: Path) -> Path:
    """The book through the recipe's own formatting and sentence splitting (one document, as bertPrep makes it),
    so that sequences fill up as on Wikipedia instead of ending at every paragraph of the raw file."""
    folder = out / f"seq{seq}"
    folder.mkdir(parents=True, exist_ok=True)
    sentences = out / f"{text.stem}_sentences.txt"
    sentences.write_text("\n".join(split_sentences(book_text(text))) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "data" / "create_pretraining_data.py"), "--input_file", str(sentences),
                    "--output_file", str(folder / "bench_training_0.hdf5"), "--vocab_file", str(vocab),
                    "--max_seq_length", str(seq), "--max_predictions_per_seq",
                    str(MASKED_PER_SEQ.get(seq, int(seq * 0.15))),  # NVIDIA's 128/20 and 512/80, else 15 %
                    "--dupe_factor", "1", "--compression", "none"], check=True, capture_output=True)
    return folder


def real_token_fraction(folder: Path) -> float:
    with h5py.File(next(folder.glob("*.hdf5"))) as f:
        return float(f["input_mask"][()].mean())


def loader_throughput(folder: Path, micro_batch: int = 64, batches: int = 400) -> float:
    """Sequences per second from HDF5 on disk to batch tensors, one worker (this process)."""
    shards = [inspect_shard(p, 30522, 512) for p in find_shards(folder, "training")]
    data = PretrainingData(shards, 1, StepShape(micro_batch, 1, 1, 0), 1, 30522)
    start = time.perf_counter()
    for i, _ in enumerate(data.batches(iter(data.reader()))):
        if i + 1 == batches:
            break
    return micro_batch * batches / (time.perf_counter() - start)


def run_loop(folder: Path, seq: int, batch: int, steps: int, out: Path, compile_optimizer: bool,
             precision: str) -> float:
    log = out / f"loop_{seq}.json"
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--input_dir", str(folder), "--config_file",
               str(REPO / "bert_configs" / "base.json"), "--output_dir", str(out / f"ckpt_{seq}"),
               "--max_seq_length", str(seq), "--max_predictions_per_seq", str(MASKED_PER_SEQ[seq]),
               "--train_batch_size", str(batch), "--max_steps", str(steps), "--learning_rate", "6e-3",
               "--warmup_proportion", "0.5", "--do_train", "--skip_checkpoint", "--disable_progress_bar",
               "--json-summary", str(log), "--no_cuda"]  # --no_cuda: on the CPU, as the peer it is compared with
    if precision == "bf16":
        command.append("--bf16")
    if not compile_optimizer:  # the default fuses LAMB's update on CPUs for a model this size
        command.append("--no_compile_optimizer")
    subprocess.run(command, check=True, capture_output=True)
    final = next(r["data"] for r in read_log(log) if r.get("step") == [])
    return float(final["training_sequences_per_second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512], choices=sorted(MASKED_PER_SEQ))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=7, help="loop steps (the first two are not timed)")
    parser.add_argument("--peer_steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="loop and peer measured in turns this many times; the median of each is reported")
    parser.add_argument("--text", type=Path, default=SHARED / "books" / "pg1342.txt")
    parser.add_argument("--vocab", type=Path, default=SHARED / "minilm" / "vocab.txt")
    parser.add_argument("--no_compile_optimizer", action="store_true",
                        help="pass --no_compile_optimizer to the loop (default: run_pretraining.py's default flags)")
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        help="of the loop and the peer (default: bf16 where the CPU has it natively, else fp32)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    for path in (args.text, args.vocab):
        if not path.is_file():
            raise SystemExit(f"error: {path} not found (pass --text and --vocab)")
    host = detect("cpu")  # loop and peer both run on the CPU
    precision = pick_precisions(host, [args.precision] if args.precision else None, ["bf16"])[0]
    print(f"{host_line(host, precision)}, {torch.get_num_threads()} threads; BERT-base, batch {args.batch}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for seq in args.seq:
            folder = make_shards(args.text, args.vocab, seq, out)
            loader = loader_throughput(folder)
            tokens = real_token_fraction(folder)
            config = BertConfig()
            step = peer_step(config, make_batch(config, args.batch, seq, MASKED_PER_SEQ[seq]))
            loops, peers = [], []
            for _ in range(args.rounds):  # in turns, so that a busy spell of a shared machine hits both
                loops.append(run_loop(folder, seq, args.batch, args.steps, out, not args.no_compile_optimizer,
                                      precision))
                peers.append(args.batch / time_steps(step, precision, warmup=2, steps=args.peer_steps))
            ours, peer = sorted(loops)[len(loops) // 2], sorted(peers)[len(peers) // 2]
            del step
            row = {"seq": seq, "batch": args.batch, "loop_seq_per_s": ours, "peer_seq_per_s": peer,
                   "speedup": ours / peer, "loader_seq_per_s_per_worker": loader, "rounds": args.rounds,
                   "real_token_fraction": tokens,
                   "loop_rounds": loops, "peer_rounds": peers, **host_record(host, precision)}
            results.append(row)
            print(f"seq {seq} {precision}: run_pretraining.py {ours:.2f} seq/s, transformers+AdamW {peer:.2f} "
                  f"seq/s, speed-up {ours / peer:.2f}x; data loader {loader:,.0f} seq/s per worker; "
                  f"{tokens:.0%} of the shard's positions are tokens", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
