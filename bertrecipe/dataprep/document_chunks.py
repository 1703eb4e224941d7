"""Document-chunk shards (docs/interfaces.md, section 1) for masked-LM-only training, as ModernBERT trains: every
document's tokens, in order, cut into rows of `[CLS]` up to max_seq_length - 2 tokens `[SEP]`, padded; no row
crosses a document, there are no sentence pairs, next-sentence labels or masks (those are drawn as the rows are
read: pretraining/masking.py). The rows are written in a random order (like Google's shuffled instances, so that
a step's samples come from many documents) in which each document's rows keep their order; `document_ids` says
which document a row belongs to."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from bertrecipe.dataprep.documents import Documents
from bertrecipe.dataprep.shard_writer import write_shard_blocks
from bertrecipe.pretraining.shard_schema import DOCUMENT_CHUNKS, KIND_ATTRIBUTE, SpecialTokenIds

BLOCK = 4096  # rows assembled and written at a time


def chunk_spans(docs: Documents, max_seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first token, number of tokens, document) of every row, int64 [R] each, in document order: document d's
    tokens cut into pieces of max_seq_length - 2, the last one shorter."""
    body = max_seq_length - 2
    bounds = docs.sentence_offsets[docs.document_offsets]  # each document's first token, then the end
    lengths = np.diff(bounds)
    per_document = -(-lengths // body)
    document = np.repeat(np.arange(len(lengths)), per_document)
    index = np.arange(len(document)) - np.repeat(np.cumsum(per_document) - per_document, per_document)
    first = bounds[document] + index * body
    return first, np.minimum(body, bounds[document + 1] - first), document


def shard_order(documents: np.ndarray, gen: np.random.Generator) -> np.ndarray:
    """The rows (numbered in document order) in the order the shard holds them: a uniformly random placement,
    except that each document's places go to its rows in their order."""
    places = gen.permutation(len(documents))
    places = places[np.lexsort((places, documents))]  # a document's places, ascending, to its rows in order
    order = np.empty_like(places)
    order[places] = np.arange(len(places))
    return order


def chunk_blocks(tokens: np.ndarray, spans: tuple[np.ndarray, np.ndarray, np.ndarray], order: np.ndarray,
                 max_seq_length: int, special: SpecialTokenIds) -> Iterator[dict[str, np.ndarray]]:
    """The shard's arrays (input_ids, input_mask, document_ids) for the rows `order` of spans, in blocks of up
    to BLOCK rows, made as they are asked for."""
    first, count, document = spans
    columns = np.arange(max_seq_length)
    for lo in range(0, len(order), BLOCK):
        rows = order[lo:lo + BLOCK]
        start, length = first[rows], count[rows]
        # Column c of a row holds token start + c - 1 for 1 <= c <= length; [CLS] before, [SEP] after, then [PAD].
        inside = (columns >= 1) & (columns <= length[:, None])
        input_ids = np.where(inside, tokens[np.where(inside, start[:, None] + columns - 1, 0)], special.pad)
        input_ids[:, 0] = special.cls
        input_ids[np.arange(len(rows)), length + 1] = special.sep
        yield {"input_ids": input_ids.astype(np.int32),
               "input_mask": (columns < length[:, None] + 2).astype(np.int8),
               "document_ids": document[rows].astype(np.int64)}


def write_document_chunks(output: Path, docs: Documents, max_seq_length: int, special: SpecialTokenIds,
                          attrs: Mapping[str, object], seed: int, compression: str | None, clean: bool) -> int:
    """Write docs as a document-chunk shard at output (atomically, as every shard); the number of rows."""
    spans = chunk_spans(docs, max_seq_length)
    order = shard_order(spans[2], np.random.default_rng(seed))
    shapes = {"input_ids": (max_seq_length,), "input_mask": (max_seq_length,), "document_ids": ()}
    blocks = chunk_blocks(docs.tokens, spans, order, max_seq_length, special)
    write_shard_blocks(output, len(order), shapes, blocks, {**attrs, KIND_ATTRIBUTE: DOCUMENT_CHUNKS},
                       compression=compression, clean=clean)
    return len(order)
