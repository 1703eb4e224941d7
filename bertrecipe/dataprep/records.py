"""Documents from the corpus files of today, read as streams: Parquet (pyarrow, the text column and the filtered
columns alone, a batch at a time), JSON Lines (.jsonl, .ndjson, .json; plain, .gz or .zst) and the Arrow folders
that `datasets`' save_to_disk writes. Each record is one document; `Selection` says which column holds its text,
which rows to keep (filters on other columns, length bounds) and whether exact duplicates go. Memory holds one
batch of rows (Parquet, Arrow) or one line (JSON Lines), never the file. Bad input is a DataError naming the
file and the row (or line)."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import operator
import re
import unicodedata
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from bertrecipe.common.errors import DataError

PARQUET_SUFFIXES = (".parquet", ".pq")
JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = (".gz", ".zst")
ARROW_STATE = "state.json"  # what save_to_disk writes beside its .arrow files
BATCH_ROWS = 1024  # rows of a Parquet or Arrow batch: bounds the memory a reader holds

_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}
_FILTER = re.compile(r"^\s*([^<>=!\s]+)\s*(>=|<=|==|!=|>|<)\s*(.*?)\s*$")


@dataclass(frozen=True)
class RowFilter:
    """Keep a record whose `column` compares to `value` by `op` (numbers as numbers, anything else as text)."""

    column: str
    op: str
    value: float | str

    def __str__(self) -> str:
        return f"{self.column}{self.op}{self.value}"

    def keeps(self, found: Any) -> bool:
        if isinstance(self.value, float):
            if isinstance(found, bool) or not isinstance(found, (int, float)) or math.isnan(found):
                return False  # a missing, textual or NaN score passes no numeric bound
            return _OPERATORS[self.op](float(found), self.value)
        return found is not None and _OPERATORS[self.op](str(found), self.value)


def parse_filter(text: str) -> RowFilter:
    """'score>=3.5', 'language==en', 'source!=spam': a column, an operator and a value."""
    match = _FILTER.match(text)
    if not match or not match.group(3):
        raise DataError("--filter", f"{text!r} is not COLUMN OP VALUE with OP one of {', '.join(_OPERATORS)} "
                                    "(e.g. --filter 'score>=3.5' --filter language==en)")
    column, op, raw = match.groups()
    try:
        value: float | str = float(raw)
    except ValueError:
        value = raw.strip("'\"")
    if isinstance(value, float) and math.isnan(value):
        raise DataError("--filter", f"{text!r}: NaN is no bound")
    return RowFilter(column, op, value)


@dataclass(frozen=True)
class Selection:
    """Which records of a record file are documents, and where their text is."""

    text_field: str = "text"
    filters: tuple[RowFilter, ...] = ()
    min_chars: int = 0
    max_chars: int | None = None
    dedup: bool = False  # drop a document whose normalised text (normalised_text) came before

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys([self.text_field, *(f.column for f in self.filters)]))


@dataclass
class Counts:
    """What a selection did to the records it read."""

    records: int = 0
    kept: int = 0
    filtered: int = 0  # by a --filter
    too_short: int = 0
    too_long: int = 0
    duplicates: int = 0
    chars: int = 0  # of the kept documents' text
    seen: set[bytes] = field(default_factory=set, repr=False)  # the kept documents' hashes, with dedup

    def dropped(self) -> str:
        """What the selection left out, in words ("3 filtered out, 1 duplicate"; "none dropped")."""
        parts = ((self.filtered, "filtered out"), (self.too_short, "too short"), (self.too_long, "too long"),
                 (self.duplicates, "duplicates"))
        return ", ".join(f"{n} {what}" for n, what in parts if n) or "none dropped"

    def as_dict(self) -> dict[str, int]:
        return {key: value for key, value in vars(self).items() if key != "seen"}


def record_format(path: Path) -> str | None:
    """'parquet', 'jsonl' or 'arrow' for a record file or folder; None for anything else (text)."""
    if path.is_dir():
        return "arrow" if (path / ARROW_STATE).is_file() else None
    name = path.name.lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):
            name = name[: -len(compression)]
            return "jsonl" if name.endswith(JSON_LINES_SUFFIXES) else None
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "jsonl" if name.endswith(JSON_LINES_SUFFIXES) else None


def normalised_text(text: str) -> str:
    """The text that dedup compares: Unicode NFC, runs of whitespace as one space, no outer space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def documents(path: Path, selection: Selection, counts: Counts | None = None,
              row_groups: list[int] | None = None) -> Iterator[str]:
    """The texts of the records of one file (or Arrow folder) that the selection keeps, in file order; of a
    Parquet file, those of row_groups alone when given (a task's share of a large file)."""
    counts = counts if counts is not None else Counts()
    kind = record_format(path)
    if kind == "parquet":
        rows = _parquet_rows(path, selection, row_groups)
    else:
        rows = {"jsonl": _json_lines_rows, "arrow": _arrow_rows}[kind or ""](path, selection)
    for where, record in rows:
        text = record.get(selection.text_field)
        if not isinstance(text, str):
            what = "null" if text is None else f"a {type(text).__name__}"
            raise DataError(path, f"{where}: {selection.text_field!r} is {what}, not a string; pass --text_field "
                                  "with the column that holds the text")
        counts.records += 1
        if _kept(text, record, selection, counts):
            counts.kept += 1
            counts.chars += len(text)
            yield text


