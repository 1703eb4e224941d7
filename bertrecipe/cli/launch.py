"""`python -m bertrecipe.cli.launch [--log_file PATH [--log_after PATH]] <torchrun options> script.py <script args>`:
torchrun (torch.distributed.run) run in this process, so that a launch ends the way its workers did.

- Exit status: 0 when every worker succeeded, else the first failing worker's own status (2 for arguments its
  entry point refused, 130 after Ctrl-C, 143 after a SIGTERM that stopped training early), 128+N for a worker
  killed by signal N. No traceback and no error summary: the worker has printed its own line already.
- SIGINT and SIGTERM are handed to the workers, each time one arrives (torchrun starts every worker in a session
  of its own, so a terminal's Ctrl-C reaches them only this way), and the launch waits for them to finish: they
  get --shutdown_timeout seconds after the first signal, then are killed. Without the flag that is what torchrun
  takes: TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 s. scripts/run_pretraining.sh passes the flag (its
  SHUTDOWN_TIMEOUT, default 300 s); run_squad.sh and run_glue.sh do not (so 30 s, or the variable's). A signal
  that comes before any worker runs ends the launch with 128+N. With --max_restarts above 0 signals are
  torchrun's.
- Arguments torchrun would refuse with its 19-line usage or a traceback (no training script, an unknown option,
  a bad value, --nnodes 2:1, a rendezvous port out of range, ...) are one line, `error: ...`, and exit 2, before
  anything starts.
- --log_file PATH: the launch's output (the workers' and torchrun's stdout and stderr, which still go to the
  console as they are) is also appended to PATH, after a line naming the script and the run's start; a log
  never replaces an earlier run's. --log_after PATH (the run's dllogger JSON): the log is opened only once PATH
  has been written to, which an entry point does right after its argument checks; until then the output is
  held in memory, and a launch that ends with exit status 2 before that (refused arguments) creates no log and
  no folder. The folder of PATH is created when the log opens. An unusable PATH is refused (exit 2) up front.
Everything else (options, rendezvous, OMP_NUM_THREADS, restarts) is torchrun's.
"""
from __future__ import annotations

import argparse
import copy
import logging
import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Optional

from bertrecipe.cli.command_line import fail
from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable_file, check_writable_folder

HOLD_LIMIT = 1 << 20  # output held before the log opens: one refusal line is far less; a working run passes it
PARTIAL_LIMIT = 1 << 16  # a line longer than this (a progress bar's \r updates) goes to the log in pieces
TAKEN_OVER = {"SIGINT", "SIGTERM"}  # the signals the launcher hands to the workers itself
PROG = "python -m bertrecipe.cli.launch"
DEFAULT_SHUTDOWN_TIMEOUT = 30  # torchrun's (its LaunchConfig), when neither the flag nor the variable sets one


@dataclass
class LogOptions:
    log_file: Optional[Path] = None
    log_after: Optional[Path] = None


def split_options(argv: list[str]) -> tuple[LogOptions, list[str]]:
    """The launcher's own leading options (--log_file, --log_after, as `--opt VALUE` or `--opt=VALUE`) and the
    rest, torchrun's command line."""
    options, rest = LogOptions(), list(argv)
    while rest and rest[0].split("=", 1)[0] in ("--log_file", "--log_after"):
        name, _, value = rest.pop(0).partition("=")
        if not value:
            if not rest:
                fail(f"{name}: expected a path")
            value = rest.pop(0)
        setattr(options, name[2:], Path(value))
    if options.log_after is not None and options.log_file is None:
        fail("--log_after: needs --log_file")
    return options, rest


def exit_status(exitcode: int) -> int:
    """A worker's Popen return code as a shell reports it: 128+N for a death by signal N."""
    return 128 - exitcode if exitcode < 0 else min(exitcode, 255)


def worker_groups() -> list[int]:
    """This process's living children that lead a process group of their own: the workers (torchrun starts each
    in a new session, so a signal to the group also reaches its DataLoader workers, as torchrun's own does)."""
    me, found = os.getpid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]  # the name in () may hold spaces
        if int(ppid) == me and int(pgrp) == int(entry.name) and state != "Z":
            found.append(int(entry.name))
    return found


