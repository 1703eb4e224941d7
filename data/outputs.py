"""How the data tools write: never onto one of their inputs, under a temporary name renamed into place, with the
temporaries of killed runs cleaned on the next write, and nothing left behind by a write that fails.

Temporary name: `.<name>.tmp-<pid>` beside the output (hidden, and never matched by the readers' `*.txt` or
`*.hdf5`). Only that exact pattern, for an output being written and a pid that no longer runs on this machine,
is ever removed.
"""
from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .errors import DataError


def temporary_name(path: Path) -> Path:
    """`.<name>.tmp-<pid>` beside path."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return pid > 0  # another user's live process (or a pid we cannot ask about): not ours to touch
    return True


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of `path` (files or extraction folders) left by runs that were killed."""
    return remove_stale_temporaries_of([path])


def remove_stale_temporaries_of(paths: Iterable[Path]) -> list[Path]:
    """remove_stale_temporaries for many outputs, listing each folder once: thousands of shards in one folder
    cost a listing each otherwise (1.9 ms at 4,096 shards, a tenth of a small shard's time)."""
    wanted: dict[Path, set[str]] = {}
    for path in paths:
        wanted.setdefault(Path(path).parent, set()).add(Path(path).name)
    removed = []
    for folder, names in wanted.items():
        try:
            listing = os.listdir(folder)
        except OSError:  # no folder yet: nothing to clean
            continue
        for name in listing:
            target, _, pid = name[1:].rpartition(".tmp-")
            if name.startswith(".") and target in names and pid.isdigit() and pid.isascii():
                removed += _remove_if_stale(folder / name, int(pid))
    return removed


def _remove_if_stale(entry: Path, pid: int) -> list[Path]:
    # A live pid may be another run writing the same output right now; a symlink was never made by us.
    if entry.is_symlink() or _running(pid):
        return []
    if entry.is_dir():
        shutil.rmtree(entry)
    else:
        entry.unlink(missing_ok=True)
    print(f"removed {entry}, left by a killed run", file=sys.stderr)
    return [entry]


def make_dirs(folder: Path) -> list[Path]:
    """mkdir -p; returns the folders it created, deepest first, so that a failed write can remove them."""
    created = []
    current = folder
    while not current.exists() and not current.is_symlink() and current != current.parent:
        created.append(current)
        current = current.parent
    folder.mkdir(parents=True, exist_ok=True)
    return created


def remove_empty_dirs(created: Iterable[Path]) -> None:
    for folder in created:
        try:
            folder.rmdir()
        except OSError:  # not empty (someone else's file) or already gone: keep it and its parents
            return


@contextmanager
def atomic_output(path: Path, clean: bool = True) -> Iterator[Path]:
    """Yields the temporary name to write path's content to; it is renamed onto path when the block ends.

    Missing folders are created and path's stale temporaries removed first (clean=False: the caller did, with
    remove_stale_temporaries_of). On any failure the temporary and the folders created here (when empty) are
    removed: the location is left as it was found."""
    created = make_dirs(path.parent)
    tmp = temporary_name(path)
    try:
        if clean:
            remove_stale_temporaries(path)
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        remove_empty_dirs(created)
        raise


@contextmanager
def scratch_folder(output: Path) -> Iterator[Path]:
    """A folder `.<name>.parts.tmp-<pid>` beside output for the intermediate files of the tasks that make it
    (on the output's file system, which Dask workers share), removed on exit; a killed run's is removed the
    next time output is written, like its temporaries. output's folder must exist."""
    anchor = output.with_name(output.name + ".parts")
    remove_stale_temporaries(anchor)
    folder = temporary_name(anchor)
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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
