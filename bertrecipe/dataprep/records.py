"""Documents from the corpus files of today, read as streams: Parquet (pyarrow, the text column and the filtered
columns alone, a batch at a time), JSON Lines (plain, gzip or zstd), Arrow IPC files and the Arrow folders that
`datasets`' save_to_disk writes. A file's format is told by its bytes, not its name (record_format); one that none
of these readers takes is refused naming what it is. Each record is one document; `Selection` says which column
holds its text, which rows to keep (filters on other columns, length bounds) and whether exact duplicates go.
Memory holds one batch of rows (Parquet, Arrow) or one line (JSON Lines), never the file. Bad input is a DataError
naming the file and the row (or line)."""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import itertools
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
DATASET_DICT = "dataset_dict.json"  # what DatasetDict.save_to_disk writes beside its splits' folders
BATCH_ROWS = 1024  # rows of a Parquet or Arrow batch: bounds the memory a reader holds
_CONTROL_BYTES = [bytes([code]) for code in range(32) if chr(code) not in "\t\n\v\f\r"]
HEAD_BYTES = 1 << 16  # the bytes read to tell JSON Lines, CSV, text and binary data apart
BOM = b"\xef\xbb\xbf"  # the UTF-8 byte order mark that Windows tools write at the start of a text file
_GZIP, _ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"
_RECORD_MAGIC = ((b"PAR1", "parquet"), (b"ARROW1", "arrow"), (b"\xff\xff\xff\xff", "arrow"))  # Arrow: file, stream
# Formats that none of the readers takes, each with what to do instead.
_OTHER_FORMATS = (
    (rb"BZh[1-9]1AY&SY", "bzip2-compressed, which is not read", "decompress it (bunzip2), or compress it with gzip "
                                                                "or zstd"),
    (rb"\xfd7zXZ\x00", "xz-compressed, which is not read", "decompress it (unxz), or compress it with gzip or zstd"),
    (rb"PK\x03\x04", "a zip archive", "unpack it and pass its files"),
    (rb"\x89HDF\r\n\x1a\n", "an HDF5 file, not text or records", "pass the text or records it was made from"),
    (rb"%PDF-", "a PDF document, not text", "extract its text first"),
    (rb"\xff\xfe|\xfe\xff", "UTF-16 text", "convert it to UTF-8 (iconv -f UTF-16 -t UTF-8)"))
_HEADER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")

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


class _ColumnKinds:
    """What each filtered column holds in one input (number, string, boolean, ...), as first seen: a later file or
    line that holds another kind, or a kind that a filter on the column cannot compare (numbers against text),
    is a DataError naming both, since every row of it would be dropped without a word. Nulls (missing values) fit
    any kind: they pass no filter."""

    def __init__(self, selection: Selection) -> None:
        self.filters = selection.filters
        self.columns = list(dict.fromkeys(f.column for f in selection.filters))
        self.first: dict[str, tuple[str, str, str]] = {}  # column -> (kind, its type in words, where)

    def note(self, path: Path, column: str, kind: str, shown: str, line: str = "") -> None:
        """Column holds kind (`shown`: its type in words) in path, at line (JSON Lines) or in the whole file."""
        if kind == "null":
            return
        noun, at = ("field", f"{line}: ") if line else ("column", "")
        earlier_kind, earlier_shown, earlier = self.first.setdefault(column, (kind, shown, line or str(path)))
        if kind != earlier_kind:
            filters = " ".join(f"--filter {f}" for f in self.filters if f.column == column)
            raise DataError(path, f"{at}{noun} {column!r} holds {shown}, {earlier}'s holds {earlier_shown}: one "
                                  f"{noun} of two types in one input, which {filters} cannot compare alike; store "
                                  f"it as one type in every {'record' if line else 'file'}")
        for f in self.filters:
            if f.column == column and (kind == "number") != isinstance(f.value, float):
                wanted, fix = (("numbers", "store it as numbers, or filter on text") if isinstance(f.value, float)
                               else ("text", f"give a number (e.g. --filter {f.column}{f.op}3) or filter text"))
                raise DataError(path, f"{at}{noun} {column!r} holds {shown}, and --filter {f} compares {wanted}: "
                                      f"no row of it would pass; {fix}")


def _arrow_kind(arrow_type: Any) -> str:
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return "number"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return "string"
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    return "null" if pa.types.is_null(arrow_type) else str(arrow_type)  # others by their type: date32[day], ...


def check_column_types(schemas: Iterable[tuple[Path, Any]], selection: Selection) -> None:
    """The filtered columns of the files of one input, by their Arrow schemas ((file, schema) pairs, read only
    when there is a filter): a column of another type in one file than in an earlier one, or than its filter's
    value, is a DataError naming the file, the column and both types (see _ColumnKinds)."""
    if not selection.filters:
        return
    kinds = _ColumnKinds(selection)
    for path, schema in schemas:
        for column in kinds.columns:
            if column in schema.names:  # a missing column: the reader names it
                arrow_type = schema.field(column).type
                kinds.note(path, column, _arrow_kind(arrow_type), str(arrow_type))


