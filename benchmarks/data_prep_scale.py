"""Benchmark of the whole data-prep chain at corpus scale: bertPrep.py text_formatting -> sharding -> create_hdf5_files.

    flock /tmp/bert-bench.lock python -m benchmarks.data_prep_scale                  # 0.5 GB, 1 and 2 processes
    flock /tmp/bert-bench.lock python -m benchmarks.data_prep_scale --size_gb 0.5 2  # the issue's comparison

A corpus of --size_gb GB of text is generated from the embedded default corpus (data/default_corpus.py) and, when
present, the books of ../shared/data/books: their text is cut into ~2 KB pieces at sentence ends and documents of
--doc_kb KB are drawn from them at random (seeded), each written as a book under download/bookscorpus/ of a
temporary $BERT_PREP_WORKING_DIR, so that `--dataset bookscorpus` reads it. Each stage then runs as its own
`python data/bertPrep.py` process (RAYON_NUM_THREADS=1: one process is one core), --n_training_shards 4096 by
default, seq 128, 20 predictions, dupe factor 5, no compression, the vocab of ../shared/data/minilm.

Per stage: seconds, MB/s per process (MB of uncompressed generated text over seconds over the processes the stage
runs; every stage runs at each --n_processes, its tasks spread over that many processes), peak
RSS of the process tree (sum of VmRSS over the stage process and its descendants, sampled every --interval s), the
largest VmHWM seen among its processes (exec resets VmHWM; ru_maxrss would count this benchmark's own memory,
which Linux carries over fork and exec into every child), and the peak of open files
of the tree (sampled from /proc/<pid>/fd). The single-shard reference is create_pretraining_data on one text shard
of --reference_mb MB cut from the same sharded text, timed inside create_shard like benchmarks/data_prep.py (the
median of 3 runs). CPU seconds per stage: those of the process tree (rusage) and the machine's other busy CPU time
meanwhile (/proc/stat), which is mostly the kernel writing the shards back and reclaiming the page cache.
Goals (issue 14): peak RSS independent of corpus size (smallest vs largest --size_gb within 10 %), create_hdf5_files
per process within 10 % of the single-shard figure, every stage linear in processes. Linear needs free cores: just
before each stage's runs, a control times the stages' computation in memory (sentence splitting and tokenizing, no
file written) on one process, then on the most --n_processes at once, --ceiling_rounds times, and prints the
speed-up this machine gave to work with no serial part at all.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from benchmarks.common import REPO, SHARED, SHARED_VOCAB, middle, write_json
from bertrecipe.common.hardware import detect, host_line

BERT_PREP = REPO / "data" / "bertPrep.py"
DATASET = "bookscorpus"  # the only text corpus bertPrep formats from plain files
PAGE = os.sysconf("SC_PAGE_SIZE")
INSTANCE_ARGS = ["--do_lower_case", "1", "--max_seq_length", "128", "--max_predictions_per_seq", "20",
                 "--dupe_factor", "5", "--compression", "none"]

REFERENCE = """
import json, sys
from pathlib import Path
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard
cfg = ShardConfig(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), True, 128, 20, 0.15, 0.1, 5, 12345)
r = create_shard(cfg, progress=False)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec, so it would count the benchmark's memory at fork
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": r.seconds, "bytes": r.input_bytes, "peak_mb": hwm / 1024}))
"""


@dataclass
class Stage:
    name: str
    processes: int
    seconds: float
    tree_rss_mb: float  # peak of the summed RSS of the process tree
    process_rss_mb: float  # peak of the largest single process
    open_files: int  # peak of the open files of the tree
    tree_cpu_s: float  # user + system CPU seconds of the tree (wait4's rusage)
    tree_sys_s: float  # of which system
    outside_cpu_s: float  # the machine's busy CPU seconds less the tree's: kernel threads (writeback, reclaim), others


# ---- the generated corpus

def source_pieces(books: Path | None, piece_bytes: int = 2048) -> list[str]:
    """The source text cut into pieces of about piece_bytes at sentence ends (". "), so that documents drawn
    from them are shuffled text rather than the same articles repeated."""
    from bertrecipe.dataprep.default_corpus import articles
    from bertrecipe.dataprep.text_formatting import book_text

    texts = list(articles())
    if books is not None:
        texts += [book_text(p) for p in sorted(books.glob("*.txt"))]
    pieces = []
    for text in texts:
        start = 0
        while start < len(text):
            end = text.find(". ", start + piece_bytes)
            end = len(text) if end < 0 else end + 1
            pieces.append(text[start:end].strip())
            start = end + 1
    return [p for p in pieces if p]


def generate_corpus(folder: Path, size_bytes: int, doc_bytes: int, pieces: list[str], seed: int) -> int:
    """Books of about doc_bytes drawn at random from the pieces until size_bytes are written; their bytes."""
    rng = random.Random(seed)
    written = index = 0
    while written < size_bytes:
        parts, doc = [], 0
        while doc < doc_bytes:
            parts.append(rng.choice(pieces))
            doc += len(parts[-1]) + 1
        data = " ".join(parts).encode("utf-8") + b"\n"
        sub = folder / f"{index // 1000:04d}"  # a thousand books a folder
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"book_{index:07d}.txt").write_bytes(data)
        written += len(data)
        index += 1
    return written


# ---- sampling the process tree

def tree(root: int) -> list[int]:
    """root and its living descendants (from each process's parent in /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def sample(pids: list[int]) -> tuple[int, int, int]:
    """(summed RSS bytes, summed open files, the largest VmHWM in bytes) of the pids that still exist."""
    rss = fds = hwm = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                rss += int(f.read().split()[1]) * PAGE
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            with open(f"/proc/{pid}/status") as f:
                hwm = max(hwm, next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")))
        except (OSError, StopIteration):
            continue
    return rss, fds, hwm


class TreeSampler(threading.Thread):
    """Peak RSS and open files of a process tree, sampled until stop()."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root, self.interval, self.done = root, interval, threading.Event()
        self.peak_rss = self.peak_fds = self.peak_process = 0

    def run(self) -> None:
        while not self.done.is_set():
            rss, fds, hwm = sample(tree(self.root))
            self.peak_rss, self.peak_fds = max(self.peak_rss, rss), max(self.peak_fds, fds)
            self.peak_process = max(self.peak_process, hwm)
            self.done.wait(self.interval)

    def stop(self) -> None:
        self.done.set()
        self.join()


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def run_stage(name: str, argv: list[str], env: dict, log: Path, processes: int, interval: float) -> Stage:
    """One bertPrep.py process, timed on the wall clock, its tree sampled while it runs."""
    with open(log, "a") as out:
        busy_before = machine_busy_seconds()
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(BERT_PREP), *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO)
        sampler = TreeSampler(proc.pid, interval)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)  # rusage of this stage alone, not of all children so far
        seconds = time.perf_counter() - started
        busy = machine_busy_seconds() - busy_before
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"bertPrep.py {' '.join(argv)} failed with status {proc.returncode}:\n{tail}")
    tree_cpu = usage.ru_utime + usage.ru_stime
    return Stage(name, processes, seconds, sampler.peak_rss / 2**20, sampler.peak_process / 2**20, sampler.peak_fds,
                 tree_cpu, usage.ru_stime, busy - tree_cpu)


# ---- what the machine allows: the stages' own computation, in memory, on 1 and on 2 processes at once

KERNEL = """
import sys, time, blingfire
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
tokenizer = BertTokenizer(load_vocab(sys.argv[2]), True)
text = open(sys.argv[1], encoding="utf-8").read()
started = time.perf_counter()
for _ in range(3):
    sentences = blingfire.text_to_sentences(text)  # sharding's computation
    tokenizer.encode_text(sentences)  # the first step of create_hdf5_files'
print(time.perf_counter() - started)
"""


def ceiling(pieces: list[str], vocab: Path, rounds: int, tmp: Path | None, processes: int) -> list[float]:
    """1 -> `processes` speed-ups of the same in-memory computation (no file written): each round times one
    process alone, then `processes` at once, each doing the same work. With that many free cores it is linear;
    what it falls short by (shared caches and memory bandwidth, neighbours on a virtual machine) no code of the
    stages can win back."""
    speedups = []
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", dir=tmp) as f:
        f.write(" ".join(pieces[:1500]))  # ~3 MB
        f.flush()
        argv = [sys.executable, "-c", KERNEL, f.name, str(vocab)]
        env = {**os.environ, "RAYON_NUM_THREADS": "1"}  # one process is one core, as in the stages
        for _ in range(rounds):
            alone = float(subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout)
            group = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) for _ in range(processes)]
            together = max(float(proc.communicate()[0]) for proc in group)
            speedups.append(processes * alone / together)
    return speedups


def measure_ceiling(name: str, args: argparse.Namespace, pieces: list[str], vocab: Path,
                    ceilings: dict[str, list[float]]) -> None:
    """The machine ceiling just before a stage's runs (the host's state drifts), into ceilings[name]."""
    if args.ceiling_rounds and len(args.n_processes) > 1:
        n = max(args.n_processes)
        ceilings[name] = speedups = ceiling(pieces, vocab, args.ceiling_rounds, args.tmp, n)
        print(f"  machine ceiling before {name}: the stages' computation in memory, 1 -> {n} processes: median "
              f"{statistics.median(speedups):.2f}x, range {min(speedups):.2f}-{max(speedups):.2f}x over "
              f"{len(speedups)} rounds", flush=True)


# ---- one corpus size

def reference(text_dir: Path, work: Path, vocab: Path, megabytes: float, env: dict, rounds: int = 3) -> dict:
    """create_pretraining_data on one text shard of about `megabytes` MB made of the first training shards: the
    median of `rounds` runs."""
    shard = work / "reference.txt"
    with open(shard, "wb") as out:
        for path in sorted(text_dir.glob(f"{DATASET}_training_*.txt"), key=lambda p: int(p.stem.rsplit("_", 1)[1])):
            out.write(path.read_bytes())
            if out.tell() >= megabytes * 1e6:
                break
    runs = []
    for _ in range(rounds):  # a single run of ~4 s varies by up to 7 %: the median of a few
        done = subprocess.run([sys.executable, "-c", REFERENCE, str(shard),
                               str(work / "reference.hdf5"), str(vocab)], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"single-shard reference failed:\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for path in (shard, work / "reference.hdf5"):
        path.unlink()
    return middle(runs, key=lambda r: r["seconds"])


def run_size(size_gb: float, args: argparse.Namespace, pieces: list[str], vocab: Path
             ) -> tuple[float, list, dict, dict]:
    """Generate, format and shard once; create_hdf5_files at each process count. (text MB, stages, reference,
    machine ceilings before each stage)"""
    with tempfile.TemporaryDirectory(prefix="data_prep_scale_", dir=args.tmp) as tmp:
        work = Path(tmp)
        env = {**os.environ, "BERT_PREP_WORKING_DIR": str(work), "RAYON_NUM_THREADS": "1"}
        books = work / "download" / DATASET
        started = time.perf_counter()
        mb = generate_corpus(books, int(size_gb * 1e9), args.doc_kb * 1024, pieces, args.seed) / 1e6
        print(f"\n{size_gb:g} GB: generated {mb:,.0f} MB of text in {time.perf_counter() - started:.0f} s",
              flush=True)
        shards = ["--n_training_shards", str(args.n_training_shards), "--n_test_shards", str(args.n_test_shards)]
        common = ["--dataset", DATASET, *shards]
        log = work / "bertPrep.log"
        stages, ceilings = [], {}
        for action in ("text_formatting", "sharding"):  # each at every process count (the output is the same)
            measure_ceiling(action, args, pieces, vocab, ceilings)
            for n in args.n_processes:
                argv = ["--action", action, *common, "--n_processes", str(n)]
                stages.append(run_stage(action, argv, env, log, n, args.interval))
                show(mb, stages[-1:])
            if action == "text_formatting":
                shutil.rmtree(books)  # the formatted text holds it all now; frees the disk for the shards
        text_dir = next((work).glob("sharded_*")) / DATASET
        ref = reference(text_dir, work, vocab, args.reference_mb, env)
        print(f"  single-shard reference: {ref['bytes'] / 1e6 / ref['seconds']:.2f} MB/s on "
              f"{ref['bytes'] / 1e6:.1f} MB, peak RSS {ref['peak_mb']:.0f} MB", flush=True)
        measure_ceiling("create_hdf5_files", args, pieces, vocab, ceilings)
        for n in args.n_processes:
            hdf5 = ["--action", "create_hdf5_files", *common, *INSTANCE_ARGS, "--vocab_file", str(vocab),
                    "--n_processes", str(n)]
            stages.append(run_stage("create_hdf5_files", hdf5, env, log, n, args.interval))
            show(mb, stages[-1:])
            for folder in work.glob("hdf5_*"):  # ~12 MB of shards per MB of text: gone before the next run
                shutil.rmtree(folder)
    return mb, stages, ref, ceilings


def show(mb: float, stages: list[Stage]) -> None:
    for s in stages:
        print(f"  {s.name:17s} {s.processes} proc: {s.seconds:7.1f} s, {mb / s.seconds / s.processes:6.2f} MB/s "
              f"per process, peak RSS tree {s.tree_rss_mb:5.0f} MB (largest process {s.process_rss_mb:4.0f} MB), "
              f"peak open files {s.open_files}; CPU {s.tree_cpu_s:.1f} s in the tree ({s.tree_sys_s:.1f} s system), "
              f"{s.outside_cpu_s:.1f} s outside it", flush=True)


def show_totals(mb: float, stages: list[Stage]) -> None:
    """The chain per process count: formatting + sharding + create_hdf5_files at that count."""
    for n in sorted({s.processes for s in stages}):
        chain = [s for s in stages if s.processes == n]
        seconds = sum(s.seconds for s in chain)
        print(f"  whole chain at {n} proc: {seconds:7.1f} s, {mb / seconds:6.2f} MB/s end to end, "
              f"peak RSS tree {max(s.tree_rss_mb for s in chain):.0f} MB, peak open files "
              f"{max(s.open_files for s in chain)}")


def verdict(ok: bool) -> str:
    return "holds" if ok else "NOT met"


def show_goals(results: dict[float, tuple[float, list[Stage], dict, dict]]) -> None:
    """The issue's three goals, judged on the smallest and largest sizes of this run."""
    small, large = min(results), max(results)
    print("\ngoals:")
    if small != large:
        for a, b in zip(results[small][1], results[large][1], strict=True):
            ratio = b.tree_rss_mb / a.tree_rss_mb
            print(f"  peak RSS {a.name} ({a.processes} proc): {a.tree_rss_mb:.0f} MB at {small:g} GB, "
                  f"{b.tree_rss_mb:.0f} MB at {large:g} GB, {ratio:.3f}x: {verdict(abs(ratio - 1) <= 0.10)}")
    for size, (mb, stages, ref, ceilings) in sorted(results.items()):
        single = ref["bytes"] / 1e6 / ref["seconds"]
        hdf5 = {s.processes: s for s in stages if s.name == "create_hdf5_files"}
        for n, s in sorted(hdf5.items()):
            per = mb / s.seconds / n
            print(f"  {size:g} GB create_hdf5_files {n} proc: {per:.2f} MB/s per process = {per / single:.3f}x "
                  f"the single shard's {single:.2f} MB/s: {verdict(per >= 0.9 * single)}")
        for name in ("text_formatting", "sharding", "create_hdf5_files"):
            runs = {s.processes: s for s in stages if s.name == name}
            if 1 in runs and len(runs) > 1:
                n = max(runs)
                speedup = runs[1].seconds / runs[n].seconds
                limit = (f"; the machine gave {statistics.median(ceilings[name]):.2f}x just before"
                         if name in ceilings else "")
                print(f"  {size:g} GB {name} 1 -> {n} processes: {speedup:.2f}x ({speedup / n:.0%} of linear; "
                      f"{os.cpu_count()} cores{limit}): {verdict(speedup / n >= 0.9)}")


def header(vocab: Path, books: Path | None, args: argparse.Namespace) -> None:
    versions = ", ".join(f"{m} {metadata.version(m)}" for m in ("numpy", "h5py", "blingfire", "tokenizers"))
    print(f"{host_line(detect(), 'no model runs')}; {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{versions}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"corpus: default corpus{' + ' + str(books) if books else ''}, documents of {args.doc_kb} KB; "
          f"{args.n_training_shards} training + {args.n_test_shards} test shards; seq 128, 20 predictions, "
          f"dupe factor 5, no compression; vocab {vocab}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size_gb", type=float, nargs="+", default=[0.5], help="corpus sizes in GB (1e9 bytes)")
    p.add_argument("--n_processes", type=int, nargs="+", default=[1, 2], help="process counts of every stage")
    p.add_argument("--n_training_shards", type=int, default=4096)
    p.add_argument("--n_test_shards", type=int, default=256)
    p.add_argument("--doc_kb", type=int, default=32, help="size of a generated document (one book = one article)")
    p.add_argument("--reference_mb", type=float, default=32.0, help="text of the single-shard reference")
    p.add_argument("--vocab_file", type=Path, default=SHARED_VOCAB)
    p.add_argument("--no_books", action="store_true", help="the default corpus only, even if the books are there")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between samples of the process tree")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--tmp", type=Path, default=None, help="where the working folder goes (default: $TMPDIR)")
    p.add_argument("--ceiling_rounds", type=int, default=5,
                   help="rounds of the machine-ceiling control before each stage (0: none)")
    p.add_argument("--json", type=Path, help="also write each size's stages and single-shard reference here")
    args = p.parse_args()
    if not args.vocab_file.is_file():
        raise SystemExit(f"error: {args.vocab_file}: vocab not found (pass --vocab_file or set BERT_SHARED_DATA)")
    books = None if args.no_books or not (SHARED / "books").is_dir() else SHARED / "books"
    header(args.vocab_file, books, args)
    pieces = source_pieces(books)
    print(f"source: {len(pieces):,} pieces, {sum(map(len, pieces)) / 1e6:.1f} MB")
    results = {}
    for size in args.size_gb:
        results[size] = run_size(size, args, pieces, args.vocab_file)
        show_totals(results[size][0], results[size][1])
    show_goals(results)
    if args.json:
        write_json(args.json, [{"size_gb": size, "text_mb": mb, "stages": [asdict(s) for s in stages],
                                "reference": ref} for size, (mb, stages, ref, _) in results.items()])


if __name__ == "__main__":
    main()
