"""Benchmark of a web-shaped Parquet corpus made into training rows: create_pretraining_data's document chunks (ours)
against the pipeline transformers' run_mlm users run (datasets + a fast tokenizer + group_texts), same input, same
tokenizer, same process count.

    flock /tmp/bert-bench.lock python -m benchmarks.corpus_pipeline [--megabytes 20] [--processes 1 2] [--scale 10]
        [--tokenizer bpe|wordpiece] [--output PREFIX]

The corpus is made here, nothing is downloaded: the paragraphs of --books (default tests/data/books, 25 KB, repeated;
../shared/data/books, 5 MB of real books, where a checkout has it beside), whitespace collapsed, drawn (seeded) into
documents of 1 to 12 paragraphs, each opened by its counter ("Document 123.") so that no two are the same, in
--processes' largest count of Parquet files of equal size (row groups of 1,000 rows) with the columns of a web
corpus: text, id, url, score. The tokenizer is a byte-level BPE tokenizer.json trained on the books
(vocab_training.train_bpe; up to --vocab_size tokens: 25 KB of text gives ~1,600), or with --tokenizer wordpiece
tests/data/vocab-uncased-excerpt.txt as a folder's vocab.txt.
- ours: create_shard(ShardConfig(..., document_chunks=True)) on each Parquet file, one shard a file, N processes
  each making its share of the shards, as N create_pretraining_data.py commands would;
- the peer: datasets.load_dataset("parquet", data_files=..., cache_dir=<temporary>), a batched map of the fast
  tokenizer (PreTrainedTokenizerFast of the same tokenizer.json, or BertTokenizerFast.from_pretrained of the
  vocab's folder) with return_special_tokens_mask as run_mlm calls it, remove_columns, then run_mlm's group_texts
  (batched map) at --seq: the rows run_mlm's trainer reads. num_proc is N (None at 1, run_mlm's default).
  run_mlm's 5 % validation split is not made: both pipelines take every document.
Each pipeline runs in processes of its own (RAYON_NUM_THREADS=1: one process is one core; HF_HOME inside the
temporary folder, offline). Reported per run: the seconds of the work inside the processes (after interpreter
start-up and imports; of the slowest process) and the wall seconds from launch to exit; the work's CPU seconds
(all its processes, the peer's reaped workers included); tokens per second per process (the documents' tokens,
special tokens not counted, over the work seconds and N) and per CPU second (which another load on the machine's
cores changes less); the peak of the process tree's summed RSS and summed PSS (psutil, every --interval s: PSS
splits the pages a forked worker shares with its parent, which the RSS sum counts twice) and the largest single
process's peak; the bytes on disk afterwards (the output, and everything else the run left: for the peer the
Arrow copy of the corpus and the tokenized Arrow files).
--scale: ours again on --scale times the text in --scale times the files of the same size, on the most processes:
the largest VmHWM of a worker there against the default size's. Goals (the corpus issue): ours >= 2x the peer's
tokens per second per process, <= half its peak memory, no second copy of the corpus on disk; the worker peak
at --scale x within 10 % of the default size's. The table and the goals go to stdout and to PREFIX.txt, every
figure to PREFIX.json (default benchmarks/results/corpus_pipeline/<date>).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from benchmarks.common import REPO, VOCAB_EXCERPT, benchmark_command, host_threads_line, status_bytes, write_json

if TYPE_CHECKING:  # imported where used: the parent process never loads datasets or transformers
    import datasets
    import transformers

BOOKS = REPO / "tests" / "data" / "books"
RESULTS = REPO / "benchmarks" / "results" / "corpus_pipeline"
SEQ = 512
ROW_GROUP_ROWS = 1000
BPE_VOCAB_SIZE = 4096  # tests/data/books are ~25 KB: the merges stop before this (min_frequency 2)
VERSIONS = ("pyarrow", "datasets", "transformers", "tokenizers", "h5py", "numpy", "blingfire", "psutil")


# --- the corpus ----------------------------------------------------------------------------------------------------

def book_paragraphs(folder: Path = BOOKS) -> list[str]:
    """The paragraphs (blank-line separated) of the books, each on one line with single spaces."""
    paragraphs = []
    for path in sorted(folder.glob("*.txt")):
        lines: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines() + [""]:
            if line.strip():
                lines.append(line)
            elif lines:
                paragraphs.append(" ".join(" ".join(lines).split()))
                lines = []
    return paragraphs


def documents(paragraphs: list[str], seed: int = 0) -> Iterator[dict]:
    """Endless web-shaped records: text of 1 to 12 consecutive paragraphs opened by the record's counter (single
    spaces, so that both pipelines tokenize the same string: ours collapses whitespace, the peer does not)."""
    rng = random.Random(seed)
    index = 0
    while True:
        start, count = rng.randrange(len(paragraphs)), rng.randint(1, 12)
        body = " ".join(paragraphs[(start + j) % len(paragraphs)] for j in range(count))
        yield {"text": f"Document {index}. {body}", "id": f"doc-{index:09d}",
               "url": f"https://example.org/books/{index}", "score": round(rng.random(), 4)}
        index += 1


def write_corpus(folder: Path, megabytes: float, files: int, seed: int = 0, books: Path = BOOKS) -> list[Path]:
    """`files` Parquet files of about megabytes / files MB of text each (UTF-8), row groups of ROW_GROUP_ROWS
    rows, written a row group at a time (a 10x corpus never sits in memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    records = documents(book_paragraphs(books), seed)
    per_file = megabytes * 1e6 / files
    paths = []
    for number in range(files):
        path = folder / f"part-{number:05d}.parquet"
        with pq.ParquetWriter(path, pa.schema([("text", pa.string()), ("id", pa.string()), ("url", pa.string()),
                                               ("score", pa.float64())])) as writer:
            size = 0
            while size < per_file:
                rows = []
                while size < per_file and len(rows) < ROW_GROUP_ROWS:
                    rows.append(next(records))
                    size += len(rows[-1]["text"].encode("utf-8"))
                writer.write_table(pa.Table.from_pylist(rows, schema=writer.schema))
        paths.append(path)
    return paths


def make_tokenizer(folder: Path, kind: str, books: Path = BOOKS, vocab_size: int = BPE_VOCAB_SIZE) -> Path:
    """A byte-level BPE tokenizer.json trained on the books' paragraphs, or the tracked WordPiece vocab excerpt
    copied as vocab.txt into a folder of its own (the folder a run_mlm user names)."""
    if kind == "wordpiece":
        (folder / "wordpiece").mkdir()
        return Path(shutil.copyfile(VOCAB_EXCERPT, folder / "wordpiece" / "vocab.txt"))
    from bertrecipe.dataprep.vocab_training import train_bpe

    text = folder / "books.txt"
    text.write_text("\n".join(book_paragraphs(books)) + "\n", encoding="utf-8")
    return train_bpe([text], folder / "tokenizer.json", vocab_size)


# --- the two pipelines, each run inside a child process ----------------------------------------------------------

def ours_work(inputs: list[Path], outputs: list[Path], tokenizer: Path, seq: int) -> dict:
    """create_pretraining_data's document chunks: one shard per input, one after the other in this process."""
    from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard

    started, cpu = time.perf_counter(), own_cpu_seconds()
    rows = documents_kept = 0
    for source, shard in zip(inputs, outputs, strict=True):
        result = create_shard(ShardConfig(source, shard, tokenizer, max_seq_length=seq, document_chunks=True,
                                          compression="none"), progress=False)
        rows += result.instances
        documents_kept += result.records.kept if result.records else 0
    return {"seconds": time.perf_counter() - started, "cpu_s": own_cpu_seconds() - cpu, "rows": rows,
            "documents": documents_kept}


def peer_tokenizer(tokenizer: Path) -> transformers.PreTrainedTokenizerBase:
    """The fast tokenizer a run_mlm user loads for the same file: PreTrainedTokenizerFast of a tokenizer.json, or
    BertTokenizerFast.from_pretrained of the folder of a vocab.txt (transformers 5 ignores a vocab_file argument:
    every token would be [UNK])."""
    import transformers

    if tokenizer.suffix == ".json":
        return transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), cls_token="[CLS]",
                                                    sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
                                                    mask_token="[MASK]")
    return transformers.BertTokenizerFast.from_pretrained(str(tokenizer.parent), do_lower_case=True)


