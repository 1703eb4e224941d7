"""Outputs written whole or not at all: under a temporary name beside the target, renamed onto it at the end.

The one temporary name, for files and folders alike: `.<target name>.<pid>.<8 random characters>.tmp` (hidden,
never matched by the readers' `*.txt`/`*.hdf5`, unique to each write). A write killed mid-way (kill -9, power
loss) leaves one behind; the next write of the same target removes it, when no process with that pid runs on
this machine (or the pid is ours but this process did not make it: an earlier run, e.g. in a restarted
container, had our pid). The names of earlier versions are cleaned the same way: `.<target>.tmp-<pid>` (the data
tools') and `.<target>.<8 random>.tmp` (the rest; no pid, so always removed). Nothing else is ever deleted, and
never through a symlink.

An output is written through symlinks or refused, never replaced: when the output's name is a symlink (a chain of
them, or a dangling one whose target folder exists) the content goes to the final target, under a temporary name
beside the TARGET renamed onto it, and the link stays as it was (a link to shared storage keeps pointing there).
An output that exists and is neither a regular file nor a folder (a device node, a FIFO, a socket: a rename would
replace it, and as root delete /dev/null) is refused with an InputError naming it, before anything is written.
"""
from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Optional

from bertrecipe.common.errors import InputError
from bertrecipe.common.stop_signals import raise_if_stopped

_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"  # tempfile's, as in the names earlier versions wrote
_RANDOM = rf"[{_ALPHABET}]{{8}}"
_OURS = re.compile(rf"\.(?P<target>.+)\.(?P<pid>[0-9]+)\.{_RANDOM}\.tmp")
_LEGACY_WITH_PID = re.compile(r"\.(?P<target>.+)\.tmp-(?P<pid>[0-9]+)")
_LEGACY_RANDOM = re.compile(rf"\.(?P<target>.+)\.{_RANDOM}\.tmp")

# Temporaries this process made and has not finished with (staged ones stay until exit): though they carry our
# pid they are never stale.
_ACTIVE: set[Path] = set()


