"""GLUE as a fine-tuning task, beside the features it reads (glue.py): a split's features, the arrays, loss and
logits the loops and timed inference take, and the predictions as GLUE's submission files lay them out."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import glue
from bertrecipe.tokenization.bpe import FineTuningTokenizer

# the flag that reads each split
SPLIT_FLAGS = {"train": "--do_train", "dev": "--do_eval", "test": "--do_predict", "train_aug": "--aug_train"}


def split_features(task: glue.GlueTask, data_dir: str | Path, split: str, tokenizer: FineTuningTokenizer,
                   max_seq_length: int) -> glue.GlueFeatures:
    """The features of one split; InputError naming the file when it holds no example."""
    examples = glue.read_examples(task, data_dir, split)
    if not examples:
        raise InputError(f"{glue.split_file(task, data_dir, split)}: no examples (the file holds no line after its "
                         f"header); {SPLIT_FLAGS[split]} needs at least one")
    return glue.glue_features(examples, task, tokenizer, max_seq_length)


def glue_task_record(task: glue.GlueTask) -> dict:
    """What a model fine-tuned on `task` does, as its checkpoint records it: text classification with the task's
    labels in the order of the classifier's outputs, or a regression (one output, labels None)."""
    kind = "text-regression" if task.labels is None else "text-classification"
    return {"kind": kind, "name": task.name, "labels": list(task.labels) if task.labels is not None else None}


def glue_arrays(features: glue.GlueFeatures) -> dict[str, np.ndarray]:
    """The model's inputs and the labels of every example."""
    return {"input_ids": features.input_ids, "segment_ids": features.segment_ids,
            "input_mask": features.input_mask, "labels": features.labels}


def glue_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A batch's loss: cross-entropy, or the squared error of a regression task (the model's head decides)."""
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"], labels=batch["labels"])[0]


def glue_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor]:
    """A batch's logits (scores of a regression task)."""
    return (model(batch["input_ids"], batch["segment_ids"], batch["input_mask"])[1],)


def glue_predictions(task: glue.GlueTask, logits: np.ndarray) -> np.ndarray:
    """Class indexes (int64 [N]), or the scores (float32 [N]) of a regression task."""
    return logits[:, 0] if task.is_regression else logits.argmax(-1)


def predictions_tsv(task: glue.GlueTask, preds: np.ndarray, labels: Optional[np.ndarray]) -> str:
    """GLUE's submission layout (index, prediction as a label string or score), with the gold label on dev."""
    def shown(values: np.ndarray, i: int) -> str:
        return f"{float(values[i]):.6f}" if task.is_regression else task.labels[int(values[i])]

    lines = ["index\tprediction" + ("\tlabel" if labels is not None else "")]
    for i in range(len(preds)):
        lines.append(f"{i}\t{shown(preds, i)}" + (f"\t{shown(labels, i)}" if labels is not None else ""))
    return "\n".join(lines) + "\n"
