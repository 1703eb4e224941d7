"""How every command chooses its outputs: never onto one of its inputs, and only where they can be written (the
one home of the writability checks: folders, files, logs).
The writing itself (a temporary name renamed into place, stale temporaries of killed runs cleaned, nothing left
behind by a failed write, symlinks written through) is atomic_files.py's; what it would refuse mid-run (a device
node, a FIFO or a socket where an output goes) these checks refuse before any work.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Callable, Iterable, Optional

from bertrecipe.common.atomic_files import output_problem
from bertrecipe.common.errors import InputError

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


def refuse_special_output(output: str | Path, output_flag: str, error: ErrorFactory = _input_error) -> Path:
    """Where an output that is replaced by a rename goes (through symlinks: atomic_files.output_problem);
    error(output, ...) naming what is there when it is a device node, a FIFO or a socket (the rename would
    replace it), a symlink loop or a link into a missing folder. Logs, which are appended to, need not call it."""
    target, problem = output_problem(output)
    if problem is not None:
        raise error(output, f"{output_flag} {problem}; move it away, or choose another place for {output_flag}")
    return target


def check_writable(output: str | Path, output_flag: str, error: ErrorFactory = _input_error) -> None:
    """Refuse, without writing anything, an output that is a folder, a device node, a FIFO or a socket, or
    whose nearest existing folder cannot be written (the folders themselves are created only when the output is
    written). A symlink output is judged by its target, which the write goes to."""
    output = Path(output)
    if output.is_dir():
        raise error(output, f"is a directory; {output_flag} must name a file")
    folder = refuse_special_output(output, output_flag, error).absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise error(folder, f"output directory is not writable (it is a file); choose another {output_flag}")
    problem = _unwritable(folder)
    if problem:
        raise error(folder, f"output directory is not writable ({problem.lower()}); choose another "
                            f"{output_flag} or make the directory writable")


def check_creatable(path: str | Path, what: str) -> None:
    """InputError when `path` cannot be created later because one of its parent folders is a file."""
    existing = next((parent for parent in Path(path).parents if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InputError(f"{path}: {what} cannot be created because {existing} is a file")


def _unwritable(path: Path) -> Optional[str]:
    """errno's text for why `path` (existing) cannot be written to or created in, or None when it can."""
    if os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return None
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return os.strerror(errno.EROFS if read_only else errno.EACCES)


def check_writable_file(path: str | Path, what: str, example: str = "dllogger.json") -> None:
    """InputError when records cannot be appended to `path`: a folder (`example` names a file to give instead),
    an existing file that is not writable, or a new one that cannot be created (a file or an unwritable folder
    on the way). Creates nothing."""
    path = Path(path)
    try:
        if path.is_dir():
            raise InputError(f"{path}: {what} is a folder; give a file name such as {path / example}")
        if path.exists():
            problem = _unwritable(path)
            if problem:
                raise InputError(f"{path}: {what} cannot be written ({problem})")
            return
        _check_new(path, what)
    except PermissionError as error:  # a folder on the way that cannot be looked into
        raise InputError(f"{path}: {what} cannot be used ({error.strerror})") from None


def check_writable_folder(folder: str | Path, what: str) -> None:
    """InputError when files cannot be created in `folder`: it is a file, a device node, a FIFO or a socket, a
    symlink to a folder that does not exist (mkdir cannot make it through the link), it is not writable, or it
    cannot be created (a file or an unwritable folder on the way). Creates nothing. A symlink to a folder is that
    folder."""
    folder = Path(folder)
    try:
        refuse_special_output(folder, what)
        if folder.is_symlink() and not folder.exists():  # mkdir cannot make a folder through a link
            raise InputError(f"{folder}: {what} is a symlink to {os.path.realpath(folder)}, which does not exist; "
                             "create that folder or choose another output folder")
        if folder.exists():
            if not folder.is_dir():
                raise InputError(f"{folder}: {what} exists and is a file; move it or choose another output folder")
            problem = _unwritable(folder)
            if problem:
                raise InputError(f"{folder}: {what} cannot be written to ({problem})")
            return
        _check_new(folder, what)
    except PermissionError as error:
        raise InputError(f"{folder}: {what} cannot be used ({error.strerror})") from None


def _check_new(path: Path, what: str) -> None:
    check_creatable(path, what)  # no file where a folder on the way would be created
    existing = next((parent for parent in path.parents if parent.exists()), None)
    problem = _unwritable(existing) if existing is not None else None
    if problem:
        raise InputError(f"{path}: {what} cannot be created: {existing} is not writable ({problem})")