def group_texts(examples: dict, seq: int = SEQ) -> dict:
    """run_mlm's group_texts: a batch's lists concatenated, the remainder under `seq` dropped, cut into rows."""
    joined = {key: [value for row in examples[key] for value in row] for key in examples}
    total = len(joined["input_ids"]) // seq * seq
    return {key: [values[i:i + seq] for i in range(0, total, seq)] for key, values in joined.items()}


def peer_work(inputs: list[Path], tokenizer: Path, seq: int, processes: int, cache: Path) -> dict:
    """run_mlm's data path on the files; the timed part ends with the grouped rows in the cache."""
    import datasets
    import pyarrow.compute as pc

    datasets.disable_progress_bars()
    fast = peer_tokenizer(tokenizer)
    num_proc = processes if processes > 1 else None
    started, cpu = time.perf_counter(), own_cpu_seconds()
    raw = datasets.load_dataset("parquet", data_files=[str(p) for p in inputs], split="train", cache_dir=str(cache))
    loaded = time.perf_counter()
    tokenized = raw.map(lambda batch: fast(batch["text"], return_special_tokens_mask=True), batched=True,
                        num_proc=num_proc, remove_columns=raw.column_names)
    mapped = time.perf_counter()
    grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc, fn_kwargs={"seq": seq})
    ended, cpu = time.perf_counter(), own_cpu_seconds() - cpu
    ids, special = tokenized.data.column("input_ids"), tokenized.data.column("special_tokens_mask")
    tokens = pc.sum(pc.list_value_length(ids)).as_py() - pc.sum(pc.list_flatten(special)).as_py()
    return {"seconds": ended - started, "cpu_s": cpu, "load_s": loaded - started, "tokenize_s": mapped - loaded,
            "group_s": ended - mapped, "rows": len(grouped), "documents": len(raw), "tokens": tokens,
            "files": {"corpus_copy": _cache_bytes(raw), "tokenized": _cache_bytes(tokenized),
                      "output": _cache_bytes(grouped)}}


