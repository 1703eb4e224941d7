"""The HDF5 pre-training shard (docs/interfaces.md, section 1), in one place: bertrecipe/dataprep/shard_writer.py
writes it and bertrecipe/pretraining/data.py reads it. Six arrays of whole rows, one row a sequence. A run finds
its shards and checks each against this schema before it starts (inspect_shard: keys, dtypes, shapes and the
writer's attributes, without reading the data); data.py checks the values as it reads the rows."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import h5py
import numpy as np

from bertrecipe.common.errors import InputError

FORMAT_VERSION = 1  # the shard's `format_version` attribute
# Array name -> (dtype, number of dimensions).
SHARD_ARRAYS = {
    "input_ids": (np.int32, 2),
    "input_mask": (np.int8, 2),
    "segment_ids": (np.int8, 2),
    "masked_lm_positions": (np.int32, 2),
    "masked_lm_ids": (np.int32, 2),
    "next_sentence_labels": (np.int8, 1),
}
SHARD_KEYS = tuple(SHARD_ARRAYS)
DEFAULT_BLOCK_ROWS = 256  # for unchunked (uncompressed) shards, where any row range reads only itself


@dataclass(frozen=True)
class ShardInfo:
    """A checked shard: its path, samples and their shape, and the block size its reading goes by."""

    path: Path
    num_samples: int
    seq_length: int
    max_predictions: int
    type_vocab_size: int = 2  # segment ids must lie below it (BERT: 0 and 1)
    block_rows: int = DEFAULT_BLOCK_ROWS  # rows of the HDF5 chunks: reading fewer decompresses as much


def find_shards(directory: str | Path, name_must_contain: str = "") -> list[Path]:
    """Sorted `*.hdf5` files of `directory` whose name contains `name_must_contain`."""
    folder = Path(directory)
    if not folder.is_dir():
        raise InputError(f"{folder}: input directory does not exist; check --input_dir / --eval_dir")
    if (name_must_contain and not any(folder.glob(f"*{name_must_contain}*.hdf5"))
            and (folder / name_must_contain).is_dir()):
        folder = folder / name_must_contain  # bertPrep's layout: <corpus>/training/<corpus>_training_<i>.hdf5
    files = sorted(p for p in folder.iterdir() if p.suffix == ".hdf5" and name_must_contain in p.name and p.is_file())
    if not files:
        what = f"*.hdf5 files with '{name_must_contain}' in their name" if name_must_contain else "*.hdf5 files"
        raise InputError(f"{folder}: holds no {what}; point the flag at the folder of shards that data/bertPrep.py or "
                         "create_pretraining_data.py wrote")
    return files


def inspect_shard(path: Path, vocab_size: int, max_positions: int, max_seq_length: Optional[int] = None,
                  max_predictions: Optional[int] = None, type_vocab_size: int = 2) -> ShardInfo:
    """Checks keys, dtypes and shapes (and the writer's attributes when present) without reading the data."""
    shapes, attrs, chunks = _read_layout(path)
    n, seq, preds = _check_shapes(path, shapes)
    if seq > max_positions:
        raise InputError(f"{path}: sequences of {seq} tokens exceed the model's max_position_embeddings "
                         f"{max_positions}; use a config with more positions or shorter shards")
    if max_seq_length is not None and seq != max_seq_length:
        raise InputError(f"{path}: sequences have {seq} tokens but --max_seq_length is {max_seq_length}; pass "
                         f"--max_seq_length {seq} or the shards of that length")
    if max_predictions is not None and preds != max_predictions:
        raise InputError(f"{path}: {preds} masked positions per sequence but --max_predictions_per_seq is "
                         f"{max_predictions}; pass --max_predictions_per_seq {preds} or matching shards")
    _check_vocab_size(path, attrs, vocab_size)
    return ShardInfo(path, n, seq, preds, type_vocab_size, block_rows_for(n, chunks))


def _read_layout(path: Path) -> tuple[dict[str, tuple], dict, list[tuple[int, int]]]:
    """Each key's shape, the file's attributes and the chunking (rows, bytes a row) of the chunked keys."""
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in SHARD_KEYS if k not in f]
            if missing:
                raise InputError(f"{path}: shard lacks the key(s) {', '.join(missing)}; not a pre-training shard of "
                                 "create_pretraining_data.py: rewrite it")
            not_arrays = [k for k in SHARD_KEYS if not isinstance(f[k], h5py.Dataset) or f[k].shape is None]
            if not_arrays:  # a group, or a dataset with no dataspace (h5py.Empty): no shape to check
                raise InputError(f"{path}: not an array: {', '.join(not_arrays)}; rewrite the shard")
            for key in SHARD_KEYS:
                if f[key].dtype.kind not in "iu":
                    raise InputError(f"{path}: {key} has dtype {f[key].dtype}, expected integers; rewrite the shard")
            chunks = [(f[k].chunks[0], f[k].dtype.itemsize * int(np.prod(f[k].shape[1:])))
                      for k in SHARD_KEYS if f[k].chunks]
            return {k: f[k].shape for k in SHARD_KEYS}, dict(f.attrs), chunks
    except InputError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError) as error:  # h5py's errors for damaged metadata
        raise InputError(f"{path}: not a readable HDF5 file ({error}); rewrite it or move it out of the folder"
                         ) from None


