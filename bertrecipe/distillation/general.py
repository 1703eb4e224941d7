"""General distillation (TinyBERT's first stage, NVIDIA's general_distill.py): a student learns a teacher's states on
the pre-training shards. It is a pre-training objective (pretraining/objective.py), so the run is run_pretraining's
in every other respect: the same shards of either kind, phases, DDP, checks, checkpoints and exact resume.

The student is the pre-training model of --config_file (its masked-LM head trained only when the prediction term
is asked for; the next-sentence head is never trained), started at random, from --init_checkpoint, or from the
teacher's layers (DistilBERT's way). Checkpoints hold the student under its own names, the projection under
`distillation.`: an ordinary checkpoint of the student for every command that reads one."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.distillation.config import DistillationConfig, read_distillation_config
from bertrecipe.distillation.losses import DistillationLoss
from bertrecipe.distillation.pairing import (
    checked_pairs,
    student_from_teacher,
    student_module,
    with_projection,
)
from bertrecipe.model.capture import capturing
from bertrecipe.model.families import ModelConfig, pretraining_model
from bertrecipe.model.weights import HF_WEIGHT_FILES, LoadedWeights, load_weights_into, read_weights
from bertrecipe.pretraining.masking import IGNORE_INDEX
from bertrecipe.pretraining.objective import Criterion, PretrainingObjective
from bertrecipe.pretraining.run_tokenizer import TextCasing, check_init_checkpoint_tokenizer
from bertrecipe.pretraining.startup import HEAD_PREFIXES, MASKED_LM_HEAD
from bertrecipe.tokenization.vocab_files import TokenizerIdentity

STUDENT_INITS = ("random", "teacher")
NAME = "general distillation"


class GeneralDistillation(PretrainingObjective):
    """The objective of general_distill.py: `teacher` any checkpoint the project reads (ours, NVIDIA's with
    `teacher_config`, a transformers folder), `distill_config` NVIDIA's JSON (distillation/config.py), the student
    started from `student_init` where --init_checkpoint gives nothing."""

    def __init__(self, teacher: str, distill_config: str, student_init: str = "random",
                 teacher_config: Optional[ModelConfig] = None, do_lower_case: Optional[bool] = None) -> None:
        self.teacher_source = teacher
        self.do_lower_case = do_lower_case  # NVIDIA's flag: None where not given
        self.config = read_distillation_config(distill_config)
        self.student_init = student_init
        self.teacher_weights = read_weights(teacher)
        self.teacher_config = teacher_config or self.teacher_weights.config
        if self.teacher_config is None:
            raise InputError(f"{teacher}: records no config (NVIDIA's checkpoints do not); pass --teacher_config_file")
        self.teacher = pretraining_model(self.teacher_config)
        missing = load_weights_into(self.teacher, self.teacher_weights, teacher)
        self.teacher_has_head = not any(name.startswith(HEAD_PREFIXES[MASKED_LM_HEAD]) for name in missing)
        self.teacher.eval().requires_grad_(False)
        self.pairs: list[tuple[int, int]] = []

    def check(self, config: ModelConfig, tokenizer: Optional[TokenizerIdentity], casing: Optional[TextCasing],
              allow_mismatch: bool) -> None:
        """Before the first write: one family, one vocabulary (the shards' is the teacher's), a layer map that fits
        both models, a teacher head for the prediction term."""
        teacher = self.teacher_source
        self.pairs = checked_pairs(self.config, config, self.teacher_config, teacher, "the student (--config_file)")
        check_init_checkpoint_tokenizer(self.teacher_weights, teacher, tokenizer, casing, allow_mismatch, warn=True)
        if self.do_lower_case is not None and casing is not None and casing.lower_case != self.do_lower_case:
            raise InputError(f"--do_lower_case: {casing.source} {casing.describe()}; drop the flag, which NVIDIA's "
                             "command needs and this one reads from the shards")
        if self.config.use_pred_states and not self.teacher_has_head:
            raise InputError(f"{teacher}: the teacher has no masked-LM head, which the prediction term "
                             f"(use_pred_states in {self.config.source}) distils from; pass a teacher with its head "
                             "or turn the term off")

    def initial_weights(self, config: ModelConfig) -> Optional[tuple[LoadedWeights, str]]:
        if self.student_init != "teacher":
            return None
        return student_from_teacher(self.teacher_weights, self.teacher_config, config, self.teacher_source)

    def trainable(self, model: nn.Module) -> nn.Module:
        """The student with the projection its hidden-state terms need; heads no term trains are frozen (saved as
        they are, and never waited for by DDP)."""
        freeze_untrained_heads(model, train_masked_lm_head=self.config.use_pred_states)
        self.teacher.to(next(model.parameters()).device)
        return with_projection(model, self.config, self.teacher_config)

    def checkpoint_record(self) -> dict[str, Any]:
        config = {key: value for key, value in asdict(self.config).items() if key != "source"}
        config["student_teacher_layer_mapping"] = mapping_record(config["student_teacher_layer_mapping"])
        return {"name": NAME, "teacher": str(self.teacher_source),
                "teacher_sha256": teacher_sha256(self.teacher_source), "distillation_config": config}

    def criterion(self, nsp: bool) -> Criterion:
        return DistillationCriterion(self.teacher, self.config, self.pairs)


class DistillationCriterion:
    """The loss of a pre-training batch: the student's and the teacher's states on it (the teacher without
    gradients), compared by DistillationLoss; the prediction term at the shards' masked positions."""

    def __init__(self, teacher: nn.Module, config: DistillationConfig, pairs: list[tuple[int, int]]) -> None:
        self.teacher, self.config = teacher, config
        self.loss = DistillationLoss(config, pairs)
        self.projection_found = False

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.projection_found:  # it lives in the trained module, found through DDP's wrapper
            self.loss.projection, self.projection_found = student_module(model).projection, True
        positions = batch["masked_lm_labels"] != IGNORE_INDEX
        if not self.config.use_pred_states:
            positions = torch.zeros_like(positions)  # no logits to make
        inputs, loss = (batch["input_ids"], batch["segment_ids"], batch["input_mask"]), self.loss
        with capturing(model, loss.student_layers, loss.captures) as student:
            student_logits = model(*inputs, predict_positions=positions).prediction_logits
        with torch.no_grad(), capturing(self.teacher, loss.teacher_layers, loss.captures) as teacher:
            teacher_logits = self.teacher(*inputs, predict_positions=positions).prediction_logits
        logits = (student_logits, teacher_logits) if self.config.use_pred_states else (None, None)
        total, _ = loss(student, teacher, batch["input_mask"], *logits)
        return total


def freeze_untrained_heads(model: nn.Module, train_masked_lm_head: bool) -> None:
    """Freezes the next-sentence head, and the masked-LM head's own weights unless its term is trained. Its decoder
    is the word embeddings, which stay trained: named_parameters lists a tied weight once, under the embeddings."""
    frozen = ("bert.pooler.", "cls.seq_relationship.")
    if not train_masked_lm_head:
        frozen += HEAD_PREFIXES[MASKED_LM_HEAD]
    for name, param in model.named_parameters():
        if name.startswith(frozen):
            param.requires_grad_(False)


def teacher_sha256(source: str) -> str:
    """The sha256 of the teacher's weights file (a folder's model.safetensors or pytorch_model.bin)."""
    path = Path(source)
    if path.is_dir():
        path = next(path / name for name in HF_WEIGHT_FILES if (path / name).is_file())
    return file_sha256(path)


def mapping_record(mapping: Any) -> Any:
    return list(mapping) if isinstance(mapping, tuple) else mapping
