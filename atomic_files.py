"""Files written whole or not at all: a temporary name beside the target, then a rename.

Our temporary names are `.<target name>.<8 random characters>.tmp`. A write killed mid-way (kill -9, power loss)
leaves one behind; `remove_stale_temporaries` removes exactly those of the targets a command is about to write
again, and nothing else.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

_RANDOM_PART = r"[a-z0-9_]{8}"  # what tempfile puts between prefix and suffix


def write_temporary(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Runs write(file) on a new temporary file beside `path` (created with its folder), syncs it and gives it
    the permissions a plain open() would; returns it. The temporary file is removed when write() fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False) as tmp:
        try:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
            os.chmod(tmp.name, 0o666 & ~_UMASK)  # tempfile's 0600 would hide a model from the user's group
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    return Path(tmp.name)


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Runs write(file) on a temporary file beside `path`, then renames it over `path`: a reader sees the old file
    or the new one, never half of one."""
    os.replace(write_temporary(path, write), path)


def _current_umask() -> int:
    mask = os.umask(0)  # the only way to read it; set back at once, at import, before any thread starts
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def remove_stale_temporaries(folder: str | Path, targets: Iterable[str] | re.Pattern) -> list[Path]:
    """Removes our temporary files left in `folder` by killed writes of the given target names (or of every
    target name the pattern matches); returns them. Call it only where no other process is writing."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    wanted = targets if isinstance(targets, re.Pattern) else None
    names = set() if wanted else set(targets)
    removed = []
    for path in folder.iterdir():
        match = re.fullmatch(rf"\.(.+)\.{_RANDOM_PART}\.tmp", path.name)
        if not match or not path.is_file():
            continue
        target = match.group(1)
        if (wanted.fullmatch(target) if wanted else target in names):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        print(f"removed {len(removed)} unfinished temporary file(s) of a killed write in {folder}", file=sys.stderr)
    return removed
