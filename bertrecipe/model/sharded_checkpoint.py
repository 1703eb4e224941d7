"""Sharded checkpoints (`--sharding fsdp` on more than one process): `<output_dir>/ckpt_<step>.dcp/`, a folder that
torch.distributed.checkpoint fills with every process writing its own shard of the model and optimizer state, in
parallel, and that any number of processes reads back, each taking the slices of its own shards.

The folder holds safetensors files (torch's HuggingFaceStorageWriter: each file's header says which slice of which
tensor it holds, so nothing is unpickled to read it) and `training_state.pt`, everything else a checkpoint holds
(steps, data position, RNG, flags; a weights-only torch file). Model tensors are named `model.<parameter>`, the
optimizer's `optimizer.<parameter>.<state key>`, and they go to separate files (`*-00001-of-00002` and
`*-00002-of-00002`), so that reading the weights never reads the moments.

The folder is written under a temporary name and renamed once every process's shard and the training state are on
disk (fsynced): a run killed during a save leaves the previous checkpoint as the newest. training_state.pt lists
the shard files and their sizes, so a folder that lost or truncated one is known not to load without reading it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint import CheckpointException, HuggingFaceStorageReader, HuggingFaceStorageWriter

from bertrecipe.common.errors import InputError
from bertrecipe.model.torch_files import load_torch_file, save_torch_atomic

SUFFIX = ".dcp"
TRAINING_STATE = "training_state.pt"
TENSOR_FILE_SUFFIX = ".safetensors"
PARTS = ("model", "optimizer")  # their tensors' name prefixes, and the order of their files


@dataclass(frozen=True)
class ShardedTensors:
    """The model's or the optimizer's tensors of a sharded checkpoint (the entry of the payload it stands in): they
    stay on disk until loaded into a model or optimizer (each process reads its own slices)."""

    folder: Path


def is_sharded_checkpoint(path: str | Path) -> bool:
    return Path(path).is_dir() and (Path(path) / TRAINING_STATE).is_file()


def write(folder: Path, payload: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
          main: bool) -> None:
    """Every process writes its shards of payload["model"] and payload["optimizer"] (state dicts whose tensors may
    be DTensors) into `folder` (a temporary one: the caller renames it), then the main process writes the rest.
    A collective: every process calls it."""
    names, tied = parameter_names(model, optimizer), tied_names(model)
    tensors = {f"model.{key}": value for key, value in payload["model"].items() if key not in tied}
    optimizer_state = payload["optimizer"]
    kept_state: dict[int, dict[str, Any]] = {}
    for index, entry in optimizer_state["state"].items():
        kept_state[index] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{names[index]}.{key}"] = value
            else:
                kept_state[index][key] = value
    files = {key: PARTS.index(key.split(".", 1)[0]) + 1 for key in tensors}
    writer = HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=files, save_distributed=True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(tensors, storage_writer=writer, no_dist=not dist.is_initialized())
    except CheckpointException as error:  # every process's failures, gathered: the first one says why
        raise InputError(f"{folder}: {_first_failure(error)}") from None
    if main:  # every process's write_data has returned: dcp.save ends with a collective
        rest = {key: value for key, value in payload.items() if key not in PARTS}
        rest["tied"] = tied
        rest["optimizer"] = {"param_groups": optimizer_state["param_groups"], "parameter_names": names,
                             "state_without_tensors": kept_state}
        rest["tensor_files"] = {path.name: path.stat().st_size for path in sorted(folder.iterdir())
                                if path.name.endswith(TENSOR_FILE_SUFFIX)}
        save_torch_atomic(rest, folder / TRAINING_STATE)


def _first_failure(error: CheckpointException) -> str:
    """Why the write or read failed, in words; a Ctrl-C or SIGTERM that landed inside it is raised as itself
    (the command then ends as that signal ends it, not as a failed write)."""
    for cause, _ in error.failures.values():
        if not isinstance(cause, Exception):
            raise cause
    for cause, _ in error.failures.values():
        if isinstance(cause, OSError):
            return cause.strerror or str(cause)
        return f"{type(cause).__name__}: {cause}"
    return str(error)


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of each of the optimizer's parameters, in the order of its state dict's indices."""
    by_identity = {id(param): name for name, param in model.named_parameters()}
    return [by_identity[id(param)] for group in optimizer.param_groups for param in group["params"]]


def tied_names(model: nn.Module) -> dict[str, str]:
    """Each parameter name that shares its tensor with an earlier one (the masked-LM decoder tied to the word
    embeddings) -> that earlier name: safetensors stores a tensor once."""
    first: dict[int, str] = {}
    tied = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


