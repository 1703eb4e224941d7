"""How the pre-training loader (sample_order.py + pretraining_data.PretrainingData) scales to W ranks x K
DataLoader workers, on synthetic shards written as NVIDIA's create_pretraining_data writes them (h5py's default
chunking, compression="gzip", int32 ids, int8 masks; seq 128, 20 predictions; sizes varied), in a temporary folder:

1. bytes decompressed per epoch over all ranks and workers, relative to the data set: the HDF5 chunks each portion
   read touches, key by key, times the chunk's uncompressed bytes (chunk shapes read from the files); per rank
   and per worker. The same on layout-only shards at cluster scale (h5py picks the same chunks from the shape,
   nothing is written);
2. peak memory of one DataLoader worker (VmHWM minus the RSS it started with), measured in real workers of a
   subprocess, on the synthetic set and on single shards of 256 and 512 MiB, next to today's loader (a whole shard);
3. the samples of the first global steps for W = 1, 8, 64 (and W = 8 with 4 workers), through the real loader;
4. samples/s of one worker: PortionReader + PretrainingData.batches against today's loader (load_shard of whole
   shards + make_batch on shuffled rows), each in a fresh process, in turns.

    python -m benchmarks.loader_scaling                 # about 3 minutes on 2 cores
    python -m benchmarks.loader_scaling --json results.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from benchmarks.common import REPO, benchmark_command, middle, status_bytes, write_json
from bertrecipe.common.hardware import detect, host_line, host_record
from bertrecipe.pretraining import sample_order
from bertrecipe.pretraining.data import PretrainingData, StepShape, check_value_ranges, make_batch
from bertrecipe.pretraining.shard_schema import SHARD_KEYS, ShardInfo, inspect_shard

VOCAB, SEQ, PREDICTIONS = 30522, 128, 20
CLS, SEP, MASK = 101, 102, 103
ROW_BYTES = SEQ * (4 + 1 + 1) + PREDICTIONS * (4 + 4) + 1  # uncompressed bytes of one sample
NVIDIA_GLOBAL_BATCH = 65536  # phase 1 of NVIDIA's recipe; sets the default lanes (64, or W when larger)
MiB = 2**20


def load_shard(info: ShardInfo, vocab_size: int) -> dict[str, np.ndarray]:
    """The previous loader's read: the six arrays of a whole shard in memory, every value range-checked."""
    with h5py.File(info.path, "r") as f:
        arrays = {k: f[k][()] for k in SHARD_KEYS}
    arrays["next_sentence_labels"] = arrays["next_sentence_labels"].reshape(-1)
    check_value_ranges(info.path, arrays, vocab_size, info.type_vocab_size)
    return arrays


# --- Synthetic shards -------------------------------------------------------------------------------------------

