"""Fine-tuning an embedding model with in-batch negatives: each query's positive document is the class to pick
among every positive of its micro-batch (and every hard negative, when the pairs have them), by cross-entropy over
the cosine similarities times a scale of 20 (the InfoNCE form of MultipleNegativesRankingLoss); optionally also
each positive's query among the batch's queries (symmetric). AdamW under a linear warm-up and decay, through
training.Stepper (precision, accumulation), logged in dllogger's format. What is trained and its loss is the run's
RetrievalObjective: in-batch negatives by default; embedding distillation (distillation/embedding.py) gives its
own, through the same pairs, loop and outputs."""
from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.beir_data import TrainingPairs
from bertrecipe.finetuning.embedding import EmbeddingModel, tokenize_texts
from bertrecipe.finetuning.loop import LoopSettings, epoch_micro_batches, optimizer_steps
from bertrecipe.tokenization.bpe import FineTuningTokenizer
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.optimization import LinearWarmUpScheduler, build_adamw
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.stepper import Precision, Stepper

SCALE = 20.0  # MultipleNegativesRankingLoss's default: cosines in [-1, 1] made into logits in [-20, 20]
COLUMNS = ("query", "positive", "negative")
# Encoder passes a micro-batch's texts are split into, by length: more passes save fewer positions each and add
# their fixed cost (four take a batch of 16 SQuAD paragraphs from 37 % padding to 7 %).
LENGTH_GROUPS = 4
Batch = dict[str, torch.Tensor]
Loss = Callable[[nn.Module, Batch], torch.Tensor]


def pair_arrays(tokenizer: FineTuningTokenizer, pairs: TrainingPairs, max_seq_length: int) -> dict[str, np.ndarray]:
    """`<column>_ids` and `<column>_mask` [N, max_seq_length] of the queries, positives and negatives (if any)."""
    texts = {"query": pairs.queries, "positive": pairs.positives, "negative": pairs.negatives}
    arrays = {}
    for column, values in texts.items():
        if values is not None:
            arrays[f"{column}_ids"], arrays[f"{column}_mask"] = tokenize_texts(tokenizer, values, max_seq_length)
    return arrays


def pair_batch(arrays: dict[str, np.ndarray], rows: np.ndarray, device: torch.device) -> Batch:
    """The rows' columns as int64 tensors, each text column cut after its own longest real sequence; an objective's
    own arrays (one value a row) as they are."""
    batch = {}
    for column in COLUMNS:
        if f"{column}_ids" in arrays:
            mask = arrays[f"{column}_mask"][rows]
            width = max(int(mask.sum(1).max()), 1)
            batch[f"{column}_ids"] = torch.from_numpy(arrays[f"{column}_ids"][rows, :width]).long().to(device)
            batch[f"{column}_mask"] = torch.from_numpy(mask[:, :width]).long().to(device)
    for key in arrays.keys() - batch.keys():
        batch[key] = torch.from_numpy(arrays[key][rows]).long().to(device)
    return batch


def documents_of(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Positives then negatives as one batch for the encoder (one pass instead of two), padded to one width.
    Queries get a pass of their own: padded to a document's width, their attention would cost far more (on a CPU
    the whole step took 1.7x as long with them in)."""
    columns = [c for c in ("positive", "negative") if f"{c}_ids" in batch]
    width = max(batch[f"{c}_ids"].shape[1] for c in columns)
    padded = [[nn.functional.pad(batch[f"{c}_{part}"], (0, width - batch[f"{c}_{part}"].shape[1]))
               for c in columns] for part in ("ids", "mask")]
    return torch.cat(padded[0]), torch.cat(padded[1])


def length_groups(lengths: list[int], most: int = LENGTH_GROUPS) -> list[list[int]]:
    """The rows (indices into lengths) in at most `most` groups of neighbouring lengths, longest first in each:
    the fewest groups among the cuts where padding each group to its longest row costs the fewest token positions
    (dynamic programming over the rows sorted by length; rows of one length stay one pass)."""
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    longest = [lengths[row] for row in order]
    n, most = len(order), min(most, len(order))
    # padded[k][j]: fewest positions for the j longest rows in k groups; cut[k][j]: where its last group starts
    padded = [[0] + [float("inf")] * n for _ in range(most + 1)]
    cut = [[0] * (n + 1) for _ in range(most + 1)]
    for k in range(1, most + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                cost = padded[k - 1][i] + (j - i) * longest[i]
                if cost < padded[k][j]:
                    padded[k][j], cut[k][j] = cost, i
    groups = min(range(1, most + 1), key=lambda k: padded[k][n])  # the first (fewest) of the cheapest
    bounds, end = [], n
    for k in range(groups, 0, -1):  # every group holds at least one row, so the cuts end at 0
        bounds.append((cut[k][end], end))
        end = cut[k][end]
    return [order[start:stop] for start, stop in reversed(bounds)]


def embed_by_length(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """model(ids, mask) with the rows encoded in length_groups, each cut to its longest row, and put back in order:
    the same embeddings (padding is masked out either way) for fewer padded positions. A batch's rows are drawn
    as they come, not by length, and attention (and, off CUDA, all of ModernBERT) runs at the padded width: 16
    SQuAD paragraphs at 256 tokens are 37 % padding in one pass, 7 % in four groups, with half the attention
    scores."""
    lengths = mask.sum(1).tolist()
    groups = length_groups(lengths)
    if len(groups) == 1:
        return model(ids[:, : max(lengths)], mask[:, : max(lengths)])
    rows = [torch.tensor(group, device=ids.device) for group in groups]
    embedded = torch.cat([model(ids[index, : lengths[group[0]]], mask[index, : lengths[group[0]]])
                          for group, index in zip(groups, rows, strict=True)])
    back = torch.empty(len(lengths), dtype=torch.long, device=ids.device)
    back[torch.cat(rows)] = torch.arange(len(lengths), device=ids.device)
    return embedded[back]


def contrastive_loss(queries: torch.Tensor, documents: torch.Tensor, symmetric: bool = False) -> torch.Tensor:
    """Cross-entropy of each query over scale * cosine with every document of the batch, its own positive (the
    document of its row) the target; symmetric adds each positive over the batch's queries and halves the sum."""
    targets = torch.arange(len(queries), device=queries.device)
    loss = nn.functional.cross_entropy(SCALE * queries @ documents.T, targets)
    if symmetric:
        positives = documents[: len(queries)]
        loss = (loss + nn.functional.cross_entropy(SCALE * positives @ queries.T, targets)) / 2
    return loss


