"""The commands' shared front: an argparse parser whose errors are one line, and run_cli, which turns a main()'s
InputError into `error: <file>: <problem>` and exit status 2 (Ctrl-C: 130)."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn

from bertrecipe.common.errors import InputError


def fail(message: str) -> NoReturn:
    # One line, whatever the message held, so that scripts and users can grep it.
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors (unknown flag, bad value, missing flag) are one line,
    `error: <prog>: <problem>; see --help`, exit 2, instead of the whole usage text."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message}; see --help")


def _without_worker_traceback(message: str) -> str:
    """An error raised in a DataLoader worker reaches the main process with the worker's traceback in its
    message; the user needs only its last line, the original message."""
    if "Original Traceback" not in message:
        return message
    last = [line for line in message.splitlines() if line.strip()][-1].strip()
    return last.split(": ", 1)[1] if last.startswith(InputError.__name__ + ": ") or ".InputError: " in last else last


def run_cli(main: Callable[[], object]) -> NoReturn:
    """Runs an entry point's main(): InputError becomes the one-line exit-2 report, Ctrl-C exit 130."""
    try:
        main()
    except InputError as error:
        fail(_without_worker_traceback(str(error)))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(0)
