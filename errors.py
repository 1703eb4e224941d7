"""Bad input ends an entry point with exit status 2 and one line on stderr naming the file and the problem."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn


class InputError(ValueError):
    """A file, flag or value the user supplied that cannot be used; the message names it and says why."""


def fail(message: str) -> NoReturn:
    # One line, whatever the message held, so that scripts and users can grep it.
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def run_cli(main: Callable[[], object]) -> NoReturn:
    """Runs an entry point's main(): InputError becomes the one-line exit-2 report, Ctrl-C exit 130."""
    try:
        main()
    except InputError as error:
        fail(str(error))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(0)
