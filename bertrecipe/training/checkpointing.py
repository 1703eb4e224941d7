"""Training checkpoints: `<output_dir>/ckpt_<global_step>.pt`, or the folder `ckpt_<global_step>.dcp` that a sharded
run's processes write together (model/sharded_checkpoint.py), written atomically and never over an existing one,
the newest 3 of the same phase that load kept (and the one a run resumed from; a phase never rotates away the
other's), a corrupt one moved aside as `*.corrupt`, and found again on resume with a corrupt newest file skipped
in favour of the previous one (docs/interfaces.md, section 3).

A checkpoint holds only tensors, numbers, strings, lists and dicts, so `torch.load(weights_only=True)` reads it.
"""
from __future__ import annotations

import random
import re
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from bertrecipe.common.atomic_files import atomic_output
from bertrecipe.common.errors import InputError, error_text
from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.torch_files import load_torch_file, save_torch_atomic
from bertrecipe.training.process_group import DistributedContext, any_process

CHECKPOINT_PATTERN = re.compile(r"^ckpt_(\d+)\.(pt|dcp)$")
CHECKPOINT_NAME = re.compile(r"ckpt_\d+\.(?:pt|dcp)")  # for atomic_files.remove_stale_temporaries
KEEP_NEWEST = 3


def checkpoint_path(output_dir: str | Path, global_step: int, sharded: bool = False) -> Path:
    return Path(output_dir) / f"ckpt_{global_step}{sharded_checkpoint.SUFFIX if sharded else '.pt'}"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every ckpt_<step>.pt file and ckpt_<step>.dcp folder in output_dir, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match and (path.is_file() if match.group(2) == "pt" else path.is_dir()):
            found.append((int(match.group(1)), path))
    return sorted(found)


def saved_at(output_dir: str | Path, global_step: int) -> Path:
    """The checkpoint of global_step in output_dir (a file or a sharded folder); the file's name when neither is
    there."""
    found = [path for step, path in list_checkpoints(output_dir) if step == global_step]
    return found[-1] if found else checkpoint_path(output_dir, global_step)


def rng_state() -> dict[str, Any]:
    """Every random generator the training step draws from (dropout, Python and numpy), as plain data."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint in an output folder as rotation and resume see it: its step, file and phase (1 or 2; None
    when the file does not load)."""

    step: int
    path: Path
    phase: Optional[int]
    phase_step: int = 0
    phase1_end_step: Optional[int] = None


def checkpoint_phase(payload: dict[str, Any]) -> int:
    return 2 if payload.get("phase2") else 1


def survey(output_dir: str | Path) -> list[SavedCheckpoint]:
    """Every ckpt_<step>.pt in output_dir, oldest first, with its phase read from the file (memory-mapped: only
    the archive's index and pickled structure are read)."""
    found = []
    for step, path in list_checkpoints(output_dir):
        try:
            payload = load_checkpoint(path, mmap=True)
        except InputError:
            found.append(SavedCheckpoint(step, path, None))
            continue
        end = payload.get("phase1_end_step")
        found.append(SavedCheckpoint(step, path, checkpoint_phase(payload), int(payload.get("phase_step", step)),
                                     int(end) if end is not None else None))
    return found


def save_checkpoint(output_dir: str | Path, global_step: int, payload: dict[str, Any],
                    keep: Optional[Path] = None) -> Path:
    """Writes ckpt_<global_step>.pt atomically, then rotates (`rotate_checkpoints`). A failed write (disk full) is an
    InputError that names the file (every earlier checkpoint intact); so is a checkpoint already at that step,
    which is never overwritten."""
    path = checkpoint_path(output_dir, global_step)
    refuse_existing(output_dir, global_step)
    try:
        save_torch_atomic({**payload, "global_step": global_step}, path)
    except OSError as error:
        # No word on earlier checkpoints here: the caller's line names the newest good one, or says there is none.
        raise InputError(f"{path}: cannot write the checkpoint ({error.strerror or error}); nothing of it is "
                         "left") from None
    rotate_checkpoints(output_dir, path, checkpoint_phase(payload), keep)
    return path