class SignalForwarder:
    """The SIGINT/SIGTERM handler while torchrun runs: hands the signal to the workers and lets torchrun go on
    watching them, so that the launch ends with their own exit status; kills them `grace` seconds after the
    first signal. Without a worker to hand it to, it stops the launch the way torchrun's handler does."""

    def __init__(self, grace: float, signals: list[signal.Signals]) -> None:
        self.grace, self.signals = grace, signals
        self._timer: Optional[threading.Timer] = None
        self._first = ""

    def install(self) -> None:
        for signum in self.signals:
            signal.signal(signum, self)

    def uninstall(self) -> None:
        """Cancels the kill; from now on a signal ends the launch at once (what is left is writing the log)."""
        if self._timer is not None:
            self._timer.cancel()
        for signum in self.signals:
            signal.signal(signum, _exit_on_signal)

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        workers = worker_groups()
        if not workers:  # before the workers start or after they ended: torchrun's own way out
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))
        for pid in workers:
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                pass
        if self._timer is None:
            self._first = signal.Signals(signum).name
            self._timer = threading.Timer(self.grace, self._kill)
            self._timer.daemon = True
            self._timer.start()

    def _kill(self) -> None:
        workers = worker_groups()
        for pid in workers:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if workers:
            print(f"launch: workers still running {self.grace:g} s after {self._first}: killed (give them longer "
                  "with --shutdown_timeout)", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: Optional[FrameType]) -> None:
    raise SystemExit(128 + signum)