def _check_shapes(path: Path, shapes: dict[str, tuple]) -> tuple[int, int, int]:
    """Samples, sequence length and masked positions a sample, once the keys' shapes agree."""
    if len(shapes["input_ids"]) != 2:
        raise InputError(f"{path}: input_ids has shape {shapes['input_ids']}, expected [N, max_seq_length]; "
                         "rewrite the shard")
    n, seq = shapes["input_ids"]
    for key in ("input_mask", "segment_ids"):
        if shapes[key] != shapes["input_ids"]:
            raise InputError(f"{path}: {key} has shape {shapes[key]}, input_ids {shapes['input_ids']}; rewrite the "
                             "shard")
    preds = shapes["masked_lm_positions"]
    if len(preds) != 2 or preds[0] != n or shapes["masked_lm_ids"] != preds:
        raise InputError(f"{path}: masked_lm_positions/ids have shapes {preds}/{shapes['masked_lm_ids']}"
                         f" for {n} samples; rewrite the shard")
    if shapes["next_sentence_labels"] not in ((n,), (n, 1)):
        raise InputError(f"{path}: next_sentence_labels has shape {shapes['next_sentence_labels']}, expected ({n},); "
                         "rewrite the shard")
    return int(n), int(seq), int(preds[1])


def _check_vocab_size(path: Path, attrs: dict, vocab_size: int) -> None:
    try:
        written_vocab = int(attrs.get("vocab_size", 0))
    except (TypeError, ValueError, OverflowError):  # a string, an array, NaN, h5py.Empty
        raise InputError(f"{path}: attribute vocab_size is {attrs['vocab_size']!r}, not a number; rewrite the shard"
                         ) from None
    if written_vocab > vocab_size:
        raise InputError(f"{path}: written for a vocab of {written_vocab} tokens, the model has {vocab_size}; use the "
                         "config (vocab_size) the shards were made for")


def block_rows_for(rows: int, chunks: list[tuple[int, int]]) -> int:
    """The block size (rows) that decompresses the fewest bytes when every block of a shard is read once: one of
    the keys' chunk row counts. `chunks`: (chunk rows, bytes of a whole row) of each chunked key. Keys are
    chunked apart (h5py sizes each key's chunks by its own row width), so no one block size fits them all."""
    if not chunks:
        return DEFAULT_BLOCK_ROWS  # contiguous: a row range reads only itself

    def decompressed(block: int) -> int:
        starts = np.arange(0, rows, block)
        stops = np.minimum(starts + block, rows)
        return sum(width * c * int(((stops - 1) // c - starts // c + 1).sum()) for c, width in chunks)

    return min(sorted({c for c, _ in chunks}), key=decompressed)

