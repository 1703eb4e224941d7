"""Which pre-training samples each optimizer step takes, and which rows of which shard each rank reads for them:
pure functions of the shard sizes, the seed and the run's shape, with no file I/O (so they are tested in
milliseconds, as MosaicML streaming tests its partitions and shuffles).

The stream, per epoch e:
1. Every shard is cut into blocks of whole HDF5 chunks (`block_rows`); all blocks of all shards are put in an
   order drawn from (seed, e). Their rows, block after block, form the epoch's row sequence of N rows.
2. That sequence is cut into C equal *lanes* (C = `lanes`, fixed for a run; the last N mod C rows of the epoch
   are left out). Lane c of epoch e is rows [c*L, (c+1)*L) with L = N // C; a lane goes on from epoch to epoch.
3. Within a lane, the rows of each block it crosses (a *portion*) are shuffled, from (seed, e, block, first row).
4. Optimizer step s takes the next G / C samples of every lane (G = the global batch, a multiple of C), lane
   after lane; micro-batch k of the step is the k-th run of `micro_batch` samples of that order, and rank r
   trains micro-batches [r*A, (r+1)*A) (A = accumulation).

So a step's samples, and each micro-batch's, depend on (seed, C, G, micro-batch) only, never on the number of
processes W or DataLoader workers; rank r only needs the lanes [r*C/W, (r+1)*C/W), so across all ranks each
block is read once per epoch, plus at most one extra portion per lane where a lane boundary cuts a block. A
resume is exact from one integer (the stream position p, a multiple of C, of G unless a batch-size warm-up took
smaller steps: every lane is at index p // C) on any W that divides C, and with any global batch C divides.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import numpy as np

from bertrecipe.common.errors import InputError

DEFAULT_MAX_LANES = 64


@dataclass(frozen=True)
class Portion:
    """Rows [start, stop) of shard `file`: the run of block `block` that lane `lane` reads in epoch `epoch`. Its
    first row is lane index `lane_index` of the lane (lane indexes count on from epoch to epoch)."""

    epoch: int
    block: int
    file: int
    start: int
    stop: int
    lane: int
    lane_index: int

    @property
    def lane_end(self) -> int:
        """The lane index after its last row."""
        return self.lane_index + self.stop - self.start


def default_lanes(global_batch: int, world_size: int, max_lanes: int = DEFAULT_MAX_LANES) -> int:
    """The largest lane count that divides the global batch, is a multiple of the world size and is at most
    max(max_lanes, world_size): every W dividing it can resume the run."""
    limit = max(max_lanes, world_size)
    return max(c for c in range(world_size, limit + 1, world_size) if global_batch % c == 0)


def check_lanes(lanes: int, global_batch: int, world_size: int) -> None:
    """InputError unless the lanes divide the global batch and are a multiple of the processes."""
    if lanes < 1 or global_batch % lanes:
        raise InputError(f"the sample stream's {lanes} lanes (--data_lanes, or kept in the checkpoint) must divide the "
                         f"global batch of {global_batch} samples (--train_batch_size x processes); keep the "
                         "global batch when changing the number of processes")
    if lanes % world_size:
        raise InputError(f"the sample stream's {lanes} lanes (--data_lanes, or kept in the checkpoint) are not a "
                         f"multiple of the {world_size} processes; it can go on on a number of processes that "
                         f"divides {lanes}")


class StreamOrder:
    """The stream of a run: shard sizes, their block size, seed and lane count (see the module docstring)."""

    def __init__(self, sizes: list[int], block_rows: list[int], seed: int, lanes: int) -> None:
        starts, files = [], []
        for file, (size, rows) in enumerate(zip(sizes, block_rows, strict=True)):
            for start in range(0, size, max(rows, 1)):
                starts.append(start)
                files.append(file)
        self.sizes = sizes
        self.block_file = np.array(files, dtype=np.int64)
        self.block_start = np.array(starts, dtype=np.int64)
        self.block_stop = np.minimum(self.block_start + np.array([block_rows[f] for f in files], dtype=np.int64),
                                     np.array([sizes[f] for f in files], dtype=np.int64))
        self.seed = seed
        self.lanes = lanes
        self.lane_length = int(sum(sizes)) // lanes
        if self.lane_length == 0:
            raise InputError(f"the shards hold {sum(sizes)} samples, fewer than the {lanes} data lanes; use more "
                             "data or a smaller global batch")

    @lru_cache(maxsize=4)  # noqa: B019 - a few epochs' orders, alive as long as the stream order
    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's blocks in their drawn order and, for each, where its rows end in the row sequence."""
        blocks = np.random.default_rng([self.seed, epoch]).permutation(len(self.block_start))
        ends = np.cumsum(self.block_stop[blocks] - self.block_start[blocks])
        return blocks, ends

    def lane_portions(self, lane: int, epoch: int) -> Iterator[Portion]:
        """The portions lane `lane` reads in epoch `epoch`, in order."""
        blocks, ends = self._epoch_layout(epoch)
        first, last = lane * self.lane_length, (lane + 1) * self.lane_length
        slot = int(np.searchsorted(ends, first, side="right"))
        position = first
        while position < last:
            block = int(blocks[slot])
            block_first_row = int(ends[slot]) - int(self.block_stop[block] - self.block_start[block])
            take_to = min(int(ends[slot]), last)
            start = int(self.block_start[block]) + position - block_first_row
            yield Portion(epoch, block, int(self.block_file[block]), start, start + take_to - position, lane,
                          epoch * self.lane_length + position - first)
            position = take_to
            slot += 1

    def portion_order(self, portion: Portion) -> np.ndarray:
        """The shuffled order of a portion's rows (indexes into [start, stop))."""
        rng = np.random.default_rng([self.seed, portion.epoch, portion.block, portion.start])
        return rng.permutation(portion.stop - portion.start)


def rank_lanes(lanes: int, world_size: int, rank: int) -> range:
    """The lanes rank `rank` of `world_size` reads: a contiguous run of lanes / world_size."""
    per_rank = lanes // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def lane_portion_stream(stream: StreamOrder, lane: int, start_index: int) -> Iterator[Portion]:
    """The portions of `lane`, from the one holding lane index `start_index` on, across epochs."""
    epoch = start_index // stream.lane_length
    while True:
        for portion in stream.lane_portions(lane, epoch):
            if portion.lane_end > start_index:
                yield portion
        epoch += 1


def portions_needed(stream: StreamOrder, lane_range: range, per_lane: int, first_index: int,
                    steps: int | None) -> Iterator[Portion]:
    """Every portion a rank reads, in the order its steps first need them: step s takes lane indexes
    [first_index + s * per_lane, first_index + (s + 1) * per_lane) of each lane of `lane_range`, lane after lane,
    so the portions come by that step, then lane after lane, then along the lane. The one walk of the stream that
    the reader and the batcher both follow (data.py). The lanes' portion streams are merged on that key, so the
    cost grows with the portions, not with the steps x lanes."""

    def keyed(position: int, lane: int) -> Iterator[tuple[int, int, int, Portion]]:
        for portion in lane_portion_stream(stream, lane, first_index):
            step = max(0, portion.lane_index - first_index) // per_lane
            if steps is not None and step >= steps:
                return
            yield step, position, portion.lane_index, portion

    for *_, portion in heapq.merge(*(keyed(position, lane) for position, lane in enumerate(lane_range))):
        yield portion