def _kept(text: str, record: dict[str, Any], selection: Selection, counts: Counts) -> bool:
    if not all(f.keeps(record.get(f.column)) for f in selection.filters):
        counts.filtered += 1
        return False
    if len(text) < selection.min_chars:
        counts.too_short += 1
        return False
    if selection.max_chars is not None and len(text) > selection.max_chars:
        counts.too_long += 1
        return False
    if selection.dedup:
        digest = hashlib.blake2b(normalised_text(text).encode("utf-8"), digest_size=16).digest()
        if digest in counts.seen:
            counts.duplicates += 1
            return False
        counts.seen.add(digest)
    return True


# --- Parquet ------------------------------------------------------------------------------------------------------

def _missing_columns(path: Path, have: list[str], selection: Selection) -> None:
    missing = [c for c in selection.columns if c not in have]
    if missing:
        flag = "--text_field" if missing[0] == selection.text_field else "--filter"
        raise DataError(path, f"no column {missing[0]!r} (columns: {', '.join(have) or 'none'}); check {flag}")


def _text_type(path: Path, name: str, arrow_type: Any, selection: Selection) -> None:
    import pyarrow as pa

    if name == selection.text_field and not (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
                                             or pa.types.is_string_view(arrow_type)):
        raise DataError(path, f"column {name!r} holds {arrow_type}, not strings; pass --text_field with the "
                              "column that holds the text")