def _cache_bytes(dataset: datasets.Dataset) -> int:
    return sum(Path(f["filename"]).stat().st_size for f in dataset.cache_files)


def child(args: argparse.Namespace) -> None:
    """One process of a pipeline: its figures and its own peak (VmHWM) as the last line of stdout."""
    inputs = [Path(p) for p in args.inputs]
    if args.child == "ours":
        figures = ours_work(inputs, [Path(p) for p in args.outputs], Path(args.tokenizer_file), args.seq)
    else:
        figures = peer_work(inputs, Path(args.tokenizer_file), args.seq, args.processes[0], Path(args.cache))
    print(json.dumps({**figures, "hwm": status_bytes("VmHWM")}), flush=True)


# --- measuring ------------------------------------------------------------------------------------------------------

@dataclass
class Tree:
    """What a set of processes (and their descendants) did: wall seconds, stdout's last lines, memory peaks."""

    wall_s: float
    outputs: list[dict]
    tree_rss: int  # peak of the summed RSS of every process of the tree
    tree_pss: int  # peak of the summed PSS
    process_rss: int  # the largest RSS one process reached (sampled)
    other_cores: float  # the machine's busy CPU time that was not the tree's nor this process's, over the wall time


def busy_seconds() -> float:
    """The machine's busy CPU seconds since boot, all cores (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that have been waited for (a finished
    tree's, whole; the peer's worker pools are reaped once a map ends): the work's cost whatever else the
    machine's cores were doing."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _sample(roots: list[int]) -> tuple[int, int, int]:
    """(summed RSS, summed PSS, largest RSS) of the living processes of the roots' trees, in bytes."""
    import psutil

    rss = pss = largest = 0
    for root in roots:
        try:
            parent = psutil.Process(root)
            members = [parent, *parent.children(recursive=True)]
        except psutil.Error:  # exited meanwhile
            continue
        for process in members:
            try:
                memory = process.memory_full_info()
            except psutil.Error:
                continue
            rss, pss, largest = rss + memory.rss, pss + memory.pss, max(largest, memory.rss)
    return rss, pss, largest