def read_training_state(folder: str | Path) -> dict[str, Any]:
    """The checkpoint's payload as a single-file checkpoint's, with its "model" and "optimizer" tensors left on
    disk (ShardedTensors); InputError naming the folder when it is incomplete or damaged."""
    folder = Path(folder)
    state = load_torch_file(folder / TRAINING_STATE)
    if not isinstance(state, dict) or not isinstance(state.get("tensor_files"), dict):
        raise InputError(f"{folder}: not a sharded checkpoint ({TRAINING_STATE} lists no tensor files)")
    for name, size in state["tensor_files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            why = "is missing" if not path.is_file() else f"has {path.stat().st_size} bytes, not {size}"
            raise InputError(f"{folder}: incomplete sharded checkpoint: {name} {why}")
    state["model"] = ShardedTensors(folder)
    state["optimizer"] = {**state["optimizer"], "state": ShardedTensors(folder)}
    return state


def _saved_tensors(folder: Path) -> dict[str, Any]:
    """Each saved tensor's name -> its whole size and dtype (from the safetensors headers)."""
    try:
        return HuggingFaceStorageReader(str(folder)).read_metadata().state_dict_metadata
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a damaged header
        raise InputError(f"{folder}: a shard file's header does not read ({type(error).__name__}: {error})") \
            from None


def _load(tensors: dict[str, Tensor], folder: Path, every_process: bool = True) -> None:
    """Fills `tensors` (whole tensors or DTensors: each process reads the slices it holds) in place; a collective
    of every process unless `every_process` is False (one process reading for itself)."""
    try:
        with warnings.catch_warnings():  # dcp warns that one process reads alone: that is what no_dist asks
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(tensors, storage_reader=HuggingFaceStorageReader(str(folder)),
                     no_dist=not (every_process and dist.is_initialized()))
    except CheckpointException as error:  # every process's failures, gathered
        raise InputError(f"{folder}: the sharded checkpoint does not load ({_first_failure(error)}); use an "
                         "earlier one") from None


def load_model(model: nn.Module, tensors: ShardedTensors) -> None:
    """The checkpoint's weights into `model`, sharded (each process reads its slices) or not (the whole)."""
    own, tied = model.state_dict(), tied_names(model)
    saved = _saved_tensors(tensors.folder)
    wanted = {f"model.{name}": value for name, value in own.items() if name not in tied}
    missing = sorted(name for name in wanted if name not in saved)
    if missing:
        raise InputError(f"{tensors.folder}: holds no {missing[0][len('model.'):]} ({len(missing)} of the model's "
                         "tensors missing): a checkpoint of another model")
    _load(wanted, tensors.folder)
    loaded = {name[len("model."):]: value for name, value in wanted.items()}
    model.load_state_dict({**loaded, **{name: loaded[source] for name, source in tied.items()}})


def optimizer_state_dict(state: dict[str, Any], model: nn.Module,
                         optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The torch state dict of `optimizer` that the checkpoint's optimizer entry (read_training_state's) holds,
    each moment read as its parameter is held (a DTensor's local slice, or the whole)."""
    folder = state["state"].folder
    ours = parameter_names(model, optimizer)
    if ours != state["parameter_names"]:
        raise InputError(f"{folder}: holds optimizer state for other parameters than this model's; continue with "
                         "the same model, or start from it with --init_checkpoint in a new --output_dir")
    params = {name: param for name, param in model.named_parameters()}
    saved = _saved_tensors(folder)
    templates = {}
    for name, metadata in saved.items():
        if not name.startswith("optimizer."):
            continue
        parameter, _ = name[len("optimizer."):].rsplit(".", 1)
        param = params[parameter]
        if tuple(metadata.size) == tuple(param.shape):  # a moment: held as its parameter is
            templates[name] = torch.zeros_like(param, dtype=metadata.properties.dtype)
        else:  # a step count or another small tensor: whole on every process
            templates[name] = torch.zeros(metadata.size, dtype=metadata.properties.dtype)
    _load(templates, folder)
    tensors = {name[len("optimizer."):]: value for name, value in templates.items()}
    return {"state": _optimizer_entries(state, tensors), "param_groups": state["param_groups"]}


def _optimizer_entries(record: dict[str, Any], tensors: dict[str, Tensor]) -> dict[int, dict[str, Any]]:
    """torch's optimizer state by parameter index: the training state's non-tensor values and `tensors`, named
    `<parameter>.<key>`."""
    entries = {int(index): dict(rest) for index, rest in record["state_without_tensors"].items()}
    index_of = {name: index for index, name in enumerate(record["parameter_names"])}
    for name, value in tensors.items():
        parameter, key = name.rsplit(".", 1)
        entries.setdefault(index_of[parameter], {})[key] = value
    return dict(sorted(entries.items()))


def whole_model_state(folder: str | Path) -> dict[str, Tensor]:
    """Every model tensor of the checkpoint, whole (for conversion and fine-tuning: one process, no model yet)."""
    folder = Path(folder)
    whole = _whole_tensors(folder, "model")
    tied = load_torch_file(folder / TRAINING_STATE, mmap=True).get("tied") or {}
    return {**whole, **{name: whole[source] for name, source in tied.items() if source in whole}}


def whole_checkpoint(folder: str | Path) -> dict[str, Any]:
    """The checkpoint as the single file an unsharded run writes (ckpt_<step>.pt: the whole model and optimizer
    state and everything else), read by one process."""
    folder = Path(folder)
    state = read_training_state(folder)
    optimizer = state["optimizer"]
    entries = _optimizer_entries(optimizer, _whole_tensors(folder, "optimizer"))
    rest = {key: value for key, value in state.items() if key not in ("tied", "tensor_files")}
    return {**rest, "model": whole_model_state(folder),
            "optimizer": {"state": entries, "param_groups": optimizer["param_groups"]}}


def _whole_tensors(folder: Path, part: str) -> dict[str, Tensor]:
    """The tensors of one part, whole, under their names without the part's prefix."""
    prefix = f"{part}."
    templates = {name: torch.empty(tuple(metadata.size), dtype=metadata.properties.dtype)
                 for name, metadata in _saved_tensors(folder).items() if name.startswith(prefix)}
    _load(templates, folder, every_process=False)
    return {name[len(prefix):]: value for name, value in templates.items()}
