"""A fine-tuning run's output files, renamed into place together at its end (StagedOutputs), and the fine-tuned
checkpoint among them (`pytorch_model.bin` = {"model": state_dict} beside `bert_config.json`)."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, Sequence

from torch import nn

from bertrecipe.common.atomic_files import output_target, remove_stale_temporaries, write_temporary
from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig, config_record
from bertrecipe.model.torch_files import save_torch_to
from bertrecipe.tokenization.vocab_files import AnyVocab, identity_of
from bertrecipe.training.stepper import unwrap

MODEL_FILES = ("pytorch_model.bin", "bert_config.json")


def remove_stale_output_temporaries(output_dir: str | Path, names: Sequence[str]) -> list[Path]:
    """Removes what killed writes of `names` left in output_dir: our `.<name>.<pid>.<random>.tmp` names (see
    atomic_files) and the names earlier versions used, `.<name>.tmp` and `<name>.<random>.tmp`. Nothing else."""
    removed = remove_stale_temporaries(output_dir, names)
    alternatives = "|".join(re.escape(name) for name in names)
    legacy = re.compile(rf"\.(?:{alternatives})\.tmp|(?:{alternatives})\.[a-z0-9_]{{8}}\.tmp")
    for path in Path(output_dir).iterdir():
        if legacy.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class StagedOutputs:
    """The output files of one run, written under temporary names in output_dir (`.<name>.<pid>.<random>.tmp`) and
    renamed into place together by commit(): a run that fails before commit() leaves output_dir as it was.

    A file that describes a model (results, predictions) must never sit beside another model. commit()
    therefore, when it replaces the model, first removes the old copies of the other files it replaces, then
    renames the model, then the rest: a crash between two renames (only a kill or power loss can stop a
    burst of renames) leaves the new model without its results, never the old results beside the new model.
    Used as a context manager, an exception discards the staged files. The folder is created, and stale
    temporaries of `names` removed, at the first write."""

    def __init__(self, output_dir: str | Path, names: Sequence[str]) -> None:
        self.output_dir = Path(output_dir)
        self.names = tuple(names)
        self._staged: dict[str, Path] = {}
        self._opened = False

    def write(self, name: str, write: Callable[[BinaryIO], None]) -> Path:
        """Runs write(file) on a new temporary file that commit() will rename to `name`; returns its path."""
        if name not in self.names:
            raise ValueError(f"{name} is not one of the outputs {self.names}")
        try:
            if not self._opened:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                remove_stale_output_temporaries(self.output_dir, self.names)
                self._opened = True
            tmp = write_temporary(self.output_dir / name, write)
        except OSError as error:  # a full disk, a read-only folder: the earlier outputs stay as they were
            raise InputError(f"{self.output_dir / name}: cannot write it ({error.strerror or error}); nothing in "
                             f"{self.output_dir} was replaced") from None
        if name in self._staged:
            self._staged[name].unlink(missing_ok=True)
        self._staged[name] = tmp
        return tmp

    def write_text(self, name: str, text: str) -> Path:
        return self.write(name, lambda f: f.write(text.encode("utf-8")))

    def write_json(self, name: str, obj: Any, indent: int = 2) -> Path:
        return self.write_text(name, json.dumps(obj, indent=indent) + "\n")  # serialized before the file opens

    def commit(self) -> list[Path]:
        """Renames every staged file into place (see the class); returns the final paths."""
        models = [name for name in MODEL_FILES if name in self._staged]
        described = [name for name in self._staged if name not in MODEL_FILES]
        if models:
            for name in described:  # a symlinked output loses its target's old copy; the link stays
                output_target(self.output_dir / name).unlink(missing_ok=True)
        done = []
        for name in models + described:
            # onto the target of a symlinked output, beside which write_temporary put the temporary
            os.replace(self._staged.pop(name), output_target(self.output_dir / name))
            done.append(self.output_dir / name)
        return done

    def discard(self) -> None:
        for tmp in self._staged.values():
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def __enter__(self) -> "StagedOutputs":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.discard()  # after commit() nothing is left to discard


def stage_finetuned(stage: StagedOutputs, model: nn.Module, config: ModelConfig,
                    vocab: Optional[AnyVocab] = None, task: Optional[dict[str, Any]] = None) -> Path:
    """Stages pytorch_model.bin ({"model": state_dict, "tokenizer": the identity of the vocab it was fine-tuned
    with, "task": what the model does, as the command that trained it knows it: its kind, name and labels, or an
    embedding's pooling}) and bert_config.json; returns the model's temporary path."""
    payload = {"model": unwrap(model).state_dict(),
               "tokenizer": identity_of(vocab).record() if vocab is not None else None,
               **({"task": task} if task is not None else {})}
    path = stage.write("pytorch_model.bin", lambda f: save_torch_to(payload, f))
    record = config_record(unwrap(model), config)
    stage.write_text("bert_config.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def save_finetuned(model: nn.Module, config: ModelConfig, output_dir: str | Path,
                   vocab: Optional[AnyVocab] = None) -> Path:
    """Writes output_dir/pytorch_model.bin and bert_config.json (stage_finetuned), together."""
    with StagedOutputs(output_dir, MODEL_FILES) as stage:
        stage_finetuned(stage, model, config, vocab)
        stage.commit()
    return Path(output_dir) / "pytorch_model.bin"
