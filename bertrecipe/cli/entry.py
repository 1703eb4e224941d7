"""The commands' entry points, for the root scripts and the console scripts alike (`from bertrecipe.cli.entry
import run_squad`; `run_squad()`). Each imports its command module (torch and the rest take a second or two) where
a Ctrl-C or SIGTERM already has its one line and exit status 130 or 143, as it has anywhere later: a command
imported first would leave that second to Python's traceback. This module imports nothing heavy itself."""
from __future__ import annotations

import importlib
from functools import partial
from typing import Callable, NoReturn

from bertrecipe.common.stop_signals import end_at_once_while_starting, handle_stop_signals

# Before anything of ours is imported: from here a signal ends the command in its line (the interpreter's own
# start-up, before this, is Python's, where nothing of the command has run).
end_at_once_while_starting()

# The modules of bertrecipe/cli/ that are commands (each has a cli()); an entry point of each name is below.
COMMANDS = ("run_pretraining", "run_squad", "run_glue", "run_downstream", "run_retrieval", "inference",
            "evaluate_squad", "bert_prep", "create_pretraining_data", "build_default_corpus", "convert_checkpoint",
            "plot_logs", "triton_deployer", "triton_server", "triton_client", "triton_perf_client",
            "triton_squad_client", "general_distill", "task_distill", "data_augmentation", "extract_features",
            "run_pretraining_inference", "export_model")


def start_command(name: str) -> NoReturn:
    """Imports bertrecipe.cli.<name> and runs its cli(); a signal during the import ends the command in one line
    (nothing has been written yet, so the usual line, run the command again, holds)."""
    from bertrecipe.cli.command_line import signals_end_in_one_line  # here: still under the start-up handler

    handle_stop_signals()
    with signals_end_in_one_line():
        command = importlib.import_module(f"bertrecipe.cli.{name}")
    command.cli()


def __getattr__(name: str) -> Callable[[], NoReturn]:
    # `from bertrecipe.cli.entry import run_squad` gives run_squad's entry point, whatever the command.
    if name in COMMANDS:
        return partial(start_command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