def run_tree(commands: list[list[str]], env: dict[str, str], logs: Path, interval: float) -> Tree:
    """Start the commands together, sample their trees' memory until all have exited; each one's last stdout line
    as JSON. A failed command raises with the end of its stderr."""
    logs.mkdir(parents=True, exist_ok=True)
    procs, files = [], []
    started, busy, own = time.perf_counter(), busy_seconds(), own_cpu_seconds()
    for number, command in enumerate(commands):
        out, err = open(logs / f"{number}.out", "w+"), open(logs / f"{number}.err", "w+")  # noqa: SIM115
        files += [out, err]
        procs.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True))
    peaks = [0, 0, 0]
    while any(p.poll() is None for p in procs):
        peaks = [max(a, b) for a, b in zip(peaks, _sample([p.pid for p in procs]), strict=True)]
        time.sleep(interval)
    wall = time.perf_counter() - started
    other = (busy_seconds() - busy) - (own_cpu_seconds() - own)
    for handle in files:
        handle.close()
    outputs = []
    for number, proc in enumerate(procs):
        if proc.returncode != 0:
            tail = (logs / f"{number}.err").read_text()[-3000:]
            raise RuntimeError(f"{' '.join(commands[number][:6])}... exited {proc.returncode}:\n{tail}")
        outputs.append(json.loads((logs / f"{number}.out").read_text().strip().splitlines()[-1]))
    return Tree(wall, outputs, *peaks, max(0.0, other) / wall)