class _NoFailureSummary(logging.Filter):
    # torchrun logs "failed (exitcode: N) local_rank: ..." after a worker's own error line: noise to the user.
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed (exitcode")


def _file_stamp(path: Optional[Path]) -> Any:
    try:
        stat = os.stat(path) if path is not None else None
    except OSError:
        return None
    return stat and (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class LogCopy:
    """The --log_file copy of the output. Each stream's complete lines (so that stdout and stderr never cut into
    each other's lines), held in memory until the run got past its argument checks (module docstring), then
    appended to the file. A log that cannot be written is given up with one warning: the run goes on."""

    def __init__(self, options: LogOptions, header: str) -> None:
        assert options.log_file is not None
        self.path, self.after = options.log_file, options.log_after
        self.console = 2  # where the warning goes: the real stderr, not the pipe this object is fed from
        self._after_stamp = _file_stamp(self.after)
        self._header = header.encode()
        self._held: list[bytes] = []
        self._held_size = 0
        self._partial = {1: b"", 2: b""}
        self._fd: Optional[int] = None
        self._broken = False
        self._lock = threading.Lock()

    def feed(self, stream: int, data: bytes) -> None:
        with self._lock:
            text = self._partial[stream] + data
            cut = text.rfind(b"\n") + 1
            if len(text) - cut > PARTIAL_LIMIT:
                cut = len(text)
            self._partial[stream] = text[cut:]
            if cut:
                self._emit(text[:cut])

    def finish(self, status: int) -> None:
        """Writes what is left; a launch refused with status 2 before the run wrote --log_after leaves no log."""
        with self._lock:
            for stream in (1, 2):
                if self._partial[stream]:
                    self._emit(self._partial[stream] + b"\n")
            if self._fd is None and not self._broken and not (status == 2 and self.after is not None):
                self._open()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _emit(self, data: bytes) -> None:
        if self._broken:
            return
        if self._fd is not None:
            self._write(data)
            return
        self._held.append(data)
        self._held_size += len(data)
        if self.after is None or self._held_size > HOLD_LIMIT or _file_stamp(self.after) != self._after_stamp:
            self._open()

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError as error:
            self._give_up(error)
            return
        held, self._held = b"".join(self._held), []
        self._write(self._separator() + self._header + held)

    def _separator(self) -> bytes:
        # The header starts on a line of its own even after an earlier log that was cut off mid-line.
        try:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                return b"" if f.read(1) == b"\n" else b"\n"
        except OSError:  # empty (or unreadable): nothing to separate from
            return b""

    def _write(self, data: bytes) -> None:
        try:
            _write_all(self._fd, data)
        except OSError as error:
            self._give_up(error)

    def _give_up(self, error: OSError) -> None:
        self._broken = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        message = f"warning: {self.path}: cannot write the log ({error.strerror}); the output goes on to the " \
                  "console only\n"
        try:
            _write_all(self.console, message.encode())
        except OSError:
            pass


def _pump(read_fd: int, console_fd: int, stream: int, log: LogCopy) -> None:
    # Whatever happens to the console or the log, the pipe is drained to its end: a worker never blocks on it.
    console = True
    while True:
        data = os.read(read_fd, 1 << 16)
        if not data:
            break
        if console:
            try:
                _write_all(console_fd, data)
            except OSError:  # the console went away (a closed pipe)
                console = False
        log.feed(stream, data)
    os.close(read_fd)


class CopiedOutput:
    """Within `with`: this process's stdout and stderr (and so the workers', which inherit them) go through pipes
    whose readers copy them to the console unchanged and to the log."""

    def __init__(self, log: LogCopy) -> None:
        self.log = log
        self._saved: dict[int, int] = {}
        self._pumps: list[threading.Thread] = []

    def __enter__(self) -> "CopiedOutput":
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in (1, 2):
            self._saved[fd] = os.dup(fd)
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            pump = threading.Thread(target=_pump, args=(read_fd, self._saved[fd], fd, self.log), daemon=True)
            pump.start()
            self._pumps.append(pump)
        self.log.console = self._saved[2]
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes this process's end of the pipe: the pump sees the end of the output
        for pump in self._pumps:
            pump.join(timeout=10)  # a worker's orphaned child may hold the pipe open: do not wait for it forever


def check_log_file(path: Optional[Path]) -> None:
    if path is not None:
        check_writable_file(path, "--log_file", example="logfile.txt")


def parse_torchrun_args(argv: list[str], torchrun: Any) -> argparse.Namespace:
    """torchrun's command line, parsed by its own parser whose errors are one line (exit 2) like every other
    command's, not its 19-line usage."""
    parser = torchrun.get_args_parser()
    parser.prog = PROG

    def one_line_error(message: str) -> NoReturn:
        if message.startswith("the following arguments are required: training_script"):
            message = f"no training script given (usage: {PROG} [options] script.py [its arguments])"
        fail(f"{PROG}: {message}; see --help")

    parser.error = one_line_error  # argparse calls self.error for every refusal
    return parser.parse_args(argv)


def check_launch(args: Any, torchrun: Any) -> None:
    """torchrun's own values that it would refuse with a traceback (or, for a signal name, a warning with one),
    refused with one line instead."""
    try:
        torchrun.parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError) as error:
        fail(f"--nnodes {args.nnodes}: {error}")
    try:
        processes = torchrun.determine_local_world_size(args.nproc_per_node)
    except ValueError as error:
        fail(f"--nproc_per_node {args.nproc_per_node}: {error}")
    if processes < 1:
        fail(f"--nproc_per_node {args.nproc_per_node}: must be at least 1")
    shutdown_timeout(args)
    for name in signal_names(args):
        if not isinstance(getattr(signal, name, None), signal.Signals):
            fail(f"--signals_to_handle {args.signals_to_handle}: {name} is not a signal; give names such as SIGTERM")
    if args.log_dir is not None:
        try:
            check_writable_folder(args.log_dir, "--log_dir")
        except InputError as error:
            fail(str(error))
    check_torchrun_config(args, torchrun)


def check_torchrun_config(args: Any, torchrun: Any) -> None:
    """The rest of torchrun's checks, those of config_from_args and of the rendezvous endpoint, run on a copy of
    the arguments before anything starts, so that what they refuse is one line, not a traceback."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    trial = copy.deepcopy(args)
    trial.log_dir = os.devnull  # torchrun creates it (a temporary folder when unset): check_launch checked it
    if trial.master_port is None:
        trial.master_port = 29500  # as torchrun's run() sets it
    omp_threads = os.environ.get("OMP_NUM_THREADS")
    torchrun_log = logging.getLogger(torchrun.__name__)
    was_disabled, torchrun_log.disabled = torchrun_log.disabled, True  # its warnings come when it runs, once
    try:
        config, _, _ = torchrun.config_from_args(trial)
        if not args.standalone:  # --standalone replaces the endpoint with localhost:0
            parse_rendezvous_endpoint(config.rdzv_endpoint, default_port=-1)
    except (ValueError, AssertionError, RuntimeError) as error:
        fail(f"{PROG}: {str(error).rstrip('.')}; see --help")
    finally:
        torchrun_log.disabled = was_disabled
        if omp_threads is None:  # config_from_args sets it for more than one process; run() will again
            os.environ.pop("OMP_NUM_THREADS", None)


def signal_names(args: Any) -> list[str]:
    return [name.strip() for name in args.signals_to_handle.split(",") if name.strip()]


def shutdown_timeout(args: Any) -> int:
    """The seconds the workers get after the first SIGINT or SIGTERM: --shutdown_timeout, else (as torchrun's
    LaunchConfig reads it) TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else torchrun's default, 30."""
    if args.shutdown_timeout is not None:
        if args.shutdown_timeout < 0:
            fail(f"--shutdown_timeout {args.shutdown_timeout}: must be 0 or more seconds")
        return args.shutdown_timeout
    value = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(DEFAULT_SHUTDOWN_TIMEOUT))
    if not value.strip().isdigit():
        fail(f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={value}: not a whole number of seconds; set it to one, or unset it")
    return int(value)


def take_over_signals(args: Any) -> Optional[SignalForwarder]:
    """The SignalForwarder for SIGINT and SIGTERM (those of --signals_to_handle), which torchrun is then left
    out of; None with --max_restarts above 0: torchrun keeps them all, as it must not restart stopped workers."""
    if args.max_restarts > 0:
        return None
    names = signal_names(args)
    # torchrun needs at least one name (an empty one is a warning with a traceback): SIGHUP, from its defaults.
    args.signals_to_handle = ",".join(name for name in names if name not in TAKEN_OVER) or "SIGHUP"
    return SignalForwarder(shutdown_timeout(args), [getattr(signal, name) for name in sorted(TAKEN_OVER & set(names))])


def launch(args: Any, torchrun: Any, forwarder: Optional[SignalForwarder]) -> int:
    """torchrun's run(args); the exit status as the module docstring says."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_NoFailureSummary())
    try:
        if forwarder is not None:
            forwarder.install()
        torchrun.run(args)
    except ChildFailedError as error:
        return exit_status(error.get_first_failure()[1].exitcode)
    except SignalException as error:
        return 128 + int(error.sigval)
    finally:
        if forwarder is not None:
            forwarder.uninstall()
    return 0


def header(args: Any, start: datetime) -> str:
    command = shlex.join([Path(args.training_script).name, *args.training_script_args])
    return f"===== run started {start.isoformat(sep=' ', timespec='seconds')}: {command} =====\n"


def run_launch(argv: list[str]) -> int:
    start = datetime.now().astimezone()
    options, rest = split_options(argv)
    try:
        check_log_file(options.log_file)
    except InputError as error:
        fail(str(error))
    from torch.distributed import run as torchrun

    args = parse_torchrun_args(rest, torchrun)
    check_launch(args, torchrun)
    forwarder = take_over_signals(args)
    log = LogCopy(options, header(args, start)) if options.log_file is not None else None
    if log is None:
        return launch(args, torchrun, forwarder)
    with CopiedOutput(log):
        status = launch(args, torchrun, forwarder)
    log.finish(status)
    return status


def main(argv: Optional[list[str]] = None) -> NoReturn:
    # Ctrl-C while torch loads ends the launch too, also when it started with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status = run_launch(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        status = 128 + signal.SIGINT
    raise SystemExit(status)


if __name__ == "__main__":
    main()
