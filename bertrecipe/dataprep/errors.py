"""Bad-input errors of the data tools, reported like every other entry point's (see errors.py)."""
from __future__ import annotations

from pathlib import Path

from bertrecipe.common.errors import ArgumentParser, InputError, run_cli

__all__ = ["ArgumentParser", "DataError", "run_cli"]


class DataError(InputError):
    """A problem with an input or output file that the user must fix (not a bug)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Picklable with both fields, so an error raised in a worker process reaches the parent intact.
        return (DataError, (self.path, self.problem))
