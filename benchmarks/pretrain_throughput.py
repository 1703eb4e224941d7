"""The whole pre-training loop (run_pretraining.py: data loading, logging and all) against transformers'
BertForPreTraining + AdamW on the same batch size and precision, plus the data loader alone.

Shards are made first from real text (../shared/data/books with the standard uncased vocab, or any text and
vocab given with --text/--vocab) by data/create_pretraining_data.py. Without ../shared/data the text is the
embedded default corpus (bertrecipe/dataprep/default_corpus.py: prose that ships with Python, one document an
article) and the vocab tests/data's excerpt of BERT's uncased vocab: no download needed.

    python -m benchmarks.pretrain_throughput                 # BERT-base, seq 128 and 512, batch 8, bf16
                                                             # where native (else fp32; --precision to choose)
    python -m benchmarks.pretrain_throughput --seq 128 --steps 6
"""
from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from benchmarks.common import (
    REPO,
    SHARED_BOOK,
    SHARED_VOCAB,
    VOCAB_EXCERPT,
    default_corpus_documents,
    host_threads_line,
    loop_sequences_per_second,
    make_shards,
    masked_per_seq,
    middle,
    real_token_fraction,
    shards_of_documents,
    time_steps,
    write_json,
)
from benchmarks.model_throughput import Batch, StepOptions, make_batch, peer_step
from bertrecipe.common.hardware import detect, host_record, pick_precisions
from bertrecipe.model.bert import BertConfig
from bertrecipe.pretraining.data import PretrainingData, StepShape
from bertrecipe.pretraining.sample_order import default_lanes
from bertrecipe.pretraining.shard_schema import find_shards, inspect_shard

LOOP_SEED = 42  # run_pretraining.py's default --seed


def shard_batches(folder: Path, micro_batch: int, vocab_size: int = 30522, seed: int = 1,
                  lanes: int = 1) -> Iterator[dict[str, torch.Tensor]]:
    """The training loader's micro-batches of the shards in `folder`, read in this process, epoch after epoch."""
    shards = [inspect_shard(p, vocab_size, 512) for p in find_shards(folder, "training")]
    data = PretrainingData(shards, seed, StepShape(micro_batch, 1, 1, 0), lanes, vocab_size)
    return data.batches(iter(data.reader()))


def loader_throughput(folder: Path, micro_batch: int = 64, batches: int = 400) -> float:
    """Sequences per second from HDF5 on disk to batch tensors, one worker (this process)."""
    start = time.perf_counter()
    for i, _ in enumerate(shard_batches(folder, micro_batch)):
        if i + 1 == batches:
            break
    return micro_batch * batches / (time.perf_counter() - start)


def first_shard_batches(folder: Path, micro_batch: int, count: int, vocab_size: int = 30522) -> list[Batch]:
    """The first `count` micro-batches a one-process run_pretraining.py run of that micro-batch reads (its default
    --seed and --data_lanes), as model_throughput's batch tuples: the model step timed alone on the rows (and
    padding) the loop trains on."""
    keys = ("input_ids", "segment_ids", "input_mask", "masked_lm_labels", "next_sentence_labels")
    loop_order = {"seed": LOOP_SEED, "lanes": default_lanes(micro_batch, 1)}
    batches = itertools.islice(shard_batches(folder, micro_batch, vocab_size, **loop_order), count)
    return [tuple(batch[k] for k in keys) for batch in batches]


@dataclass(frozen=True)
class LoopOptions:
    """How run_pretraining.py runs: its config, device, precision (fp16 -> --fp16, bf16 -> --bf16, tf32 -> --tf32),
    LAMB's update fused by torch.compile or not (None: run_pretraining.py's default for the device), and the model
    under torch.compile (--compile) or not."""

    config_file: Path = REPO / "bert_configs" / "base.json"
    device: str = "cpu"
    precision: str = "bf16"
    compile_optimizer: bool | None = None
    compile_model: bool = False


def loop_command(folder: Path, seq: int, batch: int, steps: int, out: Path, options: LoopOptions) -> list[str]:
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--input_dir", str(folder), "--config_file",
               str(options.config_file), "--output_dir", str(out / f"ckpt_{seq}"),
               "--max_seq_length", str(seq), "--max_predictions_per_seq", str(masked_per_seq(seq)),
               "--train_batch_size", str(batch), "--max_steps", str(steps), "--learning_rate", "6e-3",
               "--warmup_proportion", "0.5", "--do_train", "--skip_checkpoint", "--disable_progress_bar",
               "--json-summary", str(out / f"loop_{seq}.json")]
    if torch.device(options.device).type == "cpu":
        command.append("--no_cuda")  # on the CPU, as the peer it is compared with
    command += {"fp16": ["--fp16"], "bf16": ["--bf16"], "tf32": ["--tf32"]}.get(options.precision, [])
    if options.compile_optimizer is not None:
        command.append("--compile_optimizer" if options.compile_optimizer else "--no_compile_optimizer")
    return command + (["--compile"] if options.compile_model else [])


def run_loop(folder: Path, seq: int, batch: int, steps: int, out: Path, options: LoopOptions,
             timeout: float | None = None) -> float:
    """training_sequences_per_second of a run_pretraining.py run (its first two steps, warm-up, not counted)."""
    log = out / f"loop_{seq}.json"
    log.unlink(missing_ok=True)
    subprocess.run(loop_command(folder, seq, batch, steps, out, options), check=True, capture_output=True,
                   timeout=timeout)
    return loop_sequences_per_second(log)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=7, help="loop steps (the first two are not timed)")
    parser.add_argument("--peer_steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="loop and peer measured in turns this many times; the median of each is reported")
    parser.add_argument("--text", type=Path, default=SHARED_BOOK if SHARED_BOOK.is_file() else None,
                        help=f"a book (default {SHARED_BOOK}, else the embedded default corpus)")
    parser.add_argument("--vocab", type=Path, default=SHARED_VOCAB if SHARED_VOCAB.is_file() else VOCAB_EXCERPT)
    parser.add_argument("--no_compile_optimizer", action="store_true",
                        help="pass --no_compile_optimizer to the loop (default: run_pretraining.py's default flags)")
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        help="of the loop and the peer (default: bf16 where the CPU has it natively, else fp32)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    for path in (p for p in (args.text, args.vocab) if p is not None):  # no --text: the embedded corpus
        if not path.is_file():
            raise SystemExit(f"error: {path} not found (pass --text and --vocab)")
    host = detect("cpu")  # loop and peer both run on the CPU
    precision = pick_precisions(host, [args.precision] if args.precision else None, ["bf16"])[0]
    print(f"{host_threads_line(host, precision)}; BERT-base, batch {args.batch}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for seq in args.seq:
            folder = (make_shards(args.text, args.vocab, seq, out) if args.text
                      else shards_of_documents(default_corpus_documents(), args.vocab, seq, out))
            loader = loader_throughput(folder)
            tokens = real_token_fraction(folder)
            config = BertConfig()
            step = peer_step(config, make_batch(config, args.batch, seq, masked_per_seq(seq)),
                             StepOptions(precision=precision))
            loops, peers = [], []
            for _ in range(args.rounds):  # in turns, so that a busy spell of a shared machine hits both
                loops.append(run_loop(folder, seq, args.batch, args.steps, out,
                                      LoopOptions(precision=precision,
                                                  compile_optimizer=False if args.no_compile_optimizer else None)))
                peers.append(args.batch / time_steps(step, warmup=2, steps=args.peer_steps))
            ours, peer = middle(loops), middle(peers)
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
        write_json(args.json, results)


if __name__ == "__main__":
    main()
