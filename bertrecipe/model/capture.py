"""A model's inner states for distillation and feature extraction, captured by hooks while it runs: the embedding
output, layers' hidden states, their pre-softmax attention scores and their value vectors, for both families
(model/bert.py, model/modern.py) and every model that holds one of their encoders (pre-training, classification, QA).

Layers are numbered from 1 as transformers' hidden_states index them (layer_map.py). Only the layers and states
asked for are hooked: the others cost nothing. The models run attention in fused kernels that never expose the
scores, so a hook before each asked attention module recomputes Q, K and V from its input with the module's own
weights (and, for the modern family, its rotary positions) and makes the scores in fp32, under autocast too, with
the mask the model applies: padded keys and, in a local layer, keys outside the window, at MASKED_SCORE. Every
tensor comes in the padded layout [batch, seq, ...] of the batch, also where the model skips padding inside
(TokenPacking). Batches of packed documents (--pack_sequences) are refused.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import BertModel, BertSelfAttention, TokenPacking
from bertrecipe.model.families import layers_of
from bertrecipe.model.modern import ModernBertAttention, ModernBertModel, rotate

CAPTURES = frozenset({"embeddings", "hidden", "scores", "values"})
# The score of a key a query may not attend to (the fp32 minimum, as the models' masks): finite, so softmax and
# log-softmax stay free of NaN; losses.py tells masked keys by it.
MASKED_SCORE = torch.finfo(torch.float32).min
# Attributes that lead from a model to the encoder inside it: a DistillationStudent, DDP and torch.compile
# wrappers, then BERT's and the modern family's task models.
_WRAPPERS = ("student", "module", "_orig_mod", "bert", "model")


@dataclass
class Captured:
    """The states of the model's last forward pass, each in the padded layout of its batch [B, S, ...]:
    `embeddings` [B, S, H] (the input of layer 1), `hidden` {layer: output [B, S, H]} (the last layer's is the
    encoder's output: for the modern family after its final norm, as transformers' hidden_states[-1]), `scores`
    {layer: pre-softmax scores [B, heads, S, S], fp32, MASKED_SCORE where masked}, `values` {layer: value vectors
    [B, heads, S, head_dim]}. Padded positions hold no meaning (zeros where the model skipped them)."""

    embeddings: Optional[Tensor] = None
    hidden: dict[int, Tensor] = field(default_factory=dict)
    scores: dict[int, Tensor] = field(default_factory=dict)
    values: dict[int, Tensor] = field(default_factory=dict)


@dataclass
class _Batch:
    attention_mask: Tensor  # [B, S], 1 at tokens, 0 at padding: the batch the encoder runs


def _encoder_inside(model: nn.Module) -> BertModel | ModernBertModel:
    """The BertModel or ModernBertModel that `model` is or holds (through wrappers and task models)."""
    found: Any = model
    for _ in range(len(_WRAPPERS) + 1):
        if isinstance(found, (BertModel, ModernBertModel)):
            return found
        found = next((getattr(found, name) for name in _WRAPPERS
                      if isinstance(getattr(found, name, None), nn.Module)), None)
    raise TypeError(f"{type(model).__name__} holds no BertModel or ModernBertModel whose states could be captured")


def encoder_layers(model: nn.Module) -> int:
    """How many layers the encoder of `model` has."""
    return len(layers_of(_encoder_inside(model)))


def _packing_index(encoder: BertModel | ModernBertModel) -> int:
    """Where a layer's and an attention module's `packing` argument sits: (x, bias, packing) in BERT, (x, mask,
    rotary, packing) in the modern family."""
    return 2 if isinstance(encoder, BertModel) else 3


def _packing_of(inputs: tuple, kwargs: dict, index: int) -> Optional[TokenPacking]:
    return inputs[index] if len(inputs) > index else kwargs.get("packing")


def _padded(x: Tensor, packing: Optional[TokenPacking], length: int) -> Tensor:
    """[B, length, F] from a layer's [B, s, F] or, where the model skipped padding, [T, F] tokens: the columns the
    model left out (padding in every row) come back as zeros."""
    if packing is not None:
        x = packing.unpack(x)
    return F.pad(x, (0, 0, 0, length - x.shape[1]))


@contextmanager
def capturing(model: nn.Module, layers: set[int], what: set[str]) -> Iterator[Captured]:
    """Within the block, every forward pass of `model` fills the Captured it yields with `what` (of CAPTURES;
    "embeddings" is not per layer) of the 1-based `layers`; the hooks are removed on leaving."""
    encoder = _encoder_inside(model)
    count = len(layers_of(encoder))
    if not set(what) <= CAPTURES:
        raise ValueError(f"cannot capture {sorted(set(what) - CAPTURES)}; the states are {sorted(CAPTURES)}")
    if any(not 1 <= layer <= count for layer in layers):
        raise ValueError(f"layers {sorted(layers)} asked of an encoder of {count} layers (numbered from 1)")
    captured = Captured()
    batch = _Batch(torch.ones(0, 0))
    handles = []
    try:
        handles.append(encoder.register_forward_pre_hook(_batch_hook(encoder, batch, captured), with_kwargs=True))
        if "embeddings" in what:
            handles.append(encoder.embeddings.register_forward_hook(lambda _module, _args, output: setattr(
                captured, "embeddings", _padded(output, None, _length(batch)))))
        for layer in sorted(layers):
            block = layers_of(encoder)[layer - 1]
            if "hidden" in what:
                handles.append(block.register_forward_hook(
                    _hidden_hook(encoder, layer, layer == count, batch, captured), with_kwargs=True))
            if {"scores", "values"} & set(what):
                attention = block.attention.self if isinstance(encoder, BertModel) else block.attn
                handles.append(attention.register_forward_pre_hook(
                    _attention_hook(encoder, layer, set(what), batch, captured), with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _length(batch: _Batch) -> int:
    return batch.attention_mask.shape[1]


def _batch_hook(encoder: BertModel | ModernBertModel, batch: _Batch, captured: Captured) -> Any:
    """Before the encoder runs: the batch's attention mask (all tokens when none is given) and a fresh Captured;
    packed documents are refused, their attention is not the padded batch's."""
    signature = inspect.signature(encoder.forward)

    def hook(_module: nn.Module, inputs: tuple, kwargs: dict) -> None:
        bound = signature.bind(*inputs, **kwargs).arguments
        if bound.get("document_ids") is not None:
            raise InputError("distillation takes padded batches, one sequence a row; this one packs documents "
                             "(document_ids, --pack_sequences): run without --pack_sequences")
        input_ids = bound["input_ids"]
        mask = bound.get("attention_mask")
        batch.attention_mask = torch.ones_like(input_ids) if mask is None else mask
        captured.embeddings = None
        for states in (captured.hidden, captured.scores, captured.values):
            states.clear()
    return hook


