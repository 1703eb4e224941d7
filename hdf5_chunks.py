"""Row ranges of gzip-compressed HDF5 datasets, inflated by ISA-L instead of HDF5's zlib filter.

Shards written by NVIDIA's and Google's create_pretraining_data are gzip-chunked (h5py's default chunks, often
split across columns too); inflating them is most of what a pre-training reader does. HDF5 runs zlib's inflate
chunk by chunk; ISA-L's (the `isal` package) is about 1.7x faster on these chunks and gives the same bytes. So a
dataset whose chunks are only deflated (with or without HDF5's byte shuffle before it) is read here: the chunk
index comes from HDF5 (H5Dchunk_iter), each chunk's stored bytes are read from the file directly, inflated,
unshuffled and copied into place. Any other layout (contiguous, lzf, checksums, chunks never written) is read
by h5py as before.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import h5py
import numpy as np
from h5py import h5z
from isal import isal_zlib

__all__ = ["ChunkIndex", "RowSource"]

_SUPPORTED_FILTERS = {h5z.FILTER_SHUFFLE, h5z.FILTER_DEFLATE}


class ChunkIndex:
    """How to find and decode the chunks of one deflated dataset. Chunks are looked up one at a time, as a read
    needs them (H5Dget_chunk_info_by_coord, ~6 us): a worker touches a few blocks of many shards, and indexing a
    shard whole at every open cost it a fifth of its time."""

    def __init__(self, dataset: h5py.Dataset, filters: list[int]) -> None:
        self.dataset_id = dataset.id
        self.shape = dataset.shape
        self.dtype = dataset.dtype
        self.chunk_shape = dataset.chunks
        self.filters = filters  # in the order they were applied when writing
        self.chunk_bytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize  # edge chunks are stored whole
        self.columns = -(-self.shape[1] // self.chunk_shape[1]) if len(self.shape) == 2 else 1

    @classmethod
    def of(cls, dataset: h5py.Dataset) -> Optional["ChunkIndex"]:
        """The index of a dataset this module reads, or None (h5py reads it)."""
        dtype = dataset.dtype
        if dataset.chunks is None or dataset.ndim not in (1, 2) or dtype.kind not in "iuf" or not dtype.isnative:
            return None
        if not hasattr(dataset.id, "get_chunk_info_by_coord"):  # h5py built against an HDF5 older than 1.10.5
            return None
        plist = dataset.id.get_create_plist()
        filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
        if h5z.FILTER_DEFLATE not in filters or not set(filters) <= _SUPPORTED_FILTERS:
            return None
        index = cls(dataset, filters)
        bands = -(-index.shape[0] // index.chunk_shape[0])
        # Chunks never written read as the fill value: h5py's job.
        return index if dataset.id.get_num_chunks() == bands * index.columns else None

    def read(self, fd: int, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop): each chunk they touch inflated once."""
        out = np.empty((stop - start, *self.shape[1:]), self.dtype)
        rows, cols = self.chunk_shape[0], (self.chunk_shape[1] if len(self.shape) == 2 else 1)
        width = self.shape[1] if len(self.shape) == 2 else 1
        flat = out.reshape(stop - start, width)
        for band in range(start // rows, (stop - 1) // rows + 1 if stop > start else 0):
            first, last = max(start, band * rows), min(stop, (band + 1) * rows)
            for column in range(self.columns):
                chunk = self._chunk(fd, band, column).reshape(rows, cols)
                left, right = column * cols, min(width, (column + 1) * cols)
                flat[first - start:last - start, left:right] = chunk[first - band * rows:last - band * rows,
                                                                     :right - left]
        return out

    def _chunk(self, fd: int, band: int, column: int) -> np.ndarray:
        """One chunk's values (chunk shape, flattened), edge chunks padded as HDF5 stores them."""
        corner = (band * self.chunk_shape[0],) + ((column * self.chunk_shape[1],) if len(self.shape) == 2 else ())
        stored = self.dataset_id.get_chunk_info_by_coord(corner)
        address, size, skipped = stored.byte_offset, stored.size, stored.filter_mask  # skipped: bit i = filter i
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
    """An open HDF5 file whose datasets are read by row range: deflated ones through ChunkIndex, the others by
    h5py. The chunk index of each dataset is built on its first read."""

    def __init__(self, path: str | Path, h5file: Optional[h5py.File] = None) -> None:
        self.path = Path(path)
        self.h5 = h5file if h5file is not None else h5py.File(path, "r")
        self._owns_h5 = h5file is None
        self._fd: Optional[int] = None
        self._indexes: dict[str, Optional[ChunkIndex]] = {}

    def rows(self, key: str, start: int, stop: int) -> np.ndarray:
        if key not in self._indexes:
            self._indexes[key] = ChunkIndex.of(self.h5[key])
        index = self._indexes[key]
        if index is None or stop <= start:
            return self.h5[key][start:stop]
        stop = min(stop, index.shape[0])  # as h5py's slicing
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return index.read(self._fd, start, max(start, stop))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._owns_h5:
            self.h5.close()