def child_env(root: Path) -> dict[str, str]:
    """One tokenizer thread per process, datasets and transformers offline with their home in the scratch folder."""
    return {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HOME": str(root / "hf"),
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def shard_tokens(shards: list[Path]) -> int:
    """The documents' tokens in document-chunk shards: every unpadded position less each row's [CLS] and [SEP]."""
    import h5py
    import numpy as np

    tokens = 0
    for path in shards:
        with h5py.File(path, "r") as shard:
            for lo in range(0, len(shard["input_mask"]), 65536):
                mask = shard["input_mask"][lo:lo + 65536]
                tokens += int(np.count_nonzero(mask)) - 2 * len(mask)
    return tokens


@dataclass
class Row:
    """One pipeline at one process count."""

    pipeline: str
    processes: int
    documents: int
    tokens: int  # the documents' tokens, special tokens not counted
    rows: int  # the training rows made
    work_s: float  # inside the processes, after start-up and imports (the slowest process's)
    wall_s: float  # launch to exit
    cpu_s: float  # user + system CPU seconds of the work, all processes
    tree_rss: int
    tree_pss: int
    process_peak: int  # the largest process's peak: its own VmHWM where it reports one, else the sampled RSS
    output_bytes: int  # what training reads: our shards, the peer's grouped Arrow files
    other_bytes: int  # everything else the run left on disk
    corpus_copy_bytes: int  # of which a copy of the corpus (the peer's Arrow conversion)
    other_cores: float  # cores' worth of the machine's CPU busy with other work meanwhile
    stages: dict[str, float]

    @property
    def tokens_per_s_per_process(self) -> float:
        return self.tokens / self.work_s / self.processes

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s

    def record(self) -> dict:
        return {**asdict(self), "tokens_per_s_per_process": self.tokens_per_s_per_process,
                "tokens_per_cpu_s": self.tokens_per_cpu_s}


def run_ours(inputs: list[Path], tokenizer: Path, seq: int, processes: int, root: Path, interval: float,
             name: str = "ours") -> Row:
    """Ours on `processes` processes, each making the shards of its share of the files (as one command per file
    would, `processes` at a time); the shards removed once counted."""
    out = root / f"{name}-{processes}"
    out.mkdir(parents=True)
    commands = []
    for share in (inputs[i::processes] for i in range(processes)):
        commands.append(benchmark_command("corpus_pipeline", "--child", "ours", "--tokenizer_file", str(tokenizer),
                                          "--seq", str(seq), "--inputs", *map(str, share),
                                          "--outputs", *(str(out / f"{p.stem}.hdf5") for p in share)))
    tree = run_tree(commands, child_env(root), root / "logs" / out.name, interval)
    shards = sorted(out.glob("*.hdf5"))
    tokens, output = shard_tokens(shards), sum(p.stat().st_size for p in shards)
    other = folder_bytes(out) - output
    shutil.rmtree(out)
    done = tree.outputs
    return Row(pipeline=name, processes=processes, documents=sum(o["documents"] for o in done), tokens=tokens,
               rows=sum(o["rows"] for o in done), work_s=max(o["seconds"] for o in done), wall_s=tree.wall_s,
               cpu_s=sum(o["cpu_s"] for o in done), tree_rss=tree.tree_rss, tree_pss=tree.tree_pss,
               process_peak=max(tree.process_rss, *(o["hwm"] for o in done)), output_bytes=output,
               other_bytes=other, corpus_copy_bytes=0, other_cores=tree.other_cores, stages={})


def run_peer(inputs: list[Path], tokenizer: Path, seq: int, processes: int, root: Path, interval: float) -> Row:
    """run_mlm's path in a process of its own (its num_proc workers its children); its cache removed afterwards."""
    cache, home = root / f"peer-{processes}", root / "hf"
    command = benchmark_command("corpus_pipeline", "--child", "peer", "--tokenizer_file", str(tokenizer), "--seq",
                                str(seq), "--processes", str(processes), "--cache", str(cache),
                                "--inputs", *map(str, inputs))
    tree = run_tree([command], child_env(root), root / "logs" / cache.name, interval)
    done = tree.outputs[0]
    on_disk = folder_bytes(cache) + folder_bytes(home)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
    files = done["files"]
    return Row(pipeline="peer", processes=processes, documents=done["documents"], tokens=done["tokens"],
               rows=done["rows"], work_s=done["seconds"], wall_s=tree.wall_s, cpu_s=done["cpu_s"],
               tree_rss=tree.tree_rss, tree_pss=tree.tree_pss, process_peak=max(tree.process_rss, done["hwm"]),
               output_bytes=files["output"], other_bytes=on_disk - files["output"],
               corpus_copy_bytes=files["corpus_copy"], other_cores=tree.other_cores,
               stages={key: done[key] for key in ("load_s", "tokenize_s", "group_s")})


def benchmark(megabytes: float, process_counts: list[int], scale: int, seq: int, kind: str, root: Path,
              interval: float = 0.1, books: Path = BOOKS, vocab_size: int = BPE_VOCAB_SIZE) -> dict:
    """Both pipelines at each process count on one corpus; ours again on `scale` times the text (same file size,
    `scale` times the files) on the most processes, when scale > 1."""
    files = max(process_counts)
    inputs = write_corpus(root / "corpus", megabytes, files, books=books)
    tokenizer = make_tokenizer(root, kind, books, vocab_size)
    rows = []
    for processes in process_counts:
        rows.append(run_ours(inputs, tokenizer, seq, processes, root, interval))
        rows.append(run_peer(inputs, tokenizer, seq, processes, root, interval))
    result = {"megabytes": megabytes, "files": files, "parquet_bytes": sum(p.stat().st_size for p in inputs),
              "seq": seq, "tokenizer": kind, "books": str(books), "vocab_size": _vocab_size(tokenizer),
              "rows": [r.record() for r in rows]}
    if scale > 1:
        larger = write_corpus(root / "larger", megabytes * scale, files * scale, seed=1, books=books)
        scaled = run_ours(larger, tokenizer, seq, files, root, interval, name=f"ours-x{scale}")
        result.update(scale=scale, scaled=scaled.record(), scaled_parquet_bytes=sum(p.stat().st_size for p in larger))
        shutil.rmtree(root / "larger")
    return result


def _vocab_size(tokenizer: Path) -> int:
    from tokenizers import Tokenizer

    if tokenizer.suffix == ".json":
        return Tokenizer.from_file(str(tokenizer)).get_vocab_size()
    return len(tokenizer.read_text(encoding="utf-8").splitlines())


# --- the report -----------------------------------------------------------------------------------------------------

def header(result: dict) -> str:
    """The host (CPU, precision, torch, threads), the libraries, the date; then what the corpus was."""
    from bertrecipe.common.hardware import detect

    versions = ", ".join(f"{name} {metadata.version(name)}" for name in VERSIONS)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    books = result.get("books", str(BOOKS.relative_to(REPO)))
    corpus = (f"corpus: {result['megabytes']:g} MB of text ({books}' paragraphs drawn into documents), "
              f"{result['files']} Parquet file(s), {result['parquet_bytes'] / 1e6:.1f} MB on disk; seq "
              f"{result['seq']}; {result['tokenizer']} tokenizer of {result['vocab_size']:,} tokens; "
              "RAYON_NUM_THREADS=1 in every process")
    return f"{host_threads_line(detect(), 'no model runs')}; {os.cpu_count()} cores; {versions}; {when}\n{corpus}"


def table(rows: list[dict]) -> str:
    """A Markdown table of the runs (MB are 10^6 bytes; other load: the machine's CPU busy with anything but the run
    meanwhile, the kernel's writeback included, in cores)."""
    mb = 1e6
    lines = ["| pipeline | processes | documents | tokens | rows | work s | wall s | CPU s | tokens/s per process "
             "| tokens per CPU s | tree peak RSS MB | tree peak PSS MB | largest process MB | output MB "
             "| other files MB (corpus copy) | other load, cores |", "|---|" + "---:|" * 15]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['processes']} | {r['documents']:,} | {r['tokens']:,} | {r['rows']:,} | "
                     f"{r['work_s']:.1f} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     f"{r['tokens_per_s_per_process']:,.0f} | {r['tokens_per_cpu_s']:,.0f} | "
                     f"{r['tree_rss'] / mb:.0f} | {r['tree_pss'] / mb:.0f} | {r['process_peak'] / mb:.0f} | "
                     f"{r['output_bytes'] / mb:.1f} | {r['other_bytes'] / mb:.1f} "
                     f"({r['corpus_copy_bytes'] / mb:.1f}) | {r['other_cores']:.2f} |")
    return "\n".join(lines)