def save_sharded_checkpoint(output_dir: str | Path, global_step: int, payload: dict[str, Any], model: nn.Module,
                            optimizer: Any, ctx: DistributedContext, keep: Optional[Path] = None) -> Path:
    """Every process writes its shards of ckpt_<global_step>.dcp at once (a collective); the folder appears whole
    under its name only when all are on disk, then the first process rotates as save_checkpoint does. Failures
    as save_checkpoint's, on every process."""
    path = checkpoint_path(output_dir, global_step, sharded=True)
    failure = None
    if ctx.is_main:
        try:
            refuse_existing(output_dir, global_step)
        except InputError as error:
            failure = error
    if any_process(failure is not None, ctx):
        raise failure or InputError(f"{path}: the first process refused to write it (see its line)")
    payload = {**payload, "global_step": global_step}
    failure = None
    try:
        if ctx.is_main:
            _write_shards_as_main(path, payload, model, optimizer, ctx)
        else:
            folder = _share_folder(None, ctx)
            if folder is None:
                raise InputError("the first process could not make its folder (see its line)")
            sharded_checkpoint.write(folder, payload, model, optimizer, main=False)
    except (OSError, InputError) as error:  # a full disk on any process: dcp.save raises on every one
        failure = InputError(f"{path}: cannot write the checkpoint ({_why(error)}); nothing of it is left")
    if any_process(failure is not None, ctx):
        raise failure or InputError(f"{path}: another process could not write its shard (see its line); nothing "
                                    "of it is left")
    if ctx.is_main:
        rotate_checkpoints(output_dir, path, checkpoint_phase(payload), keep)
    return path


def _write_shards_as_main(path: Path, payload: dict[str, Any], model: nn.Module, optimizer: Any,
                          ctx: DistributedContext) -> None:
    """The first process's part: the temporary folder made and its name sent to the others (None when it could
    not be made, so that no process waits on a collective the first one never joins), its own shards and the
    training state written, the folder renamed onto `path`."""
    shared = False
    try:
        with atomic_output(path) as temporary:
            temporary.mkdir()
            shared = bool(_share_folder(temporary, ctx))
            sharded_checkpoint.write(temporary, payload, model, optimizer, main=True)
    except (OSError, InputError):
        if not shared:
            _share_folder(None, ctx)
        raise


def _share_folder(folder: Optional[Path], ctx: DistributedContext) -> Optional[Path]:
    """The first process's temporary folder name (None: there is none), on every process."""
    shared = [folder]
    if ctx.enabled:
        dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _why(error: BaseException) -> str:
    return (error.strerror or str(error)) if isinstance(error, OSError) else error_text(error)


def refuse_existing(output_dir: str | Path, global_step: int) -> None:
    """InputError when a checkpoint of global_step (either kind) is already in output_dir: it is never replaced."""
    for path in (checkpoint_path(output_dir, global_step), checkpoint_path(output_dir, global_step, sharded=True)):
        if path.exists():
            raise InputError(f"{path}: already exists and was not written by this run; it is kept and this run "
                             "stops (another run wrote into this --output_dir, or the phases' step numbers overlap)")


def rotate_checkpoints(output_dir: str | Path, path: Path, phase: int, keep: Optional[Path] = None) -> None:
    """Within `phase`: the newest KEEP_NEWEST checkpoints that load stay, and so do `path` (just written) and
    `keep` (the one this run resumed from); the other phase's are never touched; a checkpoint that does not load
    is moved aside as `*.corrupt`, never counted and never deleted."""
    loadable = []
    for saved in survey(output_dir):
        if saved.phase is None:
            move_aside(saved.path)
        elif saved.phase == phase:
            loadable.append(saved.path)
    protected = {path.resolve()} | ({keep.resolve()} if keep is not None else set())
    for old in loadable[:-KEEP_NEWEST]:
        if old.resolve() not in protected:
            _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def move_aside(path: Path) -> Path:
    """Renames a checkpoint that does not load to `*.corrupt` (never deleted: it may be all that is left)."""
    aside = _corrupt_name(path)
    path.rename(aside)
    print(f"warning: {path} does not load; moved aside to {aside.name}", file=sys.stderr, flush=True)
    return aside


