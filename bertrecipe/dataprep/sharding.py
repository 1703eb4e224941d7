"""Formatted text (one article per line) -> training and test text shards of one sentence per line.

Three steps, the costly ones as tasks for dataprep/engine.py (local processes or Dask workers):
1. Segmentation: each task takes the articles that start in one SEGMENT_BYTES range of a formatted file, splits
   them into sentences and writes them to a part file in a scratch folder beside the shards, with an index of
   each article's sentence count and byte length.
2. Balancing, here, from the indexes only (no text passes through this process): each article goes to the shard
   of its split with the fewest sentences so far, which keeps shards within one article of each other. It reads
   each index as soon as its part and those before it are written, while the rest are segmented, and saves beside
   the part its assignment (`<part>.plan.npy`): where each article goes and where it lies, ordered by shard.
3. Write-out: each task writes a contiguous range of at most FAN_OUT shards, reading from each part's assignment only
   the rows of its shards (a memory map and a binary search) and their articles, in corpus order, so a shard's
   articles keep their order. The shards are then renamed into place.

The output is the same bytes whatever the engine and worker count. Open files stay bounded whatever the shard
count (thousands of shards used to hit the open-file limit): a write-out task holds its shards and one part open.
Memory is bounded by one part's index and assignment (~100 bytes per article of SEGMENT_BYTES of text), not the corpus.
The parts take as much free space again as the corpus while the shards are written.

Sentence segmenter: blingfire, chosen over pysbd, syntok and sentencex on the Wikipedia sample (see the report
in `python -m benchmarks.data_prep --segmenters`): as accurate as syntok on hand-labelled hard cases (abbreviations,
initials, decimals) at ~25x its speed, and needs no model download.
"""
from __future__ import annotations

import heapq
import os
from array import array
from contextlib import ExitStack, closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator, Sequence

import blingfire
import numpy as np

from bertrecipe.common.atomic_files import (
    make_dirs,
    move_onto,
    remove_empty_dirs,
    remove_stale_temporaries_of,
    scratch_folder,
)
from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.engine import Runner, in_order
from bertrecipe.dataprep.layout import SPLITS
from bertrecipe.dataprep.outputs import refuse_data_input_as_output

FAN_OUT = 128  # most shards written by one write-out task
WRITE_TASKS = 64  # write-out tasks wanted (fewer when there are fewer shards, more when FAN_OUT needs it)
SEGMENT_BYTES = 64 << 20  # formatted text segmented by one task


@dataclass(frozen=True)
class ShardingConfig:
    inputs: tuple[Path, ...]  # formatted files: one article per line, blank lines ignored
    output_dir: Path  # shards go to <output_dir>/<corpus>_<split>_<i>.txt
    corpus: str
    n_training_shards: int
    n_test_shards: int
    fraction_test_set: float
    # How often each input's training articles go into the training shards (a mixture: 3.0 three times, 0.5 each
    # with probability one half, drawn from random_seed); test articles go once. Empty: every input once.
    epochs: tuple[float, ...] = ()
    random_seed: int = 12345