def comparison(ours: dict, peer: dict) -> str:
    """One process count's goals: speed, memory, disk."""
    speed = ours["tokens_per_s_per_process"] / peer["tokens_per_s_per_process"]
    cpu = ours["tokens_per_cpu_s"] / peer["tokens_per_cpu_s"]
    return (f"{ours['processes']} process(es): tokens/s per process {speed:.2f}x the peer's, per CPU second "
            f"{cpu:.2f}x (goal >= 2x); peak tree RSS {ours['tree_rss'] / peer['tree_rss']:.2f} of the peer's, PSS "
            f"{ours['tree_pss'] / peer['tree_pss']:.2f} (goal <= 0.5); beyond the output ours left "
            f"{ours['other_bytes']:,} bytes, the peer {peer['other_bytes'] / 1e6:.1f} MB, of which "
            f"{peer['corpus_copy_bytes'] / 1e6:.1f} MB an Arrow copy of the corpus (goal: no second copy)")


def scaling(result: dict, small: dict) -> str:
    """The worker peak at scale x the text against the default size's, and what it measures."""
    large, scale, files = result["scaled"], result["scale"], result["files"]
    change = large["process_peak"] / small["process_peak"] - 1
    return (f"ours on {scale}x the text ({large['documents']:,} documents in {files * scale} files of the same size, "
            f"{files} process(es) each making one shard a file in turn): largest process peak "
            f"{large['process_peak'] / 1e6:.0f} MB against {small['process_peak'] / 1e6:.0f} MB at 1x, "
            f"{change:+.1%} (goal within 10 %). Measured: the whole create_shard per process (read, tokenize, "
            "chunk, write), which holds one shard's text and tokens; bounded because the shards keep their size, "
            "not because a file of any size is streamed")


