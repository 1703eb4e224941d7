"""Read pre-training text (one sentence per line, documents separated by blank lines) into token arrays."""
from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from bertrecipe.common.errors import DataError
from bertrecipe.common.files import read_text_file
from bertrecipe.dataprep.records import is_record_name, record_format
from bertrecipe.tokenization.ascii_wordpiece import non_ascii_lines
from bertrecipe.tokenization.wordpiece import BertTokenizer

# Tokenize in slices of about this many characters: bounds the temporaries (a 4M-character slice peaked at
# ~77 MB traced); below ~250k the tokenizer's fixed per-call tables (~20 MB) make it slower.
BATCH_CHARS = 250_000


@dataclass(frozen=True)
class Documents:
    """Sentences of all documents as one flat token array.

    tokens int32 [T]; sentence s is tokens[sentence_offsets[s]:sentence_offsets[s+1]] (never empty);
    document d is sentences document_offsets[d]..document_offsets[d+1]-1 (never empty).
    """

    tokens: np.ndarray
    sentence_offsets: np.ndarray
    document_offsets: np.ndarray
    text_tokens: tuple[int, ...] = ()  # how many of the tokens each input text (file, or slice of one) gave

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1


def input_paths(spec: str | Path) -> list[Path]:
    """The files and folders an --input_file names: one path, or (as Google's script takes) a comma-separated
    list of paths and glob patterns. A pattern that matches nothing is an error, not an empty input."""
    text = str(spec)
    if Path(text).exists() or "," not in text and not glob.has_magic(text):
        return [Path(text)]  # an existing name is taken as it is, commas or brackets included
    paths = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if glob.has_magic(part):
            matches = sorted(glob.glob(part))
            if not matches:
                raise DataError(part, "no file matches this --input_file pattern; check the pattern")
            paths += [Path(m) for m in matches]
        else:
            paths.append(Path(part))
    if not paths:
        raise DataError(text, "--input_file names no file; give a file, a folder of .txt files or a "
                              "comma-separated list of them")
    return paths


def input_files(spec: str | Path) -> list[Path]:
    """The inputs of input_paths(spec): a file as it is; an Arrow folder of datasets' save_to_disk as itself; any
    other folder as its files named as text (.txt) or records (Parquet, JSON Lines: is_record_name) in name order
    (the order fixes the output). What each file is, its bytes tell (records.record_format)."""
    files = []
    for path in input_paths(spec):
        if path.is_file() or record_format(path) == "arrow":
            files.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.iterdir() if p.is_file() and (p.suffix == ".txt" or is_record_name(p)))
            if not found:
                raise DataError(path, "directory holds no .txt, Parquet or JSON Lines files; --input_file takes "
                                      "text, Parquet, JSON Lines or save_to_disk folders, or a comma-separated list "
                                      "of them")
            files += found
        else:
            raise DataError(path, "input file not found; check --input_file")
    return files


def read_text(path: Path) -> str:
    """The whole file as text, line ends as they are, without the byte order mark some Windows tools write at its
    start (one elsewhere is content); an unreadable file or non-UTF-8 bytes are a DataError."""
    return read_text_file(path, "input file", encoding="utf-8-sig", newline="", error=DataError, wording={
        "missing": "input file not found; check --input_file",
        "unreadable": "cannot read the input file ({reason}); check --input_file",
        "not UTF-8": "not UTF-8 text (invalid byte at offset {byte}); convert it to UTF-8, e.g. iconv -f <its "
                     "encoding> -t utf-8"})


def _slices(text: str) -> Iterable[str]:
    """Pieces of text cut at a "\\n" after about BATCH_CHARS characters: their lines are text.split("\\n")."""
    start = 0
    while True:
        end = text.find("\n", start + BATCH_CHARS)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


def _blank_lines(chunk: str, counts: np.ndarray) -> np.ndarray:
    """Lines that strip to nothing, as Google's reader tests them, bool [len(counts)]."""
    # In ASCII a line with tokens has a character that is neither whitespace nor control, so it is not blank:
    # only lines without tokens and lines beyond ASCII need the test, each decoded from its bytes alone.
    check = counts == 0
    data = chunk.encode("utf-8")
    bad, starts, ends = non_ascii_lines(np.frombuffer(data, np.uint8))
    check[bad] = True
    where = np.flatnonzero(check)
    blank = np.zeros(len(counts), bool)
    if where.size:
        blank[where] = [not data[s:e].decode("utf-8").strip()
                        for s, e in zip(starts[where].tolist(), ends[where].tolist(), strict=True)]
    return blank


def tokenize_documents(texts: Iterable[str], tokenizer: BertTokenizer,
                       on_progress: Callable[[int], None] | None = None) -> Documents:
    """Tokenize texts as Google's reader does: a line that strips to nothing ends a document, lines with no
    tokens are dropped, empty documents are dropped. Each text (file) also ends a document."""
    token_parts, length_parts, doc_parts = [], [], []
    text_tokens = []
    doc_base = 0
    for text in texts:
        text_tokens.append(0)
        # Lines end at "\n" only, like a line reader: "\x0c" or "\u2028" stay inside a line.
        for chunk in _slices(text):
            ids, offsets = tokenizer.encode_text(chunk)
            text_tokens[-1] += len(ids)
            counts = np.diff(offsets)
            doc_of_line = doc_base + np.cumsum(_blank_lines(chunk, counts))
            keep = counts > 0
            token_parts.append(ids)
            length_parts.append(counts[keep])
            doc_parts.append(doc_of_line[keep])
            doc_base = int(doc_of_line[-1])
            if on_progress is not None:
                on_progress(len(chunk) + 1)
        doc_base += 1
    tokens = np.concatenate(token_parts) if token_parts else np.zeros(0, np.int32)
    lengths = np.concatenate(length_parts) if length_parts else np.zeros(0, np.int64)
    doc_of_sentence = np.concatenate(doc_parts) if doc_parts else np.zeros(0, np.int64)
    sentence_offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=sentence_offsets[1:])
    # A new document starts wherever the document number changes between consecutive kept sentences.
    starts = np.flatnonzero(np.diff(doc_of_sentence, prepend=-1) != 0)
    document_offsets = np.append(starts, len(lengths)).astype(np.int64)
    return Documents(tokens=tokens.astype(np.int32, copy=False), sentence_offsets=sentence_offsets,
                     document_offsets=document_offsets, text_tokens=tuple(text_tokens))