@dataclass(frozen=True)
class ShardingResult:
    articles: int
    sentences: dict[str, list[int]]  # split -> sentences per shard
    paths: dict[str, list[Path]]
    # per input: its articles in each split, and the copies of its training articles the training shards hold
    by_input: list[dict[str, int]] | None = None
    # per shard file name: its articles as runs of [input, bytes], in the order the file holds them
    input_runs: dict[str, list[list[int]]] | None = None


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
    file, split into sentences, into part, and each one's (sentence count, byte length) into its index; the
    article count."""
    index = array("q")  # 16 bytes an article (a list of tuples took 110)
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
                    out.write(data)
                    index.extend((len(sentences), len(data)))
                    if on_article is not None:
                        on_article()
    except FileNotFoundError:
        raise DataError(path, "formatted text not found (run --action text_formatting first)") from None
    np.save(_index_of(part), np.frombuffer(index, dtype=np.int64).reshape(-1, 2))
    return len(index) // 2


def _index_of(part: str) -> str:
    return part + ".index.npy"  # (sentence count, byte length) of each article of the part


def _assignment_of(part: str) -> str:
    # [3, articles]: shard (an index into the training, then the test shards), byte offset and length of each
    # article of the part, ordered by shard and, within a shard, by corpus order
    return part + ".plan.npy"


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
        refuse_data_input_as_output(path, "the text shard", inputs, "write the shards to a folder apart from the "
                                                               "formatted text")


def _check_counts(cfg: ShardingConfig, n_articles: int) -> None:
    """Refuse fewer articles than shards (after balancing, before any shard is written)."""
    fraction = cfg.fraction_test_set if cfg.n_test_shards > 0 else 0.0
    n_test = int(n_articles * fraction)
    if n_articles - n_test < cfg.n_training_shards or n_test < cfg.n_test_shards:
        raise DataError(cfg.inputs[0], f"{n_articles} articles ({n_articles - n_test} training, {n_test} test) "
                                       f"are fewer than the {cfg.n_training_shards} training and "
                                       f"{cfg.n_test_shards} test shards asked for; ask for fewer shards "
                                       "(--n_training_shards, --n_test_shards, --fraction_test_set)")


def shard_corpus(cfg: ShardingConfig, on_article: Callable[[], None] | None = None, run: Runner | None = None
                 ) -> ShardingResult:
    """Write all shards (in a scratch folder, renamed into place at the end). Refuses fewer articles than shards.
    run is dataprep/engine.py's runner for the segmentation and write-out tasks; None runs them here, one after the
    other (bertPrep passes None for a corpus of one segmentation task: its text is too small to be worth
    starting workers for either step)."""
    _check(cfg)
    tasks = segment_tasks(cfg.inputs)
    paths = shard_paths(cfg)
    targets = [path for split in SPLITS for path in paths[split]]
    created = make_dirs(cfg.output_dir)
    try:
        remove_stale_temporaries_of(targets)  # a killed run's, from before the scratch folder (one listing)
        with scratch_folder(cfg.output_dir / cfg.corpus) as scratch:
            parts = [str(scratch / f"part-{i:06d}") for i in range(len(tasks))]
            jobs = [(*task, part) for task, part in zip(tasks, parts, strict=True)]
            fraction = cfg.fraction_test_set if cfg.n_test_shards > 0 else 0.0
            # Closed (its tasks waited for) before the scratch folder goes, should balancing fail.
            mixture = _Mixture(cfg, [cfg.inputs.index(Path(task[0])) for task in tasks])
            with closing(_segmented_in_order(jobs, on_article, run)) as ready:
                sentences, n_articles = _balance(ready, paths, fraction, mixture)
            _check_counts(cfg, n_articles)  # before any shard is written
            staged = [str(scratch / path.name) for path in targets]
            _write_out(parts, staged, run)
            for source, target in zip(staged, targets, strict=True):
                move_onto(source, target)  # a symlinked shard gets the text; the link stays
    except BaseException as err:
        remove_empty_dirs(created)
        if isinstance(err, OSError):
            raise DataError(cfg.output_dir, f"cannot write shards ({err.strerror or err}); check free space and "
                                            "permissions") from None
        raise
    return ShardingResult(n_articles, sentences, paths, mixture.by_input,
                          {path.name: mixture.runs.get(i, []) for i, path in enumerate(targets)})


def _segmented_in_order(jobs: Sequence[tuple], on_article: Callable[[], None] | None, run: Runner | None
                        ) -> Iterator[str]:
    """The parts of the segmentation jobs, in order, each as soon as it and those before it are written: with an
    engine, balancing the first parts overlaps segmenting the rest (dataprep/engine.py's in_order)."""
    task = partial(segment_range, on_article=on_article) if run is None else segment_range
    with closing(in_order(run, task, jobs)) as counts:
        for job, count in zip(jobs, counts, strict=True):
            for _ in range(count if run is not None and on_article is not None else 0):
                on_article()  # here, the bar moved article by article already
            yield job[-1]


class _Mixture:
    """How many copies of each article the training shards take (ShardingConfig.epochs), counted per input."""

    def __init__(self, cfg: ShardingConfig, input_of_part: list[int]) -> None:
        self.epochs = cfg.epochs or (1.0,) * len(cfg.inputs)
        self.input_of_part = input_of_part
        self.rng = np.random.default_rng(cfg.random_seed)
        self.by_input = [{"training": 0, "test": 0, "training_copies": 0, "training_bytes": 0, "test_bytes": 0}
                         for _ in cfg.inputs]
        self.runs: dict[int, list[list[int]]] = {}  # shard -> [input, bytes] runs, in the shard's order

    def place(self, part: int, shard: int, size: int) -> None:
        """A copy of an article of `size` bytes of `part` goes to `shard`, after the articles placed there before
        (write_shards writes a shard's articles in part order, each part's in its order)."""
        runs = self.runs.setdefault(shard, [])
        source = self.input_of_part[part]
        if runs and runs[-1][0] == source:
            runs[-1][1] += size
        else:
            runs.append([source, size])

    def copies(self, part: int, split: str, size: int) -> int:
        """The copies of an article of `size` bytes (its sentences' text) in the shards of its split."""
        source = self.by_input[self.input_of_part[part]]
        source[split] += 1
        count = 1
        if split == "training":
            epochs = self.epochs[self.input_of_part[part]]
            whole = int(epochs)
            count = whole + int(self.rng.random() < epochs - whole) if epochs != whole else whole
            source["training_copies"] += count
        source[f"{split}_bytes"] += count * size
        return count


def _balance(parts: Iterator[str], paths: dict[str, list[Path]], fraction: float, mixture: _Mixture
             ) -> tuple[dict[str, list[int]], int]:
    """Assign each article of the parts, in corpus order, to the shard of its split with the fewest sentences so
    far (the lowest index on a tie), from the parts' indexes, once per copy the mixture asks for (each copy to the
    least full shard then); each part's assignment is saved beside it. Sentences per shard, articles."""
    sentences = {split: [0] * len(paths[split]) for split in SPLITS}
    heaps = {split: [(0, i) for i in range(len(paths[split]))] for split in SPLITS}
    first = {"training": 0, "test": len(paths["training"])}
    n_articles = 0
    for number, part in enumerate(parts):
        index = np.load(_index_of(part))
        offsets = np.cumsum(index[:, 1]) - index[:, 1]
        shards, rows = [], []
        for row, (n_sentences, size) in enumerate(index.tolist()):
            split = "test" if fraction and is_test_article(n_articles, fraction) else "training"
            for _ in range(mixture.copies(number, split, size)):
                count, shard = heapq.heappop(heaps[split])
                heapq.heappush(heaps[split], (count + n_sentences, shard))
                sentences[split][shard] += n_sentences
                shards.append(first[split] + shard)
                rows.append(row)
                mixture.place(number, first[split] + shard, size)
            n_articles += 1
        _save_assignment(part, np.array(shards, dtype=np.int64), offsets[rows], index[rows, 1])
    return sentences, n_articles


def _save_assignment(part: str, shards: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
    """The part's assignment (_assignment_of), ordered so that a write-out task reads its own rows only."""
    order = np.argsort(shards, kind="stable")  # stable: a shard's articles stay in corpus order
    np.save(_assignment_of(part), np.stack((shards[order], offsets[order], lengths[order])))


def _write_out_width(n_shards: int) -> int:
    """Shards per write-out task: a contiguous range of at most FAN_OUT, about WRITE_TASKS tasks in all."""
    return min(FAN_OUT, -(-n_shards // WRITE_TASKS))


def _write_out(parts: Sequence[str], staged: Sequence[str], run: Runner | None) -> None:
    """Write the shards as tasks of _write_out_width contiguous shards each."""
    width = _write_out_width(len(staged))
    jobs = [(tuple(parts), first, tuple(staged[first:first + width])) for first in range(0, len(staged), width)]
    if run is None:
        for job in jobs:
            write_shards(*job)
    else:
        run(write_shards, jobs, lambda _: None)


def write_shards(parts: Sequence[str], first: int, shards: Sequence[str]) -> None:
    """One write-out task: the articles assigned to shards first .. first + len(shards) - 1, read from the parts
    in corpus order, into those shard files."""
    with ExitStack() as stack:
        files = [stack.enter_context(open(path, "wb")) for path in shards]
        for part in parts:
            assignment = np.load(_assignment_of(part), mmap_mode="r")  # only the pages of this task's rows are read
            lo, hi = np.searchsorted(assignment[0], (first, first + len(files)))
            if lo == hi:
                continue
            mine = assignment[:, lo:hi].tolist()
            with open(part, "rb", buffering=0) as text:
                for shard, offset, length in zip(*mine, strict=True):
                    data = os.pread(text.fileno(), length, offset)
                    if len(data) != length:  # another process cut the scratch folder's part short
                        raise DataError(part, f"ends at byte {offset + len(data)}, before the article its index "
                                              f"puts at {offset}..{offset + length}; run sharding again")
                    files[shard - first].write(data)
