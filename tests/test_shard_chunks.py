"""pretraining/data.py's chunk reading (ChunkLayout, RowSource): rows of deflated HDF5 datasets read outside HDF5's
filter pipeline, checked against h5py (HDF5's own pipeline) on every layout it takes, and h5py's reading kept for the
layouts it does not."""
import os
import zlib

import h5py
import numpy as np
import pytest

from bertrecipe.pretraining.data import ChunkLayout, RowSource

LAYOUTS = [  # (shape, chunks, dtype, shuffle)
    ((1000, 128), None, "i4", False),  # h5py's own chunk shape, as NVIDIA's shards: split across columns
    ((1000, 128), (97, 48), "i4", True),  # edge chunks in both dimensions
    ((517, 20), (64, 20), "i4", True),
    ((517, 20), (64, 20), "i8", False),
    ((300, 128), (40, 128), "i1", True),  # shuffle of 1-byte values does nothing
    ((300, 7), (33, 3), "f4", True),
    ((1001,), None, "i1", False),
    ((1001,), (100,), "u2", True),
]


def values(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 120, shape).astype(dtype)  # small ids: compressible, as real shards


@pytest.mark.parametrize("shape,chunks,dtype,shuffle", LAYOUTS)
def test_every_row_range_equals_h5pys(tmp_path, shape, chunks, dtype, shuffle):
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values(shape, dtype), chunks=chunks or True, compression="gzip", shuffle=shuffle)
    rng = np.random.default_rng(1)
    ranges = [(0, shape[0]), (0, 0), (5, 5), (shape[0] - 1, shape[0]), (0, 1), (3, shape[0] + 50),
              (shape[0] + 1, shape[0] + 9)] + [tuple(sorted(rng.integers(0, shape[0] + 1, 2))) for _ in range(20)]
    with h5py.File(path, "r") as f:
        assert ChunkLayout.of(f["x"].id) is not None
        source = RowSource(path)
        try:
            for start, stop in ranges:
                got, want = source.rows("x", start, stop), f["x"][start:stop]
                assert got.dtype == want.dtype and got.shape == want.shape, (start, stop)
                np.testing.assert_array_equal(got, want)
        finally:
            source.close()


def test_a_chunk_stored_without_deflate_is_read_as_stored(tmp_path):
    """HDF5 skips an optional filter that does not shrink a chunk and says so in the chunk's filter mask."""
    path = tmp_path / "x.hdf5"
    data = values((200, 16), "i4")
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=data, chunks=(50, 16), compression="gzip", shuffle=True)
        raw = np.ascontiguousarray(data[50:100]).view(np.uint8).reshape(-1, 4).T.tobytes()  # shuffled, not deflated
        d.id.write_direct_chunk((50, 0), raw, filter_mask=0b10)  # filter 1 (deflate) skipped
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["x"][:], data)  # HDF5 agrees that this is the dataset
    source = RowSource(path)
    try:
        np.testing.assert_array_equal(source.rows("x", 0, 200), data)
    finally:
        source.close()


@pytest.mark.parametrize("options", [{}, {"compression": "lzf"}, {"compression": "gzip", "fletcher32": True},
                                     {"chunks": (10, 4)}])
def test_other_layouts_are_left_to_h5py(tmp_path, options):
    path = tmp_path / "x.hdf5"
    data = values((100, 4), "i4")
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=data, **options)
    with h5py.File(path, "r") as f:
        assert ChunkLayout.of(f["x"].id) is None
    source = RowSource(path)
    try:
        np.testing.assert_array_equal(source.rows("x", 10, 90), data[10:90])
    finally:
        source.close()


def test_unwritten_chunks_and_big_endian_values_are_left_to_h5py(tmp_path):
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("partial", shape=(100, 4), dtype="i4", chunks=(10, 4), compression="gzip", fillvalue=7)
        f["partial"][0:10] = 1  # the other nine chunks were never written: they read as the fill value
        f.create_dataset("big", data=values((100, 4), ">i4"), chunks=(10, 4), compression="gzip")
    with h5py.File(path, "r") as f:
        assert ChunkLayout.of(f["partial"].id) is None and ChunkLayout.of(f["big"].id) is None
    source = RowSource(path)
    try:
        assert source.rows("partial", 5, 15)[:, 0].tolist() == [1] * 5 + [7] * 5
    finally:
        source.close()


