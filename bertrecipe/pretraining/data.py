"""Pre-training batches from HDF5 shards, and the loss they are trained on.

One batch's way through this file: PretrainingData.portions() is the walk of this rank's share of the stream
(sample_order.portions_needed: which rows, in which order); PortionReader reads each portion's rows (read_rows,
value-checked; gzip chunks inflated by ISA-L through RowSource, at the end of the file) in a DataLoader worker
and delivers them as PortionRows; PretrainingData.batches() files them under their lanes and cuts each step into
micro-batches (make_batch: BATCH_KEYS); BertPretrainingCriterion turns a micro-batch and the model into the loss.

The samples of every optimizer step depend on (seed, lanes, global batch) only, so 2 processes with accumulation
2 see exactly what 1 process with accumulation 4 sees, and a position in the stream is one integer, which makes
resuming exact. Held-out evaluation reads every sample once, in order, a block at a time.
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

import h5py
import numpy as np
import torch
from h5py import h5d, h5z
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from bertrecipe.common.errors import InputError
from bertrecipe.pretraining import masking, packing, sample_order
from bertrecipe.pretraining.shard_schema import KIND_ARRAYS, ShardInfo, as_static_rows

try:
    from isal import isal_zlib
except ImportError:  # a platform without isal's wheels: h5py inflates as fast as zlib would here
    isal_zlib = None

OPEN_FILES_PER_READER = 4


# --- Reading rows: a shard's rows [start, stop), every value checked --------------------------------------------------
def check_value_ranges(path: Path, arrays: dict[str, np.ndarray], vocab_size: int, type_vocab_size: int,
                       first_row: int = 0) -> None:
    """InputError naming the file, key, row and value of the first value a model could not take: a token id
    outside the vocab, a masked position outside the sequence, a segment id above 1 or the config's
    type_vocab_size, a label other than 0/1."""
    seq_length = arrays["input_ids"].shape[1]
    segments = min(2, type_vocab_size)
    limits = (("input_ids", vocab_size, f"the model's vocab of {vocab_size}"),
              ("masked_lm_ids", vocab_size, f"the model's vocab of {vocab_size}"),
              ("masked_lm_positions", seq_length, f"the sequence of {seq_length} tokens"),
              ("segment_ids", segments, f"segment ids 0..{segments - 1} (type_vocab_size {type_vocab_size})"),
              ("input_mask", 2, "mask values 0 and 1"),
              ("next_sentence_labels", 2, "labels 0 and 1"))
    for key, end, allowed in limits:
        values = arrays[key]
        if not values.size or (values.min() >= 0 and values.max() < end):
            continue
        bad = np.argwhere((values < 0) | (values >= end))[0]
        raise InputError(f"{path}: {key} row {first_row + int(bad[0])} holds {int(values[tuple(bad)])}, outside "
                         f"{allowed}; the shard was written for another vocab or config, or is damaged")


def read_rows(info: ShardInfo, f: h5py.File | RowSource, start: int, stop: int, vocab_size: int
              ) -> dict[str, np.ndarray]:
    """Rows [start, stop) of an open shard of either kind as the six SHARD_KEYS (shard_schema.as_static_rows), every
    value range-checked (only these rows' chunks are decompressed; through a RowSource, gzip by ISA-L)."""
    source = f if isinstance(f, RowSource) else RowSource(f.filename, f)
    try:
        arrays = {k: source.rows(k, start, stop) for k in KIND_ARRAYS[info.kind]}
    except (OSError, KeyError, RuntimeError, ValueError) as error:
        raise InputError(f"{info.path}: cannot read rows {start}-{stop} of the shard ({error}); rewrite it or remove "
                         "it from the input directory") from None
    finally:
        if source is not f:
            source.close()
    if len(arrays["input_ids"]) != stop - start:
        raise InputError(f"{info.path}: holds fewer rows than it said when the run started; rewrite it")
    arrays = as_static_rows(info, arrays, start)  # document chunks: zero segments and labels, a fixed mask
    check_value_ranges(info.path, arrays, vocab_size, info.type_vocab_size, start)
    return arrays


# --- The batch: what the model is fed, and the loss it is trained on --------------------------------------------------
BATCH_KEYS = ("input_ids", "segment_ids", "input_mask", "masked_lm_labels", "next_sentence_labels")


def make_batch(arrays: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of a loaded shard as a batch (BATCH_KEYS, int64): input_ids, segment_ids, input_mask [B, S],
    masked_lm_labels [B, S] (masking.IGNORE_INDEX except at the masked positions: masking.masked_positions),
    next_sentence_labels [B]."""
    ids = arrays["masked_lm_ids"][rows].astype(np.int64)
    input_ids = arrays["input_ids"][rows].astype(np.int64)
    valid, row_index, columns = masking.masked_positions(arrays["masked_lm_positions"][rows])
    labels = np.full(input_ids.shape, masking.IGNORE_INDEX, dtype=np.int64)
    labels[row_index, columns] = ids[valid]
    return {
        "input_ids": input_ids,
        "segment_ids": arrays["segment_ids"][rows].astype(np.int64),
        "input_mask": arrays["input_mask"][rows].astype(np.int64),
        "masked_lm_labels": labels,
        "next_sentence_labels": arrays["next_sentence_labels"][rows].astype(np.int64),
    }


class BertPretrainingCriterion:
    """NVIDIA's pre-training loss of a batch (BATCH_KEYS): the masked-LM cross-entropy over the positions whose
    label is not masking.IGNORE_INDEX, plus the next-sentence cross-entropy unless nsp is False (--no_nsp: the
    masked-LM term alone). criterion(model, batch) runs a BertForPreTraining on the batch with its labels (its MLM
    head only at the labelled positions; the cross-entropies are the model's own, in fp32 whatever the autocast)
    and returns the scalar loss; it is the Stepper's compute_loss."""

    def __init__(self, nsp: bool = True) -> None:
        self.nsp = nsp

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        next_sentence_labels = batch["next_sentence_labels"] if self.nsp else None
        return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                     masked_lm_labels=batch["masked_lm_labels"], next_sentence_labels=next_sentence_labels,
                     document_ids=batch.get("document_ids")).loss


# --- The training stream: this rank's share, read by portions, cut into micro-batches ---------------------------------
@dataclass(frozen=True)
class StepShape:
    """How an optimizer step is cut: micro-batches of micro_batch samples, `accumulation` of them a process,
    on world_size processes; `rank` is this process."""

    micro_batch: int
    accumulation: int
    world_size: int
    rank: int

    @property
    def samples_per_step(self) -> int:
        """The global batch: samples of all processes per optimizer step."""
        return self.micro_batch * self.accumulation * self.world_size


class PortionRows(NamedTuple):
    """What the reader delivers: a portion of the stream (sample_order.Portion: which lane, which lane indexes)
    and its rows in shuffled order (numpy arrays; tensors once through a DataLoader)."""

    portion: sample_order.Portion
    rows: dict[str, Any]


class ReaderFailure(NamedTuple):
    """A reader's one-line error delivered as an item: raised in a DataLoader worker, torch would bring it to the
    training process as a RuntimeError holding the worker's traceback."""

    error: InputError


class PretrainingData:
    """This rank's share of the stream (sample_order.py) from stream position `start` on, for `max_steps` steps
    (None: without end). `reader()` is the IterableDataset that reads the portions of shards the rank needs
    (spread over DataLoader workers, each portion read by one of them); `batches(delivered)` cuts what it
    delivers, in order, into micro-batches (BATCH_KEYS, int64 tensors). Both follow one walk of the stream,
    portions(). Stateful: state_dict() is the checkpoint's "data", load_state_dict() goes on from one."""

    def __init__(self, shards: list[ShardInfo], seed: int, shape: StepShape, lanes: int, vocab_size: int,
                 start: int = 0, max_steps: Optional[int] = None,
                 masking_spec: Optional[masking.MaskingSpec] = None, bin_by_length: bool = False,
                 pack_sequences: bool = False, mask_schedule: Optional[masking.MaskSchedule] = None,
                 first_step: int = 0) -> None:
        sample_order.check_lanes(lanes, shape.samples_per_step, shape.world_size)
        self.stream = sample_order.StreamOrder([s.num_samples for s in shards], [s.block_rows for s in shards],
                                               seed, lanes)
        self.shards = shards
        self.shape = shape
        self.vocab_size = vocab_size
        self.lane_range = sample_order.rank_lanes(lanes, shape.world_size, shape.rank)
        self.per_lane = shape.samples_per_step // lanes
        self.max_steps = max_steps
        self.seed = seed
        self.masking_spec = masking_spec  # None: the shards' own (static) masks
        # The rate of each phase step with masking_spec (None: the spec's rate); first_step is the phase step at
        # `start`, so a row's step follows from its lane index (full steps: the flags refuse a varying rate with
        # a batch-size warm-up).
        self.mask_schedule = mask_schedule
        self.first_step = first_step
        self.bin_by_length = bin_by_length
        self.pack_sequences = pack_sequences  # packing.py: each micro-batch's samples in as few rows as hold them
        self.first_sample = np.concatenate([[0], np.cumsum([s.num_samples for s in shards])[:-1]]).astype(np.int64)
        self.start = self.position = start  # samples of all ranks: where reading starts, and what was handed out
        # Micro-batches per process of the next step (the loop's batch-size warm-up sets it before the step; None:
        # the full step, shape.accumulation). Read as the step's first micro-batch is cut.
        self.next_step_micro_batches: Optional[int] = None

    def state_dict(self) -> dict[str, Any]:
        """The stream's checkpoint state: its position (whole steps handed out) and what the position counts."""
        state = {"stream_position": self.position, "seed": self.seed, "lanes": self.stream.lanes,
                 "files": [shard.path.name for shard in self.shards], "global_batch": self.shape.samples_per_step}
        fingerprints = [shard.fingerprint for shard in self.shards]
        if None not in fingerprints:  # the files by content (resume_rules compares them)
            state["fingerprints"] = fingerprints
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Goes on from a checkpoint's position (before reading starts). ValueError for the state of another
        stream; resume_rules refuses those first, naming the flags."""
        ours = self.state_dict()
        for key in ("seed", "lanes", "files", "global_batch"):
            if state.get(key) is not None and state[key] != ours[key]:
                raise ValueError(f"the checkpoint's sample stream has {key} {state[key]!r}, this one {ours[key]!r}")
        self.start = self.position = int(state["stream_position"])

    def epoch(self) -> int:
        """The epoch the stream position lies in."""
        return self.position // self.stream.lanes // self.stream.lane_length

    def portions(self) -> Iterator[sample_order.Portion]:
        """The walk: this rank's portions in the order its steps first need them."""
        return sample_order.portions_needed(self.stream, self.lane_range, self.per_lane,
                                            self.start // self.stream.lanes, self.max_steps)

    def row_steps(self, portion: sample_order.Portion) -> np.ndarray:
        """int64 [rows]: the phase step that takes each row of the portion (delivered in its shuffled order, row j
        at lane index portion.lane_index + j); rows before the start, which no step takes, get steps below it."""
        lane_indexes = portion.lane_index + np.arange(portion.stop - portion.start, dtype=np.int64)
        return self.first_step + (lane_indexes - self.start // self.stream.lanes) // self.per_lane

    def reader(self) -> "PortionReader":
        """The IterableDataset for the DataLoader, whose workers read the portions."""
        return PortionReader(self)

    def batches(self, delivered: Iterator[PortionRows | ReaderFailure], pin_memory: bool = False
                ) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's micro-batches, step after step, from the reader's portions in the order it delivers them.
        Step s takes lane indexes [i + s * per_lane, i + (s + 1) * per_lane) of each of the rank's lanes, lane
        after lane (i: the start's lane index); it pulls the next portion only when a lane holds too few. A step
        of fewer micro-batches (next_step_micro_batches) takes as many fewer samples of every lane. With
        pin_memory (training on CUDA) the micro-batches are in pinned memory, so that their non-blocking copies to
        the GPU are asynchronous (they are made here, after the loader, so the loader's own pinning would not be)."""
        lanes = {lane: _LaneRows() for lane in self.lane_range}
        index, step = self.start // self.stream.lanes, 0
        while self.max_steps is None or step < self.max_steps:
            per_lane, pieces = self._step_per_lane(), []
            for lane in self.lane_range:
                while lanes[lane].end < index + per_lane:
                    item = next(delivered)
                    if isinstance(item, ReaderFailure):
                        raise item.error
                    portion, rows = item
                    lanes[portion.lane].add(portion, _numpy(rows))
                pieces += lanes[lane].take(index, per_lane)
            step, index = step + 1, index + per_lane
            self.position = index * self.stream.lanes  # handed out from here on: every lane is at `index`
            for batch in self._cut(pieces):
                yield {k: v.pin_memory() for k, v in batch.items()} if pin_memory else batch

    def _step_per_lane(self) -> int:
        """Samples of every lane in the next step: per_lane, or fewer for a step of fewer micro-batches."""
        count = self.next_step_micro_batches
        if count is None or count == self.shape.accumulation:
            return self.per_lane
        samples = count * self.shape.micro_batch * self.shape.world_size
        if not 0 < count <= self.shape.accumulation or samples % self.stream.lanes:
            raise ValueError(f"a step of {count} micro-batches per process ({samples} samples) does not split over "
                             f"the stream's {self.stream.lanes} lanes")
        return samples // self.stream.lanes

    def _cut(self, pieces: list[dict[str, np.ndarray]]) -> Iterator[dict[str, torch.Tensor]]:
        """A step's rows (this rank's) as its micro-batches."""
        rows = {k: np.concatenate([piece[k] for piece in pieces]) for k in pieces[0]}
        if self.bin_by_length:  # micro-batches of like lengths: attention stops at each one's longest sample
            by_length = np.argsort(np.count_nonzero(rows["input_mask"], axis=1), kind="stable")
            rows = {k: v[by_length] for k, v in rows.items()}
        size = self.shape.micro_batch
        for first in range(0, len(rows["input_ids"]), size):
            picked = np.arange(first, first + size)
            if "masked_lm_labels" in rows:  # masked afresh by the reader
                batch = {k: rows[k][picked].astype(np.int64) for k in BATCH_KEYS}
            else:
                batch = make_batch(rows, picked)
            if self.pack_sequences:
                batch = packing.pack_batch(batch)
            yield {k: torch.from_numpy(v) for k, v in batch.items()}


class _LaneRows:
    """The rows a lane was delivered and has not handed out yet: its portions, in lane order."""

    def __init__(self) -> None:
        self.portions: deque[tuple[int, dict[str, np.ndarray]]] = deque()  # (first lane index, rows)
        self.end = 0  # the lane index after the last row delivered

    def add(self, portion: sample_order.Portion, rows: dict[str, np.ndarray]) -> None:
        """The lane's next portion and its rows (the walk delivers each lane's portions in lane order)."""
        self.portions.append((portion.lane_index, rows))
        self.end = portion.lane_end

    def take(self, index: int, count: int) -> list[dict[str, np.ndarray]]:
        """Lane indexes [index, index + count) (all delivered), in pieces of one portion each; what is taken
        is let go."""
        pieces = []
        while count:
            begins, rows = self.portions[0]
            offset = index - begins
            size = min(count, len(rows["input_ids"]) - offset)
            pieces.append({k: v[offset:offset + size] for k, v in rows.items()})
            index, count = index + size, count - size
            if offset + size == len(rows["input_ids"]):
                self.portions.popleft()
        return pieces


class PortionReader(IterableDataset):
    """Reads this rank's portions (PretrainingData.portions()) and delivers each as PortionRows; DataLoader worker
    w of K reads the portions n with n % K == w, which the DataLoader hands back in order, so what is delivered
    does not depend on K."""

    def __init__(self, data: PretrainingData) -> None:
        self.data = data

    def __iter__(self) -> Iterator[PortionRows | ReaderFailure]:
        worker = get_worker_info()
        workers, worker_id = (worker.num_workers, worker.id) if worker else (1, 0)
        files = _OpenFiles(OPEN_FILES_PER_READER)
        try:
            for serial, portion in enumerate(self.data.portions()):
                if serial % workers == worker_id:
                    yield PortionRows(portion, self._read(files, portion))
        except InputError as error:
            if worker is None:
                raise
            yield ReaderFailure(error)  # batches() raises it in the training process
        finally:
            files.close()

    def _read(self, files: "_OpenFiles", portion: sample_order.Portion) -> dict[str, np.ndarray]:
        """The portion's rows, range-checked, in its shuffled order (masked afresh with --dynamic_masking)."""
        info = self.data.shards[portion.file]
        arrays = read_rows(info, files.get(info), portion.start, portion.stop, self.data.vocab_size)
        order = self.data.stream.portion_order(portion)
        arrays = {k: v[order] for k, v in arrays.items()}
        if self.data.masking_spec is not None:
            arrays = self._remask(arrays, portion, order)
        return arrays

    def _remask(self, arrays: dict[str, np.ndarray], portion: sample_order.Portion,
                order: np.ndarray) -> dict[str, np.ndarray]:
        """Dynamic masking: the shard's original tokens, masked afresh from (seed, epoch, sample id)."""
        original = masking.recover_original_tokens(arrays["input_ids"], arrays["masked_lm_positions"],
                                                   arrays["masked_lm_ids"])
        sample_ids = self.data.first_sample[portion.file] + portion.start + order
        schedule, rates = self.data.mask_schedule, None
        if schedule is not None and schedule.varies:  # the step travels with the rows: workers read ahead
            rates = schedule.rates(self.data.row_steps(portion))
        input_ids, labels = masking.dynamic_mask(original, arrays["input_mask"], sample_ids, portion.epoch,
                                                 self.data.seed, self.data.masking_spec, rates)
        return {"input_ids": input_ids, "segment_ids": arrays["segment_ids"], "input_mask": arrays["input_mask"],
                "masked_lm_labels": labels, "next_sentence_labels": arrays["next_sentence_labels"]}


class _OpenFiles:
    """The few shards a reader has open, most recently used kept (portions of a shard come in runs)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.files: dict[Path, RowSource] = {}
        # Each dataset's chunk layout, kept when its file is closed and reopened.
        self.layouts: dict[tuple[Path, str], Optional[ChunkLayout]] = {}

    def get(self, info: ShardInfo) -> RowSource:
        path = info.path
        if path in self.files:
            self.files[path] = self.files.pop(path)
        else:
            if len(self.files) >= self.limit:
                oldest = next(iter(self.files))
                self.files.pop(oldest).close()
            if info.stamp is not None:  # rewritten since the run checked it: its rows are no longer those checked
                info.stamp.check(path, "shard")
            try:
                self.files[path] = RowSource(path, layouts=self.layouts)
            except OSError as error:  # e.g. truncated since the run started
                raise InputError(f"{path}: cannot read rows of the shard ({error}); rewrite it or remove it from "
                                 "the input directory") from None
        return self.files[path]

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


def _numpy(rows: dict[str, Any]) -> dict[str, np.ndarray]:
    """Delivered rows as numpy arrays (the DataLoader turned them into tensors)."""
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in rows.items()}


# --- Held-out evaluation ----------------------------------------------------------------------------------------------
def evaluation_batches(shards: list[ShardInfo], vocab_size: int, batch_size: int, rank: int, world_size: int,
                       ) -> Iterator[dict[str, torch.Tensor]]:
    """Every sample of the evaluation shards once, in order, in batches of batch_size (the last may be shorter).
    Rank r of W takes the r-th of W contiguous runs of batches and reads only their rows, a block at a time:
    across the ranks each row is read once, and a rank never holds a whole shard."""
    first = np.concatenate([[0], np.cumsum([s.num_samples for s in shards])]).astype(np.int64)
    total = int(first[-1])
    if total == 0:
        raise InputError(f"{shards[0].path.parent}: the shards hold no samples; write them again from a larger text")
    n_batches = -(-total // batch_size)
    start = rank * n_batches // world_size * batch_size
    stop = min((rank + 1) * n_batches // world_size * batch_size, total)
    rows: Optional[dict[str, np.ndarray]] = None  # read but not yet batched: less than a batch
    for piece in _rows_in_order(shards, first, start, stop, vocab_size):
        rows = piece if rows is None else {k: np.concatenate([rows[k], piece[k]]) for k in piece}
        whole = len(rows["input_ids"]) // batch_size * batch_size
        for lo in range(0, whole, batch_size):
            yield _tensors(make_batch(rows, np.arange(lo, lo + batch_size)))
        rows = {k: v[whole:] for k, v in rows.items()}
    if rows is not None and len(rows["input_ids"]):  # the last batch of all, on the last rank
        yield _tensors(make_batch(rows, np.arange(len(rows["input_ids"]))))


def _tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {key: torch.from_numpy(value) for key, value in batch.items()}


def _rows_in_order(shards: list[ShardInfo], first: np.ndarray, start: int, stop: int, vocab_size: int
                   ) -> Iterator[dict[str, np.ndarray]]:
    """Rows [start, stop) of the shards one after the other, in pieces that end at a shard's block boundary
    (so that each compressed chunk is decompressed once), every value range-checked."""
    files = _OpenFiles(1)
    try:
        position = start
        while position < stop:
            file = int(np.searchsorted(first, position, side="right")) - 1
            info, local = shards[file], position - int(first[file])
            end = min((local // info.block_rows + 1) * info.block_rows, info.num_samples, stop - int(first[file]))
            yield read_rows(info, files.get(info), local, end, vocab_size)
            position = int(first[file]) + end
    finally:
        files.close()


# --- Rows of gzip-chunked datasets, inflated by ISA-L instead of HDF5's zlib filter -----------------------------------
# Shards written by NVIDIA's and Google's create_pretraining_data are gzip-chunked (h5py's default chunks, often
# split across columns too); inflating them is most of what a pre-training reader does. HDF5 runs zlib's inflate
# chunk by chunk; ISA-L's (the `isal` package) is about 1.7x faster on these chunks and gives the same bytes. So a
# dataset whose chunks are only deflated (with or without HDF5's byte shuffle before it) is read here: HDF5 says
# where each chunk lies (H5Dget_chunk_info_by_coord), its stored bytes are read from the file directly, inflated,
# unshuffled and copied into place. Any other layout (contiguous, lzf, checksums, chunks never written) is read
# by h5py as before.
_SUPPORTED_FILTERS = {h5z.FILTER_SHUFFLE, h5z.FILTER_DEFLATE}
# Chunk lookups need HDF5 1.10.5 or later; os.pread is POSIX (on Windows h5py reads everything).
_CAN_READ_CHUNKS = isal_zlib is not None and hasattr(h5d.DatasetID, "get_chunk_info_by_coord") \
    and hasattr(os, "pread")


@dataclass(frozen=True)
class ChunkLayout:
    """The shape, chunks and filters of one deflated dataset: how to find and decode its chunks. Chunks are looked
    up one at a time as a read needs them (~6 us each): a worker touches a few blocks of many shards."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunk_shape: tuple[int, ...]
    filters: tuple[int, ...]  # in the order they were applied when writing

    @cached_property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunk_shape) * self.dtype.itemsize  # edge chunks are stored whole

    @cached_property
    def columns(self) -> int:
        """Chunks across a row."""
        return -(-self.shape[1] // self.chunk_shape[1]) if len(self.shape) == 2 else 1

    @classmethod
    def of(cls, dataset: h5d.DatasetID) -> Optional["ChunkLayout"]:
        """The layout of a dataset this module reads, or None (h5py reads it)."""
        if not _CAN_READ_CHUNKS:
            return None
        dtype, plist = dataset.dtype, dataset.get_create_plist()
        if plist.get_layout() != h5d.CHUNKED or len(dataset.shape) not in (1, 2) or dtype.kind not in "iuf" \
                or not dtype.isnative:
            return None
        filters = tuple(plist.get_filter(i)[0] for i in range(plist.get_nfilters()))
        if h5z.FILTER_DEFLATE not in filters or not set(filters) <= _SUPPORTED_FILTERS:
            return None
        layout = cls(dataset.shape, dtype, plist.get_chunk(), filters)
        bands = -(-layout.shape[0] // layout.chunk_shape[0])
        # Chunks never written read as the fill value: h5py's job.
        return layout if dataset.get_num_chunks() == bands * layout.columns else None

    def read(self, dataset: h5d.DatasetID, fd: int, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) (0 <= start <= stop <= rows): each chunk they touch inflated once."""
        out = np.empty((stop - start, *self.shape[1:]), self.dtype)
        rows, cols = self.chunk_shape[0], (self.chunk_shape[1] if len(self.shape) == 2 else 1)
        width = self.shape[1] if len(self.shape) == 2 else 1
        flat = out.reshape(stop - start, width)
        for band in range(start // rows, (stop - 1) // rows + 1 if stop > start else 0):
            first, last = max(start, band * rows), min(stop, (band + 1) * rows)
            for column in range(self.columns):
                chunk = self._chunk(dataset, fd, band, column).reshape(rows, cols)
                left, right = column * cols, min(width, (column + 1) * cols)
                flat[first - start:last - start, left:right] = chunk[first - band * rows:last - band * rows,
                                                                     :right - left]
        return out

    def _chunk(self, dataset: h5d.DatasetID, fd: int, band: int, column: int) -> np.ndarray:
        """One chunk's values (chunk shape, flattened), edge chunks padded as HDF5 stores them."""
        corner = (band * self.chunk_shape[0],) + ((column * self.chunk_shape[1],) if len(self.shape) == 2 else ())
        stored = dataset.get_chunk_info_by_coord(corner)
        address, size, skipped = stored.byte_offset, stored.size, stored.filter_mask  # skipped: bit i = filter i
        if address is None:  # the file changed since its layout was read
            raise OSError(f"no chunk at {corner}: the dataset is not laid out as when the run started")
        data = os.pread(fd, size, address)
        if len(data) != size:
            raise OSError(f"the file ends inside the chunk at byte {address} (truncated)")
        for position in reversed(range(len(self.filters))):
            if skipped >> position & 1:
                continue
            if self.filters[position] == h5z.FILTER_DEFLATE:
                data = _inflate(data, address, self.chunk_bytes)
            else:
                data = _unshuffle(data, self.dtype.itemsize)
        if len(data) != self.chunk_bytes:
            raise OSError(f"the chunk at byte {address} holds {len(data)} bytes, not a whole chunk (damaged)")
        return np.frombuffer(data, self.dtype)


def _inflate(data: bytes, address: int, expected: int) -> bytes:
    try:
        return isal_zlib.decompress(data, bufsize=expected)
    except isal_zlib.error as error:
        raise OSError(f"the chunk at byte {address} does not inflate ({error}; damaged)") from None


def _unshuffle(data: bytes, itemsize: int) -> bytes:
    """HDF5's shuffle filter stores byte k of every value together; whole values are put back."""
    if itemsize == 1:
        return data
    return np.frombuffer(data, np.uint8).reshape(itemsize, -1).T.tobytes()


class RowSource:
    """An open HDF5 file whose datasets are read by row range: deflated ones through ChunkLayout, the others by
    h5py. `layouts`, which a reader shares between the files it opens and reopens, keeps each dataset's layout
    by (path, key): reopening a shard then costs the file open only."""

    def __init__(self, path: str | Path, h5file: Optional[h5py.File] = None,
                 layouts: Optional[dict[tuple[Path, str], Optional[ChunkLayout]]] = None) -> None:
        self.path = Path(path)
        self.h5 = h5file if h5file is not None else h5py.File(path, "r")
        self._owns_h5 = h5file is None
        self._fd: Optional[int] = None
        self._owns_fd = False
        self._datasets: dict[str, h5d.DatasetID] = {}
        self._layouts = {} if layouts is None else layouts

    def rows(self, key: str, start: int, stop: int) -> np.ndarray:
        """dataset[start:stop] for 0 <= start."""
        if (self.path, key) not in self._layouts:
            self._layouts[self.path, key] = ChunkLayout.of(self._dataset(key))
        layout = self._layouts[self.path, key]
        if layout is None:
            return h5py.Dataset(self._dataset(key))[start:stop]  # the dataset opened above, not a second lookup
        stop = max(start, min(stop, layout.shape[0]))  # as h5py's slicing
        return layout.read(self._dataset(key), self._descriptor(), start, stop)

    def _descriptor(self) -> int:
        """HDF5's own descriptor of the file where it has one (pread leaves its offset alone): the chunks are read
        from the very file HDF5 located them in, even if the path was replaced since, and no second open."""
        if self._fd is None:
            if self.h5.driver == "sec2":
                self._fd = self.h5.id.get_vfd_handle()
            else:
                self._fd, self._owns_fd = os.open(self.path, os.O_RDONLY), True
        return self._fd

    def _dataset(self, key: str) -> h5d.DatasetID:
        if key not in self._datasets:
            self._datasets[key] = h5d.open(self.h5.id, key.encode())
        return self._datasets[key]

    def close(self) -> None:
        self._datasets.clear()
        if self._owns_fd:
            os.close(self._fd)
        self._fd, self._owns_fd = None, False
        if self._owns_h5:
            self.h5.close()