def synthetic_rows(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Rows shaped like create_pretraining_data's: [CLS] A [SEP] B [SEP], 10 % shorter, 15 % of tokens masked."""
    lengths = np.where(rng.random(n) < 0.1, rng.integers(24, SEQ, n), SEQ)
    column = np.arange(SEQ)
    mask = column < lengths[:, None]
    split = (lengths * rng.uniform(0.3, 0.7, n)).astype(np.int64)
    ids = np.where(mask, rng.integers(1000, VOCAB, (n, SEQ), dtype=np.int32), 0).astype(np.int32)
    ids[:, 0] = CLS
    ids[np.arange(n), split] = SEP
    ids[np.arange(n), lengths - 1] = SEP
    segments = (mask & (column > split[:, None])).astype(np.int8)
    # Masked positions: `count` random real tokens (never CLS/SEP), ascending, then zeros; all become [MASK].
    keys = np.where(mask & (ids != CLS) & (ids != SEP), rng.random((n, SEQ), dtype=np.float32), 2.0)
    count = np.minimum(PREDICTIONS, np.maximum(1, np.round(0.15 * lengths).astype(np.int64)))
    used = np.arange(PREDICTIONS) < count[:, None]
    picked = np.argsort(keys, axis=1)[:, :PREDICTIONS]
    positions = np.sort(np.where(used, picked, SEQ), axis=1)
    positions = np.where(used, positions, 0).astype(np.int32)
    r, c = np.nonzero(used)
    labels = np.zeros((n, PREDICTIONS), np.int32)
    labels[r, c] = ids[r, positions[r, c]]
    ids[r, positions[r, c]] = MASK
    return {"input_ids": ids, "input_mask": mask.astype(np.int8), "segment_ids": segments,
            "masked_lm_positions": positions, "masked_lm_ids": labels,
            "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}


def write_shard(path: Path, n: int, seed: int, layout_only: bool = False) -> None:
    """NVIDIA's create_pretraining_data writes each key with create_dataset(..., compression="gzip"), so h5py
    chooses the chunks from the shape; layout_only gives the same chunks from the shape alone (nothing written)."""
    dtypes = {"input_ids": ("i4", (SEQ,)), "input_mask": ("i1", (SEQ,)), "segment_ids": ("i1", (SEQ,)),
              "masked_lm_positions": ("i4", (PREDICTIONS,)), "masked_lm_ids": ("i4", (PREDICTIONS,)),
              "next_sentence_labels": ("i1", ())}
    if layout_only:
        with h5py.File(path, "w") as f:
            for key, (dtype, tail) in dtypes.items():
                f.create_dataset(key, shape=(n, *tail), dtype=dtype, compression="gzip")
        return
    rng = np.random.default_rng(seed)
    pieces = [synthetic_rows(min(32768, n - s), rng) for s in range(0, n, 32768)]  # bounded temporaries
    with h5py.File(path, "w") as f:
        for key, (dtype, _) in dtypes.items():
            f.create_dataset(key, data=np.concatenate([p[key] for p in pieces]), dtype=dtype, compression="gzip")


def make_set(folder: Path, sizes: list[int], seed: int, layout_only: bool = False) -> list[ShardInfo]:
    folder.mkdir(parents=True, exist_ok=True)
    for index, n in enumerate(sizes):
        write_shard(folder / f"synthetic_training_{index}.hdf5", n, seed + index, layout_only)
    return [inspect_shard(folder / f"synthetic_training_{i}.hdf5", VOCAB, 512) for i in range(len(sizes))]


# --- 1. Bytes decompressed ---------------------------------------------------------------------------------------

def shard_layout(path: Path) -> tuple[list[tuple[int, int]], int, int]:
    """Per key (chunk rows, uncompressed bytes of one band of chunks across the row), the data's bytes, and the
    bytes of decompressing every chunk once (edge chunks are stored whole, so this is a little above the data)."""
    bands, data_bytes, once = [], 0, 0
    with h5py.File(path, "r") as f:
        for key in SHARD_KEYS:
            d = f[key]
            chunks = d.chunks or (1, *d.shape[1:])  # contiguous: a read touches exactly its rows
            across = math.prod(math.ceil(s / c) for s, c in zip(d.shape[1:], chunks[1:], strict=True))
            band = across * math.prod(chunks) * d.dtype.itemsize
            bands.append((chunks[0], band))
            data_bytes += math.prod(d.shape) * d.dtype.itemsize
            once += math.ceil(d.shape[0] / chunks[0]) * band
    return bands, data_bytes, once


def portion_bytes(bands: list[tuple[int, int]], portion: sample_order.Portion) -> int:
    return sum(((portion.stop - 1) // rows - portion.start // rows + 1) * band for rows, band in bands)


def rank_portions(stream: sample_order.StreamOrder, world: int, rank: int, per_lane: int) -> list[sample_order.Portion]:
    """The portions rank `rank` reads for epoch 0, in its readers' order (serial n goes to worker n % K); the
    steps run into epoch 1, whose portions keep their serial numbers but are not counted."""
    steps = -(-stream.lane_length // per_lane)
    lanes = sample_order.rank_lanes(stream.lanes, world, rank)
    return list(sample_order.portions_needed(stream, lanes, per_lane, 0, steps))


def decompression(infos: list[ShardInfo], worlds: list[int], workers: list[int], seed: int) -> list[dict]:
    """Rows of item 1: for each (W, K), bytes decompressed in epoch 0 by all ranks, by the busiest rank and worker."""
    layouts = [shard_layout(info.path) for info in infos]
    data_bytes, once = sum(layout[1] for layout in layouts), sum(layout[2] for layout in layouts)
    whole = sample_order.StreamOrder([i.num_samples for i in infos], [i.block_rows for i in infos], seed, 1)
    blocks = sum(portion_bytes(layouts[p.file][0], p) for p in whole.lane_portions(0, 0)) / data_bytes
    rows = []
    for world in worlds:
        lanes = sample_order.default_lanes(NVIDIA_GLOBAL_BATCH, world)
        stream = sample_order.StreamOrder([i.num_samples for i in infos], [i.block_rows for i in infos], seed, lanes)
        per_rank = []
        for rank in range(world):
            read = [(serial, portion_bytes(layouts[p.file][0], p))
                    for serial, p in enumerate(rank_portions(stream, world, rank, NVIDIA_GLOBAL_BATCH // lanes))
                    if p.epoch == 0]
            per_rank.append(read)
        rank_bytes = [sum(b for _, b in read) for read in per_rank]
        for k in workers:
            worker_max = max(sum(b for serial, b in read if serial % k == w) for read in per_rank for w in range(k))
            rows.append({"world": world, "workers": k, "lanes": lanes, "total_over_data": sum(rank_bytes) / data_bytes,
                         "total_over_chunks_once": sum(rank_bytes) / once, "rank_max_mb": max(rank_bytes) / MiB,
                         "rank_mean_mb": sum(rank_bytes) / world / MiB, "worker_max_mb": worker_max / MiB,
                         "data_mb": data_bytes / MiB, "blocks_once_over_data": blocks})
    return rows


# --- 2. Peak memory of a worker (runs in a subprocess) -----------------------------------------------------------

def _reset_peak() -> int:
    """Resets VmHWM to the current RSS (Linux clear_refs 5) and returns that RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_bytes("VmRSS")


class MeasuredReader(IterableDataset):
    """A rank's PortionReader that, in each DataLoader worker, ends with the worker's peak RSS growth."""

    def __init__(self, data: PretrainingData) -> None:
        self.reader = data.reader()

    def __iter__(self) -> Iterator[Any]:
        start, portions, largest = _reset_peak(), 0, 0
        for item in self.reader:
            portions, largest = portions + 1, max(largest, len(item.rows["input_ids"]))
            yield item
        yield {"peak_bytes": status_bytes("VmHWM") - start, "portions": portions, "largest_rows": largest}


def child_worker_memory(folder: str, world: int, workers: int, lanes: int | None) -> dict:
    """Rank 0 of W reads one epoch with K real DataLoader workers; the items are dropped as they arrive."""
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: on purpose
    infos = [inspect_shard(p, VOCAB, 512) for p in sorted(Path(folder).glob("*.hdf5"))]
    lanes = lanes or sample_order.default_lanes(NVIDIA_GLOBAL_BATCH, world)
    stream = sample_order.StreamOrder([i.num_samples for i in infos], [i.block_rows for i in infos], 0, lanes)
    steps = max(1, stream.lane_length // (NVIDIA_GLOBAL_BATCH // lanes))
    data = PretrainingData(infos, 0, StepShape(NVIDIA_GLOBAL_BATCH // world, 1, world, 0), lanes, VOCAB,
                           max_steps=steps)
    loader = DataLoader(MeasuredReader(data), batch_size=None, num_workers=workers)
    reports = [item for item in loader if isinstance(item, dict)]  # the rest: PortionRows
    return {"peak_mb": max(r["peak_bytes"] for r in reports) / MiB,
            "largest_portion_mb": max(r["largest_rows"] for r in reports) * ROW_BYTES / MiB,
            "block_rows": max(i.block_rows for i in infos), "lanes": lanes}


def child_old_memory(folder: str) -> dict:
    """Today's loader holds a whole shard (and reads the next in a thread): load_shard of the largest one."""
    infos = [inspect_shard(p, VOCAB, 512) for p in sorted(Path(folder).glob("*.hdf5"))]
    start = _reset_peak()
    arrays = load_shard(max(infos, key=lambda i: i.num_samples), VOCAB)
    return {"peak_mb": (status_bytes("VmHWM") - start) / MiB, "shard_mb": sum(a.nbytes for a in arrays.values()) / MiB}


def run_child(task: str, **kwargs: Any) -> dict:
    """A fresh interpreter for each measurement, so that no earlier allocation hides a peak."""
    command = benchmark_command("loader_scaling", "--child", json.dumps({"task": task, **kwargs}))
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{task} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- 3. Sample order across W -------------------------------------------------------------------------------------

def sample_id(row: torch.Tensor) -> str:
    """A sample's identity: the hash of its tokens (random rows of 128 tokens do not repeat)."""
    return hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest()


def global_steps(infos: list[ShardInfo], world: int, workers: int, lanes: int, batch: int, steps: int) -> list:
    """The sample ids of each global step, ranks in order, as the loader gives them to the ranks."""
    accumulation = max(1, batch // 8 // world)  # micro-batches of 8 where possible, 1 sample at W = 64
    micro = batch // world // accumulation
    per_rank = []
    for rank in range(world):
        data = PretrainingData(infos, 1, StepShape(micro, accumulation, world, rank), lanes, VOCAB, max_steps=steps)
        reader = data.reader()
        items = iter(DataLoader(reader, batch_size=None, num_workers=workers)) if workers else iter(reader)
        micro_batches = [[sample_id(r) for r in b["input_ids"]] for b in data.batches(items)]
        per_rank.append([sum(micro_batches[s * accumulation:(s + 1) * accumulation], []) for s in range(steps)])
    return [sum((rank[s] for rank in per_rank), []) for s in range(steps)]


def order_check(infos: list[ShardInfo], steps: int, lanes: int = 64) -> dict:
    reference = global_steps(infos, 1, 0, lanes, lanes, steps)
    runs = {"W=8": global_steps(infos, 8, 0, lanes, lanes, steps),
            "W=64": global_steps(infos, 64, 0, lanes, lanes, steps),
            "W=8, K=4": global_steps(infos, 8, 4, lanes, lanes, steps)}
    ids = sum(reference, [])
    return {"steps": steps, "global_batch": lanes, "lanes": lanes, "distinct_samples": len(set(ids)),
            "samples": len(ids), "equal": {name: run == reference for name, run in runs.items()}}


# --- 4. Samples/s of one worker (each in a subprocess) -----------------------------------------------------------

def child_new_throughput(folder: str, lanes: int, micro: int) -> dict:
    """One epoch of rank 0 of 1: PortionReader iterated in this process (a worker's work) + batches (the main
    process's work); then the reader alone, to split the time between the two."""
    infos = [inspect_shard(p, VOCAB, 512) for p in sorted(Path(folder).glob("*.hdf5"))]
    stream = sample_order.StreamOrder([i.num_samples for i in infos], [i.block_rows for i in infos], 0, lanes)
    steps = stream.lane_length * lanes // micro
    data = PretrainingData(infos, 0, StepShape(micro, 1, 1, 0), lanes, VOCAB, max_steps=steps)
    start, began, samples = _reset_peak(), time.perf_counter(), 0
    for batch in data.batches(iter(data.reader())):
        samples += len(batch["input_ids"])
    seconds = time.perf_counter() - began
    peak_mb = (status_bytes("VmHWM") - start) / MiB
    began, read = time.perf_counter(), 0
    for item in data.reader():  # each item dropped once counted, as a worker hands it on: holding the epoch's
        read += len(item.rows["input_ids"])  # items would time the page faults of 440 MiB of new memory too
    reader = time.perf_counter() - began
    items = list(data.reader())
    began = time.perf_counter()
    for _ in data.batches(iter(items)):
        pass
    batches = time.perf_counter() - began
    return {"samples_per_s": samples / seconds, "samples": samples, "peak_mb": peak_mb,
            "reader_samples_per_s": read / reader, "batches_samples_per_s": samples / batches}


def child_old_throughput(folder: str, micro: int) -> dict:
    """Today's loader: each shard read whole (load_shard), its rows shuffled, make_batch on runs of `micro`."""
    infos = [inspect_shard(p, VOCAB, 512) for p in sorted(Path(folder).glob("*.hdf5"))]
    rng = np.random.default_rng(0)
    start, began, samples = _reset_peak(), time.perf_counter(), 0
    for index in rng.permutation(len(infos)):
        arrays = load_shard(infos[index], VOCAB)
        rows = rng.permutation(infos[index].num_samples)
        for first in range(0, len(rows) - micro + 1, micro):
            batch = {k: torch.from_numpy(v) for k, v in make_batch(arrays, rows[first:first + micro]).items()}
            samples += len(batch["input_ids"])
    seconds = time.perf_counter() - began
    return {"samples_per_s": samples / seconds, "samples": samples, "peak_mb": (status_bytes("VmHWM") - start) / MiB}


def throughput(folder: Path, lanes: list[int], micro: int, rounds: int) -> dict:
    """Median samples/s of each loader over `rounds`, the loaders timed in turns (a busy spell hits all)."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        runs.setdefault("today", []).append(run_child("old_throughput", folder=str(folder), micro=micro))
        for c in lanes:
            runs.setdefault(f"new, C={c}", []).append(
                run_child("new_throughput", folder=str(folder), lanes=c, micro=micro))
    return {name: middle(r, key=lambda x: x["samples_per_s"]) for name, r in runs.items()}


# --- Report -------------------------------------------------------------------------------------------------------

def print_decompression(title: str, rows: list[dict]) -> None:
    print(f"\n{title}; every block read whole once (1 lane): {rows[0]['blocks_once_over_data']:.3f}x the data")
    print("  W    K  lanes  decompressed/data  /every-chunk-once  per rank max / mean MiB  per worker max MiB")
    for r in rows:
        print(f"{r['world']:>3} {r['workers']:>4} {r['lanes']:>6} {r['total_over_data']:>15.3f}x "
              f"{r['total_over_chunks_once']:>17.3f}x {r['rank_max_mb']:>13.1f} / {r['rank_mean_mb']:<9.1f} "
              f"{r['worker_max_mb']:>15.1f}")


def memory_rows(small: Path, big: list[Path], configs: list[tuple[int, int, int | None]]) -> list[dict]:
    """(W, K, lanes or None for the default) runs on each set, then today's loader on its largest shard."""
    rows = []
    sets = [("synthetic set", small)] + [(f"one shard, {_shard_mib(f):.0f} MiB", f) for f in big]
    for name, folder in sets:
        for world, workers, lanes in configs:
            rows.append({"set": name, "world": world, "workers": workers,
                         **run_child("worker_memory", folder=str(folder), world=world, workers=workers, lanes=lanes)})
        rows.append({"set": name, "world": "today", "workers": 1, **run_child("old_memory", folder=str(folder))})
    print("\n2. Peak memory of one DataLoader worker (VmHWM growth), rank 0 reading one epoch")
    for r in rows:
        bound = (f"lanes {r['lanes']}, largest portion {r['largest_portion_mb']:.1f} MiB, blocks <= "
                 f"{r['block_rows']} rows" if "lanes" in r
                 else f"today's loader: a whole shard, {r['shard_mb']:.1f} MiB")
        print(f"  {r['set']:<18} W={r['world']!s:<5} K={r['workers']}  {r['peak_mb']:7.1f} MiB   ({bound})")
    return rows


def _shard_mib(folder: Path) -> float:
    return sum(shard_layout(p)[1] for p in folder.glob("*.hdf5")) / MiB


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--rows", type=int, nargs=2, default=[1000, 25000],
                        help="shard sizes, drawn log-uniformly between these (not round numbers, as real shards)")
    parser.add_argument("--big_rows", type=int, nargs="+", default=[256 * MiB // ROW_BYTES, 512 * MiB // ROW_BYTES],
                        help="rows of the single-shard sets of the memory runs (256 and 512 MiB uncompressed)")
    parser.add_argument("--scale_shards", type=int, default=256, help="layout-only shards at cluster scale")
    parser.add_argument("--scale_rows", type=int, nargs=2, default=[100_000, 1_000_000])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 8, 64, 512])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--order_steps", type=int, default=20)
    parser.add_argument("--micro", type=int, default=64, help="micro-batch of the samples/s runs")
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 64], help="lanes of the samples/s runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def child(spec: str) -> None:
    task = json.loads(spec)
    work = {"worker_memory": child_worker_memory, "old_memory": child_old_memory,
            "new_throughput": child_new_throughput, "old_throughput": child_old_throughput}[task.pop("task")]
    print(json.dumps(work(**task)))


def main() -> None:
    args = arguments()
    if args.child:
        return child(args.child)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="This DataLoader will create")  # 4 workers on 2 cores: on purpose
    host = detect()
    print(f"{host_line(host, 'no model runs')}, {os.cpu_count()} logical CPUs; h5py {h5py.__version__} (HDF5 "
          f"{h5py.version.hdf5_version}), numpy {np.__version__}; seq {SEQ}, {PREDICTIONS} predictions, gzip shards "
          f"of h5py's default chunks")
    rng = np.random.default_rng(args.seed)
    sizes = np.exp(rng.uniform(*np.log(args.rows), args.shards)).astype(int).tolist()
    scale = rng.integers(*args.scale_rows, args.scale_shards).tolist()
    results: dict[str, Any] = {"cpu": f"{host.device}, {os.cpu_count()} logical CPUs",
                               **host_record(host, "no model runs"), "sizes": sizes}
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        small = make_set(Path(tmp) / "small", sizes, args.seed)
        big = [Path(tmp) / f"big{n}" for n in args.big_rows]
        for n, folder in zip(args.big_rows, big, strict=True):
            make_set(folder, [n], args.seed + n)
        large = make_set(Path(tmp) / "scale", scale, 0, layout_only=True)
        print(f"wrote {len(sizes)} shards of {min(sizes)}-{max(sizes)} rows ({sum(sizes):,} samples, "
              f"{sum(sizes) * ROW_BYTES / MiB:.0f} MiB uncompressed) and single shards of {args.big_rows} rows "
              f"in {time.perf_counter() - began:.0f} s")
        results["decompression"] = decompression(small, args.worlds, args.workers, args.seed)
        print_decompression(f"1. Bytes decompressed per epoch, all ranks and workers (global batch "
                            f"{NVIDIA_GLOBAL_BATCH}, default lanes); synthetic set", results["decompression"])
        results["decompression_scale"] = decompression(large, args.worlds, args.workers, args.seed)
        print_decompression(f"   Layout-only set: {len(scale)} shards of {min(scale):,}-{max(scale):,} rows "
                            f"({sum(scale) * ROW_BYTES / 2**30:.0f} GiB uncompressed)", results["decompression_scale"])
        results["memory"] = memory_rows(Path(tmp) / "small", big,
                                     [(1, 1, None), (8, 4, None), (64, 4, None), (512, 1, None), (1, 1, 1)])
        results["order"] = order_check(small, args.order_steps)
        order = results["order"]
        print(f"\n3. Samples of the first {order['steps']} global steps of {order['global_batch']} ({order['lanes']} "
              f"lanes, {order['distinct_samples']} distinct of {order['samples']}) equal to W=1's: {order['equal']}")
        results["throughput"] = throughput(Path(tmp) / "small", args.lanes, args.micro, args.rounds)
    print(f"\n4. Samples/s of one worker, seq {SEQ}, micro-batch {args.micro}, one epoch of the synthetic set, "
          f"median of {args.rounds} (peak RSS growth of the process)")
    today = results["throughput"]["today"]["samples_per_s"]
    for name, r in results["throughput"].items():
        split = (f"  (reader alone {r['reader_samples_per_s']:,.0f}/s, batches alone "
                 f"{r['batches_samples_per_s']:,.0f}/s)" if "reader_samples_per_s" in r else "")
        print(f"  {name:<10} {r['samples_per_s']:>10,.0f} samples/s  {r['samples_per_s'] / today:5.2f}x  "
              f"{r['peak_mb']:7.1f} MiB{split}")
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
