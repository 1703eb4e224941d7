"""One run per output folder: `<folder>/.run.lock`, taken before the run's first write into the folder, kept fresh
by a heartbeat while the run lives and removed when it ends (docs/reliability.md, "One run per folder").

The lock file holds who took it (host, pid, the process's start, pid namespace and boot, Slurm job and restart
count), the folder it was taken for (st_dev, st_ino and path) and a random token. It is never seen half-written:
it is written whole under a temporary name and hard-linked to `.run.lock` (`link` is atomic and fails when the
name exists); only where the file system has no hard links is it created with O_CREAT | O_EXCL and written in
place. A second run finds it and is refused in one line naming the holder, unless the holder is certainly gone:
- on the same host (same boot and pid namespace): its process no longer exists, or the pid now belongs to a later
  process (compared by start time);
- the lock was taken for another folder (a `cp -r` of a live run's folder copies its lock): judged on the host
  and boot that took it, by the folder's inode number;
- the same Slurm job with a higher restart count (a requeue: Slurm requeues only a job that has ended);
- anywhere else: its heartbeat (the file's mtime, refreshed every HEARTBEAT_SECONDS) is older than the lease
  (LEASE_SECONDS, default 10 minutes, `BERT_RUN_LOCK_LEASE_SECONDS` overrides).
A lock file that holds no lock (empty or garbage: a crash between create and write, a full disk, a `touch`) is
taken over once it is older than UNREADABLE_GRACE_SECONDS, the time the O_EXCL fallback and older versions need
to write theirs. A lock found stale is taken over with a warning. What it relies on from a shared file system
(NFSv3+, Lustre, GPFS, BeeGFS): `link`, `open(O_CREAT | O_EXCL)` and `rename` are atomic, and mtime is set by
`utime`. Host clocks must agree to well within the lease (NTP), since a heartbeat's age is read against the local
clock.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, Optional

from bertrecipe.common.atomic_files import make_dirs, remove_empty_dirs, remove_stale_temporaries_of, write_temporary
from bertrecipe.common.errors import InputError

LOCK_NAME = ".run.lock"
HEARTBEAT_SECONDS = 30.0
LEASE_SECONDS = 600.0
TAKEOVER_STALE_SECONDS = 60.0  # a take-over whose process died half-way leaves its marker this long at most
# An unreadable lock younger than this may be one that the O_EXCL fallback or an older version (which created the
# file, then wrote it) is still writing; older, it is no lock at all.
UNREADABLE_GRACE_SECONDS = 5.0
# What link() says on file systems without hard links (FAT, many FUSE and object-store mounts): use O_EXCL there.
NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV})


def lease_seconds() -> float:
    return float(os.environ.get("BERT_RUN_LOCK_LEASE_SECONDS", LEASE_SECONDS))


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.readline().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The running process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid it
    names one process for the host's whole uptime, even once the pid is reused. Empty where /proc is missing and
    for a process that has ended but is not yet reaped (a zombie: state Z or X), which holds nothing any more."""
    stat_line = _read_first_line(f"/proc/{pid}/stat")
    fields_after_name = stat_line.rsplit(")", 1)[-1].split() if stat_line else []
    return fields_after_name[19] if fields_after_name and fields_after_name[0] not in ("Z", "X") else ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a folder's lock, as written in the lock file."""

    host: str
    pid: int
    started: str  # ISO time the lock was taken
    token: str
    process_start: str = ""
    pid_namespace: str = ""
    boot_id: str = ""
    slurm_job: str = ""
    slurm_restart: int = 0
    # The folder the lock was taken for, as its host saw it; 0 and "" in the locks of older versions.
    folder_dev: int = 0
    folder_ino: int = 0
    folder_path: str = ""

    @classmethod
    def of_this_process(cls, folder: Optional[str | Path] = None) -> LockHolder:
        identity = os.stat(folder) if folder is not None else None
        return cls(host=socket.gethostname(), pid=os.getpid(), started=datetime.now().astimezone().isoformat(
                   timespec="seconds"), token=secrets.token_hex(8), process_start=process_start(os.getpid()),
                   pid_namespace=_pid_namespace(), boot_id=_read_first_line("/proc/sys/kernel/random/boot_id"),
                   slurm_job=os.environ.get("SLURM_JOB_ID", ""),
                   slurm_restart=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
                   folder_dev=identity.st_dev if identity else 0, folder_ino=identity.st_ino if identity else 0,
                   folder_path=os.path.realpath(folder) if folder is not None else "")

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_job}" if self.slurm_job else ""
        return f"host {self.host}, process {self.pid}{job}, started {self.started}"