def goals(result: dict) -> str:
    """Each goal of the issue against the figures (reported, never asserted)."""
    by = {(r["pipeline"], r["processes"]): r for r in result["rows"]}
    lines = [comparison(by[("ours", n)], by[("peer", n)]) for n in sorted({r["processes"] for r in result["rows"]})]
    if "scaled" in result:
        lines.append(scaling(result, by[("ours", result["files"])]))
    return "\n".join(lines)


def report(result: dict) -> str:
    rows = result["rows"] + ([result["scaled"]] if "scaled" in result else [])
    return f"{header(result)}\n\n{table(rows)}\n\n{goals(result)}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.corpus_pipeline", description=__doc__.split("\n")[0])
    p.add_argument("--megabytes", type=float, default=20.0, help="text of the generated corpus (default 20 MB)")
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="process counts (default 1 2)")
    p.add_argument("--scale", type=int, default=10, help="ours again on this many times the text (1: not run)")
    p.add_argument("--seq", type=int, default=SEQ, help=f"max_seq_length (default {SEQ})")
    p.add_argument("--tokenizer", choices=("bpe", "wordpiece"), default="bpe")
    p.add_argument("--books", type=Path, default=BOOKS,
                   help="the .txt books the corpus and the BPE tokenizer are made of (default tests/data/books, 25 "
                        "KB, repeated into the corpus; ../shared/data/books has 5 MB of real, varied text)")
    p.add_argument("--vocab_size", type=int, default=BPE_VOCAB_SIZE,
                   help=f"tokens of the BPE tokenizer trained on the books (default {BPE_VOCAB_SIZE})")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between memory samples")
    p.add_argument("--work_dir", type=Path, help="where the scratch folder goes (default: the system's temporary)")
    p.add_argument("--output", type=Path, help="write OUTPUT.txt and OUTPUT.json (default "
                                               "benchmarks/results/corpus_pipeline/<date>)")
    p.add_argument("--child", choices=("ours", "peer"), help=argparse.SUPPRESS)
    for hidden in ("--inputs", "--outputs"):
        p.add_argument(hidden, nargs="+", help=argparse.SUPPRESS)
    for hidden in ("--tokenizer_file", "--cache"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix="corpus_pipeline_") as scratch:
        result = benchmark(args.megabytes, args.processes, args.scale, args.seq, args.tokenizer, Path(scratch),
                           args.interval, args.books, args.vocab_size)
    text = report(result)
    print(text)
    output = args.output or RESULTS / time.strftime("%Y-%m-%d", time.gmtime())
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    write_json(output.with_suffix(".json"), {"host": text.splitlines()[0], **result})


if __name__ == "__main__":
    main()
