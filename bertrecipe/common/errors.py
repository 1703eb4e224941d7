"""The error types of bad input: what the user supplied cannot be used. The commands report them in one line
with exit status 2 (cli.command_line.run_cli); files.py reads user files with these errors."""
from __future__ import annotations

import re
from pathlib import Path


class InputError(ValueError):
    """A file, flag or value the user supplied that cannot be used; the message names it and says why."""


class DataError(InputError):
    """A problem with an input or output file that the user must fix (not a bug)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Picklable with both fields, so an error raised in a worker process reaches the parent intact.
        return (DataError, (self.path, self.problem))


def error_text(error: BaseException) -> str:
    """An error's own message: for one raised in a DataLoader worker, whose message carries the worker's traceback,
    the original message of its last line."""
    message = str(error)
    if "Original Traceback" not in message:
        return message
    last = [line for line in message.splitlines() if line.strip()][-1].strip()
    ours = re.match(r"(?:[\w.]+\.)?(?:InputError|DataError): (.*)", last)
    return ours.group(1) if ours else last
