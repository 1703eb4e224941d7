"""The commands' shared front: an argparse parser whose errors are one line, and run_cli, which turns a main()'s
InputError, and any OSError no layer turned into one, into `error: <file>: <problem>` and exit status 2 (Ctrl-C:
130, SIGTERM: 143, each one line; the reader of its output gone, as in `| head -1`: 141, quietly)."""
from __future__ import annotations

import argparse
import io
import os
import re
import select
import signal
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NoReturn, Optional, TextIO

from bertrecipe.common.errors import InputError, error_text
from bertrecipe.common.stop_signals import Terminated, exit_with_stop_line, handle_stop_signals, stop_signal_received


def fail(message: str) -> NoReturn:
    # One line, whatever the message held, so that scripts and users can grep it.
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (unknown flag, bad value, missing flag) are one line,
    `error: <prog>: <problem>; see --help`, exit 2, instead of the whole usage text; a value that starts like a
    negative number (`-1e-5`, `-0.1,3e-5`) is a value, for the flag's own check to judge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse takes only `-1` and `-.5` for numbers, so `--learning_rates -1e-5` read as an unknown flag.
        # No flag of ours starts with a digit, so nothing that does can be one.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}; see --help")


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a Unix tool killed by SIGPIPE: 141


def _reader_gone(stream: Optional[TextIO]) -> bool:
    """True when `stream` writes into a pipe or socket whose reader has closed it (poll reports POLLERR or
    POLLHUP for its end); False for a terminal, a file, or a stream without a file descriptor."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: only the ones always reported, errors and hang-ups
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _end_quietly_after_the_reader_left() -> NoReturn:
    """Python's recipe for SIGPIPE (the `signal` module's docs): the closed output is pointed at os.devnull, so that
    flushing it again at exit cannot print "Exception ignored ... BrokenPipeError"; the status is SIGPIPE's."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        if _reader_gone(stream):
            os.dup2(devnull, stream.fileno())
    os.close(devnull)
    raise SystemExit(EXIT_BROKEN_PIPE)


@contextmanager
def signals_end_in_one_line() -> Iterator[None]:
    """Ctrl-C in the block ends the command with one line and exit 130, a SIGTERM (raised as Terminated) with one
    line and exit 143; so does any error raised after one of them arrived."""
    try:
        yield
    except (KeyboardInterrupt, Terminated) as stopped:
        _end_for_signal(stopped)
    except Exception:
        # A library may turn the signal's exception into an error of its own: h5py's type conversion, where
        # Ctrl-C lands while a shard's attributes are written, raises TypeError. The signal still ends it.
        arrived = stop_signal_received()
        if arrived is None:
            raise
        _end_for_signal(arrived)


def _end_for_signal(stopped: BaseException) -> NoReturn:
    """The signal's one line and the shell's status for it (KeyboardInterrupt: Ctrl-C; else SIGTERM)."""
    exit_with_stop_line(signal.SIGINT if isinstance(stopped, KeyboardInterrupt) else signal.SIGTERM)


def run_cli(main: Callable[[], object]) -> NoReturn:
    """Runs an entry point's main(): InputError becomes the one-line exit-2 report, Ctrl-C one line and exit 130,
    SIGTERM (where nothing else handles it) one line and exit 143, and a reader of the output that went away
    (`| head -1`) a quiet exit 141, as for any Unix tool."""
    handle_stop_signals()  # SIGTERM raised as Ctrl-C is, both remembered (common/stop_signals.py)
    try:
        with signals_end_in_one_line():
            main()
            if sys.stdout is not None:
                sys.stdout.flush()  # buffered output meets a closed pipe here, not at exit where it cannot be caught
    except InputError as error:
        fail(error_text(error))
    except BrokenPipeError as error:
        if _reader_gone(sys.stdout) or _reader_gone(sys.stderr):
            _end_quietly_after_the_reader_left()
        fail(os_error_text(error))  # another pipe or a socket (a server's connection) broke: a real error
    except OSError as error:  # whatever no layer named: still one line, naming the file where the OS did
        fail(os_error_text(error))
    raise SystemExit(0)


def os_error_text(error: OSError) -> str:
    """An OSError as `<file>: <the OS's words>` (both files of a rename or link), or the words alone where the
    error names no file (a socket)."""
    words = error.strerror or str(error) or type(error).__name__
    files = [str(name) for name in (error.filename, error.filename2) if name is not None]
    return f"{' -> '.join(files)}: {words}" if files else words
