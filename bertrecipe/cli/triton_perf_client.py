"""Latency and throughput of a Triton-served BERT across batch sizes and concurrency: CSV + PNG.

    python triton/run_perf_client.py --url 127.0.0.1:8000 --model_name bert --batch_sizes 1 2 4 8 \
        --concurrency 1 2 4 --seq_length 384 --requests 50 --output_dir results/perf

For every (batch size, concurrency) pair, `concurrency` threads (one client each) send requests of real SQuAD
windows (--predict_file, else the built-in paragraph that deployer.py checks exports with) until --requests
are done or --max_seconds passed. perf.csv holds p50/p90/p95/p99 and mean latency (ms) and throughput
(sequences/s); perf.png draws them.
"""
from __future__ import annotations

import argparse
import csv
import threading
import time
from pathlib import Path
from typing import Callable, NoReturn, Optional, Sequence

import numpy as np

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.cli.finetuning_flags import add_allow_vocab_mismatch
from bertrecipe.cli.triton_flags import add_server_arguments, check_server, client_from_args
from bertrecipe.common.errors import InputError
from bertrecipe.deploy.serving import TritonQA, sample_inputs
from bertrecipe.finetuning import squad
from bertrecipe.finetuning.model_loading import load_tokenizer

FIELDS = ("batch_size", "concurrency", "requests", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms",
          "sequences_per_second")


def measure(make_client: Callable[[], TritonQA], arrays: Sequence[np.ndarray], batch_size: int, concurrency: int,
            requests: int, max_seconds: float) -> dict[str, float]:
    """One (batch size, concurrency) point; every thread stops at the request budget or the deadline."""
    rows = np.arange(batch_size) % len(arrays[0])  # repeat windows when the sample holds fewer than batch_size
    batch = [a[rows] for a in arrays]
    latencies: list[float] = []
    lock = threading.Lock()
    budget = [requests]
    deadline = time.perf_counter() + max_seconds
    errors: list[BaseException] = []

    def worker() -> None:
        qa = None
        try:
            qa = make_client()
            qa.infer(batch)  # warm-up, not counted
            while time.perf_counter() < deadline:
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                began = time.perf_counter()
                qa.infer(batch)
                with lock:
                    latencies.append(time.perf_counter() - began)
        except BaseException as error:  # reported by the caller, not lost in the thread
            errors.append(error)
        finally:
            if qa is not None:
                qa.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    if errors:
        raise errors[0]
    if not latencies:
        raise InputError("no request finished within --max_seconds")
    ms = np.asarray(latencies) * 1000
    return {"batch_size": batch_size, "concurrency": concurrency, "requests": len(latencies),
            **{f"p{q}_ms": float(np.percentile(ms, q)) for q in (50, 90, 95, 99)}, "mean_ms": float(ms.mean()),
            "sequences_per_second": len(latencies) * batch_size / wall}


def write_csv(rows: list[dict[str, float]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()} for row in rows)


def plot_throughput_and_latency(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for concurrency in sorted({r["concurrency"] for r in rows}):
        points = sorted((r for r in rows if r["concurrency"] == concurrency), key=lambda r: r["batch_size"])
        sizes = [r["batch_size"] for r in points]
        left.plot(sizes, [r["sequences_per_second"] for r in points], marker="o", label=f"concurrency {concurrency}")
        right.plot(sizes, [r["p50_ms"] for r in points], marker="o", label=f"p50, concurrency {concurrency}")
        right.plot(sizes, [r["p99_ms"] for r in points], marker="x", linestyle="--",
                   label=f"p99, concurrency {concurrency}")
    left.set(xlabel="batch size", ylabel="sequences/s", title="throughput")
    right.set(xlabel="batch size", ylabel="latency (ms)", title="latency")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MAX_CONCURRENCY = 64


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(p)
    p.add_argument("--vocab_file", required=True)
    p.add_argument("--do_lower_case", action="store_true")
    add_allow_vocab_mismatch(p)
    p.add_argument("--predict_file", help="SQuAD JSON whose windows are sent (default: a built-in paragraph)")
    p.add_argument("--seq_length", type=int, default=384)
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2])
    p.add_argument("--requests", type=int, default=50, help="measured requests per point (at most)")
    p.add_argument("--max_seconds", type=float, default=60.0, help="time limit per point")
    p.add_argument("--output_dir", default="results/perf")
    args = p.parse_args(argv)
    # Every value is checked, not only the last: each one becomes a measured point.
    for flag, values in (("--batch_sizes", args.batch_sizes), ("--concurrency", args.concurrency),
                         ("--requests", [args.requests])):
        if min(values) < 1:
            raise InputError(f"{flag} {min(values)}: must be at least 1")
    if max(args.concurrency) > MAX_CONCURRENCY:
        raise InputError(f"--concurrency {max(args.concurrency)}: at most {MAX_CONCURRENCY} (one thread and client "
                         "each)")
    return args


def main(argv: Optional[Sequence[str]] = None) -> list[dict[str, float]]:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    arrays = sample_inputs(tokenizer, args.predict_file, squad.WindowSettings(args.seq_length, 128, 64))

    check_server(args)  # one clear error for a dead server, before any thread starts
    rows = []
    for concurrency in args.concurrency:
        for batch_size in args.batch_sizes:
            row = measure(lambda: client_from_args(args), arrays, batch_size, concurrency, args.requests,
                          args.max_seconds)
            print(", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
            rows.append(row)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "perf.csv")
    plot_throughput_and_latency(rows, out / "perf.png")
    print(out / "perf.csv")
    return rows


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
