"""A text embedding model of either family: the bare encoder, then mean pooling over the attention mask (every
real token, [CLS] and [SEP] included) or the [CLS] token's output, L2-normalised; texts tokenized as one
`[CLS] text [SEP]` each, and encoded in batches sorted by length."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.model_loading import build_model
from bertrecipe.model.bert import BertModel
from bertrecipe.model.families import ModelConfig, is_modern_config
from bertrecipe.model.modern import ModernBertModel
from bertrecipe.model.weights import LoadedWeights
from bertrecipe.tokenization.bpe import FineTuningTokenizer
from bertrecipe.training.stepper import Precision

POOLINGS = ("mean", "cls")


def bare_encoder(config: ModelConfig) -> nn.Module:
    """The family's encoder without heads (BERT's pooler is not part of a sentence embedding)."""
    return ModernBertModel(config) if is_modern_config(config) else BertModel(config, add_pooling_layer=False)


def embedding_task_record(pooling: str, max_seq_length: int) -> dict[str, Any]:
    """What a retrieval-trained model is, as its checkpoint records it: an encoder whose sentence embedding is its
    token outputs under `pooling`, L2-normalised, of texts cut to max_seq_length tokens."""
    return {"kind": "sentence-embedding", "pooling": pooling, "normalize": True, "max_seq_length": max_seq_length}


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[B, S, H] token outputs -> [B, H] unit vectors."""
    if pooling == "cls":
        pooled = hidden[:, 0]
    else:
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return nn.functional.normalize(pooled.float(), p=2, dim=-1)


class EmbeddingModel(nn.Module):
    """forward(input_ids [B, S], input_mask [B, S]) -> [B, H] float32 unit vectors."""

    def __init__(self, encoder: nn.Module, pooling: str) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise InputError(f"--pooling {pooling!r}: use one of {', '.join(POOLINGS)}")
        self.encoder, self.pooling = encoder, pooling
        self.config = encoder.config
        self.modern = is_modern_config(encoder.config)

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
        if self.modern:
            hidden = self.encoder(input_ids, input_mask)
        else:
            hidden = self.encoder(input_ids, torch.zeros_like(input_ids), input_mask)[0]
        return pool(hidden, input_mask, self.pooling)


def load_embedding_model(config: ModelConfig, weights: Optional[LoadedWeights], source: Optional[str],
                         tokenizer: FineTuningTokenizer, max_seq_length: int, pooling: str,
                         allow_vocab_mismatch: bool = False) -> EmbeddingModel:
    """The checkpoint's encoder (build_model's checks of the vocab and the length) under `pooling`."""
    encoder = build_model(bare_encoder, config, weights, source, tokenizer.vocab, max_seq_length,
                          allow_vocab_mismatch)
    return EmbeddingModel(encoder, pooling)


def tokenize_texts(tokenizer: FineTuningTokenizer, texts: Sequence[str], max_seq_length: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """`[CLS] text [SEP]` rows, the text cut to max_seq_length - 2 tokens: int32 ids and int8 mask [N, max]."""
    if max_seq_length < 3:
        raise InputError(f"--max_seq_length {max_seq_length} is too small: [CLS], [SEP] and a token need 3")
    cls_id, sep_id = tokenizer.vocab.id("[CLS]"), tokenizer.vocab.id("[SEP]")
    # "\n" separates lines for the tokenizer and is only whitespace to BERT.
    flat, offsets = tokenizer.encode_lines([text.replace("\n", " ").replace("\r", " ") for text in texts])
    ids = np.zeros((len(texts), max_seq_length), np.int32)
    mask = np.zeros((len(texts), max_seq_length), np.int8)
    for row in range(len(texts)):
        pieces = flat[offsets[row] : offsets[row + 1]][: max_seq_length - 2]
        ids[row, 0], ids[row, 1 : 1 + len(pieces)], ids[row, 1 + len(pieces)] = cls_id, pieces, sep_id
        mask[row, : 2 + len(pieces)] = 1
    return ids, mask


def trimmed(ids: np.ndarray, mask: np.ndarray, rows: np.ndarray, device: torch.device
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows as int64 tensors cut after their longest real sequence (padding is masked out either way)."""
    width = max(int(mask[rows].sum(1).max()), 1)
    return (torch.from_numpy(ids[rows, :width]).long().to(device),
            torch.from_numpy(mask[rows, :width]).long().to(device))


@torch.no_grad()
def encode(model: EmbeddingModel, ids: np.ndarray, mask: np.ndarray, batch_size: int, precision: Precision,
           progress: Optional[str] = None) -> torch.Tensor:
    """Embeddings [N, H] float32 (on the CPU) of tokenized rows, batch_size rows at a time, longest first so that
    each batch pads little."""
    device = next(model.parameters()).device
    order = np.argsort(-mask.sum(1), kind="stable")
    out = torch.empty((len(ids), model.config.hidden_size), dtype=torch.float32)
    was_training = model.training
    model.eval()
    starts = range(0, len(order), batch_size)
    for start in tqdm(starts, desc=progress, unit="batch", disable=progress is None, dynamic_ncols=True):
        rows = order[start : start + batch_size]
        with precision.autocast():
            out[torch.from_numpy(rows)] = model(*trimmed(ids, mask, rows, device)).float().cpu()
    model.train(was_training)
    return out


def encode_texts(model: EmbeddingModel, tokenizer: FineTuningTokenizer, texts: Sequence[str],
                 max_seq_length: int, batch_size: int, precision: Precision,
                 progress: Optional[str] = None) -> torch.Tensor:
    return encode(model, *tokenize_texts(tokenizer, texts, max_seq_length), batch_size, precision, progress)
