"""Row ranges of gzip-compressed HDF5 datasets, inflated by ISA-L instead of HDF5's zlib filter.

Shards written by NVIDIA's and Google's create_pretraining_data are gzip-chunked (h5py's default chunks, often
split across columns too); inflating them is most of what a pre-training reader does. HDF5 runs zlib's inflate
chunk by chunk; ISA-L's (the `isal` package) is about 1.7x faster on these chunks and gives the same bytes. So a
dataset whose chunks are only deflated (with or without HDF5's byte shuffle before it) is read here: HDF5 says
where each chunk lies (H5Dget_chunk_info_by_coord), its stored bytes are read from the file directly, inflated,
unshuffled and copied into place. Any other layout (contiguous, lzf, checksums, chunks never written) is read
by h5py as before.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Optional

import h5py
import numpy as np
from h5py import h5d, h5z

try:
    from isal import isal_zlib
except ImportError:  # a platform without isal's wheels: h5py inflates as fast as zlib would here
    isal_zlib = None

__all__ = ["ChunkLayout", "RowSource"]

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
