"""Embedding distillation (sentence-transformers' MSE distillation, Reimers and Gurevych 2020): a student learns to
give a teacher's sentence embeddings. It is a retrieval objective (finetuning/retrieval_training.py), so the run is
run_retrieval.py's in every other respect: the same training pairs, loop, checks, scoring and outputs.

The texts distilled are those of the training pairs, as in-batch negatives reads them: each micro-batch's queries
and documents (positives, and hard negatives where the pairs have them). The loss is the mean over those texts and
the embedding's features of (s - t)², s the student's embedding (through a Projection where the widths differ), t
the teacher's, both as run_retrieval embeds a text (pooled, L2-normalised; the teacher with its own pooling). The
teacher runs in eval mode under no_grad, so a text's embedding never changes: each distinct text's is computed
once, when it first comes, and kept. The student is any checkpoint, or the teacher's own layers (DistilBERT's
start); it is saved as an ordinary checkpoint of itself, the projection under `distillation.`."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor, nn

from bertrecipe.common.errors import DataError, InputError
from bertrecipe.distillation.pairing import teacher_layers_for
from bertrecipe.distillation.student import DistillationStudent, Projection, student_weights_from_teacher
from bertrecipe.finetuning.beir_data import TrainingPairs
from bertrecipe.finetuning.embedding import EmbeddingModel, load_embedding_model
from bertrecipe.finetuning.model_loading import config_and_weights
from bertrecipe.finetuning.retrieval_training import (
    COLUMNS,
    Batch,
    Loss,
    RetrievalObjective,
    documents_of,
    embed_by_length,
    pair_arrays,
    pair_embeddings,
)
from bertrecipe.model.families import ModelConfig, is_modern_config
from bertrecipe.model.weights import LoadedWeights
from bertrecipe.pretraining.run_tokenizer import released_vocab_file
from bertrecipe.tokenization.bpe import FineTuningTokenizer
from bertrecipe.tokenization.vocab_files import identity_of, load_vocab_file, refuse_other_tokenizer

NAME = "embedding distillation"


def embedding_mse(student: Tensor, teacher: Tensor, projection: Optional[nn.Module] = None) -> Tensor:
    """Mean over texts and features of (student - teacher)² of [N, H] embeddings, in fp32 (torch's MSELoss with its
    mean, as sentence-transformers' MSELoss takes it); the student's through `projection` where given. InputError
    where the widths differ and no projection maps one to the other."""
    if projection is not None:
        student = projection(student.float())
    if student.shape[-1] != teacher.shape[-1]:
        raise InputError(f"the student's embeddings are {student.shape[-1]} wide and the teacher's "
                         f"{teacher.shape[-1]}: compare them through a Projection({student.shape[-1]}, "
                         f"{teacher.shape[-1]})")
    if student.shape != teacher.shape:
        raise ValueError(f"{len(student)} student embeddings for {len(teacher)} teacher embeddings")
    return (student.float() - teacher.float()).pow(2).mean()


class TeacherEmbeddings:
    """The teacher's embeddings of the training texts, each distinct text's computed (under no_grad, in length
    groups) the first time it comes and kept on the CPU: [texts, H] float32 and which are known."""

    def __init__(self, teacher: EmbeddingModel, texts: int) -> None:
        self.teacher = teacher
        self.table = torch.zeros(texts, teacher.config.hidden_size)
        self.known = torch.zeros(texts, dtype=torch.bool)

    def __call__(self, ids: Tensor, mask: Tensor, texts: Tensor) -> Tensor:
        """[N, H] for the rows of ids and mask [N, S], whose distinct-text numbers are `texts` [N]."""
        numbers = texts.cpu()
        missing = torch.nonzero(~self.known[numbers]).flatten()
        if len(missing):
            # one row for each distinct text not yet embedded
            distinct, first = np.unique(numbers[missing].numpy(), return_index=True)
            rows = missing[torch.from_numpy(first)].to(ids.device)
            with torch.no_grad():
                embedded = embed_by_length(self.teacher, ids[rows], mask[rows])
            self.table[torch.from_numpy(distinct)] = embedded.float().cpu()
            self.known[torch.from_numpy(distinct)] = True
        return self.table[numbers].to(ids.device)


class EmbeddingDistillationLoss:
    """A micro-batch's loss: embedding_mse of the student's embeddings of its queries and documents against the
    teacher's."""

    def __init__(self, teacher: TeacherEmbeddings, projection: Optional[nn.Module]) -> None:
        self.teacher, self.projection = teacher, projection

    def __call__(self, model: nn.Module, batch: Batch) -> Tensor:
        queries, documents = pair_embeddings(model, batch)
        document_texts = torch.cat([batch[f"{column}_text"] for column in COLUMNS[1:] if f"{column}_text" in batch])
        teacher = torch.cat([self.teacher(batch["query_ids"], batch["query_mask"], batch["query_text"]),
                             self.teacher(*documents_of(batch), document_texts)])
        return embedding_mse(torch.cat([queries, documents]), teacher, self.projection)


class EmbeddingDistillation(RetrievalObjective):
    """The objective of run_retrieval.py --teacher_model: `teacher` any embedding model run_retrieval loads (its
    config from `teacher_config_file` where its checkpoint records none), embedding with `pooling`."""

    def __init__(self, teacher: str, pooling: str, teacher_config_file: Optional[str] = None) -> None:
        super().__init__()
        self.source, self.pooling = teacher, pooling
        self.config, weights = config_and_weights(teacher_config_file, teacher)
        self.weights: LoadedWeights = weights
        self.teacher: Optional[EmbeddingModel] = None
        self.projection: Optional[Projection] = None
        self.distinct_texts = 0

    def student_start(self, layers: int) -> tuple[ModelConfig, LoadedWeights, str]:
        """A student of `layers` of the teacher's layers (the uniform choice: every other one for half of them) with
        its embeddings, as DistilBERT starts one: its config, weights, and a name for them."""
        total = self.config.num_hidden_layers
        if not 1 <= layers <= total:
            raise InputError(f"--student_layers {layers}: the teacher {self.source} has {total} layers; take 1 to "
                             f"{total} of them")
        chosen = teacher_layers_for(layers, total)
        # a modern student's layer keeps its teacher layer's attention (global or local)
        kept = {"layer_types": [self.config.layer_types[k - 1] for k in chosen]} if is_modern_config(self.config) \
            else {}
        config = dataclasses.replace(self.config, num_hidden_layers=layers, **kept)
        state = student_weights_from_teacher(self.weights.state_dict, self.config, config, chosen)
        named = f"layer{'s' if layers > 1 else ''} {', '.join(map(str, chosen))}"
        return config, LoadedWeights(state, config, "ours", self.weights.tokenizer), f"{self.source} (its {named})"

    def check(self, model: EmbeddingModel, tokenizer: FineTuningTokenizer, max_seq_length: int,
              allow_vocab_mismatch: bool) -> None:
        """Before the first write: one vocabulary (the run's --vocab_file is the teacher's), the teacher's positions
        enough for --max_seq_length; then the teacher is loaded (load_embedding_model's checks)."""
        source, teacher_vocab = self.source, self.config.vocab_size
        if model.config.vocab_size != teacher_vocab:
            raise InputError(f"{source}: the teacher's vocab_size is {teacher_vocab}, the student's "
                             f"{model.config.vocab_size}: teacher and student share one vocabulary (the same ids "
                             "embedded by both); distil into a student of the teacher's vocab")
        if max_seq_length > self.config.max_position_embeddings:
            raise InputError(f"--max_seq_length {max_seq_length} exceeds the teacher's ({source}) "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        released = released_vocab_file(source)
        if self.weights.tokenizer is None and released is not None:  # a released folder's own vocab
            try:
                own = identity_of(load_vocab_file(released))
            except DataError:
                own = None  # a tokenizer the recipe does not read: nothing to compare
            refuse_other_tokenizer(identity_of(tokenizer.vocab), own, "pass the vocab the teacher embeds with",
                                   allow_vocab_mismatch)
        self.teacher = load_embedding_model(self.config, self.weights, source, tokenizer, max_seq_length,
                                            self.pooling, allow_vocab_mismatch)
        self.teacher.eval().requires_grad_(False)

    def arrays(self, tokenizer: FineTuningTokenizer, pairs: TrainingPairs, max_seq_length: int
               ) -> dict[str, np.ndarray]:
        """The pairs' tokenized texts and `<column>_text`: each text's number among the distinct texts."""
        arrays = pair_arrays(tokenizer, pairs, max_seq_length)
        numbers: dict[str, int] = {}
        columns = {"query": pairs.queries, "positive": pairs.positives, "negative": pairs.negatives}
        for column, texts in columns.items():
            if texts is not None:
                arrays[f"{column}_text"] = np.array([numbers.setdefault(text, len(numbers)) for text in texts])
        self.distinct_texts = len(numbers)
        return arrays

    def trainable(self, model: EmbeddingModel) -> EmbeddingModel:
        """The student; where its width is not the teacher's, its encoder with the projection (DistillationStudent:
        saved as the student's own checkpoint, the projection under `distillation.`)."""
        if self.teacher is None:
            raise RuntimeError("check() loads the teacher; call it first")
        device = next(model.parameters()).device
        self.teacher.to(device)
        widths = (model.config.hidden_size, self.config.hidden_size)
        if widths[0] == widths[1]:
            return model
        self.projection = Projection(*widths, model.config.initializer_range).to(device)
        return EmbeddingModel(DistillationStudent(model.encoder, self.projection), model.pooling)

    def loss(self) -> Loss:
        if self.teacher is None:
            raise RuntimeError("check() loads the teacher; call it first")
        return EmbeddingDistillationLoss(TeacherEmbeddings(self.teacher, self.distinct_texts), self.projection)

    def record(self) -> dict[str, Any]:
        return {"objective": NAME, "teacher": str(self.source), "teacher_pooling": self.pooling,
                "projection": self.projection is not None}
