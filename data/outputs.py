"""How the data tools choose their outputs: never onto one of their inputs, and only where they can be written.
The writing itself (a temporary name renamed into place, stale temporaries of killed runs cleaned, nothing left
behind by a failed write) is atomic_files.py's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .errors import DataError


def same_file(a: Path, b: Path) -> bool:
    """True when a and b name (or, once missing folders are made, will name) one file, whatever the spelling:
    relative, `x/..`, symlinks, hard links."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:  # one does not exist yet, e.g. `new/../a.txt`: where it will be is what counts
        pass
    return Path(a).resolve() == Path(b).resolve()


def refuse_input_as_output(output: Path, output_flag: str, inputs: Iterable[tuple[str, Path]],
                           fix: str | None = None) -> None:
    """DataError naming both when output is one of the (flag, path) inputs or an input folder itself."""
    for flag, path in inputs:
        if same_file(output, path):
            kind = "folder" if Path(path).is_dir() else "file"
            raise DataError(output, f"{output_flag} is the same {kind} as {flag} {path}; writing it would destroy "
                                    f"the input: {fix or 'choose another ' + output_flag}")


def inside(path: Path, folder: Path) -> bool:
    """True when path (existing or not) resolves to a place under folder."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def check_writable(output: Path, output_flag: str) -> None:
    """Refuse, without writing anything, an output that is a folder or whose nearest existing folder cannot
    be written (the folders themselves are created only when the output is written)."""
    if output.is_dir():
        raise DataError(output, f"is a directory; {output_flag} must name a file")
    folder = output.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise DataError(folder, f"output directory is not writable (it is a file); choose another {output_flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(folder, f"output directory is not writable (permission denied); choose another "
                                f"{output_flag} or make the directory writable")