def record_schemas(path: Path) -> list[tuple[Path, Any]]:
    """(file, Arrow schema) of a Parquet file (its footer), an Arrow IPC file or each file of a save_to_disk folder
    (their first message); none for JSON Lines, whose records carry their own types."""
    import pyarrow as pa

    kind = record_format(path)
    if kind == "parquet":
        return [(path, parquet_file(path).schema_arrow)]
    if kind != "arrow":
        return []
    schemas = []
    for file in arrow_files(path) if path.is_dir() else [path]:
        try:
            with pa.memory_map(str(file)) as source:
                schemas.append((file, _ipc_batches(source)[0]))
        except (pa.ArrowException, OSError) as err:
            raise DataError(file, f"not a readable Arrow file ({_first_line(err)}); is it whole?") from None
    return schemas


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


def is_record_name(path: Path) -> bool:
    """Whether a file's name is a record file's (.parquet, .pq, .jsonl, .ndjson, .json, the last three also .gz or
    .zst): the files of a folder that are read. What each one is, its bytes tell (record_format)."""
    return _format_by_name(path) is not None


def _format_by_name(path: Path) -> str | None:
    name = path.name.lower()
    for compression in COMPRESSIONS:
        if name.endswith(compression):
            return "jsonl" if name[: -len(compression)].endswith(JSON_LINES_SUFFIXES) else None
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "jsonl" if name.endswith(JSON_LINES_SUFFIXES) else None


def record_format(path: Path) -> str | None:
    """'parquet', 'jsonl' or 'arrow' for a record file or folder, told by its bytes, not its name (an empty file,
    which has none, by its name); None for text. A file or folder that none of the readers takes (a DatasetDict
    folder, compressed Parquet or text, bzip2, xz, zip, HDF5, PDF, a CSV table, UTF-16 text, binary data) is a
    DataError naming what it is."""
    if path.is_dir():
        return _folder_format(path)
    magic = _head(path, 16)
    kind = next((kind for prefix, kind in _RECORD_MAGIC if magic.startswith(prefix)), None)
    if kind is not None:
        return kind
    if magic.startswith((_GZIP, _ZSTD)):
        return _compressed_format(path, "gzip" if magic.startswith(_GZIP) else "zstd")
    for pattern, what, fix in _OTHER_FORMATS:
        if re.match(pattern, magic):
            raise DataError(path, f"{what}; {fix}")
    head = _head(path, HEAD_BYTES)
    if not head.removeprefix(BOM).strip():
        return _format_by_name(path)
    if _looks_like_json(head):
        return "jsonl"
    problem = _not_text(head)
    if problem:
        raise DataError(path, problem)
    return None