def _corrupt_name(path: Path) -> Path:
    aside = path.with_name(path.name + ".corrupt")
    serial = 1
    while aside.exists():  # never overwrite an earlier one
        aside = path.with_name(f"{path.name}.{serial}.corrupt")
        serial += 1
    return aside


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Reads one checkpoint (weights only); raises InputError naming the file when it is unreadable. With `mmap`,
    tensors stay on disk until used; a sharded checkpoint's always do (its "model" and "optimizer" state are
    sharded_checkpoint.ShardedTensors, which load_model_state and the optimizer's loader read)."""
    if Path(path).is_dir() and Path(path).name.endswith(sharded_checkpoint.SUFFIX):
        return sharded_checkpoint.read_training_state(path)
    payload = load_torch_file(path, mmap=mmap)
    if not isinstance(payload, dict) or "model" not in payload:
        raise InputError(f"{path}: not a training checkpoint (no 'model' entry); pass a ckpt_<step>.pt that "
                         "run_pretraining.py wrote")
    if not isinstance(payload["model"], dict):  # load_state_dict would fail with a traceback on resume
        raise InputError(f"{path}: not a training checkpoint (its 'model' entry is a {type(payload['model']).__name__},"
                         " not a state dict)")
    return payload


def load_newest_checkpoint(output_dir: str | Path, step: Optional[int] = None) -> tuple[Path, dict[str, Any]]:
    """The newest readable checkpoint (or that of `step`); unreadable newer ones are skipped with a warning."""
    candidates = list_checkpoints(output_dir)
    if step is not None and step >= 0:
        candidates = [(s, p) for s, p in candidates if s == step]
    if not candidates:
        wanted = f"ckpt_{step}.pt" if step is not None and step >= 0 else "ckpt_<step>.pt"
        raise InputError(f"{output_dir}: no checkpoint {wanted} to resume from; check --output_dir and --resume_step")
    for _, path in reversed(candidates):
        try:
            return path, load_checkpoint(path)
        except InputError as error:
            print(f"warning: skipping {error}", file=sys.stderr, flush=True)
    raise InputError(f"{output_dir}: every checkpoint is unreadable (see the warnings above); restore one or start "
                     "afresh in a new --output_dir")


def newest_good_checkpoint(output_dir: str | Path) -> Optional[Path]:
    """The newest checkpoint of output_dir that loads (read memory-mapped: its index and structure only)."""
    for _, path in reversed(list_checkpoints(output_dir)):
        try:
            load_checkpoint(path, mmap=True)
        except InputError:
            continue
        return path
    return None


def where_to_resume(output_dir: str | Path) -> str:
    """The end of a stopped run's line: the checkpoint to resume from, or that there is none yet."""
    newest = newest_good_checkpoint(output_dir)
    if newest is None:
        return f"no checkpoint in {output_dir} yet"
    return f"the newest good checkpoint is {newest}: resume from it with --resume_from_checkpoint"


@contextmanager
def failures_name_the_checkpoint(output_dir: str | Path) -> Iterator[None]:
    """A run's one-line failures (InputError) and its I/O failures (OSError: a full disk, a file gone) during the
    block end with the checkpoint to resume from; an OSError becomes one line naming its file."""
    try:
        yield
    except InputError as error:
        raise InputError(f"{error_text(error)}; {where_to_resume(output_dir)}") from None
    except BrokenPipeError:
        raise  # the reader of the output left (`| head -1`): the command ends as Unix tools do, not a file's fault
    except OSError as error:
        where = error.filename or output_dir
        raise InputError(f"{where}: {error.strerror or error}; {where_to_resume(output_dir)}") from None
