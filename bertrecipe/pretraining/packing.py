"""Packing (--pack_sequences): a micro-batch's samples placed whole, best fit, into as few rows as hold them.

Each sample keeps its own positions and attends only to itself (model/documents.py: `document_ids` number the
samples of a row 1, 2, ... with 0 at padding), so a packed row computes what its samples would compute alone; the
masked-LM loss, a mean over the labelled tokens of the micro-batch, is the same as without packing. Only the
padding goes: a micro-batch of short samples takes fewer, fuller rows. The next-sentence task reads one [CLS] a
row, so packing needs --no_nsp (or the modern family, which has no NSP).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bertrecipe.pretraining.masking import IGNORE_INDEX

PACKED_KEYS = ("input_ids", "segment_ids", "input_mask", "masked_lm_labels")


def best_fit_rows(lengths: Sequence[int], row_length: int) -> list[list[int]]:
    """Sample indexes per row, best-fit decreasing: longest sample first, each into the row it leaves the least
    room in (a new row when none has room). Samples of equal length keep their order."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    room: list[int] = []
    for index in order:
        length = lengths[index]
        fitting = [r for r in range(len(rows)) if room[r] >= length]
        if fitting:
            best = min(fitting, key=lambda r: room[r])
            rows[best].append(index)
            room[best] -= length
        else:
            rows.append([index])
            room.append(row_length - length)
    return rows


def pack_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A micro-batch (PACKED_KEYS, [N, S], each sample's tokens first and its padding after) as packed rows
    [R, S], R <= N, with document_ids; next_sentence_labels, if any, are left out."""
    row_length = batch["input_ids"].shape[1]
    lengths = np.count_nonzero(batch["input_mask"], axis=1).tolist()
    rows = best_fit_rows(lengths, row_length)
    packed = {key: np.zeros((len(rows), row_length), dtype=np.int64) for key in PACKED_KEYS}
    packed["masked_lm_labels"].fill(IGNORE_INDEX)
    packed["document_ids"] = np.zeros((len(rows), row_length), dtype=np.int64)
    for row, samples in enumerate(rows):
        start = 0
        for document, sample in enumerate(samples, start=1):
            end = start + lengths[sample]
            for key in PACKED_KEYS:
                packed[key][row, start:end] = batch[key][sample, : lengths[sample]]
            packed["document_ids"][row, start:end] = document
            start = end
    return packed
