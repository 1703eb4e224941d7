"""What a pre-training run trains and how its loss is computed. The default is the model's own masked-LM (and
next-sentence) loss; general distillation (bertrecipe/distillation/general.py) trains a student against a teacher
through the same session, loop, checkpoints and resume rules, by giving its own objective."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig
from bertrecipe.model.weights import LoadedWeights
from bertrecipe.pretraining.data import BertPretrainingCriterion
from bertrecipe.pretraining.run_tokenizer import TextCasing
from bertrecipe.tokenization.vocab_files import TokenizerIdentity

Criterion = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]


class PretrainingObjective:
    """The masked-LM objective (NVIDIA's BertPretrainingCriterion); a subclass changes what it needs. Each hook is
    called once by pretraining/session.py, in this order: check (before the first write), initial_weights,
    trainable, checkpoint_record / check_resume, criterion."""

    def check(self, config: ModelConfig, tokenizer: Optional[TokenizerIdentity], casing: Optional[TextCasing],
              allow_mismatch: bool) -> None:
        """Refuses, before the first write, what contradicts the run's inputs (the shards' tokenizer and casing,
        the model's config)."""

    def initial_weights(self, config: ModelConfig) -> Optional[tuple[LoadedWeights, str]]:
        """Weights to start from where --init_checkpoint gives none, and what to call them in messages (None: the
        model's random initialisation)."""
        return None

    def trainable(self, model: nn.Module) -> nn.Module:
        """The module the optimizer trains and the checkpoints hold, made from the pre-training model."""
        return model

    def checkpoint_record(self) -> dict[str, Any]:
        """What each checkpoint records of the objective (under "objective"), for a resume to compare."""
        return {}

    def check_resume(self, path: Path, ckpt: dict[str, Any]) -> None:
        """Refuses to continue a checkpoint written under another objective, or another teacher or distillation
        config (its record differs), naming what differs."""
        saved, ours = ckpt.get("objective") or {}, self.checkpoint_record()
        if saved == ours:
            return
        changed = "; ".join(f"{key} {saved.get(key, '(none)')} -> {ours.get(key, '(none)')}"
                            for key in sorted(set(saved) | set(ours)) if saved.get(key) != ours.get(key))
        raise InputError(f"{path}: was trained under another objective ({changed}): a resume continues its own run; "
                         "start from it with --init_checkpoint in a new --output_dir")

    def criterion(self, nsp: bool) -> Criterion:
        """The loss of a batch: criterion(trainable module, batch) -> scalar."""
        return BertPretrainingCriterion(nsp=nsp)


MASKED_LM = PretrainingObjective()
