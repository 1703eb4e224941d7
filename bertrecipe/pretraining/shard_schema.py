"""The HDF5 pre-training shard (docs/interfaces.md, section 1), in one place: bertrecipe/dataprep/shard_writer.py
writes it and bertrecipe/pretraining/data.py reads it. Arrays of whole rows, one row a sequence, of one of two
kinds (the `shard_kind` attribute): NVIDIA's sentence pairs with static masks (six arrays; no attribute, as NVIDIA
writes them) or document chunks for masked-LM-only training (three arrays, masked as they are read). A run finds
its shards and checks each against this schema before it starts (inspect_shard: keys, dtypes, shapes and the
writer's attributes, without reading the data); data.py checks the values as it reads the rows."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import h5py
import numpy as np

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import FileStamp, content_kind
from bertrecipe.pretraining import masking
from bertrecipe.tokenization.vocab_files import BPE, WORDPIECE, TokenizerIdentity

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
KIND_ATTRIBUTE = "shard_kind"
SENTENCE_PAIRS = "sentence_pairs"  # the kind of a shard without the attribute (NVIDIA's, Google's, ours)
DOCUMENT_CHUNKS = "document_chunks"
# Document chunks: each document's tokens cut into rows of [CLS] up to L - 2 tokens [SEP]; no pairs, no masks.
DOCUMENT_CHUNK_ARRAYS = {
    "input_ids": (np.int32, 2),
    "input_mask": (np.int8, 2),
    "document_ids": (np.int64, 1),  # the row's document, numbered in input order; its rows keep their order
}
SPECIAL_ID_ATTRIBUTES = ("cls_id", "sep_id", "pad_id", "mask_id")  # document chunks: what load-time masking needs
KIND_ARRAYS = {SENTENCE_PAIRS: SHARD_ARRAYS, DOCUMENT_CHUNKS: DOCUMENT_CHUNK_ARRAYS}
# The fixed mask a document-chunk row gets when it is read as static rows (held-out evaluation): Google's rule
# at this rate, capped only by the row (P = round(L * rate) positions), drawn from the row's number in its shard.
CHUNK_EVAL_MASKED_LM_PROB = 0.15
DEFAULT_BLOCK_ROWS = 256  # for unchunked (uncompressed) shards, where any row range reads only itself


@dataclass(frozen=True)
class SpecialTokenIds:
    """A document-chunk shard's special token ids and tokenizer size (its attributes): what masking needs."""

    cls: int
    sep: int
    pad: int
    mask: int
    vocab_size: int


@dataclass(frozen=True)
class ShardInfo:
    """A checked shard: its path, samples and their shape, and the block size its reading goes by."""

    path: Path
    num_samples: int
    seq_length: int
    max_predictions: int
    type_vocab_size: int = 2  # segment ids must lie below it (BERT: 0 and 1)
    block_rows: int = DEFAULT_BLOCK_ROWS  # rows of the HDF5 chunks: reading fewer decompresses as much
    kind: str = SENTENCE_PAIRS
    special: Optional[SpecialTokenIds] = None  # document chunks only
    tokenizer: Optional[TokenizerIdentity] = None  # what the writer recorded (None: NVIDIA's shards record nothing)
    fingerprint: Optional[str] = None  # content_fingerprint's, where the run computed it
    lower_case: Optional[bool] = None  # whether the text was lower-cased (do_lower_case; None: not recorded)
    stamp: Optional[FileStamp] = None  # the file as inspected: each later opening checks it is still that file


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
    """Checks keys, dtypes and shapes (and the writer's attributes when present) without reading the data.
    max_predictions (static masks expected) refuses a document-chunk shard, which holds no masks."""
    stamp = FileStamp.of(path)  # before the first read: a change from here on is caught at the next opening
    kind, shapes, attrs, chunks = _read_layout(path)
    if kind == DOCUMENT_CHUNKS:
        if max_predictions is not None:
            raise InputError(f"{path}: a document-chunk shard holds no masks (they are drawn as it is read): add "
                             "--dynamic_masking")
        n, seq = _check_chunk_shapes(path, shapes)
        preds = max(1, round(seq * CHUNK_EVAL_MASKED_LM_PROB))
    else:
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
    special = _special_ids(path, attrs) if kind == DOCUMENT_CHUNKS else None
    return ShardInfo(path, n, seq, preds, type_vocab_size, block_rows_for(n, chunks), kind, special,
                     _recorded_tokenizer(path, attrs), lower_case=_recorded_casing(path, attrs), stamp=stamp)


