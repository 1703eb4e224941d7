"""Reading user-given text and JSON files: an InputError naming the file and the problem, never a traceback (a file
of another format named as what its bytes say it is: content_kind); a file's identity (FileStamp) to tell that it
changed between two reads."""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from bertrecipe.common.errors import DataError, InputError

# How read_text_file words each failure, after "<path>: "; a caller may reword some for its file (same fields).
READ_PROBLEMS = {
    "missing": "{what} not found",
    "directory": "{what} is a directory",
    "not UTF-8": "{what} is not UTF-8 (byte {byte})",
    "unreadable": "cannot read the {what} ({reason})",
}


# What a file is, told by its first bytes: for a reader to name what it was given instead of what it expected.
_SIGNATURES = (
    (rb"\x1f\x8b", "a gzip-compressed file"), (rb"\x28\xb5\x2f\xfd", "a zstd-compressed file"),
    (rb"BZh[1-9]1AY&SY", "a bzip2-compressed file"), (rb"\xfd7zXZ\x00", "an xz-compressed file"),
    (rb"PK\x03\x04", "a zip archive (a torch checkpoint is one)"), (rb"\x89HDF\r\n\x1a\n", "an HDF5 file"),
    (rb"PAR1", "a Parquet file"), (rb"ARROW1", "an Arrow file"), (rb"%PDF-", "a PDF document"),
    (rb"SQLite format 3\x00", "an SQLite database"), (rb"\x80[\x02-\x05]", "a Python pickle"),
    (rb"\xff\xfe|\xfe\xff", "UTF-16 text"), (rb"\x7fELF", "an executable"),
    (rb"(?s).{6}\x00\x00\{\"", "a safetensors file"))  # a little-endian header length, then its JSON


def content_kind(path: str | Path) -> Optional[str]:
    """What the file is by its first bytes ("a gzip-compressed file", "an HDF5 file", ...), or None where they
    name no format: text (even text that starts like a signature, "PAR1 ..."), an empty or unreadable file. Cheap
    enough for a reader to ask before it reads."""
    try:
        with open(path, "rb") as f:
            return kind_of_head(f.read(64))
    except OSError:
        return None


def kind_of_head(head: bytes) -> Optional[str]:
    """content_kind of a file's first bytes (64 tell every format named here)."""
    if _reads_as_text(head[:64]):
        return None
    return next((kind for signature, kind in _SIGNATURES if re.match(signature, head)), None)


def _reads_as_text(head: bytes) -> bool:
    # UTF-8 without control bytes but whitespace; the head may end inside a character
    text = head.decode("utf-8", errors="ignore") if _utf8_but_the_end(head) else None
    return text is not None and not any(ord(c) < 32 and c not in "\t\n\r\f\v" for c in text)


def _utf8_but_the_end(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        return error.start >= len(head) - 3 and error.reason == "unexpected end of data"
    return True


def _input_error(path: str | Path, problem: str) -> InputError:
    return InputError(f"{path}: {problem}")


def read_text_file(path: str | Path, what: str = "file", *, encoding: str = "utf-8", newline: Optional[str] = None,
                   wording: Mapping[str, str] = {},
                   error: Callable[[str | Path, str], InputError] = _input_error) -> str:
    """The text of a user-given file; an error(path, problem) (InputError by default) naming the file (as `what`)
    when it cannot be read, or is a file of another format (named as its bytes say: content_kind). `wording`
    replaces some of READ_PROBLEMS (e.g. to add the fix); `newline` is open()'s (None: universal newlines; "": the
    text as it is)."""
    try:
        with open(path, "rb") as f:  # read once: the bytes tell the format, then decode as open() would
            raw = f.read()
        found = kind_of_head(raw[:64])
        if found is not None:
            raise error(path, f"{found}, not a {what}")
        return io.TextIOWrapper(io.BytesIO(raw), encoding=encoding, newline=newline).read()
    except FileNotFoundError:
        kind, fields = "missing", {}
    except IsADirectoryError:
        kind, fields = "directory", {}
    except UnicodeDecodeError as decode_error:
        kind, fields = "not UTF-8", {"byte": decode_error.start}
    except OSError as os_error:
        kind, fields = "unreadable", {"reason": os_error.strerror}
    problem = wording.get(kind, READ_PROBLEMS[kind]).format(what=what, **fields)
    raise error(path, problem) from None


# The JSON readers' wording since their first versions (the SQuAD files, predictions, na-probs).
_JSON_WORDING = {"directory": "is a directory, not a {what}", "not UTF-8": "not UTF-8 (byte {byte})"}


def read_json_file(path: str | Path, what: str = "JSON file", wording: Mapping[str, str] = {},
                   newline: Optional[str] = None) -> Any:
    """The parsed JSON of a user-given file (read as read_text_file does, `wording` rewording its problems);
    InputError naming the file when it cannot be read or parsed."""
    return parse_json_text(path, read_json_text(path, what, wording, newline))


def read_json_text(path: str | Path, what: str = "JSON file", wording: Mapping[str, str] = {},
                   newline: Optional[str] = None) -> str:
    """The text of a JSON file, with read_json_file's wording of its problems (for a caller that parses it with
    parse_json_text and also needs the text)."""
    return read_text_file(path, what, wording={**_JSON_WORDING, **wording}, newline=newline)


def parse_json_text(path: str | Path, text: str) -> Any:
    """json.loads of a file's text; InputError naming the file when it is not JSON that Python can hold."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: malformed JSON ({error.msg} at line {error.lineno} column {error.colno})") from None
    except (ValueError, RecursionError) as error:  # an integer of over 4300 digits; nesting deeper than the stack
        raise InputError(f"{path}: unusable JSON ({str(error).splitlines()[0][:100]})") from None


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file, read a block at a time (a corpus or a checkpoint may be gigabytes); OSError as
    open() raises it."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass(frozen=True)
class FileStamp:
    """What tells a file's contents apart cheaply: its size, modification time (ns) and inode. A file written in
    place, appended to, or replaced by a rename (rsync, an atomic writer) has another stamp. Take the stamp before
    the first read, check it at each later use and after the last. Compare stamps taken on one host: inode
    numbers differ between the clients of some network file systems (FUSE)."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: str | Path) -> FileStamp:
        """The stamp of path (through symlinks); a DataError naming it when it cannot be looked at."""
        try:
            status = os.stat(path)
        except OSError as error:
            raise DataError(path, f"cannot be read ({error.strerror})") from None
        return cls(status.st_size, status.st_mtime_ns, status.st_ino)

    def check(self, path: str | Path, what: str = "input file") -> None:
        """A DataError naming path (as `what`) when it is no longer the file this stamp was taken of."""
        try:
            now = FileStamp.of(path)
        except DataError:
            raise DataError(path, f"{what} removed while this command ran; put it back and run the command again"
                            ) from None
        if now == self:
            return
        changes = [f"size {self.size} -> {now.size} bytes"] if now.size != self.size else []
        changes += ["modified"] if now.mtime_ns != self.mtime_ns else []
        changes += ["replaced by another file"] if now.inode != self.inode else []
        raise DataError(path, f"{what} changed while this command ran ({', '.join(changes)}); run the command "
                              "again once nothing writes to it")
