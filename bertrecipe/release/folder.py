"""A release folder written whole or not at all: its files go to a temporary folder beside it, which takes the
folder's name once every file is written and checked. An existing folder is replaced only with --overwrite and only
when this command wrote it (its release.json says so), or when it is empty; the previous release is moved aside
first and removed once the new one holds its name, so a failure at any point leaves the previous one whole."""
from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from bertrecipe.common.atomic_files import make_dirs, remove_empty_dirs, temporary_name
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.common.stop_signals import raise_if_stopped

RECORD = "release.json"  # what export_model.py wrote: the source, the command and every file's sha256


def check_release_target(out: Path, overwrite: bool) -> None:
    """Refuses, before anything is written, a target that is a file, a non-empty folder without --overwrite, or a
    non-empty folder this command did not write."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; choose a folder for the release")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise InputError(f"{out}: exists and holds files; pass --overwrite to replace a release written by "
                         "export_model.py, or choose another folder")
    if not (out / RECORD).is_file():
        raise InputError(f"{out}: holds files but no {RECORD}, so export_model.py did not write it; it is not "
                         "replaced: choose another folder")


def write_release_record(folder: Path, record: dict[str, Any]) -> None:
    """release.json: `record` and the sha256 of every file in the folder (itself left out)."""
    files = {str(path.relative_to(folder)): file_sha256(path) for path in sorted(folder.rglob("*"))
             if path.is_file() and path.name != RECORD}
    (folder / RECORD).write_text(json.dumps({**record, "files": files}, indent=2) + "\n", encoding="utf-8")


@contextmanager
def release_folder(out: Path, overwrite: bool) -> Iterator[Path]:
    """Yields an empty temporary folder beside `out`; when the block ends it takes out's name (see the module)."""
    check_release_target(out, overwrite)
    created = make_dirs(out.parent)
    staging = temporary_name(out)
    staging.mkdir()
    try:
        yield staging
        raise_if_stopped()
        replace_folder(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        remove_empty_dirs(created)
        raise


def replace_folder(staging: Path, out: Path) -> None:
    """staging takes out's name; a previous folder there is renamed aside first and removed after."""
    previous = None
    if out.exists():
        previous = temporary_name(out)
        os.replace(out, previous)
    try:
        os.replace(staging, out)
    except BaseException:
        if previous is not None:
            os.replace(previous, out)
        raise
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