def _recorded_casing(path: Path, attrs: dict) -> Optional[bool]:
    """The do_lower_case attribute as a bool; None for a shard that records none (NVIDIA's, Google's)."""
    value = attrs.get("do_lower_case")
    if value is None:
        return None
    if isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_)) and float(value) in (0.0, 1.0):
        return bool(value)
    raise InputError(f"{path}: attribute do_lower_case is {value!r}, not 0 or 1; rewrite the shard")


def _recorded_tokenizer(path: Path, attrs: dict) -> Optional[TokenizerIdentity]:
    """The tokenizer create_pretraining_data.py recorded (vocab_sha256, vocab_size and, for document chunks, its
    kind; sentence pairs are WordPiece's); None for a shard that records none."""
    sha256 = attrs.get("vocab_sha256")
    if sha256 is None:
        return None
    kind = attrs.get("tokenizer", WORDPIECE)
    kind, sha256 = (v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in (kind, sha256))
    if kind not in (WORDPIECE, BPE) or not isinstance(sha256, str):
        raise InputError(f"{path}: attributes tokenizer {kind!r} and vocab_sha256 {sha256!r} name no tokenizer; "
                         "rewrite the shard")
    return TokenizerIdentity(str(kind), int(attrs.get("vocab_size", 0)), sha256, str(path))


FINGERPRINT_ROWS = 8  # rows of every array hashed: each array's first chunk is read and decompressed, no more


def content_fingerprint(path: Path) -> str:
    """A shard's identity by content: a hash of its attributes, every array's dtype and shape, and the values of
    its first FINGERPRINT_ROWS rows. Another vocab, casing, dupe factor, seed or masking under the same file name
    changes it (the rows are drawn and shuffled anew); reading it costs one chunk of each array."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with h5py.File(path, "r") as f:
            for name in sorted(f.attrs):
                digest.update(f"{name}={_plain(f.attrs[name])!r};".encode())
            for name in sorted(f):
                data = f[name]
                digest.update(f"{name}:{data.dtype.str}:{data.shape};".encode())
                digest.update(np.ascontiguousarray(data[:FINGERPRINT_ROWS]).tobytes())
    except (OSError, KeyError, RuntimeError, ValueError) as error:  # h5py's errors for damaged data
        raise InputError(f"{path}: cannot read the shard ({error}); rewrite it or move it out of the folder"
                         ) from None
    return digest.hexdigest()


def _plain(value: Any) -> Any:
    """An attribute as plain Python (numpy scalars and arrays print alike across numpy versions)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value.item() if isinstance(value, np.generic) else value


def _read_layout(path: Path) -> tuple[str, dict[str, tuple], dict, list[tuple[int, int]]]:
    """The shard's kind, each key's shape, the file's attributes and the chunking (rows, bytes a row) of the
    chunked keys."""
    try:
        with h5py.File(path, "r") as f:
            attrs = dict(f.attrs)
            kind = _kind(path, attrs)
            keys = tuple(KIND_ARRAYS[kind])
            missing = [k for k in keys if k not in f]
            if missing:
                what = "document-chunk" if kind == DOCUMENT_CHUNKS else "pre-training"
                raise InputError(f"{path}: shard lacks the key(s) {', '.join(missing)}; not a {what} shard of "
                                 "create_pretraining_data.py: rewrite it")
            not_arrays = [k for k in keys if not isinstance(f[k], h5py.Dataset) or f[k].shape is None]
            if not_arrays:  # a group, or a dataset with no dataspace (h5py.Empty): no shape to check
                raise InputError(f"{path}: not an array: {', '.join(not_arrays)}; rewrite the shard")
            for key in keys:
                if f[key].dtype.kind not in "iu":
                    raise InputError(f"{path}: {key} has dtype {f[key].dtype}, expected integers; rewrite the shard")
            chunks = [(f[k].chunks[0], f[k].dtype.itemsize * int(np.prod(f[k].shape[1:])))
                      for k in keys if f[k].chunks]
            return kind, {k: f[k].shape for k in keys}, attrs, chunks
    except InputError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError) as error:  # h5py's errors for damaged metadata
        found = content_kind(path)
        if found is not None and found != "an HDF5 file":
            raise InputError(f"{path}: {found}, not an HDF5 shard; move it out of the folder") from None
        raise InputError(f"{path}: not a readable HDF5 file ({error}); rewrite it or move it out of the folder"
                         ) from None


def _kind(path: Path, attrs: dict) -> str:
    """The shard_kind attribute; a shard without one is NVIDIA's kind."""
    value = attrs.get(KIND_ATTRIBUTE, SENTENCE_PAIRS)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or value not in KIND_ARRAYS:
        raise InputError(f"{path}: attribute {KIND_ATTRIBUTE} is {value!r}, not one of {', '.join(KIND_ARRAYS)}; "
                         "rewrite the shard")
    return value