def _hidden_hook(encoder: BertModel | ModernBertModel, layer: int, last: bool, batch: _Batch,
                 captured: Captured) -> Any:
    index = _packing_index(encoder)

    def hook(_module: nn.Module, inputs: tuple, kwargs: dict, output: Tensor) -> None:
        hidden = _padded(output, _packing_of(inputs, kwargs, index), _length(batch))
        if last and isinstance(encoder, ModernBertModel):  # the encoder's output, as its hidden_states[-1]
            hidden = encoder.final_norm(hidden)
        captured.hidden[layer] = hidden
    return hook


def _attention_hook(encoder: BertModel | ModernBertModel, layer: int, what: set[str], batch: _Batch,
                    captured: Captured) -> Any:
    index = _packing_index(encoder)

    def hook(module: nn.Module, inputs: tuple, kwargs: dict) -> None:
        x = inputs[0] if inputs else kwargs["x"]
        q, k, v = _heads(module, encoder, _packing_of(inputs, kwargs, index), x, _length(batch))
        if "values" in what:
            captured.values[layer] = v
        if "scores" in what:
            local = isinstance(module, ModernBertAttention) and module.local
            allowed = _allowed(batch.attention_mask, module.half_window if local else None)
            with torch.autocast(q.device.type, enabled=False):  # autocast would make the product bf16 again
                scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            captured.scores[layer] = scores.masked_fill(~allowed, MASKED_SCORE)
    return hook


def _heads(module: nn.Module, encoder: BertModel | ModernBertModel, packing: Optional[TokenPacking], x: Tensor,
           length: int) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K, V [B, heads, length, head_dim] of the attention module's input x, as the module makes them (its
    weights, under the same autocast; the modern family's rotary positions on Q and K)."""
    if isinstance(module, BertSelfAttention):
        weight = torch.cat((module.query.weight, module.key.weight, module.value.weight))
        bias = torch.cat((module.query.bias, module.key.bias, module.value.bias))
        qkv = F.linear(x, weight, bias)
    else:
        qkv = F.linear(x, module.Wqkv.weight, module.Wqkv.bias)
    qkv = _padded(qkv, packing, length)
    batch_size, heads = qkv.shape[0], module.num_heads
    q, k, v = qkv.view(batch_size, length, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
    if isinstance(module, ModernBertAttention):
        positions = torch.arange(length, device=x.device).expand(batch_size, length)
        cos, sin = encoder.rotary[module.local](positions)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    return q, k, v


def _allowed(attention_mask: Tensor, half_window: Optional[int]) -> Tensor:
    """[B, 1, 1 or S, S] bool: the keys a query attends to (real ones; within half_window positions in a local
    layer), as the models' masks (bert.attention_bias_from_mask, documents.document_attention_bias)."""
    allowed = (attention_mask != 0)[:, None, None, :]
    if half_window is None:
        return allowed
    index = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return allowed & ((index[:, None] - index[None, :]).abs() <= half_window)