_SPECIAL_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                  (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def special_file_kind(path: str | Path) -> Optional[str]:
    """What path is ("a character device", "a FIFO (named pipe)", ...) when it exists and is neither a regular
    file nor a folder; None otherwise. Symlinks are followed."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or a link that leads nowhere: nothing there to replace
        return None
    return next((kind for is_kind, kind in _SPECIAL_KINDS if is_kind(mode)), None)


def _final_target(path: Path) -> Path:
    """path, or when it is a symlink (a chain of them, a dangling one) where the links finally lead."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def output_problem(path: str | Path) -> tuple[Path, Optional[str]]:
    """(where a write of path puts its content, why it must not be written there, or None).

    The place is path itself or, when path is a symlink, the link's final target (see the module). The problems:
    a symlink loop, a link into a folder that does not exist, or something that is not a regular file or a folder
    (a device node, a FIFO, a socket), which a rename would replace."""
    path = Path(path)
    target = _final_target(path)
    if target.is_symlink():  # realpath stops inside a loop
        return target, "is a symlink loop"
    link = f"is a symlink to {target}, " if target != path else "is "
    if target != path and not target.parent.is_dir():
        return target, f"{link}whose folder {target.parent} does not exist"
    kind = special_file_kind(target)
    if kind is not None:
        return target, f"{link}{kind}: writing the output there would replace it"
    return target, None


def output_target(path: str | Path) -> Path:
    """Where a write of path puts its content (output_problem); InputError naming path and the problem when it
    must not be written."""
    target, problem = output_problem(path)
    if problem is not None:
        raise InputError(f"{path}: {problem}; choose another name for this output")
    return target


def temporary_name(path: Path) -> Path:
    """A new temporary name for path (nothing is created), registered as being written by this process."""
    random_part = "".join(secrets.choice(_ALPHABET) for _ in range(8))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{random_part}.tmp")
    _ACTIVE.add(tmp)
    return tmp


def _discard(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)
    _ACTIVE.discard(tmp)


@contextmanager
def atomic_output(path: str | Path, clean: bool = True) -> Iterator[Path]:
    """Yields the temporary name to write path's content to (a file or a folder); it is renamed onto path when
    the block ends.

    Missing folders are created and path's stale temporaries removed first (clean=False: the caller did, with
    remove_stale_temporaries_of). On any failure the temporary and the folders created here (when empty) are
    removed: the location is left as it was found. A symlink path is written through (its target gets the
    content, the temporary is made beside the target, whose stale temporaries are removed too); a device node,
    FIFO or socket at path is an InputError before anything is written (see the module)."""
    path = Path(path)
    target = output_target(path)
    created = make_dirs(target.parent)
    tmp = temporary_name(target)
    try:
        stale_beside = ([path] if clean else []) + ([target] if target != path else [])
        remove_stale_temporaries_of(stale_beside)
        yield tmp
        raise_if_stopped()  # a signal Python swallowed during the write (in a weakref callback) still stops it here
        os.replace(tmp, target)
        _ACTIVE.discard(tmp)
    except BaseException:
        _discard(tmp)
        remove_empty_dirs(created)
        raise


def _write_synced(tmp: Path, write: Callable[[BinaryIO], None]) -> None:
    # A plain open's permissions (tempfile's 0600 would hide a model from the user's group); synced so that
    # the rename never exposes a file whose data is still only in the page cache.
    with open(tmp, "xb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def write_atomic(path: str | Path, write: Callable[[BinaryIO], None], clean: bool = True) -> None:
    """Runs write(file) on a temporary file beside `path`, then renames it over `path`: a reader sees the old file
    or the new one, never half of one. See atomic_output for folders, stale temporaries and failures."""
    with atomic_output(path, clean) as tmp:
        _write_synced(tmp, write)


def write_temporary(path: str | Path, write: Callable[[BinaryIO], None]) -> Path:
    """Runs write(file) on a new temporary file beside `path` (its folder created) and returns it, for a caller
    that renames several files into place together, with move_onto(tmp, path). The temporary is removed when
    write() fails. A symlink path: the temporary is made beside its target (whose stale temporaries are removed);
    a device node, FIFO or socket: an InputError before anything is written."""
    path = Path(path)
    target = output_target(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target != path:  # the caller cleans beside path, where it looks for its outputs
        remove_stale_temporaries_of([target])
    tmp = temporary_name(target)
    try:
        _write_synced(tmp, write)
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def move_onto(source: str | Path, path: str | Path) -> Path:
    """Renames the finished file `source` onto path's target (output_target): through a symlink, never replacing
    the link, a device node, a FIFO or a socket. A source on another file system (a scratch folder beside a link
    to shared storage) is first copied to a temporary beside the target. Returns the target."""
    source = Path(source)
    target = output_target(path)
    raise_if_stopped()
    try:
        os.replace(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        with open(source, "rb") as original:
            write_atomic(target, lambda f: shutil.copyfileobj(original, f), clean=False)
        source.unlink()
    _ACTIVE.discard(source)
    return target


@contextmanager
def scratch_folder(output: Path) -> Iterator[Path]:
    """A temporary folder beside output (named as `<output name>.parts`'s temporary) for the intermediate files
    of the tasks that make it (on the output's file system, which Dask workers share), removed on exit; a killed
    run's is removed the next time output is written. output's folder must exist."""
    anchor = output.with_name(output.name + ".parts")
    remove_stale_temporaries_of([anchor])
    folder = temporary_name(anchor)
    folder.mkdir()
    try:
        yield folder
    finally:
        _discard(folder)


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


def remove_stale_temporaries_of(paths: Iterable[str | Path]) -> list[Path]:
    """Removes the stale temporaries (see the module) of the given outputs, listing each folder once: thousands
    of shards in one folder cost a listing each otherwise (1.9 ms at 4,096 shards)."""
    wanted: dict[Path, set[str]] = {}
    for path in paths:
        wanted.setdefault(Path(path).parent, set()).add(Path(path).name)
    return [removed for folder, names in wanted.items() for removed in remove_stale_temporaries(folder, names)]


def remove_stale_temporaries(folder: str | Path, targets: Iterable[str] | re.Pattern) -> list[Path]:
    """Removes the stale temporaries in `folder` of the given target names (or of every target name the pattern
    matches); returns them."""
    folder = Path(folder)
    try:
        listing = os.listdir(folder)
    except OSError:  # no folder yet: nothing to clean
        return []
    is_target = targets.fullmatch if isinstance(targets, re.Pattern) else set(targets).__contains__
    removed = []
    for name in listing:
        pid = _stale_pid(name, is_target)
        entry = folder / name
        if pid is not None and not entry.is_symlink() and (pid < 0 or _left_by_a_killed_run(entry, pid)):
            _discard(entry)
            print(f"removed {entry}, left by a killed write", file=sys.stderr)
            removed.append(entry)
    return removed


def _stale_pid(name: str, is_target: Callable[[str], object]) -> Optional[int]:
    """The pid in one of our temporary names of a target (-1 for the old names without one); None for any
    other name."""
    for pattern in (_OURS, _LEGACY_WITH_PID, _LEGACY_RANDOM):
        match = pattern.fullmatch(name)
        if match:  # the first form that fits is the one: a live temporary is never read as an old name
            if not is_target(match["target"]):
                return None
            return int(match["pid"]) if "pid" in pattern.groupindex else -1
    return None


def _left_by_a_killed_run(entry: Path, pid: int) -> bool:
    if pid == os.getpid():
        return entry not in _ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False  # another user's live process (or a pid we cannot ask about): not ours to touch
    return False
