"""Benchmark of create_pretraining_data on ../shared/data/books (dupe_factor 5, max_seq_length 128).

    flock /tmp/bert-bench.lock python -m benchmarks.data_prep [--segmenters]

Prints, per HDF5 compression (none is the default): MB of raw text per second per process, instances per second
and peak memory of one process making one shard of all the books, then the speed-up of 2 processes over 1 on
two half-shards.
Each run is a fresh process with one tokenizer thread (RAYON_NUM_THREADS=1), timed inside create_shard (the
~0.5 s of interpreter start-up and imports is reported separately). Google's reference builds instances at
0.27 MB/s on this machine (issue 4); the goal is 5.4 MB/s per process.
--segmenters also compares the sentence segmenters on the Wikipedia sample (quality and speed); the candidates
besides blingfire come from benchmarks/requirements.txt.
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

from benchmarks.common import SHARED, SHARED_VOCAB
from bertrecipe.common.hardware import detect, host_line

GOOGLE_MB_S = 0.27

CHILD = """
import json, resource, sys, time
from pathlib import Path
from bertrecipe.dataprep.create_pretraining_data import ShardConfig, create_shard
cfg = ShardConfig(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), True, 128, 20, 0.15, 0.1, 5, 12345,
                  compression=sys.argv[4])
