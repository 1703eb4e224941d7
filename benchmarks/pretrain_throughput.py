#!/usr/bin/env python3
"""The whole pre-training loop (run_pretraining.py: data loading, logging and all) against transformers'
BertForPreTraining + AdamW on the same batch size and precision, plus the data loader alone.

Shards are made first from real text (../shared/data/books with the standard uncased vocab, or any text and
vocab given with --text/--vocab) by data/create_pretraining_data.py. Without ../shared/data the text is the
embedded default corpus (bertrecipe/dataprep/default_corpus.py: prose that ships with Python, one document an
article) and the vocab tests/data's excerpt of BERT's uncased vocab: no download needed.

    python benchmarks/pretrain_throughput.py                 # BERT-base, seq 128 and 512, batch 8, bf16
                                                             # where native (else fp32; --precision to choose)
    python benchmarks/pretrain_throughput.py --seq 128 --steps 6
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py
import torch
from model_throughput import Batch, StepOptions, make_batch, masked_per_seq, peer_step, time_steps

from bertrecipe.common.hardware import detect, host_line, host_record, pick_precisions
from bertrecipe.dataprep.sharding import split_sentences
from bertrecipe.dataprep.text_formatting import book_text
from bertrecipe.model.bert import BertConfig
from bertrecipe.pretraining.data import PretrainingData, StepShape
from bertrecipe.pretraining.sample_order import default_lanes
from bertrecipe.pretraining.shard_schema import find_shards, inspect_shard
from bertrecipe.training.metric_logger import read_log

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
SHARED_BOOK = SHARED / "books" / "pg1342.txt"
SHARED_VOCAB = SHARED / "minilm" / "vocab.txt"
VOCAB_EXCERPT = REPO / "tests" / "data" / "vocab-uncased-excerpt.txt"  # tracked: there on every checkout
LOOP_SEED = 42  # run_pretraining.py's default --seed


def make_shards(text: Path, vocab: Path, seq: int, out: Path) -> Path:
    """The book through the recipe's own formatting and sentence splitting (one document, as bertPrep makes it),
    so that sequences fill up as on Wikipedia instead of ending at every paragraph of the raw file."""
    return shards_of_documents([book_text(text)], vocab, seq, out, text.stem)


def default_corpus_documents(max_chars: int | None = None) -> list[str]:
    """The embedded default corpus's articles, each a document, in its fixed order, up to about max_chars."""
    from bertrecipe.dataprep.default_corpus import articles

    documents, chars = [], 0
    for article in articles():
        if max_chars is not None and chars >= max_chars:
            break
        documents.append(article)
        chars += len(article)
    return documents


def shards_of_documents(documents: list[str], vocab: Path, seq: int, out: Path, name: str = "corpus",
                        dupe_factor: int = 1, timeout: float | None = None) -> Path:
    """A training shard of `documents` (one sentence a line by the recipe's splitter, a blank line between
    documents) at `seq`, masked as NVIDIA's 128/20 and 512/80 (else 15 %), in out/seq<seq>/."""
    folder = out / f"seq{seq}"
    folder.mkdir(parents=True, exist_ok=True)
    sentences = out / f"{name}_sentences.txt"
    sentences.write_text("\n\n".join("\n".join(split_sentences(d)) for d in documents) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, str(REPO / "data" / "create_pretraining_data.py"), "--input_file", str(sentences),
                    "--output_file", str(folder / "bench_training_0.hdf5"), "--vocab_file", str(vocab),
                    "--max_seq_length", str(seq), "--max_predictions_per_seq", str(masked_per_seq(seq)),
                    "--dupe_factor", str(dupe_factor), "--compression", "none"],
                   check=True, capture_output=True, timeout=timeout)
    return folder


def real_token_fraction(folder: Path) -> float:
    with h5py.File(next(folder.glob("*.hdf5"))) as f:
        return float(f["input_mask"][()].mean())


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
    final = next(r["data"] for r in read_log(log) if r.get("step") == [])
    return float(final["training_sequences_per_second"])


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
    print(f"{host_line(host, precision)}, {torch.get_num_threads()} threads; BERT-base, batch {args.batch}")
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
