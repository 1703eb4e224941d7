"""What a fine-tuning run trains and how its loss is computed. The default is the task's own loss (GLUE's
cross-entropy or squared error, SQuAD's span loss); task distillation (bertrecipe/distillation/task.py) trains a
student against a fine-tuned teacher through the same commands, features, loop, evaluation and outputs, by giving
its own objective."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from bertrecipe.model.families import ModelConfig
from bertrecipe.model.weights import LoadedWeights

Batch = dict[str, torch.Tensor]
Loss = Callable[[nn.Module, Batch], torch.Tensor]


class FinetuningObjective:
    """The task's own loss; a subclass changes what it needs. run_glue.py and run_squad.py call check before
    anything is written, trainable on the model they built, and compute_loss with the task's loss."""

    def check(self, config: ModelConfig, num_labels: int, vocab: object = None) -> None:
        """Refuses, before the first write, what contradicts the run's model (its config, its task head, the
        vocab it reads its text with)."""

    def initial_weights(self, config: ModelConfig) -> Optional[tuple[LoadedWeights, str]]:
        """Weights to start from where --init_checkpoint gives none, and what to call them (None: random)."""
        return None

    def trainable(self, model: nn.Module) -> nn.Module:
        """The module the optimizer trains and the run saves, made from the task model."""
        return model

    def compute_loss(self, task_loss: Loss) -> Loss:
        """The loss of a batch, given the task's."""
        return task_loss


TASK_LOSS = FinetuningObjective()
