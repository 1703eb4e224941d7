"""Formatted text (one article per line) -> training and test text shards of one sentence per line.

Streams: articles are read, segmented into sentences and written one at a time, so memory does not grow
with the corpus (NVIDIA's holds every article in RAM). Balancing is greedy: each article goes to the shard of
its split with the fewest sentences so far, which keeps shards within one article of each other. One pass
over the lines, so it always terminates.

Sentence segmenter: blingfire, chosen over pysbd, syntok and sentencex on the Wikipedia sample (see the report
in benchmarks/data_prep.py --segmenters): as accurate as syntok on hand-labelled hard cases (abbreviations,
initials, decimals) at ~25x its speed, and needs no model download.
"""
from __future__ import annotations

import heapq
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import blingfire

from .errors import DataError
from .layout import SPLITS


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


def iter_articles(paths: Sequence[Path]) -> Iterator[str]:
    """Non-empty lines of the formatted files, streamed; non-UTF-8 bytes are a DataError naming the file."""
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield line
        except FileNotFoundError:
            raise DataError(path, "formatted text not found (run --action text_formatting first)") from None
        except UnicodeDecodeError as err:
            raise DataError(path, f"not UTF-8 text ({err.reason})") from None


def count_articles(paths: Sequence[Path]) -> int:
    return sum(1 for _ in iter_articles(paths))


def shard_paths(cfg: ShardingConfig) -> dict[str, list[Path]]:
    counts = {"training": cfg.n_training_shards, "test": cfg.n_test_shards}
    return {split: [cfg.output_dir / f"{cfg.corpus}_{split}_{i}.txt" for i in range(counts[split])]
            for split in SPLITS}


def is_test_article(index: int, fraction: float) -> bool:
    """Spreads floor(n * fraction) test articles evenly over the corpus, whatever n is."""
    return int((index + 1) * fraction) > int(index * fraction)


def shard_corpus(cfg: ShardingConfig, on_article: Callable[[], None] | None = None) -> ShardingResult:
    """Write all shards (to temporary names, renamed at the end). Refuses fewer articles than shards."""
    if cfg.n_training_shards < 1:
        raise DataError("--n_training_shards", f"must be at least 1, got {cfg.n_training_shards}")
    if cfg.n_test_shards < 0 or not 0.0 <= cfg.fraction_test_set < 1.0:
        raise DataError("--fraction_test_set", "must be in [0, 1) with --n_test_shards >= 0")
    fraction = cfg.fraction_test_set if cfg.n_test_shards > 0 else 0.0
    n_articles = count_articles(cfg.inputs)
    n_test = int(n_articles * fraction)
    if n_articles - n_test < cfg.n_training_shards or n_test < cfg.n_test_shards:
        raise DataError(cfg.inputs[0], f"{n_articles} articles ({n_articles - n_test} training, {n_test} test) "
                                       f"are fewer than the {cfg.n_training_shards} training and "
                                       f"{cfg.n_test_shards} test shards asked for")
    paths = shard_paths(cfg)
    try:
        cfg.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(cfg.output_dir, f"cannot create output directory ({err.strerror})") from None
    tmp = {split: [p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in paths[split]] for split in SPLITS}
    files = []
    try:
        handles = {split: [open(p, "w", encoding="utf-8") for p in tmp[split]] for split in SPLITS}
        files = [h for hs in handles.values() for h in hs]
        sentences = {split: [0] * len(paths[split]) for split in SPLITS}
        heaps = {split: [(0, i) for i in range(len(paths[split]))] for split in SPLITS}
        for index, article in enumerate(iter_articles(cfg.inputs)):
            split = "test" if fraction and is_test_article(index, fraction) else "training"
            sents = split_sentences(article)
            count, shard = heapq.heappop(heaps[split])
            heapq.heappush(heaps[split], (count + len(sents), shard))
            sentences[split][shard] += len(sents)
            handles[split][shard].write("\n".join(sents) + "\n\n")
            if on_article is not None:
                on_article()
        for h in files:
            h.close()
        for split in SPLITS:
            for t, p in zip(tmp[split], paths[split]):
                os.replace(t, p)
    except OSError as err:
        raise DataError(cfg.output_dir, f"cannot write shards ({err.strerror or err})") from None
    finally:
        for h in files:
            h.close()
        for split in SPLITS:
            for t in tmp[split]:
                t.unlink(missing_ok=True)
    return ShardingResult(n_articles, sentences, paths)
