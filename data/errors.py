"""Bad-input errors for the data tools: exit status 2 and one stderr line naming the file and the problem."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, NoReturn


class DataError(Exception):
    """A problem with an input or output file that the user must fix (not a bug)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Picklable with both fields, so an error raised in a worker process reaches the parent intact.
        return (DataError, (self.path, self.problem))


def run_cli(main: Callable[[], None]) -> NoReturn:
    """Run an entry point; a DataError becomes exit status 2 with exactly one line on stderr."""
    try:
        main()
    except DataError as err:
        # One line, whatever the message held, so scripts and users can grep it.
        message = " ".join(str(err).split())
        print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(0)
