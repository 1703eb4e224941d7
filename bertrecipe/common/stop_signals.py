"""Ctrl-C and SIGTERM as exceptions that are also remembered. Python drops an exception raised inside a weakref
callback or a __del__ ("Exception ignored in ..." and its traceback) and goes on: h5py runs many while a shard is
written, so a signal landing there was lost and the shard committed with exit 0. Here such a signal is delivered
again, where it can be raised, without the traceback; and writers that commit an output (atomic_files) ask
raise_if_stopped() first, so that nothing is committed after a signal whatever became of its exception."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, NoReturn, Optional


class Terminated(BaseException):
    """SIGTERM, raised where the command is, as Ctrl-C raises KeyboardInterrupt: the outputs being written are
    discarded on the way out (atomic_files, StagedOutputs), where the default action would leave them behind."""


_received: list[int] = []


def stop_line(what: str) -> str:
    """A signal's one line: outputs are only ever kept whole, so a second run finishes what is missing."""
    return f"{what}: stopped before the end; nothing half-written was kept, run the command again to finish"


def exit_with_stop_line(signum: int) -> NoReturn:
    """Ends the command on SIGINT (Ctrl-C) or SIGTERM: its one line, and the shell's status for it (130, 143)."""
    print(stop_line("interrupted (Ctrl-C)" if signum == signal.SIGINT else "SIGTERM"), file=sys.stderr, flush=True)
    raise SystemExit(128 + signum) from None


def end_at_once_while_starting() -> None:
    """Until handle_stop_signals(), SIGINT and SIGTERM end the command at once with their line and the shell's
    status (130, 143): while it imports, nothing has been written, and Python's own response would be a traceback
    for Ctrl-C and no word at all for SIGTERM. A signal the command was started ignoring (`cmd &` in a script
    ignores SIGINT) stays ignored, here and after."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _end_while_starting)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _end_while_starting)


def _end_while_starting(signum: int, frame: object) -> NoReturn:
    exit_with_stop_line(signum)  # SystemExit leaves through the import under way, quietly


def handle_stop_signals() -> None:
    """SIGINT and SIGTERM raise their exceptions (raise_on_signal) where no other handler was set (a launcher's, a
    training loop's own stay), and a swallowed one is delivered again; no signal is remembered yet."""
    forget_signals()
    ours = (raise_on_signal, _end_while_starting)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, *ours):
        signal.signal(signal.SIGTERM, raise_on_signal)
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, *ours):
        signal.signal(signal.SIGINT, raise_on_signal)
    deliver_swallowed_signals_again()


def deliver_swallowed_signals_again() -> None:
    """A stop signal's exception that Python swallows is sent again instead of printed (sys.unraisablehook)."""
    global _unraisable_before
    if sys.unraisablehook is not _deliver_again:
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = _deliver_again


def _deliver_again(unraisable: Any) -> None:
    """sys.unraisablehook: a stop signal's exception that Python could not raise (it landed in a weakref callback
    or a __del__) is sent again, to be raised in the code that runs next; anything else is shown as before."""
    if isinstance(unraisable.exc_value, (KeyboardInterrupt, Terminated)) and _received:
        # Sent from a thread a moment later: sent now, its handler would run here, inside the hook, and be
        # swallowed again; the main thread is back in its own code by then (a callback again: this repeats).
        again = threading.Timer(0.01, os.kill, (os.getpid(), _received[-1]))
        again.daemon = True
        again.start()
        return
    _unraisable_before(unraisable)


_unraisable_before = sys.unraisablehook


def raise_on_signal(signum: int, frame: object) -> NoReturn:
    """The handler of SIGINT and SIGTERM in a command: remembers the signal, then raises its exception."""
    _received.append(signum)
    raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def raise_if_stopped() -> None:
    """Raises the first signal's exception again when one arrived since forget_signals(): where Python swallowed it,
    the command still stops before its next commit. In the main thread only, where signals are raised and handled:
    another thread's commit is of a whole output, and the main thread ends the command."""
    arrived = stop_signal_received()
    if arrived is not None and threading.current_thread() is threading.main_thread():
        raise arrived


def stop_signal_received() -> Optional[BaseException]:
    """The exception of the first stop signal received since forget_signals(), None if none was."""
    if not _received:
        return None
    return KeyboardInterrupt() if _received[0] == signal.SIGINT else Terminated()


def stop_signal_within(seconds: float) -> Optional[BaseException]:
    """The exception of a stop signal this process received, or receives within `seconds` (None if none comes):
    a Ctrl-C or SIGTERM sent to a whole job reaches its processes a moment apart, and one of them may first see its
    peers gone (they stopped on theirs) before its own arrives."""
    arrived = stop_signal_received()
    if arrived is not None:
        return arrived
    try:
        time.sleep(seconds)
    except (KeyboardInterrupt, Terminated) as arrived:
        return arrived
    return None


def forget_signals() -> None:
    """A new command (or a test's next in-process one) starts with no signal received."""
    _received.clear()