def _first_chunk(path):
    with h5py.File(path, "r") as f:
        found = []
        f["x"].id.chunk_iter(found.append)
    return found[0]


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values((400, 32), "i4"), chunks=(100, 32), compression="gzip")
    return path


def test_a_damaged_chunk_is_an_oserror_naming_its_byte(shard):
    chunk = _first_chunk(shard)
    with open(shard, "r+b") as f:
        f.seek(chunk.byte_offset + chunk.size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    source = RowSource(shard)
    try:
        with pytest.raises(OSError, match=f"chunk at byte {chunk.byte_offset} .*damaged"):
            source.rows("x", 0, 10)
        np.testing.assert_array_equal(source.rows("x", 100, 400), h5py.File(shard, "r")["x"][100:400])
    finally:
        source.close()


def test_a_chunk_that_inflates_to_the_wrong_size_is_an_oserror(tmp_path):
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("x", data=values((200, 8), "i4"), chunks=(100, 8), compression="gzip")
        d.id.write_direct_chunk((0, 0), zlib.compress(b"\0" * 100))  # 100 bytes, not 3,200
    source = RowSource(path)
    try:
        with pytest.raises(OSError, match="holds 100 bytes, not a whole chunk"):
            source.rows("x", 0, 200)
    finally:
        source.close()


def test_a_file_cut_after_the_index_was_read_is_an_oserror(shard):
    source = RowSource(shard)
    try:
        source.rows("x", 0, 1)  # the index is read, the file is open
        chunk = _first_chunk(shard)
        os.truncate(shard, chunk.byte_offset + 10)
        with pytest.raises(OSError, match="truncated"):
            source.rows("x", 0, 1)
    finally:
        source.close()


def test_the_layout_knows_a_chunks_bytes_and_the_column_chunks_of_a_row(tmp_path):
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=values((10, 130), "i4"), chunks=(4, 64), compression="gzip")
        layout = ChunkLayout.of(f["x"].id)
        assert (layout.chunk_bytes, layout.columns) == (4 * 64 * 4, 3)


def test_a_layout_is_kept_across_reopening_and_a_rewritten_file_is_refused(shard):
    layouts = {}
    first = RowSource(shard, layouts=layouts)
    want = first.rows("x", 150, 250)
    first.close()
    assert set(layouts) == {(shard, "x")}
    again = RowSource(shard, layouts=layouts)  # a reader reopening the shard: the layout is not read again
    try:
        np.testing.assert_array_equal(again.rows("x", 150, 250), want)
    finally:
        again.close()
    with h5py.File(shard, "w") as f:  # rewritten with other chunks while the run goes on
        f.create_dataset("x", data=values((400, 32), "i4"), chunks=(64, 32), compression="gzip")
    changed = RowSource(shard, layouts=layouts)
    try:
        with pytest.raises(OSError):
            changed.rows("x", 150, 250)
    finally:
        changed.close()


def test_without_isal_chunk_lookups_or_pread_h5py_reads_everything(shard, monkeypatch):
    from bertrecipe.pretraining import data
    monkeypatch.setattr(data, "_CAN_READ_CHUNKS", False)  # no isal wheel, HDF5 before 1.10.5, or Windows
    with h5py.File(shard, "r") as f:
        assert ChunkLayout.of(f["x"].id) is None
        want = f["x"][30:270]
    source = RowSource(shard)
    try:
        np.testing.assert_array_equal(source.rows("x", 30, 270), want)
    finally:
        source.close()


def test_chunks_are_read_from_the_file_hdf5_opened_even_after_the_path_is_replaced(shard, tmp_path):
    """The chunks come through HDF5's own descriptor: a shard renamed over after it was opened (a rerun of data
    prep) does not feed the old file's chunk addresses with the new file's bytes, and no second descriptor."""
    with h5py.File(shard, "r") as f:
        want = f["x"][150:250]
    source = RowSource(shard)
    try:
        other = tmp_path / "other.hdf5"
        with h5py.File(other, "w") as f:
            f.create_dataset("x", data=values((400, 32), "i4") + 1, chunks=(64, 32), compression="gzip")
        os.replace(other, shard)
        np.testing.assert_array_equal(source.rows("x", 150, 250), want)
        assert source._descriptor() == source.h5.id.get_vfd_handle()
    finally:
        source.close()  # HDF5 closes its descriptor itself: closing it here too would fail HDF5's close