def pair_embeddings(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's queries (one pass) and its positives then hard negatives (another), each in length groups."""
    return (embed_by_length(model, batch["query_ids"], batch["query_mask"]),
            embed_by_length(model, *documents_of(batch)))


def in_batch_negatives_loss(model: nn.Module, batch: Batch, symmetric: bool = False) -> torch.Tensor:
    """contrastive_loss of the batch's queries against its positives (and hard negatives)."""
    return contrastive_loss(*pair_embeddings(model, batch), symmetric)


class RetrievalObjective:
    """What a retrieval run trains and its loss: in-batch negatives here (`symmetric`: also each positive's query);
    a subclass changes what it needs. run_retrieval.py calls check before anything is written, arrays on the
    training pairs, trainable on the model it loaded (it trains, saves and scores what that returns), loss in the
    loop, and record for results.json."""

    def __init__(self, symmetric: bool = False) -> None:
        self.symmetric = symmetric

    def check(self, model: EmbeddingModel, tokenizer: FineTuningTokenizer, max_seq_length: int,
              allow_vocab_mismatch: bool) -> None:
        """Refuses, before the first write, what contradicts the run's model, vocab or sequence length."""

    def arrays(self, tokenizer: FineTuningTokenizer, pairs: TrainingPairs, max_seq_length: int
               ) -> dict[str, np.ndarray]:
        """The training rows: the pairs' tokenized texts (pair_arrays) and whatever else the loss reads."""
        return pair_arrays(tokenizer, pairs, max_seq_length)

    def trainable(self, model: EmbeddingModel) -> EmbeddingModel:
        """The embedding model the optimizer trains and the run saves and scores, made from the loaded one."""
        return model

    def loss(self) -> Loss:
        """The loss of a micro-batch: loss(trained model, pair_batch) -> scalar."""
        return partial(in_batch_negatives_loss, symmetric=self.symmetric)

    def record(self) -> dict[str, Any]:
        """What results.json records of the objective."""
        return {}


IN_BATCH_NEGATIVES = RetrievalObjective()


def train_embeddings(model: EmbeddingModel, arrays: dict[str, np.ndarray], settings: LoopSettings,
                     precision: Precision, ctx: DistributedContext, log: MetricLogger,
                     objective: RetrievalObjective = IN_BATCH_NEGATIVES) -> dict[str, Any]:
    """Fine-tunes `model` (on ctx.device; the objective's trainable) on the rows of `arrays` (its arrays) by its
    loss, for optimizer_steps steps of seeded, shuffled micro-batches (the last of an epoch may be smaller); returns
    e2e_train_time, training_pairs_per_second, final_loss, train_steps and train_pairs."""
    if ctx.world_size != 1:  # in-batch negatives would need the other processes' embeddings gathered
        raise InputError("run_retrieval.py trains in one process; launch it without torchrun")
    n = len(arrays["query_ids"])
    total_steps = optimizer_steps(n, settings, ctx)
    optimizer = build_adamw(model, settings.learning_rate)
    scheduler = LinearWarmUpScheduler(optimizer, settings.warmup_proportion, total_steps)
    stepper = Stepper(model, optimizer, scheduler, precision, objective.loss())
    bar = tqdm(total=total_steps, disable=not settings.progress_bar, desc="fine-tuning", unit="step")
    model.train()
    steps, pairs, epoch, loss, start = 0, 0, 0, float("nan"), time.perf_counter()
    while steps < total_steps:
        batches = epoch_micro_batches(n, settings.micro_batch_size, settings.seed, epoch, ctx)
        for first in range(0, len(batches), settings.accumulation):
            group = batches[first : first + settings.accumulation]
            loss = stepper.step([pair_batch(arrays, rows, ctx.device) for rows in group]).loss
            steps, pairs = steps + 1, pairs + sum(len(rows) for rows in group)
            bar.update(1)
            if steps % settings.log_freq == 0 or steps == total_steps:
                log.log([epoch, steps], {"step_loss": loss, "learning_rate": optimizer.param_groups[0]["lr"],
                                         "skipped_steps": stepper.skipped_steps})
            if steps == total_steps:
                break
        epoch += 1
    bar.close()
    elapsed = time.perf_counter() - start
    return {"e2e_train_time": elapsed, "training_pairs_per_second": pairs / elapsed, "final_loss": loss,
            "train_steps": total_steps, "train_pairs": n}
