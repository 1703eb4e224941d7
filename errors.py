"""Bad input ends an entry point with exit status 2 and one line on stderr naming the file and the problem."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn


class InputError(ValueError):
    """A file, flag or value the user supplied that cannot be used; the message names it and says why."""


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_cli(main: Callable[[], object]) -> None:
    """Runs an entry point's main(), turning InputError into the one-line, exit-status-2 report."""
    try:
        main()
    except InputError as error:
        fail(str(error))