def _check_chunk_shapes(path: Path, shapes: dict[str, tuple]) -> tuple[int, int]:
    """Rows and sequence length of a document-chunk shard, once its keys' shapes agree."""
    if len(shapes["input_ids"]) != 2 or shapes["input_mask"] != shapes["input_ids"]:
        raise InputError(f"{path}: input_ids and input_mask have shapes {shapes['input_ids']} and "
                         f"{shapes['input_mask']}, expected one shape [N, max_seq_length]; rewrite the shard")
    n, seq = shapes["input_ids"]
    if shapes["document_ids"] != (n,):
        raise InputError(f"{path}: document_ids has shape {shapes['document_ids']}, expected ({n},); rewrite the "
                         "shard")
    return int(n), int(seq)


def _special_ids(path: Path, attrs: dict) -> SpecialTokenIds:
    """A document-chunk shard's special ids: distinct integers below its vocab_size attribute."""
    names = ("vocab_size", *SPECIAL_ID_ATTRIBUTES)
    values = [attrs.get(name) for name in names]
    numbers = [int(v) for v in values if isinstance(v, (int, np.integer))]
    if len(numbers) != len(names) or len(set(numbers[1:])) != 4 or not all(0 <= i < numbers[0] for i in numbers[1:]):
        found = ", ".join(f"{name}={value!r}" for name, value in zip(names, values, strict=True))
        raise InputError(f"{path}: a document-chunk shard needs distinct integer attributes {', '.join(names[1:])} "
                         f"below vocab_size (found {found}); rewrite it with create_pretraining_data.py "
                         "--document_chunks")
    return SpecialTokenIds(*numbers[1:], vocab_size=numbers[0])


def as_static_rows(info: ShardInfo, arrays: dict[str, np.ndarray], first_row: int) -> dict[str, np.ndarray]:
    """Rows read from a shard (its kind's keys) as the six SHARD_KEYS of the sentence-pair kind, next_sentence_labels
    [N]. Document chunks get segment ids and next-sentence labels 0 and a fixed mask: Google's rule at
    CHUNK_EVAL_MASKED_LM_PROB, keyed by the row's number in its shard (the same at every read), which held-out
    evaluation scores and --dynamic_masking undoes and draws afresh."""
    if info.kind != DOCUMENT_CHUNKS:
        return {**arrays, "next_sentence_labels": arrays["next_sentence_labels"].reshape(-1)}
    special = info.special
    assert special is not None  # inspect_shard reads it off every document-chunk shard
    spec = masking.spec_from_special_ids(special.cls, special.sep, special.pad, special.mask, special.vocab_size,
                                         CHUNK_EVAL_MASKED_LM_PROB, info.max_predictions)
    rows = np.arange(first_row, first_row + len(arrays["input_ids"]))
    input_ids, labels = masking.dynamic_mask(arrays["input_ids"], arrays["input_mask"], rows, 0, 0, spec)
    positions, ids = masking.labels_to_positions(labels, info.max_predictions)
    mask = arrays["input_mask"]
    # int64 as masked: a too large id of a foreign file is refused by the range check, not wrapped into range.
    return {"input_ids": input_ids, "input_mask": mask, "segment_ids": np.zeros(mask.shape, np.int8),
            "masked_lm_positions": positions, "masked_lm_ids": ids,
            "next_sentence_labels": np.zeros(len(rows), np.int8)}


def check_run_kinds(shards: list[ShardInfo], no_nsp: bool) -> None:
    """One kind of shard a run; document chunks (all of one tokenizer) train the masked LM alone."""
    chunks = [s for s in shards if s.kind == DOCUMENT_CHUNKS]
    if not chunks:
        return
    if len(chunks) != len(shards):
        pairs = next(s for s in shards if s.kind != DOCUMENT_CHUNKS)
        raise InputError(f"{chunks[0].path}: a document-chunk shard among sentence-pair shards (e.g. {pairs.path}); "
                         "train on one kind of shard per run")
    other = next((s for s in chunks if s.special != chunks[0].special), None)
    if other is not None:
        raise InputError(f"{other.path}: written with other special ids or vocab size than {chunks[0].path} "
                         f"({other.special} vs {chunks[0].special}); use shards of one tokenizer")
    if not no_nsp:
        raise InputError(f"{chunks[0].path}: a document-chunk shard holds no sentence pairs (no next-sentence "
                         "task): add --no_nsp")


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

