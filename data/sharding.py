"""Formatted text (one article per line) -> training and test text shards of one sentence per line.

Streams: articles are read, segmented into sentences and written one at a time, so memory does not grow
with the corpus (NVIDIA's holds every article in RAM). Balancing is greedy: each article goes to the shard of
its split with the fewest sentences so far, which keeps shards within one article of each other. One pass
over the lines, so it always terminates.

Open files stay bounded, whatever the shard count (thousands of shards used to hit the open-file limit): up to
FAN_OUT shards are written directly; beyond that the articles are first spilled, in order, into at most
FAN_OUT anonymous temporary files beside the shards (each holding a contiguous range of shards), and each spill
is then written out the same way: 4,096 shards hold about 130 files open at once. A shard's articles keep
their order, so the output is the bytes of writing every shard at once; the cost is one more sequential write
and read of the text, and as much free space again while it runs (the spills vanish when closed, and with the
process if it is killed).

Segmentation, the costly part, is split into tasks for data/engine.py (local processes or Dask workers): each
task takes the articles that start in one SEGMENT_BYTES range of a formatted file and writes them, split into
sentences, to a part file in a scratch folder beside the shards. This process then reads the parts in order,
balances and writes the shards: the output is the same bytes whatever the engine and worker count, and needs
as much free space again for the parts while it runs.

Sentence segmenter: blingfire, chosen over pysbd, syntok and sentencex on the Wikipedia sample (see the report
in benchmarks/data_prep.py --segmenters): as accurate as syntok on hand-labelled hard cases (abbreviations,
initials, decimals) at ~25x its speed, and needs no model download.
"""
from __future__ import annotations

import heapq
import math
import os
import struct
import tempfile
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Sequence

import blingfire

from bertrecipe.atomic_files import atomic_output, remove_stale_temporaries_of, scratch_folder

from .engine import Runner, in_order
from .errors import DataError
from .layout import SPLITS
from .outputs import refuse_input_as_output

FAN_OUT = 128  # most shards, or spill files, written at once by one level (at least 2)
_RECORD = struct.Struct("<IQ")  # an article: shard index within a spill (or sentences in a part), byte length
SEGMENT_BYTES = 64 << 20  # formatted text segmented by one task


@dataclass(frozen=True)
class ShardingConfig:
    inputs: tuple[Path, ...]  # formatted files: one article per line, blank lines ignored
    output_dir: Path  # shards go to <output_dir>/<corpus>_<split>_<i>.txt
    corpus: str
    n_training_shards: int
    n_test_shards: int
    fraction_test_set: float


@dataclass(frozen=True)
class ShardingResult:
    articles: int
    sentences: dict[str, list[int]]  # split -> sentences per shard
    paths: dict[str, list[Path]]


def split_sentences(article: str) -> list[str]:
    """Sentences of one article (blingfire), stripped, empty ones dropped."""
    return [s.strip() for s in blingfire.text_to_sentences(article).split("\n") if s.strip()]


def segment_tasks(paths: Sequence[Path]) -> list[tuple[str, int, int]]:
    """(file, first byte, end byte) of each segmentation task, in corpus order."""
    tasks = []
    for path in paths:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DataError(path, "formatted text not found (run --action text_formatting first)") from None
        tasks += [(str(path), lo, min(lo + SEGMENT_BYTES, size)) for lo in range(0, max(size, 1), SEGMENT_BYTES)]
    return tasks


def segment_range(path: str, start: int, end: int, part: str, on_article: Callable[[], None] | None = None) -> int:
    """One segmentation task: the articles (non-blank lines) that start in bytes [start, end) of a formatted
    file, split into sentences, into part as records (sentence count, text); the article count."""
    count = 0
    try:
        with open(path, "rb") as f, open(part, "wb") as out:
            if start > 0:
                f.seek(start - 1)
                f.readline()  # the rest of a line that starts before start belongs to the range before
            while f.tell() < end and (raw := f.readline()):
                for line in _text_lines(raw, path):
                    if not line.strip():
                        continue
                    sentences = split_sentences(line)
                    data = ("\n".join(sentences) + "\n\n").encode("utf-8")
                    out.write(_RECORD.pack(len(sentences), len(data)) + data)
                    count += 1
                    if on_article is not None:
                        on_article()
    except FileNotFoundError:
        raise DataError(path, "formatted text not found (run --action text_formatting first)") from None
    return count


