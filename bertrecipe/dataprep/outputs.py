"""The data tools' view of output_paths.py (outputs never onto inputs, only where writable): the same rules,
raising DataError."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from bertrecipe.common.errors import DataError
from bertrecipe.common.output_paths import check_writable as _check_writable
from bertrecipe.common.output_paths import inside, refuse_special_output, same_file
from bertrecipe.common.output_paths import refuse_input_as_output as _refuse_input_as_output

__all__ = ["check_data_output_writable", "inside", "refuse_data_input_as_output", "same_file"]


def refuse_data_input_as_output(output: Path, output_flag: str, inputs: Iterable[tuple[str, Path]],
                           fix: str | None = None) -> None:
    """DataError naming both when output is one of the (flag, path) inputs or an input folder itself; DataError
    naming what is there when it is a device node, a FIFO or a socket (every data output is renamed into place)."""
    _refuse_input_as_output(output, output_flag, inputs, fix, error=DataError)
    refuse_special_output(output, output_flag, error=DataError)


def check_data_output_writable(output: Path, output_flag: str) -> None:
    """DataError when the output is a folder or its nearest existing folder cannot be written."""
    _check_writable(output, output_flag, error=DataError)
