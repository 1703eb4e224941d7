"""Bad input ends an entry point with exit status 2 and one line on stderr naming the file and the problem."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, NoReturn


class InputError(ValueError):
    """A file, flag or value the user supplied that cannot be used; the message names it and says why."""


def read_text_file(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a user-given file; InputError naming the file (as `what`) when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: {what} is a directory") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: {what} is not UTF-8 (byte {error.start})") from None
    except OSError as error:
        raise InputError(f"{path}: cannot read the {what} ({error.strerror})") from None


def check_output_dir(path: str | Path, flag: str = "--output_dir") -> None:
    """InputError when the folder cannot be used: it is a file, or a file stands where a parent folder would be
    created. Creates nothing (the folder is made at the first write)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{folder}: {flag} exists and is a file, not a folder; choose a folder")
    check_creatable(folder, flag)


def check_creatable(path: str | Path, what: str) -> None:
    """InputError when `path` cannot be created later because one of its parent folders is a file."""
    existing = next((parent for parent in Path(path).parents if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InputError(f"{path}: {what} cannot be created because {existing} is a file")


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