def _head(path: Path, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(size)
    except FileNotFoundError:
        raise DataError(path, "input file not found; check --input_file") from None
    except OSError as err:
        raise DataError(path, f"cannot read the input file ({err.strerror}); check --input_file") from None


def _looks_like_json(head: bytes) -> bool:
    """A JSON array or an object (with a key, or empty) first: JSON Lines (the reader says when it is one array)."""
    return re.match(rb"\s*(\[|\{\s*[\"}])", head.removeprefix(BOM)) is not None


def _not_text(head: bytes) -> str | None:
    """Why the first bytes of a file that is neither JSON nor of a known binary format are not text to read as
    sentences: binary data (NUL and other control bytes make more than 1 % of it) or a table (CSV, TSV); None for
    text. A stray NUL in text is text: Google's tokenizer drops it, as it drops other control characters."""
    nul = head.find(b"\0")
    if nul >= 0 and sum(map(head.count, _CONTROL_BYTES)) > len(head) / 100:
        return (f"binary data (a NUL byte at offset {nul}), not text, Parquet, JSON Lines or Arrow; pass the corpus "
                "in one of those")
    table = _table_header(head, cut=len(head) == HEAD_BYTES)
    if table:
        kind, names = table
        return (f"a {kind} file (columns: {', '.join(names)}), not JSON Lines or Parquet; convert it, e.g. "
                "pandas.read_csv(file).to_parquet(...)")
    return None


def _table_header(head: bytes, cut: bool) -> tuple[str, list[str]] | None:
    """('CSV' or 'TSV', the column names) when the text is a table: a header of two or more names without spaces,
    then rows of as many fields (a quoted field may span lines); None for other text. cut: the head ends mid-file,
    so its last row may be partial."""
    text = head.removeprefix(BOM).decode("utf-8", errors="ignore")
    for delimiter, kind in ((",", "CSV"), ("\t", "TSV")):
        try:
            table = list(itertools.islice(csv.reader(io.StringIO(text), delimiter=delimiter), 21))
        except csv.Error:
            continue
        header, rows = (table[0] if table else []), [row for row in table[1:len(table) - cut] if row]
        if (len(header) >= 2 and rows and all(_HEADER_NAME.fullmatch(name) for name in header)
                and all(len(row) == len(header) for row in rows)):
            return kind, header
    return None


def _compressed_format(path: Path, compression: str) -> str:
    """'jsonl' for compressed JSON Lines (or a stream too damaged to tell: the JSON Lines reader names the damage);
    a DataError naming anything else compressed."""
    import zstandard

    try:
        with _open_bytes(path) as stream:
            head = stream.read(HEAD_BYTES)
    except (EOFError, OSError, zlib.error, zstandard.ZstdError):
        return "jsonl"
    if not head.removeprefix(BOM).strip() or _looks_like_json(head):
        return "jsonl"
    tool = {"gzip": "gunzip", "zstd": "zstd -d"}[compression]
    inner = next((kind for prefix, kind in _RECORD_MAGIC if head.startswith(prefix)), None)
    if inner is not None:
        name = {"parquet": "Parquet", "arrow": "Arrow"}[inner]
        raise DataError(path, f"{compression}-compressed {name}; decompress it ({tool}): {name} compresses its own "
                              "data")
    what = "binary data" if b"\0" in head else "text"
    raise DataError(path, f"{compression}-compressed {what}, not JSON Lines; decompress it ({tool}) and pass "
                          f"{'the text as it is' if what == 'text' else 'records or text'}")


def _folder_format(folder: Path) -> str | None:
    """'arrow' for a save_to_disk folder of one dataset; None for a plain folder; a DataError naming a DatasetDict
    folder (several splits), of which one split is the corpus, with its splits."""
    if (folder / ARROW_STATE).is_file():
        return "arrow"
    if not (folder / DATASET_DICT).is_file():
        return None
    try:
        splits = [str(name) for name in json.loads((folder / DATASET_DICT).read_text(encoding="utf-8"))["splits"]]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        splits = sorted(p.name for p in folder.iterdir() if (p / ARROW_STATE).is_file())
    example = folder / ("train" if "train" in splits or not splits else splits[0])
    raise DataError(folder, f"a DatasetDict folder of datasets' save_to_disk (splits: {', '.join(splits) or 'none'}), "
                            f"not one dataset; pass one split's folder, e.g. {example}")


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


def _arrow_rows(path: Path, selection: Selection) -> Iterator[tuple[str, dict[str, Any]]]:
    """The records of a save_to_disk folder (its .arrow files in order) or of one Arrow IPC file."""
    import pyarrow as pa

    row = 0
    for file in arrow_files(path) if path.is_dir() else [path]:
        try:
            with pa.memory_map(str(file)) as source:
                schema, batches = _ipc_batches(source)
                _missing_columns(file, schema.names, selection)
                _text_type(file, selection.text_field, schema.field(selection.text_field).type, selection)
                for batch in batches:
                    for start in range(0, batch.num_rows, BATCH_ROWS):
                        part = batch.slice(start, BATCH_ROWS).select(selection.columns)
                        for record in part.to_pylist():
                            yield f"row {row}", record
                            row += 1
        except (pa.ArrowException, OSError) as err:
            raise DataError(file, f"cannot read past row {row} ({_first_line(err)}); is the file whole?") from None


def _ipc_batches(source: Any) -> tuple[Any, Iterator[Any]]:
    """The schema and record batches of an Arrow IPC file (random-access format, magic ARROW1) or stream (the
    format save_to_disk writes)."""
    import pyarrow as pa

    is_file_format = source.read(6) == b"ARROW1"
    source.seek(0)
    if is_file_format:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    stream = pa.ipc.open_stream(source)
    return stream.schema, iter(stream)


# --- JSON Lines ------------------------------------------------------------------------------------------------------

def _open_bytes(path: Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed on the fly when they are gzip or zstd (told by their magic numbers)."""
    raw = open(path, "rb")  # noqa: SIM115 - the returned reader closes it
    magic = raw.peek(4)[:4]
    if magic.startswith(_GZIP):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(_ZSTD):
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
    kinds = _ColumnKinds(selection)
    try:
        with _open_bytes(path) as stream:
            for number, data in enumerate(stream, 1):  # noqa: B007 - number names the line of an error
                try:
                    line = (data.removeprefix(BOM) if number == 1 else data).decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(path, f"line {number}: not UTF-8 ({err.reason} at byte {err.start})") from None
                if line.strip():
                    record = _json_record(path, number, line, selection)
                    for column in kinds.columns:
                        kind = _json_kind(record[column])
                        kinds.note(path, column, kind, _JSON_KIND_WORDS.get(kind, kind), f"line {number}")
                    yield f"line {number}", record
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


_JSON_KIND_WORDS = {"string": "a string", "number": "a number", "boolean": "a boolean", "array": "an array",
                    "object": "an object"}


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "number")


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