_HOLDER_FIELDS = frozenset(field.name for field in fields(LockHolder))


def _read_bytes(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except OSError:  # gone, or a read that failed (NFS's ESTALE while the file is replaced): not garbage
        return None


def parse_holder(content: bytes) -> Optional[LockHolder]:
    """The holder a lock file's content names; None when it is no lock (empty, cut short, garbage). Fields a later
    version added are left out, so that its locks keep their holder's name here."""
    try:
        found = json.loads(content.decode("utf-8"))
        return LockHolder(**{name: value for name, value in found.items() if name in _HOLDER_FIELDS})
    except (ValueError, TypeError, AttributeError):
        return None


def read_holder(path: Path) -> Optional[LockHolder]:
    """The lock file's holder; None when the file is gone or not (yet, or no longer) a lock we can read."""
    content = _read_bytes(path)
    return parse_holder(content) if content is not None else None


def folder_judged_here(holder: LockHolder, me: LockHolder) -> bool:
    """Whether this process can tell if the lock was taken for its folder: only on the host and boot that took it,
    where an inode number means the same file (across NFS clients st_dev differs for one folder; elsewhere, after
    a reboot or in a lock of an older version, the other rules judge)."""
    return bool(holder.folder_ino and me.folder_ino and holder.boot_id and
                (holder.host, holder.boot_id) == (me.host, me.boot_id))


def was_copied(holder: LockHolder, me: LockHolder) -> bool:
    """Whether the lock sits in another folder than the one it was taken for (a copy, cp -r, of a live run's
    folder). Judged by st_ino alone: one folder can show two st_dev on one host (two mounts of one NFS export),
    never two inode numbers; a renamed or moved folder keeps its inode, so its run keeps the lock."""
    return folder_judged_here(holder, me) and holder.folder_ino != me.folder_ino


def _has_ended(holder: LockHolder, me: LockHolder) -> bool:
    if holder.pid == me.pid and holder.process_start == me.process_start:
        return False  # this very process
    return not holder.process_start or process_start(holder.pid) != holder.process_start


def why_stale(holder: Optional[LockHolder], age_seconds: float, me: LockHolder, lock_size: int) -> Optional[str]:
    """Why the holder is certainly gone (the warning's words), or None while it may still be running; `me` is the
    process asking (with the folder it asks for), lock_size the size of the lock file's content."""
    if holder is None:
        if age_seconds <= UNREADABLE_GRACE_SECONDS:
            return None  # perhaps a lock still being written (the O_EXCL fallback, an older version)
        what = f"{lock_size} bytes that are not a run lock" if lock_size else "empty"
        return f"it was {what}, and {age_seconds:.0f} s old: no lock in the making"
    if holder.slurm_job and holder.slurm_job == me.slurm_job and holder.slurm_restart < me.slurm_restart:
        return f"Slurm requeued job {holder.slurm_job} (restart {holder.slurm_restart} -> {me.slurm_restart})"
    same_machine = (holder.host, holder.boot_id, holder.pid_namespace) == (me.host, me.boot_id, me.pid_namespace)
    if same_machine and _has_ended(holder, me):
        return f"its process {holder.pid} on this host has ended"
    if was_copied(holder, me):
        return (f"it was copied from {holder.folder_path or 'another folder'}, which that process writes; this "
                f"folder is another one")
    if same_machine:
        return None
    if holder.host == me.host and holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
        return "this host has rebooted since"
    if age_seconds > lease_seconds():
        return f"its heartbeat is {age_seconds / 60:.0f} minutes old (lease {lease_seconds() / 60:.0f} minutes)"
    return None


class RunLock:
    """`with RunLock(folder):` holds the folder's lock for the block (see the module). `acquire()` raises
    InputError naming the holder when another live run has it."""

    def __init__(self, folder: str | Path, flag: str = "--output_dir", name: str = LOCK_NAME,
                 subject: Optional[str | Path] = None) -> None:
        """The lock of `folder` (its file `name` there); `subject`, what the refusal says is in use (the folder,
        or a file in it such as a --json-summary log), and `flag`, the flag that named it."""
        self.folder = Path(folder)
        self.path = self.folder / name
        self.subject = Path(subject) if subject is not None else self.folder
        self.flag = flag
        self.holder: Optional[LockHolder] = None
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        me = LockHolder.of_this_process(self.folder)
        # Long enough to see an unreadable lock finished or abandoned, and a rival's take-over done.
        deadline = time.monotonic() + UNREADABLE_GRACE_SECONDS + 1.0
        while not self._create(me):
            holder, age, size = self._inspect()
            reason = why_stale(holder, age, me, size)
            if reason is None and holder is not None:
                raise InputError(self._refusal(holder, me))
            if reason is not None and self._take_over(holder, me):
                whose = f"the lock of {holder.describe()}" if holder else "a lock file that held no lock"
                print(f"warning: {self.path}: took over {whose}: {reason}", file=sys.stderr, flush=True)
                break
            if time.monotonic() > deadline:
                raise InputError(f"{self.path}: could not take the run lock (it changed hands while we looked); "
                                 "run again once the other run has started or ended")
            time.sleep(0.2)
        self.holder = me
        remove_stale_temporaries_of([self.path])  # lock temporaries of killed runs; ours is in place
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="run-lock-heartbeat")
        self._heartbeat.start()

    def _refusal(self, holder: LockHolder, me: LockHolder) -> str:
        copy_hint = ""
        if holder.folder_path and holder.folder_path != me.folder_path and not folder_judged_here(holder, me):
            # Another host: its st_ino cannot be compared with ours, so a copied lock waits for the lease.
            copy_hint = (f"; the lock was taken for {holder.folder_path}: if this folder is a copy of that one, "
                         f"delete {self.path}")
        return (f"{self.subject}: another run is using this {self.flag} ({holder.describe()}; lock {self.path})"
                f"{copy_hint}; wait for it to end, or choose another {self.flag}")

    def _write_error(self, error: OSError) -> InputError:
        return InputError(f"{self.path}: cannot write the run lock ({error.strerror}); make the folder writable "
                          f"and free space on its disk, or choose another {self.flag}")

    def _write_temporary(self, me: LockHolder) -> Path:
        content = json.dumps(asdict(me)).encode("utf-8")
        try:
            return write_temporary(self.path, lambda f: f.write(content))
        except OSError as error:
            raise self._write_error(error) from None

    def _create(self, me: LockHolder) -> bool:
        """Puts our lock in place if there is none, whole: written under a temporary name, then hard-linked to the
        lock's name. False when a lock is there."""
        tmp = self._write_temporary(me)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            # NFS answers a retransmitted link() that succeeded with EEXIST; the link count tells (open(2)).
            return _link_count(tmp) == 2
        except FileNotFoundError:
            return False  # a rival's clean-up took our temporary (or the folder went): look again
        except OSError as error:
            if error.errno not in NO_HARD_LINKS:
                raise self._write_error(error) from None
        finally:
            tmp.unlink(missing_ok=True)
        return self._create_in_place(me)

    def _create_in_place(self, me: LockHolder) -> bool:
        """The fallback where the file system has no hard links: O_EXCL, then the content; readers give an
        unreadable lock UNREADABLE_GRACE_SECONDS to be written."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as error:
            raise self._write_error(error) from None
        created = os.fstat(fd).st_ino
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(asdict(me)).encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:
            if _inode(self.path) == created:  # ours, half-written; never a lock that replaced it meanwhile
                self.path.unlink(missing_ok=True)
            raise self._write_error(error) from None
        current = read_holder(self.path)  # stalled past the grace, we may have been taken over while writing
        return current is not None and current.token == me.token

    def _inspect(self) -> tuple[Optional[LockHolder], float, int]:
        """The lock's holder (None: unreadable or gone), its age in seconds by mtime, and its size in bytes."""
        try:
            info = self.path.lstat()
        except FileNotFoundError:
            return None, 0.0, -1
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{self.path}: is not a lock file but a folder or a link; move it away, or choose "
                             f"another {self.flag}")
        content = _read_bytes(self.path)
        if content is None:
            return None, 0.0, -1  # gone since, or not read this time: the next round looks again
        return parse_holder(content), time.time() - info.st_mtime, len(content)

    def _take_over(self, stale: Optional[LockHolder], me: LockHolder) -> bool:
        """Replaces the stale lock by ours, one taker at a time: a marker file created with O_EXCL is the mutex,
        and the lock is replaced only if it still holds the stale token."""
        marker = self.path.with_name(self.path.name + ".takeover")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - marker.stat().st_mtime > TAKEOVER_STALE_SECONDS:
                    marker.unlink(missing_ok=True)  # its taker died half-way; the next round retries
            except FileNotFoundError:
                pass
            return False
        except OSError as error:
            raise self._write_error(error) from None
        os.close(fd)
        try:
            content = _read_bytes(self.path)
            current = parse_holder(content) if content is not None else None
            if content is None or (current.token if current else None) != (stale.token if stale else None):
                return False  # taken over, refreshed, released or unread since we looked: the next round looks again
            tmp = self._write_temporary(me)
            try:
                os.replace(tmp, self.path)
            except FileNotFoundError:
                return False  # a rival's clean-up took our temporary
            except OSError as error:
                tmp.unlink(missing_ok=True)
                raise self._write_error(error) from None
            return True
        finally:
            marker.unlink(missing_ok=True)

    def still_held(self) -> bool:
        """Whether the lock file is still ours (not taken over by another run that judged us gone)."""
        current = read_holder(self.path)
        return self.holder is not None and current is not None and current.token == self.holder.token

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self.still_held():
                print(f"warning: {self.path}: this run's lock was taken over by another run; this run will "
                      "write no further checkpoint", file=sys.stderr, flush=True)
                return
            try:
                os.utime(self.path)
            except OSError:
                pass  # the next beat tries again; the lease is many beats long

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self.holder is not None and self.still_held():
            self.path.unlink(missing_ok=True)
        self.holder = None