def _text_lines(raw: bytes, path: str) -> list[str]:
    """The lines of one \\n-ended line of bytes as a text-mode reader sees them (\\r\\n, a lone \\r end lines)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(path, f"not UTF-8 text ({err.reason}); run --action text_formatting again") from None
    return text.replace("\r\n", "\n").split("\r") if "\r" in text else [text]


def shard_paths(cfg: ShardingConfig) -> dict[str, list[Path]]:
    counts = {"training": cfg.n_training_shards, "test": cfg.n_test_shards}
    return {split: [cfg.output_dir / f"{cfg.corpus}_{split}_{i}.txt" for i in range(counts[split])]
            for split in SPLITS}


def is_test_article(index: int, fraction: float) -> bool:
    """Spreads floor(n * fraction) test articles evenly over the corpus, whatever n is."""
    return int((index + 1) * fraction) > int(index * fraction)


def _check(cfg: ShardingConfig) -> None:
    """Refuse bad counts and shards that would overwrite an input, before anything is written."""
    if cfg.n_training_shards < 1:
        raise DataError("--n_training_shards", f"must be at least 1, got {cfg.n_training_shards}")
    if cfg.n_test_shards < 0:
        raise DataError("--n_test_shards", f"must be at least 0, got {cfg.n_test_shards}")
    if not 0.0 <= cfg.fraction_test_set < 1.0:
        raise DataError("--fraction_test_set", f"must be in [0, 1), got {cfg.fraction_test_set}")
    inputs = [("formatted text", path) for path in cfg.inputs]
    for path in (p for ps in shard_paths(cfg).values() for p in ps):
        refuse_input_as_output(path, "the text shard", inputs, "write the shards to a folder apart from the "
                                                               "formatted text")


def _check_counts(cfg: ShardingConfig, n_articles: int) -> None:
    """Refuse fewer articles than shards (after segmentation, before any shard is renamed into place)."""
    fraction = cfg.fraction_test_set if cfg.n_test_shards > 0 else 0.0
    n_test = int(n_articles * fraction)
    if n_articles - n_test < cfg.n_training_shards or n_test < cfg.n_test_shards:
        raise DataError(cfg.inputs[0], f"{n_articles} articles ({n_articles - n_test} training, {n_test} test) "
                                       f"are fewer than the {cfg.n_training_shards} training and "
                                       f"{cfg.n_test_shards} test shards asked for; ask for fewer shards "
                                       "(--n_training_shards, --n_test_shards, --fraction_test_set)")


def shard_corpus(cfg: ShardingConfig, on_article: Callable[[], None] | None = None, run: Runner | None = None
                 ) -> ShardingResult:
    """Write all shards (to temporary names, renamed at the end). Refuses fewer articles than shards. run is
    data/engine.py's runner for the segmentation tasks; None runs them here, one after the other."""
    _check(cfg)
    tasks = segment_tasks(cfg.inputs)
    paths = shard_paths(cfg)
    try:
        with ExitStack() as outputs:
            # The first shard creates the folder; the stale temporaries of killed runs go in one listing (one per
            # shard cost 2 ms each among 4,096 shards).
            remove_stale_temporaries_of(p for ps in paths.values() for p in ps)
            tmp = {split: [outputs.enter_context(atomic_output(p, clean=False)) for p in paths[split]]
                   for split in SPLITS}
            scratch = outputs.enter_context(scratch_folder(cfg.output_dir / cfg.corpus))
            parts = [str(scratch / f"part-{i:06d}.bin") for i in range(len(tasks))]
            jobs = [(*task, part) for task, part in zip(tasks, parts)]
            # Closed (its tasks waited for) before the scratch folder goes, should writing the shards fail.
            ready = outputs.enter_context(closing(_segmented_in_order(jobs, on_article, run)))
            fraction = cfg.fraction_test_set if cfg.n_test_shards > 0 else 0.0
            sentences, n_articles = _write_shards(ready, tmp, fraction)
            _check_counts(cfg, n_articles)  # before the shards are renamed into place
    except OSError as err:
        raise DataError(cfg.output_dir, f"cannot write shards ({err.strerror or err}); check free space and "
                                        "permissions") from None
    return ShardingResult(n_articles, sentences, paths)


