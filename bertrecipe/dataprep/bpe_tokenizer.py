"""Document-chunk shards' text through a byte-level BPE tokenizer.json (tokenization/bpe.py: load_bpe):
bpe_documents tokenizes text of one sentence a line, documents separated by blank lines, into
dataprep.documents.Documents.

Byte-level BPE is cased and lossless: no normalizer, every byte a token, so decoding the ids gives the text back.
A document is tokenized whole, as ModernBERT tokenizes its documents: its lines stripped and joined by one space
(the line breaks are the sentence splitter's, which cut the text at spaces), so that a word keeps the leading
space its BPE pieces were learnt with."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np

from bertrecipe.dataprep.documents import BATCH_CHARS, Documents
from bertrecipe.tokenization.bpe import BpeVocab, SpacedWordEncoder


def document_texts(text: str) -> Iterator[str]:
    """The documents of one file's text as Google's reader splits them (lines end at "\\n"; a line that strips to
    nothing ends a document; empty documents are dropped), each its stripped lines joined by one space."""
    lines: list[str] = []
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped:
            lines.append(stripped)
        elif lines:
            yield " ".join(lines)
            lines = []
    if lines:
        yield " ".join(lines)


def _batches(texts: Iterable[str]) -> Iterator[tuple[list[str], list[int]]]:
    """Documents of all texts (a text ends a document), in lists of about BATCH_CHARS characters, each with the
    number (in texts) of the text each document comes from."""
    batch: list[str] = []
    origins: list[int] = []
    size = 0
    for number, text in enumerate(texts):
        for document in document_texts(text):
            batch.append(document)
            origins.append(number)
            size += len(document)
            if size >= BATCH_CHARS:
                yield batch, origins
                batch, origins, size = [], [], 0
    if batch:
        yield batch, origins


def bpe_documents(texts: Iterable[str], vocab: BpeVocab,
                  on_progress: Callable[[int], None] | None = None) -> Documents:
    """The documents of texts (files), each tokenized whole without special tokens: Documents whose every
    document is one "sentence" (document chunks need no sentences)."""
    texts = list(texts)
    encoder = SpacedWordEncoder(vocab)
    parts: list[np.ndarray] = []
    lengths: list[int] = []
    text_tokens = [0] * len(texts)
    for batch, origins in _batches(texts):
        ids, batch_lengths = encoder.encode(batch)
        parts.append(np.asarray(ids, np.int32))
        lengths += [n for n in batch_lengths if n]  # a document of no token (none is made here) is no document
        for number, n in zip(origins, batch_lengths, strict=True):
            text_tokens[number] += n
        if on_progress is not None:
            on_progress(sum(len(document) for document in batch))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Documents(tokens=tokens, sentence_offsets=offsets, document_offsets=np.arange(len(lengths) + 1),
                     text_tokens=tuple(text_tokens))
