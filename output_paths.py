"""How every command chooses its outputs: never onto one of its inputs, and only where they can be written.
The writing itself (a temporary name renamed into place, stale temporaries of killed runs cleaned, nothing left
behind by a failed write) is atomic_files.py's.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Optional

from bertrecipe.errors import InputError

# (path, problem) -> the error to raise; the data tools pass DataError.
ErrorFactory = Callable[[str | Path, str], InputError]


def _input_error(path: str | Path, problem: str) -> InputError:
    return InputError(f"{path}: {problem}")


def same_file(a: str | Path, b: str | Path) -> bool:
    """True when a and b name (or, once missing folders are made, will name) one file, whatever the spelling:
    relative, `x/..`, symlinks, hard links."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:  # one does not exist yet, e.g. `new/../a.txt`: where it will be is what counts
        pass
    return Path(a).resolve() == Path(b).resolve()


def inside(path: str | Path, folder: str | Path) -> bool:
    """True when path (existing or not) resolves to a place under folder."""
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def refuse_input_as_output(output: str | Path, output_flag: str, inputs: Iterable[tuple[str, Optional[str | Path]]],
                           fix: str | None = None, error: ErrorFactory = _input_error) -> None:
    """Raises error(output, ...) naming both when output is one of the (flag, path) inputs (None paths are
    skipped) or an input folder itself."""
    for flag, path in inputs:
        if path is not None and same_file(output, path):
            kind = "folder" if Path(path).is_dir() else "file"
            raise error(output, f"{output_flag} is the same {kind} as {flag} {path}; writing it would destroy "
                                f"the input: {fix or 'choose another ' + output_flag}")


def check_writable(output: str | Path, output_flag: str, error: ErrorFactory = _input_error) -> None:
    """Refuse, without writing anything, an output that is a folder or whose nearest existing folder cannot
    be written (the folders themselves are created only when the output is written)."""
    output = Path(output)
    if output.is_dir():
        raise error(output, f"is a directory; {output_flag} must name a file")
    folder = output.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise error(folder, f"output directory is not writable (it is a file); choose another {output_flag}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise error(folder, f"output directory is not writable (permission denied); choose another "
                            f"{output_flag} or make the directory writable")