def _segmented_in_order(jobs: Sequence[tuple], on_article: Callable[[], None] | None, run: Runner | None
                        ) -> Iterator[str]:
    """The parts of the segmentation jobs, in order, each as soon as it and those before it are written: with an
    engine, balancing the first parts overlaps segmenting the rest (data/engine.py's in_order)."""
    task = partial(segment_range, on_article=on_article) if run is None else segment_range
    with closing(in_order(run, task, jobs)) as counts:
        for job, count in zip(jobs, counts):
            for _ in range(count if run is not None and on_article is not None else 0):
                on_article()  # here, the bar moved article by article already
            yield job[-1]


def _write_shards(parts: Iterable[str], tmp: dict[str, list[Path]], fraction: float
                  ) -> tuple[dict[str, list[int]], int]:
    """Stream the segmented articles into the shard files (greedy balance); sentences per shard, articles."""
    sentences = {split: [0] * len(tmp[split]) for split in SPLITS}
    targets = [path for split in SPLITS for path in tmp[split]]
    articles = [0]
    _distribute(_assign(parts, sentences, fraction, articles), targets, targets[0].parent)
    return sentences, articles[0]


def _segmented(parts: Iterable[str]) -> Iterator[tuple[int, bytes]]:
    """(sentence count, text) of each article of the parts, in corpus order."""
    for part in parts:
        with open(part, "rb") as f:
            yield from _read_spill(f)
        os.unlink(part)  # frees its space as the shards fill


def _assign(parts: Iterable[str], sentences: dict[str, list[int]], fraction: float, articles: list[int]
            ) -> Iterator[tuple[int, bytes]]:
    """(index into the training then test shards, text) of each article in corpus order; counts the sentences
    of each shard into `sentences` and the articles into articles[0]."""
    heaps = {split: [(0, i) for i in range(len(sentences[split]))] for split in SPLITS}
    first = {"training": 0, "test": len(sentences["training"])}
    for index, (n_sentences, data) in enumerate(_segmented(parts)):
        split = "test" if fraction and is_test_article(index, fraction) else "training"
        count, shard = heapq.heappop(heaps[split])
        heapq.heappush(heaps[split], (count + n_sentences, shard))
        sentences[split][shard] += n_sentences
        articles[0] = index + 1
        yield first[split] + shard, data


def _distribute(records: Iterable[tuple[int, bytes]], targets: Sequence[Path], folder: Path) -> None:
    """Append each (target index, data) record to its target, in record order, never holding more than
    FAN_OUT files open per level (a level above the shards spills ranges of them to temporary files)."""
    if len(targets) <= FAN_OUT:
        with ExitStack() as stack:
            files = [stack.enter_context(open(path, "wb")) for path in targets]
            for index, data in records:
                files[index].write(data)
        return
    # About sqrt(n) spills of sqrt(n) shards: the fewest files open at once while spilling only once for up to
    # FAN_OUT**2 shards; more shards spill at most FAN_OUT ways per level.
    width = max(math.isqrt(len(targets) - 1) + 1, -(-len(targets) // FAN_OUT))  # shards per spill
    with ExitStack() as stack:
        spills = [stack.enter_context(tempfile.TemporaryFile(dir=folder))
                  for _ in range(-(-len(targets) // width))]
        for index, data in records:
            spills[index // width].write(_RECORD.pack(index % width, len(data)) + data)
        for number, spill in enumerate(spills):
            spill.seek(0)
            _distribute(_read_spill(spill), targets[number * width:(number + 1) * width], folder)
            spill.close()  # frees its disk space before the next one is written out


def _read_spill(spill: BinaryIO) -> Iterator[tuple[int, bytes]]:
    while header := spill.read(_RECORD.size):
        index, length = _RECORD.unpack(header)
        yield index, spill.read(length)
