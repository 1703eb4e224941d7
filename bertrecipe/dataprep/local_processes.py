"""The local engine's worker processes (dataprep/engine.py, --n_processes N): tasks run on spawned processes, and a
Ctrl-C or SIGTERM ends them all within seconds, with nothing left running and no worker traceback.

Each worker takes one task at a time through a pipe of its own, so no lock is shared between processes.
multiprocessing.Pool's workers share the locks of its task and result queues: one ended by a signal while holding
one (an idle worker holds the task queue's while it waits) makes Pool.terminate() wait for ever, and a worker that
dies inside a task leaves Pool.imap waiting for its result for ever. Here a worker that ends without answering is
seen at once (its process sentinel) and reported in one line.

Signals, for a command whose parent turns Ctrl-C into KeyboardInterrupt and SIGTERM into an exception of its own
(cli/command_line.py's run_cli):
- a worker ignores SIGINT: a terminal's Ctrl-C reaches every process of the foreground group, and the parent alone
  decides what happens (it stops the workers, then prints its one line);
- SIGTERM in a worker raises SystemExit(143): the task unwinds (its atomic outputs discard their temporaries) and
  the process ends without a word. The parent stops its workers with SIGTERM too, and SIGKILLs one still inside
  C code after STOP_SECONDS;
- both are held back while a worker starts (the signal mask passes through spawn's fork and exec) and let through
  once its handlers are set, so that a signal during its imports is neither lost nor a KeyboardInterrupt traceback;
- a worker ended by SIGTERM while the parent waits for it: Slurm and a terminal signal every process, so the
  parent most likely has the signal too and waits SIGNAL_GRACE seconds for it before reporting the worker.
"""
from __future__ import annotations

import multiprocessing
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Iterator, NoReturn, Sequence

from tqdm import tqdm

from bertrecipe.common.errors import DataError, InputError
from bertrecipe.common.stop_signals import Terminated, deliver_swallowed_signals_again, raise_on_signal

STOP_SECONDS = 2.0  # from a worker's SIGTERM to its SIGKILL: a task inside C code runs on until it returns
SIGNAL_GRACE = 1.0  # how long a worker's death by SIGTERM waits for this process's own signal
EXIT_ON_SIGTERM = 128 + signal.SIGTERM
_HELD = {signal.SIGINT, signal.SIGTERM}
_POLL_SECONDS = 0.1  # how often a run looks at its stop event


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back in this thread, and in the processes it starts, until the block ends; they
    are delivered then, none is lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class WorkerTraceback(Exception):
    """Where in a worker an error was raised: the cause of the error the parent raises again."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


def _exit_quietly(signum: int, frame: object) -> NoReturn:
    # The parent's SIGTERM follows Slurm's or a group's: it must not cut short the unwinding that removes the
    # task's temporaries (SIGKILL remains, after STOP_SECONDS). Raised as a remembered Terminated: where Python
    # swallows it (a weakref callback of h5py's), the task's next commit still stops (common/stop_signals.py).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise_on_signal(signum, frame)


def _serve(connection: Connection) -> None:
    """A worker's life: (function, task) from the pipe, answered (True, result, "") or (False, error, traceback),
    until None comes, the parent is gone, or SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_quietly)
    deliver_swallowed_signals_again()  # and never print one as "Exception ignored"
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)  # held since the start: a pending SIGTERM ends us here
        _answer_tasks(connection)
    except Terminated:
        raise SystemExit(EXIT_ON_SIGTERM) from None  # an int code: multiprocessing ends the process silently


def _answer_tasks(connection: Connection) -> None:
    # tqdm's default lock, even for a disabled bar, is a multiprocessing semaphore, which the resource tracker
    # reports on stderr at exit when the worker that made it was SIGKILLed: a thread lock does here.
    tqdm.set_lock(threading.RLock())
    while True:
        try:
            message = connection.recv()
        except EOFError:  # the parent ended
            return
        if message is None:
            return
        function, task = message
        try:
            answer = (True, function(*task), "")
        except Exception as error:  # noqa: BLE001 - raised again in the parent, with this traceback as its cause
            answer = (False, error, traceback.format_exc())
        if not _answer(connection, answer):
            return


def _answer(connection: Connection, answer: tuple[bool, Any, str]) -> bool:
    """Sends the answer (an error that cannot be pickled as a RuntimeError of its text); False when the parent is
    gone."""
    try:
        connection.send(answer)
    except OSError:
        return False
    except Exception as error:  # noqa: BLE001 - pickling fails before anything is written to the pipe
        what = answer[1] if not answer[0] else f"the result of type {type(answer[1]).__name__}"
        connection.send((False, RuntimeError(f"{what!r} could not be sent to the parent: {error}"), answer[2]))
    return True


