"""A byte-level BPE tokenizer.json (written by vocab_training.train_bpe, or any tokenizers file with BERT's special
tokens) for document-chunk shards: load_bpe checks it and finds the special ids, bpe_documents tokenizes text of
one sentence a line, documents separated by blank lines, into dataprep.documents.Documents.

Byte-level BPE is cased and lossless: no normalizer, every byte a token, so decoding the ids gives the text back.
A document is tokenized whole, as ModernBERT tokenizes its documents: its lines stripped and joined by one space
(the line breaks are the sentence splitter's, which cut the text at spaces), so that a word keeps the leading
space its BPE pieces were learnt with."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.documents import BATCH_CHARS, Documents
from bertrecipe.tokenization.wordpiece import SPECIAL_TOKENS


@dataclass(frozen=True)
class BpeVocab:
    """A loaded tokenizer.json: its tokenizer, size (added tokens included), file hash and special ids."""

    path: Path
    tokenizer: Tokenizer
    size: int
    sha256: str
    special: dict[str, int]  # [PAD] [UNK] [CLS] [SEP] [MASK] -> id

    def id(self, token: str) -> int:
        return self.special[token]


def is_bpe_file(path: str | Path) -> bool:
    """A --vocab_file that names a tokenizer.json rather than a WordPiece vocab.txt."""
    return Path(path).suffix == ".json"


def load_bpe(path: str | Path) -> BpeVocab:
    """The tokenizer.json at path; DataError (one line) if it cannot be read, parsed, or lacks a special token."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(path, f"cannot read the tokenizer ({err.strerror}); check --vocab_file") from None
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises plain Exception for a bad file; UnicodeDecodeError too
        problem = " ".join(str(err).split())[:200]
        raise DataError(path, f"not a tokenizers tokenizer.json ({problem}); write one with bertPrep.py --action "
                              "create_vocab --vocab_type bpe") from None
    special = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, index in special.items() if index is None]
    if missing:
        raise DataError(path, f"the tokenizer lacks the special token(s) {' '.join(missing)}, which BERT's rows and "
                              "masks need; train it with bertPrep.py --action create_vocab --vocab_type bpe")
    # Text that spells a special token ("[SEP]" in an article about BERT) is text: its bytes, not the token's id,
    # as Google's WordPiece tokenizer splits it into pieces. Only this copy, which tokenizes data, does so.
    tokenizer.encode_special_tokens = True
    return BpeVocab(path, tokenizer, tokenizer.get_vocab_size(with_added_tokens=True),
                    hashlib.sha256(raw).hexdigest(), special)


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


def _batches(texts: Iterable[str]) -> Iterator[list[str]]:
    """Documents of all texts (a text ends a document), in lists of about BATCH_CHARS characters."""
    batch: list[str] = []
    size = 0
    for text in texts:
        for document in document_texts(text):
            batch.append(document)
            size += len(document)
            if size >= BATCH_CHARS:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def bpe_documents(texts: Iterable[str], vocab: BpeVocab,
                  on_progress: Callable[[int], None] | None = None) -> Documents:
    """The documents of texts (files), each tokenized whole without special tokens: Documents whose every
    document is one "sentence" (document chunks need no sentences)."""
    parts: list[np.ndarray] = []
    lengths: list[int] = []
    for batch in _batches(texts):
        for encoding in vocab.tokenizer.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray(encoding.ids, np.int32)
            if len(ids):
                parts.append(ids)
                lengths.append(len(ids))
        if on_progress is not None:
            on_progress(sum(len(document) for document in batch))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Documents(tokens=tokens, sentence_offsets=offsets, document_offsets=np.arange(len(lengths) + 1))
