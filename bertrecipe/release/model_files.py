"""What a released model is (its pipeline, its transformers class, its labels or its pooling) and the files that give
it to transformers and sentence-transformers with no code of ours and no missing or unused weight.

A pre-trained checkpoint is released as a masked LM (BertForMaskedLM, ModernBertForMaskedLM: what
AutoModelForMaskedLM and pipeline("fill-mask") load); its next-sentence head and pooler, which that class has not,
are kept beside it in nsp_head.safetensors. A fine-tuned one keeps its head with its labels' names as the checkpoint
records them. An embedding model (a retrieval run's, or any encoder with --embedding) is a sentence-transformers
folder: the encoder, its pooling, the L2 normalisation, the maximum length.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import torch
from safetensors.torch import save as safetensors_bytes
from torch import Tensor, nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification
from bertrecipe.model.families import is_modern_config
from bertrecipe.model.modern import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
)

NSP_FILE = "nsp_head.safetensors"
NSP_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")  # what BertForPreTraining has beyond BertForMaskedLM
POOLER = ("bert.pooler.dense.weight", "bert.pooler.dense.bias")


@dataclass(frozen=True)
class ReleaseKind:
    """What the release is: the Hub's pipeline tag, the transformers class, and the task's facts."""

    pipeline_tag: str  # fill-mask, text-classification, question-answering, sentence-similarity, feature-extraction
    architecture: str
    task_name: Optional[str] = None
    labels: Optional[list[str]] = None  # a classifier's, in the order of its outputs
    pooling: Optional[str] = None  # an embedding model's: mean or cls
    max_seq_length: Optional[int] = None  # an embedding model's

    @property
    def is_embedding(self) -> bool:
        return self.pipeline_tag == "sentence-similarity"


def release_kind(model: nn.Module, task: Optional[dict[str, Any]], embedding: bool, pooling: Optional[str],
                 max_seq_length: Optional[int]) -> ReleaseKind:
    """The release of `model` (as model_for_weights built it) with its checkpoint's task record; --embedding and
    --pooling make an encoder an embedding model (a fine-tuned head is never dropped for it)."""
    task = task or {}
    modern = is_modern_config(model.config)
    family = "ModernBert" if modern else "Bert"
    if isinstance(model, (BertForSequenceClassification, ModernBertForSequenceClassification,
                          BertForQuestionAnswering, ModernBertForQuestionAnswering)):
        if embedding:
            raise InputError("--embedding: this checkpoint is a fine-tuned "
                             f"{type(model).__name__}; its head would be dropped: export it without --embedding")
        if isinstance(model, (BertForQuestionAnswering, ModernBertForQuestionAnswering)):
            return ReleaseKind("question-answering", f"{family}ForQuestionAnswering", task.get("name"))
        return classification_kind(model, task, family)
    if embedding or task.get("kind") == "sentence-embedding":
        chosen = pooling or task.get("pooling") or "mean"
        length = max_seq_length or task.get("max_seq_length") or model.config.max_position_embeddings
        return ReleaseKind("sentence-similarity", f"{family}Model", task.get("name"), pooling=chosen,
                           max_seq_length=int(length))
    if isinstance(model, (BertForPreTraining, ModernBertForMaskedLM)):
        return ReleaseKind("fill-mask", f"{family}ForMaskedLM")
    return ReleaseKind("feature-extraction", f"{family}Model")


def classification_kind(model: nn.Module, task: dict[str, Any], family: str) -> ReleaseKind:
    """A classifier's release: its labels as the checkpoint records them, else as a Hugging Face source's config
    names them, else numbered (an older or NVIDIA checkpoint records none)."""
    outputs = model.num_labels
    extra = getattr(model.config, "extra", None) or {}
    labels = task.get("labels") or config_labels(extra.get("id2label"), outputs)
    if labels is None or len(labels) != outputs:
        labels = ["score"] if outputs == 1 else [f"LABEL_{i}" for i in range(outputs)]
    name = task.get("name") or extra.get("finetuning_task")
    return ReleaseKind("text-classification", f"{family}ForSequenceClassification", name, labels=labels)


def config_labels(id2label: Any, outputs: int) -> Optional[list[str]]:
    """transformers' id2label ({"0": name, ...}) as a list in output order; None where it does not name them all."""
    if not isinstance(id2label, dict) or len(id2label) != outputs:
        return None
    names = [id2label.get(str(i), id2label.get(i)) for i in range(outputs)]
    return None if any(name is None for name in names) else [str(name) for name in names]