r = create_shard(cfg, progress=False)
print(json.dumps({"seconds": r.seconds, "instances": r.instances, "bytes": r.input_bytes,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def prepare_inputs(folder: Path) -> tuple[Path, list[Path]]:
    """The books as create_pretraining_data input (one sentence a line, a book per document): all, and halves."""
    from bertrecipe.dataprep.sharding import split_sentences
    from bertrecipe.dataprep.text_formatting import book_text

    books = []
    for path in sorted((SHARED / "books").glob("*.txt")):
        books.append("\n".join(split_sentences(book_text(path))) + "\n\n")
    everything = folder / "books.txt"
    everything.write_text("".join(books), encoding="utf-8")
    halves: list[list[str]] = [[], []]
    for book in sorted(books, key=len, reverse=True):  # greedy balance by size
        min(halves, key=lambda h: sum(map(len, h))).append(book)
    paths = []
    for i, half in enumerate(halves):
        paths.append(folder / f"half_{i}.txt")
        paths[-1].write_text("".join(half), encoding="utf-8")
    return everything, paths


def launch(text: Path, out: Path, vocab: Path, compression: str) -> subprocess.Popen:
    env = {**os.environ, "RAYON_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(text), str(out), str(vocab),
                             compression], stdout=subprocess.PIPE, text=True, env=env)


def result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed with status {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def run_benchmark(repeats: int) -> None:
    vocab = SHARED_VOCAB
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        everything, halves = prepare_inputs(folder)
        mb = everything.stat().st_size / 1e6
        print(f"input: {mb:.2f} MB of text (10 books, one sentence a line), dupe_factor 5, max_seq_length 128")
        for compression in ("none", "lzf", "gzip"):  # none is the default
            runs = []
            for _ in range(repeats):
                started = time.perf_counter()
                r = result(launch(everything, folder / "all.hdf5", vocab, compression))
                r["wall"] = time.perf_counter() - started
                runs.append(r)
            best = min(runs, key=lambda r: r["seconds"])
            size = (folder / "all.hdf5").stat().st_size / 1e6
            rate = mb / best["seconds"]
            print(f"[{compression:4s}] 1 process: {rate:.2f} MB/s ({rate / GOOGLE_MB_S:.1f}x "
                  f"Google's 0.27), {best['instances'] / best['seconds']:,.0f} instances/s, {best['instances']} "
                  f"instances in {best['seconds']:.2f} s (+{best['wall'] - best['seconds']:.2f} s start-up), "
                  f"peak RSS {best['peak_mb']:.0f} MB, shard {size:.0f} MB")
        for compression in ("none",):
            started = time.perf_counter()
            for i, half in enumerate(halves):
                result(launch(half, folder / f"seq_{i}.hdf5", vocab, compression))
            sequential = time.perf_counter() - started
            started = time.perf_counter()
            procs = [launch(half, folder / f"par_{i}.hdf5", vocab, compression) for i, half in enumerate(halves)]
            peaks = [result(p)["peak_mb"] for p in procs]
            parallel = time.perf_counter() - started
            print(f"[{compression:4s}] 2 half-shards: 1 process {sequential:.2f} s, 2 processes {parallel:.2f} s, "
                  f"speed-up {sequential / parallel:.2f}x (peak RSS per process {max(peaks):.0f} MB; the machine "
                  f"has {os.cpu_count()} cores, shared)")


GOLD = [
    ["Dr. Smith went to Washington, D.C. on Monday.", "He arrived at 3 p.m. and left soon after."],
    ["The U.S. economy grew by 3.5 percent in 2019.", "Growth slowed in 2020."],
    ["J. R. R. Tolkien wrote The Hobbit.", "It was published in 1937."],
    ["She said, \"I will come.\"", "Then she left."],
    ["Prices rose, e.g. for bread and milk.", "Wages did not."],
    ["Is this true?", "Nobody knows!", "We will see."],
    ["The company (Acme Inc.) was founded by Mr. Jones.", "It employs 500 people."],
    ["It weighed approx. 5 kg.", "That is heavy."],
    ["Mt. Everest is 8,848 m high.", "Many have climbed it."],
    ["He was born in St. Louis, Mo., in 1900.", "He died in 1980."],
    ["The vote was 5 vs. 4.", "The motion passed."],
    ["See Fig. 3 for details.", "The data are clear."],
    ["The population was 12,345 at the 2010 census.", "The town is in Ohio."],
    ["He left... and never returned.", "His family waited."],
    ["Albert Einstein (1879–1955) was a physicist.", "He developed relativity."],
    ["The film grossed $1.2 billion worldwide.", "It won three awards."],
    ["In 1066 A.D. the Normans invaded.", "England changed forever."],
    ["Gen. Lee surrendered at Appomattox.", "The war ended soon after."],
]


def _segmenters() -> dict:
    found = {}
    try:
        import blingfire
        found["blingfire"] = lambda t: [s for s in blingfire.text_to_sentences(t).split("\n") if s.strip()]
    except ImportError:
        pass
    try:
        import syntok.segmenter as syntok_segmenter
        found["syntok"] = lambda t: ["".join(tok.spacing + tok.value for tok in sent).strip()
                                     for para in syntok_segmenter.analyze(t) for sent in para]
    except ImportError:
        pass
    try:
        import sentencex
        found["sentencex"] = lambda t: [s.strip() for s in sentencex.segment("en", t) if s.strip()]
    except ImportError:
        pass
    try:
        import pysbd
        seg = pysbd.Segmenter(language="en", clean=False)
        found["pysbd"] = lambda t: [s.strip() for s in seg.segment(t) if s.strip()]
    except ImportError:
        pass
    return found


def compare_segmenters() -> None:
    """Accuracy on hand-labelled hard cases, agreement with syntok on 30 articles, speed on the wiki sample."""
    from bertrecipe.dataprep.text_formatting import wiki_articles

    articles = list(wiki_articles(SHARED / "wiki" / "enwiki-sample-pages-articles.xml.bz2"))
    mb = sum(len(a.encode()) for a in articles) / 1e6
    found = _segmenters()

    def boundaries(sentences: list[str]) -> set[int]:
        out, pos = set(), 0
        for s in sentences:
            pos += len("".join(s.split()))
            out.add(pos)
        return out

    sample = articles[::3][:30]
    reference = [boundaries(found["syntok"](a)) for a in sample] if "syntok" in found else None
    for name, segment in found.items():
        correct = sum(1 for g in GOLD if [s.strip() for s in segment(" ".join(g))] == g)
        texts = articles if name != "pysbd" else articles[:10]  # pysbd is ~500x slower: time a slice
        started = time.perf_counter()
        for a in texts:
            segment(a)
        speed = sum(len(a.encode()) for a in texts) / 1e6 / (time.perf_counter() - started)
        agreement = ""
        if reference is not None:
            tp = fp = fn = 0
            for a, ref in zip(sample, reference, strict=True):
                got = boundaries(segment(a))
                tp, fp, fn = tp + len(got & ref), fp + len(got - ref), fn + len(ref - got)
            agreement = f", boundaries vs syntok P {tp / (tp + fp):.3f} R {tp / (tp + fn):.3f}"
        print(f"{name:10s} hard cases {correct}/{len(GOLD)}{agreement}, {speed:.2f} MB/s ({mb:.1f} MB sample)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=2, help="runs per setting; the fastest is reported")
    p.add_argument("--segmenters", action="store_true", help="also compare sentence segmenters")
    args = p.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"error: {SHARED}: shared data not found (set BERT_SHARED_DATA)")
    print(host_line(detect(), "no model runs"), flush=True)
    run_benchmark(args.repeats)
    if args.segmenters:
        compare_segmenters()


if __name__ == "__main__":
    main()
