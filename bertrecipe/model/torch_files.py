"""torch files read and written safely: `torch.load(..., weights_only=True)` with a one-line error for every way a
file can be wrong, and `torch.save` written whole or not at all (the checkpoints, fine-tuned models and sharded
checkpoints' training state all go through here)."""
from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any, Optional

import torch

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError


class WeightsError(InputError):
    """A weights file that cannot be used; the message names the file and the problem."""


ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6
PICKLE_MAGIC = b"\x80"  # the legacy format: a pickle with a protocol header


def load_torch_file(path: str | Path, mmap: bool = False) -> Any:
    """torch.load with weights_only=True; any failure is one WeightsError line that says what the file is and
    never suggests unpickling it (torch's own hint ends by recommending weights_only=False)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except IsADirectoryError:
        raise WeightsError(f"{path}: is a directory, not a checkpoint file") from None
    except OSError as error:
        raise WeightsError(f"{path}: cannot read the checkpoint ({error.strerror})") from None
    if not head.startswith((ZIP_MAGIC, PICKLE_MAGIC)):
        raise WeightsError(f"{path}: not a torch checkpoint (neither a torch.save zip archive nor a pickle); "
                           "pass a .pt/.bin checkpoint or a Hugging Face directory")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols on stderr: not one line
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and head == ZIP_MAGIC)
    except pickle.UnpicklingError:
        raise WeightsError(f"{path}: not a tensor checkpoint: it holds Python objects besides tensors, numbers, "
                           "strings and containers, and this recipe never unpickles those (they can run code); "
                           "re-save its state dict with torch.save") from None
    except Exception as error:  # noqa: BLE001 - zip and storage errors of a damaged file come as several types
        why = "truncated or damaged" if head == ZIP_MAGIC else "damaged"
        raise WeightsError(f"{path}: {why} checkpoint ({type(error).__name__}); use an earlier or a fresh copy") \
            from None


def save_torch_atomic(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary name beside `path`, then rename: a reader never sees a half-written file. A write
    that fails (a full disk) is the OSError behind it, whatever torch's writer made of it."""
    write_atomic(path, lambda f: save_torch_to(obj, f))


def save_torch_to(obj: Any, file: Any) -> None:
    """torch.save(obj, file), with what interrupted the file's writes raised as itself: torch's zip writer catches
    it and raises its own RuntimeError ("[enforce fail at inline_container.cc] unexpected pos") with the cause only
    as context. A signal (Ctrl-C's KeyboardInterrupt, SIGTERM raised as an exception) then ends the command with its
    one line, and a failed write (a full disk) names its file."""
    try:
        torch.save(obj, file)
    except RuntimeError as error:
        cause = interruption_behind(error)
        if cause is not None:
            raise cause from None
        raise


def interruption_behind(error: BaseException) -> Optional[BaseException]:
    """The signal's exception (any BaseException that is not an Exception) or, failing one, the OSError in the
    chain of causes and contexts behind `error`, or None."""
    chain, seen = [], set()
    link: Optional[BaseException] = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        chain.append(link)
        link = link.__cause__ or link.__context__
    signals = [link for link in chain if not isinstance(link, Exception)]
    failures = [link for link in chain if isinstance(link, OSError)]
    return (signals or failures or [None])[0]