def release_config(config: dict[str, Any], kind: ReleaseKind) -> dict[str, Any]:
    """config.json for the release: its class, and a classifier's labels and problem type."""
    config = {**config, "architectures": [kind.architecture]}
    if kind.labels is not None:
        config["id2label"] = {str(i): label for i, label in enumerate(kind.labels)}
        config["label2id"] = {label: i for i, label in enumerate(kind.labels)}
        config["num_labels"] = len(kind.labels)
        config["problem_type"] = "regression" if len(kind.labels) == 1 else "single_label_classification"
    if kind.task_name:
        config["finetuning_task"] = kind.task_name
    return config


def release_weights(state: dict[str, Tensor], kind: ReleaseKind, modern: bool
                    ) -> tuple[dict[str, Tensor], dict[str, Tensor], list[str]]:
    """The weights of the release's class, the next-sentence head and pooler kept beside a BERT masked LM, and notes
    for the card (a zero pooler added where transformers' BertModel expects one the checkpoint lacks)."""
    notes: list[str] = []
    if modern:
        if kind.is_embedding or kind.pipeline_tag == "feature-extraction":
            state = {name: tensor for name, tensor in state.items() if name.startswith("model.")}
        return state, {}, notes
    if kind.pipeline_tag == "fill-mask":
        side = {name: tensor for name, tensor in state.items() if name.startswith(NSP_PREFIXES)}
        return {name: tensor for name, tensor in state.items() if name not in side}, side, notes
    if kind.is_embedding or kind.pipeline_tag == "feature-extraction":
        state = {name: tensor for name, tensor in state.items() if name.startswith("bert.")}
        if not all(name in state for name in POOLER):  # BertModel has one; the sentence embedding never uses it
            hidden = state["bert.embeddings.word_embeddings.weight"].shape[1]
            state.update({POOLER[0]: torch.zeros(hidden, hidden), POOLER[1]: torch.zeros(hidden)})
            notes.append("The checkpoint has no pooler (neither the token outputs nor a sentence embedding use "
                         "it); the folder's `bert.pooler` weights are zeros, so that transformers' BertModel finds "
                         "every weight it expects.")
    return state, {}, notes


def sentence_transformers_files(kind: ReleaseKind, hidden_size: int) -> dict[str, bytes]:
    """modules.json (the encoder, its pooling, the normalisation), sentence_bert_config.json (the maximum length),
    1_Pooling/config.json and config_sentence_transformers.json (cosine similarity)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    pooling = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": kind.pooling == "cls",
               "pooling_mode_mean_tokens": kind.pooling == "mean", "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": False, "include_prompt": True}
    files = {"modules.json": modules, "sentence_bert_config.json": {"max_seq_length": kind.max_seq_length,
                                                                    "do_lower_case": False},
             "1_Pooling/config.json": pooling,
             "config_sentence_transformers.json": {"prompts": {}, "default_prompt_name": None,
                                                   "similarity_fn_name": "cosine"}}
    return {name: (json.dumps(value, indent=2) + "\n").encode("utf-8") for name, value in files.items()}


def weights_bytes(state: dict[str, Tensor]) -> bytes:
    return safetensors_bytes({name: tensor.contiguous() for name, tensor in state.items()}, metadata={"format": "pt"})