def _link_count(path: Path) -> int:
    try:
        return os.stat(path).st_nlink
    except OSError:
        return 0


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1


def log_lock(log_file: str | Path) -> RunLock:
    """The lock of a log that runs append to (--json-summary): `.<name>.lock` beside it, so that two runs with
    different output folders never write one log together."""
    log = Path(log_file)
    return RunLock(log.parent, "--json-summary", name=f".{log.name}.lock", subject=log)


def outside(path: str | Path, folder: str | Path) -> bool:
    """True when path does not lie in folder (whose lock then does not cover it)."""
    return not Path(path).resolve().is_relative_to(Path(folder).resolve())


@contextmanager
def locked_output_folder(folder: str | Path, is_main: bool, any_process: Callable[[bool], bool] = bool,
                         flag: str = "--output_dir", log_file: Optional[str | Path] = None
                         ) -> Iterator[Optional[RunLock]]:
    """Holds folder's lock on the main process for the block (None on the others), and log_file's (log_lock) when
    the log lies outside the folder; `any_process(flag)` tells every process whether any has the flag set
    (process_group.any_process), so that all stop when a lock cannot be taken: the main one with the line naming
    the holder, the others silently. Folders this made are removed again when the block fails while empty."""
    shared_log = log_file and outside(log_file, folder) and (Path(log_file).is_file() or not Path(log_file).exists())
    locks = [RunLock(folder, flag)] + ([log_lock(log_file)] if shared_log else [])  # not /dev/stdout's folder
    created: list[list[Path]] = []
    held: list[RunLock] = []
    refusal = None
    if is_main:
        try:
            for lock in locks:
                created.append(make_dirs(lock.folder))
                lock.acquire()
                held.append(lock)
        except InputError as error:
            refusal = error
    try:
        if any_process(refusal is not None):
            if refusal is not None:
                raise refusal
            raise SystemExit(2)
        yield held[0] if held else None
    finally:
        for lock in reversed(held):
            lock.release()
        for folders in created:  # only while empty: a refused run leaves no folder, a run that wrote keeps it
            remove_empty_dirs(folders)