def parquet_file(path: Path) -> Any:
    """pyarrow's ParquetFile of path; a file that is not whole Parquet is a DataError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(path, f"not a readable Parquet file ({_first_line(err)}); is it whole?") from None


def parquet_row_groups(path: Path) -> int:
    return parquet_file(path).num_row_groups


def _parquet_rows(path: Path, selection: Selection, row_groups: list[int] | None = None
                  ) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa

    parquet = parquet_file(path)
    schema = parquet.schema_arrow
    _missing_columns(path, schema.names, selection)
    _text_type(path, selection.text_field, schema.field(selection.text_field).type, selection)
    groups = list(range(parquet.num_row_groups)) if row_groups is None else row_groups
    row = sum(parquet.metadata.row_group(g).num_rows for g in range(groups[0])) if groups else 0
    try:
        for batch in parquet.iter_batches(BATCH_ROWS, row_groups=groups, columns=selection.columns):
            for record in batch.to_pylist():
                yield f"row {row}", record
                row += 1
    except (pa.ArrowException, OSError) as err:
        raise DataError(path, f"cannot read past row {row} ({_first_line(err)}); is the file whole?") from None


# --- Arrow folders of datasets' save_to_disk ------------------------------------------------------------------------

def arrow_files(folder: Path) -> list[Path]:
    """The .arrow files of a save_to_disk folder, in the dataset's order (its state.json)."""
    state_file = folder / ARROW_STATE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        files = [folder / entry["filename"] for entry in state["_data_files"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise DataError(state_file, f"not the state.json of datasets' save_to_disk ({_first_line(err)})") from None
    for file in files:
        if not file.is_file():
            raise DataError(file, f"missing: {state_file} lists it; copy the whole folder")
    return files


def _arrow_rows(folder: Path, selection: Selection) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow as pa

    row = 0
    for file in arrow_files(folder):
        try:
            with pa.memory_map(str(file)) as source:
                reader = pa.ipc.open_stream(source)
                _missing_columns(file, reader.schema.names, selection)
                _text_type(file, selection.text_field, reader.schema.field(selection.text_field).type, selection)
                for batch in reader:
                    for start in range(0, batch.num_rows, BATCH_ROWS):
                        part = batch.slice(start, BATCH_ROWS).select(selection.columns)
                        for record in part.to_pylist():
                            yield f"row {row}", record
                            row += 1
        except (pa.ArrowException, OSError) as err:
            raise DataError(file, f"cannot read past row {row} ({_first_line(err)}); is the file whole?") from None


# --- JSON Lines ------------------------------------------------------------------------------------------------------

def _open_bytes(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed on the fly for .gz and .zst."""
    raw = open(path, "rb")  # noqa: SIM115 - the returned reader closes it
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if name.endswith(".zst"):
        return io.BufferedReader(_ZstdFrames(raw), 1 << 20)
    return raw


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of one or more zstd frames; a stream that ends inside a frame is an EOFError
    (zstandard's stream_reader ends such a stream quietly, as if the file were whole)."""

    def __init__(self, raw: io.BufferedIOBase) -> None:
        import zstandard

        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._frame, self._pending, self._started = self._new(), b"", False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            data = self._raw.read(1 << 20)
            if not data:
                if self._started and not self._frame.eof:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._pending = self._decompress(data)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame.eof:  # the next frame of a file written in several (zstd -B, pzstd)
                self._frame = self._new()
            self._started = True
            out.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)

    def close(self) -> None:
        self._raw.close()
        super().close()


def _json_lines_rows(path: Path, selection: Selection) -> Iterator[tuple[str, dict[str, Any]]]:
    import zstandard

    number = 0
    try:
        with _open_bytes(path) as stream:
            for number, data in enumerate(stream, 1):  # noqa: B007 - number names the line of an error
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(path, f"line {number}: not UTF-8 ({err.reason} at byte {err.start})") from None
                if line.strip():
                    yield f"line {number}", _json_record(path, number, line, selection)
    except (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError) as err:
        raise DataError(path, f"compressed stream cut or damaged after line {number} ({_first_line(err)}); is the "
                              "file whole?") from None
    except OSError as err:
        raise DataError(path, f"cannot read after line {number} ({err.strerror or _first_line(err)})") from None


def _json_record(path: Path, number: int, line: str, selection: Selection) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        hint = " (the file is one JSON array, not JSON Lines)" if number == 1 and line.lstrip().startswith("[") else ""
        raise DataError(path, f"line {number}: invalid JSON ({err.msg} at column {err.colno}){hint}") from None
    if not isinstance(record, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(record), "number")
        raise DataError(path, f"line {number}: a JSON {kind}, not an object with {selection.text_field!r} (JSON "
                              "Lines holds one object a line)")
    for column in selection.columns:
        if column not in record:
            flag = "--text_field" if column == selection.text_field else "--filter"
            raise DataError(path, f"line {number}: no field {column!r} (fields: {', '.join(record) or 'none'}); "
                                  f"check {flag}")
    return record


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def google_layout(texts: Iterable[str], batch_chars: int = 250_000, by_sentence: bool = True) -> Iterator[str]:
    """Documents in the layout of Google's reader, as the Wikipedia path makes it (whitespace runs as one space,
    blingfire's sentences one a line, a blank line after each document), joined into pieces of about
    batch_chars characters (each piece ends a document). With by_sentence False a document is one line: for byte-level
    BPE chunks, which tokenize a document whole, so that it keeps its text where two sentences meet without a space
    (Chinese, Japanese), which the sentence lines, joined by one space, would not."""
    from bertrecipe.dataprep.sharding import split_sentences  # blingfire, loaded where records are read

    piece: list[str] = []
    size = 0
    for text in texts:
        single_spaced = " ".join(text.split())
        lines = split_sentences(single_spaced) if by_sentence else [single_spaced] * bool(single_spaced)
        if not lines:
            continue
        block = "\n".join(lines) + "\n\n"
        piece.append(block)
        size += len(block)
        if size >= batch_chars:
            yield "".join(piece)
            piece, size = [], 0
    if piece:
        yield "".join(piece)
