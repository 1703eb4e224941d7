"""A released model's calling convention, transformers' own: input_ids, attention_mask (and token_type_ids for BERT)
in; logits, start_logits/end_logits, or last_hidden_state (and an embedding model's sentence_embedding) out. The
ONNX export runs this module, and the folder's check compares it on the source model and on the folder's weights."""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor, nn

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.embedding import pool
from bertrecipe.model.bert import BertModel
from bertrecipe.model.families import encoder_of, is_modern_config
from bertrecipe.model.modern import ModernBertModel
from bertrecipe.model.weights import load_weights_into, model_for_weights, read_weights
from bertrecipe.release.model_files import ReleaseKind

OPSET = 17


def release_output_names(kind: ReleaseKind) -> tuple[str, ...]:
    return {"fill-mask": ("logits",), "text-classification": ("logits",),
            "question-answering": ("start_logits", "end_logits"),
            "sentence-similarity": ("last_hidden_state", "sentence_embedding"),
            "feature-extraction": ("last_hidden_state",)}[kind.pipeline_tag]


def input_names(modern: bool) -> tuple[str, ...]:
    return ("input_ids", "attention_mask") if modern else ("input_ids", "attention_mask", "token_type_ids")


class ReleaseSignature(nn.Module):
    """The model (as model_for_weights builds it) called as transformers' class of the release is."""

    def __init__(self, model: nn.Module, kind: ReleaseKind) -> None:
        super().__init__()
        self.model, self.kind = model, kind
        self.modern = is_modern_config(model.config)

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Optional[Tensor] = None) -> tuple[Tensor, ...]:
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        tag = self.kind.pipeline_tag
        if tag in ("sentence-similarity", "feature-extraction"):
            return self.encoded(input_ids, attention_mask, types)
        outputs = self.model(input_ids, types, attention_mask)
        if tag == "fill-mask":
            return (outputs.prediction_logits,)
        return tuple(outputs[1:])  # a classifier's logits, or the span's start and end logits; the loss is None

    def encoded(self, input_ids: Tensor, attention_mask: Tensor, types: Tensor) -> tuple[Tensor, ...]:
        encoder = encoder_in(self.model)
        hidden = encoder(input_ids, attention_mask) if self.modern else encoder(input_ids, types, attention_mask)[0]
        if self.kind.is_embedding:
            return hidden, pool(hidden, attention_mask, self.kind.pooling or "mean")
        return (hidden,)


def encoder_in(model: nn.Module) -> nn.Module:
    """The encoder a model is or holds (a bare encoder is its own)."""
    return model if isinstance(model, (BertModel, ModernBertModel)) else encoder_of(model)


def release_onnx_bytes(model: nn.Module, kind: ReleaseKind) -> bytes:
    """The release as ONNX, dynamic batch and sequence axes, traced dense (one static graph whatever the padding)."""
    signature = ReleaseSignature(copy.deepcopy(model).cpu().eval(), kind)
    encoder_in(signature.model).skip_padding = False
    names = input_names(signature.modern)
    example = tuple(torch.ones((2, 8), dtype=torch.long) if name != "token_type_ids" else
                    torch.zeros((2, 8), dtype=torch.long) for name in names)
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    for name in release_output_names(kind):
        axes[name] = {0: "batch"} if name in ("logits", "sentence_embedding") and kind.pipeline_tag != "fill-mask" \
            else {0: "batch", 1: "sequence"}
    buffer = io.BytesIO()
    torch.onnx.export(signature, example, buffer, input_names=list(names),
                      output_names=list(release_output_names(kind)), dynamic_axes=axes, opset_version=OPSET,
                      dynamo=False)
    return buffer.getvalue()


def probe_inputs(vocab_size: int, modern: bool) -> tuple[Tensor, ...]:
    """Two rows of real ids (past the special ones), the second padded: what the check runs."""
    ids = (torch.arange(16).reshape(2, 8) * 7 + 5) % (vocab_size - 5) + 5
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return (ids, mask) if modern else (ids, mask, torch.zeros_like(ids))


@torch.no_grad()
def check_same_outputs(model: nn.Module, folder: Path, kind: ReleaseKind, tolerance: float = 1e-5) -> None:
    """The folder's weights, read back as any source is, give the source model's outputs (fp32) on probe rows;
    otherwise an error, and the release is not made."""
    weights = read_weights(folder)
    reloaded = model_for_weights(weights, weights.config)
    load_weights_into(reloaded, weights, folder)
    probe = probe_inputs(model.config.vocab_size, is_modern_config(model.config))
    expected = ReleaseSignature(model, kind).eval()(*probe)
    found = ReleaseSignature(reloaded.eval(), kind)(*probe)
    for name, a, b in zip(release_output_names(kind), expected, found, strict=True):
        mask = probe[1].bool() if a.dim() >= 2 and a.shape[:2] == probe[1].shape else None
        difference = float(((a - b)[mask] if mask is not None else (a - b)).abs().max())
        if difference > tolerance * max(1.0, float(a.abs().max())):
            raise InputError(f"{folder}: the release's weights read back give {name} {difference:.2e} away from the "
                             "source's; nothing was released (please report this)")
