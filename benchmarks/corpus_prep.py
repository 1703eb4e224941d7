"""Your corpus, prepared: our Parquet -> document-chunk shards against the pipeline transformers' run_mlm users run
on the same Parquet files and tokenizer (issue "your corpus", benchmarks).

    python -m benchmarks.corpus_prep [--megabytes 10] [--processes 1 2] [--scale 10] [--output_dir DIR]

The input is made here: the embedded default corpus's articles (Python's own documentation), repeated with a
counter until --megabytes of text, as Parquet files of a web corpus's shape (text, id, url, score), one per process.
Both pipelines get a byte-level BPE tokenizer.json trained on it and the same process count:
- ours: create_pretraining_data's document chunks, one shard per Parquet file, on the recipe's local engine;
- the peer: datasets.load_dataset("parquet") into its cache, a batched map tokenizing with transformers' fast
  tokenizer of the same file (special tokens added, as run_mlm does), then run_mlm's group_texts (concatenate and
  cut into rows of max_seq_length, batched map), num_proc equal to ours: the rows a trainer reads.
Each runs in a process of its own, which reports its seconds, its own and its workers' peak memory (VmHWM,
RUSAGE_CHILDREN) and the bytes it left on disk. Tokens per second per process count the documents' tokens (the
tokenizer's, without special tokens) in both. --scale also runs ours on --scale times as many files of the same
size: its workers' peak memory, which the streaming readers and one-shard-per-task split keep bounded.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, benchmark_command, default_corpus_documents, status_bytes, write_json

SEQ = 512


def make_corpus(folder: Path, megabytes: float, files: int) -> list[Path]:
    """`files` Parquet files holding about `megabytes` of text in all, in documents of the default corpus."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    articles = default_corpus_documents()
    rows, size, index = [], 0, 0
    while size < megabytes * 1e6:
        text = f"Copy {index // len(articles)}. {articles[index % len(articles)]}"
        rows.append({"text": text, "id": f"doc-{index}", "url": f"https://example.org/{index}", "score": index % 5})
        size += len(text.encode("utf-8"))
        index += 1
    folder.mkdir(parents=True, exist_ok=True)
    share = -(-len(rows) // files)
    paths = []
    for number in range(files):
        path = folder / f"part-{number:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows[number * share:(number + 1) * share]), path, row_group_size=1000)
        paths.append(path)
    return paths


def train_tokenizer(inputs: list[Path], folder: Path) -> Path:
    """A byte-level BPE tokenizer.json (4,096 tokens) trained on the first file's text."""
    import pyarrow.parquet as pq

    from bertrecipe.dataprep.vocab_training import train_bpe

    text = folder / "sample.txt"
    texts = pq.read_table(inputs[0], columns=["text"]).column("text").to_pylist()
    text.write_text("\n\n".join(texts[:2000]), encoding="utf-8")
    return train_bpe([text], folder / "tokenizer.json", 4096)


def ours(inputs: list[Path], tokenizer: Path, processes: int, out: Path) -> dict:
    """Document-chunk shards of the files on the recipe's local engine; the documents' tokens."""
    import h5py
    import numpy as np

    from bertrecipe.dataprep.create_pretraining_data import ShardConfig, shard_task
    from bertrecipe.dataprep.engine import EngineConfig, open_runner

    jobs = [(ShardConfig(path, out / f"{path.stem}.hdf5", tokenizer, max_seq_length=SEQ, document_chunks=True),)
            for path in inputs]
    with open_runner(EngineConfig("local", processes)) as run:
        run(shard_task, jobs, lambda _: None)
    tokens = 0
    for path in sorted(out.glob("*.hdf5")):
        with h5py.File(path, "r") as shard:
            mask = shard["input_mask"][()]
            tokens += int(np.count_nonzero(mask)) - 2 * len(mask)  # less each row's [CLS] and [SEP]
    return {"tokens": tokens, "rows": sum(_rows(p) for p in out.glob("*.hdf5"))}


def _rows(path: Path) -> int:
    import h5py

    with h5py.File(path, "r") as shard:
        return len(shard["input_mask"])


def peer(inputs: list[Path], tokenizer: Path, processes: int, out: Path) -> dict:
    """run_mlm's path: load_dataset("parquet"), a batched tokenizing map, group_texts; the rows a trainer reads."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), cls_token="[CLS]", sep_token="[SEP]",
                                                pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    raw = datasets.load_dataset("parquet", data_files=[str(p) for p in inputs], split="train", cache_dir=str(out))

    def tokenize(batch: dict) -> dict:
        return fast(batch["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize, batched=True, num_proc=processes if processes > 1 else None,
                        remove_columns=raw.column_names)

    def group_texts(batch: dict) -> dict:  # run_mlm's: concatenate, drop the remainder, cut into rows
        joined = {key: sum(batch[key], []) for key in batch}
        length = len(joined["input_ids"]) // SEQ * SEQ
        return {key: [values[i:i + SEQ] for i in range(0, length, SEQ)] for key, values in joined.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=processes if processes > 1 else None)
    special = sum(sum(row) for row in tokenized["special_tokens_mask"])
    tokens = sum(len(row) for row in tokenized["input_ids"]) - special
    return {"tokens": tokens, "rows": len(grouped), "special_tokens": special, "documents": len(raw)}


def child(args: argparse.Namespace) -> None:
    """One pipeline in this process: its figures as one JSON line."""
    inputs = sorted(Path(args.input).glob("*.parquet"))
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    tick = time.perf_counter()
    processes = args.processes[0]  # a child runs one process count
    result = (ours if args.child == "ours" else peer)(inputs, Path(args.tokenizer), processes, out)
    seconds = time.perf_counter() - tick
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest worker's peak
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(json.dumps({**result, "seconds": seconds, "peak_bytes": status_bytes("VmHWM"), "worker_peak_bytes": workers,
                      "disk_bytes": disk}), flush=True)


def measure(name: str, inputs: Path, tokenizer: Path, processes: int, work: Path) -> dict:
    """A pipeline in a fresh interpreter (its memory its own), its work folder removed afterwards."""
    command = benchmark_command("corpus_prep", "--child", name, "--input", str(inputs), "--tokenizer",
                                str(tokenizer), "--processes", str(processes), "--work", str(work))
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    shutil.rmtree(work, ignore_errors=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["tokens_per_second_per_process"] = figures["tokens"] / figures["seconds"] / processes
    return figures


def compare(megabytes: float, process_counts: list[int], scale: int, root: Path) -> dict:
    """Both pipelines at each process count on the same files; ours again on `scale` times the files."""
    corpus = root / "corpus"
    inputs = make_corpus(corpus, megabytes, max(process_counts))
    input_bytes = sum(p.stat().st_size for p in inputs)
    tokenizer = train_tokenizer(inputs, root)
    rows = []
    for processes in process_counts:
        for name in ("ours", "peer"):
            rows.append({"pipeline": name, "processes": processes,
                         **measure(name, corpus, tokenizer, processes, root / f"{name}-{processes}")})
    larger = root / "larger"
    make_corpus(larger, megabytes * scale, max(process_counts) * scale)
    scaled = measure("ours", larger, tokenizer, max(process_counts), root / "ours-larger")
    return {"megabytes": megabytes, "input_bytes": input_bytes, "seq": SEQ, "rows": rows, "scale": scale,
            "scaled": scaled}


def table(result: dict) -> str:
    lines = ["| pipeline | processes | tokens | seconds | tokens/s per process | peak MB (main) | peak MB (worker) "
             "| disk MB left |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['pipeline']} | {row['processes']} | {row['tokens']:,} | {row['seconds']:.1f} | "
                     f"{row['tokens_per_second_per_process']:,.0f} | {row['peak_bytes'] / 1e6:.0f} | "
                     f"{row['worker_peak_bytes'] / 1e6:.0f} | {row['disk_bytes'] / 1e6:.1f} |")
    scaled = result["scaled"]
    lines.append(f"\nours on {result['scale']}x the input ({result['scale']}x the files of the same size): worker peak "
                 f"{scaled['worker_peak_bytes'] / 1e6:.0f} MB, main {scaled['peak_bytes'] / 1e6:.0f} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.corpus_prep", description=__doc__.split("\n")[0])
    p.add_argument("--megabytes", type=float, default=10.0, help="text of the corpus (default 10 MB)")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--scale", type=int, default=10, help="ours again on this many times the files (default 10)")
    p.add_argument("--output_dir", type=Path, help="write corpus_prep.json and corpus_prep.md here")
    p.add_argument("--child", choices=("ours", "peer"), help=argparse.SUPPRESS)
    for hidden in ("--input", "--tokenizer", "--work"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    from bertrecipe.common.hardware import detect, host_line

    with tempfile.TemporaryDirectory() as scratch:
        result = compare(args.megabytes, args.processes, args.scale, Path(scratch))
    result["host"] = host_line(detect(), "no model runs")
    report = f"{result['host']}\n\n{table(result)}"
    print(report)
    if args.output_dir:
        write_json(args.output_dir / "corpus_prep.json", result)
        (args.output_dir / "corpus_prep.md").write_text(report + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