class WorkerProcesses:
    """`count` spawned workers for one run of tasks. As a context manager: at a normal end the workers are told to
    end and waited for; on an exception (a task's error, Ctrl-C, SIGTERM) or with tasks still running, they are
    stopped (stop())."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.workers: list[tuple[BaseProcess, Connection]] = []
        self.busy: dict[Connection, BaseProcess] = {}
        self.abandoned: threading.Event | None = None  # run()'s stop event

    def __enter__(self) -> WorkerProcesses:
        context = multiprocessing.get_context("spawn")
        # Started by the first spawn otherwise, where it unblocks SIGINT and SIGTERM in this thread (instead of
        # restoring the mask), so that the first worker would start without them held.
        resource_tracker.ensure_running()
        try:
            for index in range(self.count):
                ours, theirs = context.Pipe()
                process = context.Process(target=_serve, args=(theirs,), name=f"data-prep-worker-{index}",
                                          daemon=True)
                with signals_held():  # the worker starts with them held, until its handlers are set
                    process.start()
                    self.workers.append((process, ours))
                    theirs.close()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: object) -> None:
        if error is not None or self.busy:
            self.stop()
            return
        try:
            self._finish()
        except BaseException:
            self.stop()
            raise

    def _finish(self) -> None:
        """Tells the idle workers to end and waits for them (a moment: they are between tasks)."""
        for _, connection in self.workers:
            try:
                connection.send(None)
            except OSError:  # ended already
                pass
        deadline = time.monotonic() + STOP_SECONDS
        for process, _ in self.workers:
            process.join(max(0.0, deadline - time.monotonic()))
        self.stop()  # any that did not end; closes the pipes

    def stop(self) -> None:
        """Ends every worker within about STOP_SECONDS: SIGTERM, which unwinds its task (its temporaries are
        discarded), then SIGKILL for one still inside C code. A second Ctrl-C is held back meanwhile, so that it
        cannot cut this short and leave workers behind; it is delivered after."""
        with signals_held():
            for process, _ in self.workers:
                if process.exitcode is None:
                    process.terminate()
            deadline = time.monotonic() + STOP_SECONDS
            for process, _ in self.workers:
                process.join(max(0.0, deadline - time.monotonic()))
            for process, connection in self.workers:
                if process.exitcode is None:
                    process.kill()  # cannot be refused: gone at once
                    process.join(STOP_SECONDS)
                connection.close()
            self.workers, self.busy = [], {}

    def run(self, function: Callable, tasks: Sequence[tuple], on_done: Callable[[Any], None],
            stop: threading.Event | None = None) -> None:
        """function(*task) for every task on the workers, on_done(result) here as each ends, in any order. A task's
        error is raised here as it was raised there; a worker that ends without answering is one DataError line.
        Once stop is set, returns without waiting for the tasks still running (leaving the block stops them)."""
        todo = iter(tasks)
        self.abandoned = stop
        for process, connection in self.workers:
            self._give(process, connection, function, todo)
        while self.busy:
            if stop is not None and stop.is_set():
                return
            running = list(self.busy.items())
            ready = set(wait([*self.busy, *(process.sentinel for _, process in running)], timeout=_POLL_SECONDS))
            for connection, process in running:
                if connection in ready or process.sentinel in ready:
                    on_done(self._result(process, connection))
                    self._give(process, connection, function, todo)

    def _give(self, process: BaseProcess, connection: Connection, function: Callable, todo: Iterator[tuple]) -> None:
        task = next(todo, None)
        if task is None:
            return
        try:
            connection.send((function, task))
        except OSError:  # it ended while idle
            self._lost(process)
        self.busy[connection] = process

    def _result(self, process: BaseProcess, connection: Connection) -> Any:
        """The answer of a worker that is ready: its result, or its error raised here."""
        try:
            ok, value, where = connection.recv()
        except (EOFError, OSError):  # it ended without answering
            self._lost(process)
        del self.busy[connection]
        if ok:
            return value
        if not isinstance(value, InputError):  # one line by design; any other error shows where it was raised
            value.__cause__ = WorkerTraceback(where)
        raise value

    def _lost(self, process: BaseProcess) -> NoReturn:
        process.join(STOP_SECONDS)  # its exit status
        status = process.exitcode
        if status in (EXIT_ON_SIGTERM, -signal.SIGTERM):  # this process's own SIGTERM most likely comes: it wins
            if self.abandoned is not None:
                self.abandoned.wait(SIGNAL_GRACE)  # in_order's thread: its caller, which has the signal, is waiting
            else:
                time.sleep(SIGNAL_GRACE)  # the signal's exception is raised in the sleep
        if status is not None and status < 0:
            how = f"was killed by {signal.Signals(-status).name}"
        else:
            how = "was stopped by SIGTERM" if status == EXIT_ON_SIGTERM else f"ended with exit status {status}"
        hint = " (with fewer --n_processes if memory ran out)" if status == -signal.SIGKILL else ""
        raise DataError("--n_processes", f"worker process {process.pid} {how} before finishing its task; nothing "
                                         f"half-written was kept, run the command again{hint}")
