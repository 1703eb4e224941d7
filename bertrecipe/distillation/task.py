"""Task distillation (TinyBERT's second stage, NVIDIA's task_distill.py): a student (generally distilled, or any
checkpoint) learns a fine-tuned teacher's states on a task's training set, then its predictions, in two runs as
NVIDIA's recipe does (distillation_config_backbone.json, then _heads.json). It is a fine-tuning objective
(finetuning/objective.py), so the run is run_glue.py's or run_squad.py's in every other respect: the same features,
loop, evaluation and outputs; the student it writes is an ordinary fine-tuned checkpoint (the projection under
`distillation.`, which every reader drops)."""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import read_distillation_config
from bertrecipe.distillation.losses import DistillationLoss
from bertrecipe.distillation.pairing import checked_pairs, student_from_teacher, student_module, with_projection
from bertrecipe.finetuning.objective import Batch, FinetuningObjective, Loss
from bertrecipe.model.capture import capturing
from bertrecipe.model.families import ModelConfig
from bertrecipe.model.weights import LoadedWeights, load_weights_into, read_weights
from bertrecipe.tokenization.vocab_files import identity_from_record, identity_of, refuse_other_tokenizer

# The weights of each task head, by name (both families): a task teacher must have its own.
TASK_HEADS = ("classifier.", "qa_outputs.", "head.")
# Those a student trains only for the prediction term (the backbone stage leaves them as they are).
HEAD_ONLY = ("classifier.", "qa_outputs.", "head.", "bert.pooler.")


class TaskDistillation(FinetuningObjective):
    """`teacher` a fine-tuned model of the run's task (our run_glue/run_squad output, a transformers folder with
    its head), built by `make_model(config)` as the run builds its student; `distill_config` NVIDIA's JSON."""

    def __init__(self, teacher: str, distill_config: str, make_model: Callable[[ModelConfig], nn.Module],
                 teacher_config: Optional[ModelConfig] = None, student_init: str = "random") -> None:
        self.source = teacher
        self.student_init = student_init  # where the run has no student weights: "random" or the teacher's layers
        self.config = read_distillation_config(distill_config)
        self.weights = read_weights(teacher)
        self.teacher_config = teacher_config or self.weights.config
        if self.teacher_config is None:
            raise InputError(f"{teacher}: records no config (NVIDIA's checkpoints do not); pass "
                             "--teacher_config_file")
        self.teacher = make_model(self.teacher_config)
        missing = load_weights_into(self.teacher, self.weights, teacher)
        if any(name.startswith(TASK_HEADS) for name in missing):
            raise InputError(f"{teacher}: the teacher has no head for this task (a pre-trained model, or one "
                             "fine-tuned on another task): task distillation learns from a fine-tuned teacher; "
                             "fine-tune it with run_glue.py or run_squad.py first")
        self.teacher.eval().requires_grad_(False)
        self.pairs: list[tuple[int, int]] = []

    def check(self, config: ModelConfig, num_labels: int, vocab: object = None) -> None:
        """Before the first write: one family, one vocabulary (the run's --vocab_file is the teacher's), heads
        that agree where attention terms compare them, a layer map that fits both."""
        teacher = self.source
        self.pairs = checked_pairs(self.config, config, self.teacher_config, teacher)
        if vocab is not None:
            refuse_other_tokenizer(identity_of(vocab), identity_from_record(self.weights.tokenizer, teacher),
                                   "pass the vocab the teacher was fine-tuned with", False)
        if num_labels == 1 and self.config.use_pred_states:  # a regression task's one score: no distribution
            self.config = dataclasses.replace(self.config, pred_loss="mse")

    def initial_weights(self, config: ModelConfig) -> Optional[tuple[LoadedWeights, str]]:
        """With student_init "teacher": the teacher's embeddings, task head and the last layer of each block
        (DistilBERT's way), where the run has no student weights."""
        if self.student_init != "teacher":
            return None
        return student_from_teacher(self.weights, self.teacher_config, config, self.source)

    def trainable(self, model: nn.Module) -> nn.Module:
        """The student with its projection; in the backbone stage its task head is left as it is (frozen)."""
        if not self.config.use_pred_states:
            for name, param in model.named_parameters():
                if name.startswith(HEAD_ONLY):
                    param.requires_grad_(False)
        self.teacher.to(next(model.parameters()).device)
        return with_projection(model, self.config, self.teacher_config)

    def compute_loss(self, task_loss: Loss) -> Loss:
        return TaskDistillationLoss(self.teacher, DistillationLoss(self.config, self.pairs))


class TaskDistillationLoss:
    """A task batch's distillation loss: the states of student and teacher on it (the teacher without gradients)
    and, for the prediction term, their logits: a classifier's [B, labels], or SQuAD's start and end logits, each
    a distribution over the window's tokens (padding left out)."""

    def __init__(self, teacher: nn.Module, loss: DistillationLoss) -> None:
        self.teacher, self.loss = teacher, loss
        self.projection_found = False

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        loss = self.loss
        if not self.projection_found:  # the projection lives in the trained module, behind DDP's wrapper
            loss.projection, self.projection_found = student_module(model).projection, True
        inputs = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
        with capturing(model, loss.student_layers, loss.captures) as student:
            student_out = model(*inputs)
        with torch.no_grad(), capturing(self.teacher, loss.teacher_layers, loss.captures) as teacher:
            teacher_out = self.teacher(*inputs)
        if not loss.config.use_pred_states:
            return loss(student, teacher, batch["input_mask"])[0]
        return prediction_loss(loss, student, teacher, batch["input_mask"], student_out, teacher_out)


def prediction_loss(loss: DistillationLoss, student: object, teacher: object, mask: torch.Tensor,
                    student_out: tuple, teacher_out: tuple) -> torch.Tensor:
    """With the prediction term: a classifier's logits ((loss None, logits) from its forward), or the mean of
    SQuAD's two terms ((loss None, start, end)), each a distribution over the window's real tokens."""
    if len(student_out) == 2:
        return loss(student, teacher, mask, student_out[1], teacher_out[1])[0]
    token_mask = mask.bool()
    start = loss(student, teacher, mask, student_out[1], teacher_out[1], token_mask)[0]
    end = loss(student, teacher, mask, student_out[2], teacher_out[2], token_mask)[0]
    return (start + end) / 2
