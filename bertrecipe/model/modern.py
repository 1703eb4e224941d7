"""The modern encoder family (ModernBERT, Warner et al. 2024): rotary positions, GeGLU MLPs, pre-norm LayerNorms
without biases, alternating local (sliding-window) and global attention, a masked-LM head without NSP.

Parameter names equal Hugging Face transformers' ModernBERT names, so state dicts move between the two unchanged.
As in bert.py, the dense layers run on the real tokens only (padding skipped), the masked-LM head only on the
predicted positions, and attention through `attend`. Rows may hold several documents (`document_ids`, see
documents.py): attention then stays inside each document and positions restart at each one.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bertrecipe.model.autocast import compute_dtype
from bertrecipe.model.bert import (
    ACTIVATIONS,
    Linear,
    PreTrainingOutput,
    TokenPacking,
    attend,
    attend_by_three_products,
    attention_bias_from_mask,
    classification_loss,
    span_loss,
)
from bertrecipe.model.chunked_cross_entropy import masked_lm_loss
from bertrecipe.model.documents import document_attention_bias, document_runs, positions_within_documents
from bertrecipe.model.fast_dropout import Dropout
from bertrecipe.model.local_attention import Band, banded_attention
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.model.varlen_attention import (
    DocumentSpans,
    Kernel,
    document_spans,
    in_token_order,
    kernel_for,
    varlen_attention,
)

Limit = Union[Tensor, Band, DocumentSpans]  # what a layer's attention is limited by (ModernBertModel._masks)


def _layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class RotaryPositions:
    """cos and sin of rotary position embeddings (Su et al. 2021) for given positions, computed in fp32."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.inverse_frequencies = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))

    def __call__(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [batch, seq] -> cos, sin [batch, 1, seq, head_dim // 2] of the angles, broadcast over heads
        (each angle turns a pair of features, one from each half of the head; see rotate)."""
        angles = positions[..., None].float() * self.inverse_frequencies.to(positions.device)
        return angles[:, None].cos(), angles[:, None].sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., head_dim] turned by the rotary angles (cos, sin [..., head_dim // 2] broadcast to its halves; in
    fp32, returned in x's dtype): the pair (x1[i], x2[i]) of the two halves turns by angle i, which is
    x * cat(cos, cos) + rotate_half(x) * cat(sin, sin) (RoFormer, transformers) written by halves: a bf16 x times
    fp32 angles is computed in fp32 without a float copy of x, rotate_half's negation or the angles' duplication,
    to the same values to the last bit."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = _layer_norm(config)
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))


class ModernBertAttention(nn.Module):
    """Fused QKV, rotary positions on Q and K, attention (local layers: a window of local_attention // 2 tokens on
    each side), output projection."""

    def __init__(self, config: ModernBertConfig, local: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.Wqkv = Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_prob = config.attention_dropout
        self.out_drop = Dropout(config.attention_dropout)
        self.local = local
        self.half_window = config.local_attention // 2

    def forward(self, x: Tensor, mask: Limit, rotary: tuple[Tensor, Tensor],
                packing: Optional[TokenPacking]) -> Tensor:
        """mask: an additive bias [B, 1, S, S], the Band a long sequence's local layer attends within, or the
        DocumentSpans of the tokens for the varlen kernel."""
        if torch.onnx.is_in_onnx_export() and packing is None and not self.training and (
                mask is None or isinstance(mask, Tensor)):
            return self.out_drop(self.Wo(self._three_products(x, mask, rotary)))
        qkv = self.Wqkv(x)
        if isinstance(mask, DocumentSpans):
            return self.out_drop(self.Wo(self._attend_spans(qkv, mask, rotary)))
        if packing is not None:
            qkv = packing.unpack(qkv)
        batch, seq, width = qkv.shape
        head_dim = width // 3 // self.num_heads
        q, k, v = qkv.view(batch, seq, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = rotate(q, *rotary), rotate(k, *rotary)
        if isinstance(mask, Band):
            context = banded_attention(q, k, v, mask, self.dropout_prob, self.training)
        else:
            context = attend(q, k, v, mask, self.dropout_prob, self.training)
        context = context.transpose(1, 2).reshape(batch, seq, width // 3)
        if packing is not None:
            context = packing.pack(context)
        return self.out_drop(self.Wo(context))

    def _three_products(self, x: Tensor, attention_bias: Optional[Tensor], rotary: tuple[Tensor, Tensor]) -> Tensor:
        """forward's attention in an ONNX export, as BERT's (BertSelfAttention._three_products): Q, K and V each a
        product of its slice of Wqkv, the softmax scale folded into Q's (rotation is linear, so it commutes)."""
        width = self.Wqkv.out_features // 3
        scale = (width // self.num_heads) ** -0.5  # a number, not a traced shape: folded
        weight, bias = self.Wqkv.weight, self.Wqkv.bias
        # slices of a parameter by numbers (not split, which the exporter leaves to run time): constants folded
        projections = [(weight[i * width:(i + 1) * width] * factor,
                        None if bias is None else bias[i * width:(i + 1) * width] * factor)
                       for i, factor in enumerate((scale, 1.0, 1.0))]
        return attend_by_three_products(x, projections, self.num_heads, attention_bias,
                                        lambda states: rotate(states, *rotary))

    def _attend_spans(self, qkv: Tensor, spans: DocumentSpans, rotary: tuple[Tensor, Tensor]) -> Tensor:
        """qkv of the attended tokens ([T, 3 * width], or every position's [B, S, 3 * width]) through the varlen
        kernel, with rotary cos/sin [T, 1, head_dim // 2] in token order; returns the context in qkv's layout."""
        width = qkv.shape[-1] // 3
        tokens = qkv.reshape(-1, 3, self.num_heads, width // self.num_heads)
        q, k, v = tokens.unbind(1)
        q, k = rotate(q, *rotary), rotate(k, *rotary)
        context = varlen_attention(q, k, v, spans, self.half_window if self.local else None)
        return context.reshape(*qkv.shape[:-1], width)


class ModernBertMLP(nn.Module):
    """GeGLU: Wo(act(a) * b) where Wi(x) = [a, b]."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.Wi = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.activation = ACTIVATIONS[config.hidden_activation]
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.drop(self.activation(value) * gate))


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm residual block; the first layer has no attention norm (the embeddings end with one)."""

    def __init__(self, config: ModernBertConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else _layer_norm(config)
        self.attn = ModernBertAttention(config, local=config.layer_types[index] == "sliding_attention")
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: Tensor, mask: Limit, rotary: tuple[Tensor, Tensor],
                packing: Optional[TokenPacking]) -> Tensor:
        x = x + self.attn(self.attn_norm(x), mask, rotary, packing)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertModel(nn.Module):
    """The encoder. forward(input_ids [B, S], attention_mask [B, S] 1/0, document_ids [B, S]) returns the final
    hidden states [B, S, H] (0 at padded positions when padding is skipped, the default)."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = _layer_norm(config)
        head_dim = config.hidden_size // config.num_attention_heads
        self.rotary = {True: RotaryPositions(head_dim, config.local_rope_theta),
                       False: RotaryPositions(head_dim, config.global_rope_theta)}
        self.skip_padding = True
        self.checkpoint_activations = False

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                document_ids: Optional[Tensor] = None) -> Tensor:
        packed = document_ids is not None
        if document_ids is None:
            document_ids = torch.ones_like(input_ids) if attention_mask is None else (attention_mask != 0).long()
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        else:
            document_ids = document_runs(document_ids)  # the one rule of what a document is (documents.py)
            positions = positions_within_documents(document_ids)
        full_length = input_ids.shape[1]
        packing = TokenPacking.of((document_ids != 0).long()) if self.skip_padding else None
        if packing is not None:  # columns that are padding in every row are left out altogether
            input_ids, document_ids, positions = (t[:, : packing.seq] for t in (input_ids, document_ids, positions))
        x = self.embeddings(input_ids)
        masks = self._masks(document_ids, compute_dtype(x), packed, packing)
        rotary = {local: self._rotary(local, positions, packing, isinstance(mask, DocumentSpans))
                  for local, mask in masks.items()}
        if packing is not None:
            x = packing.pack(x)
        for layer in self.layers:
            local = layer.attn.local
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, masks[local], rotary[local], packing, use_reentrant=False)
            else:
                x = layer(x, masks[local], rotary[local], packing)
        x = self.final_norm(x)
        if packing is None:
            return x
        return F.pad(packing.unpack(x), (0, 0, 0, full_length - packing.seq))

    def _masks(self, document_ids: Tensor, dtype: torch.dtype, packed: bool,
               packing: Optional[TokenPacking]) -> dict[bool, Limit]:
        """Per kind of layer (local: True) what attention is limited by: on CUDA, where the varlen kernel serves,
        the tokens' DocumentSpans; for global layers of rows that hold one document, the key-padding bias
        [B, 1, 1, S] (as BERT's); else the [B, 1, S, S] document (and window) bias, or for local layers of long
        rows the Band, whose memory grows linearly with the length."""
        masks: dict[bool, Limit] = {}
        spans: Optional[DocumentSpans] = None
        for local in {layer.attn.local for layer in self.layers}:
            kernel = self._varlen_kernel(document_ids, dtype, packing, local)
            band = Band(document_ids, self.config.local_attention // 2)
            if kernel is not None:
                spans = spans or document_spans(document_ids, packing.index if packing else None, kernel)
                masks[local] = spans
            elif local and band.worth_it() and not torch.jit.is_tracing():  # exported graphs stay dense
                masks[local] = band
            elif not local and not packed:
                masks[local] = attention_bias_from_mask(document_ids, dtype)
            else:
                masks[local] = document_attention_bias(document_ids, dtype, band.reach if local else None)
        return masks

    def _varlen_kernel(self, document_ids: Tensor, dtype: torch.dtype, packing: Optional[TokenPacking],
                       local: bool) -> Optional[Kernel]:
        """The varlen kernel where it serves these layers: every attended token real (padding skipped, or none)."""
        config = self.config
        if torch.jit.is_tracing() or (packing is None and not bool((document_ids > 0).all())):
            return None
        return kernel_for(document_ids.device, dtype, config.hidden_size // config.num_attention_heads,
                          config.attention_dropout, self.training, local=local)

    def _rotary(self, local: bool, positions: Tensor, packing: Optional[TokenPacking],
                spans: bool) -> tuple[Tensor, Tensor]:
        """cos, sin [B, 1, S, head_dim // 2]; for the varlen kernel [T, 1, head_dim // 2], the tokens in order."""
        if not spans:
            return self.rotary[local](positions)
        cos, sin = self.rotary[local](in_token_order(positions, packing.index if packing else None)[None])
        return cos[0, 0, :, None], sin[0, 0, :, None]


class ModernBertPredictionHead(nn.Module):
    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.activation = ACTIVATIONS[config.classifier_activation]
        self.norm = _layer_norm(config)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.activation(self.dense(x)))


class ModernBertPreTrainedModel(nn.Module):
    """ModernBERT's initialization: truncated normals, output projections scaled down with depth."""

    config: ModernBertConfig
    model: ModernBertModel

    def init_weights(self) -> None:
        config = self.config
        cutoff = config.initializer_cutoff_factor
        inner = config.initializer_range
        outer = config.initializer_range / math.sqrt(2.0 * config.num_hidden_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = {"Wo": outer, "dense": outer, "classifier": config.hidden_size ** -0.5}.get(
                    name.rsplit(".", 1)[-1], inner)
                nn.init.trunc_normal_(module.weight, std=std, a=-cutoff * std, b=cutoff * std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def set_checkpoint_activations(self, enabled: bool) -> None:
        self.model.checkpoint_activations = enabled


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """The encoder with its masked-LM head (decoder tied to the token embeddings, a bias of its own); no NSP.

    forward takes the pre-training batch as BertForPreTraining does (token_type_ids accepted and unused) and
    returns a PreTrainingOutput whose next-sentence fields are None: the head runs where masked_lm_labels >= 0,
    else where predict_positions is true, else everywhere; the loss is the masked-LM cross-entropy in fp32. While
    gradients are recorded (bf16 or fp32) the loss comes from chunked_cross_entropy and the logits are None."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.init_weights()
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, masked_lm_labels: Optional[Tensor] = None,
                next_sentence_labels: Optional[Tensor] = None, predict_positions: Optional[Tensor] = None,
                document_ids: Optional[Tensor] = None) -> PreTrainingOutput:
        if next_sentence_labels is not None:
            raise ValueError("the modern family has no next-sentence head; train it without NSP labels")
        hidden = self.model(input_ids, attention_mask, document_ids)
        if masked_lm_labels is not None:
            predict_positions = masked_lm_labels >= 0
        if predict_positions is not None:
            hidden = hidden[predict_positions]
        hidden = self.head(hidden)
        if masked_lm_labels is None:
            return PreTrainingOutput(None, None, None, self.decoder(hidden), None)
        logits, loss = masked_lm_loss(hidden, self.decoder.weight, self.decoder.bias,
                                      masked_lm_labels[predict_positions])
        return PreTrainingOutput(loss, loss, None, logits, None)


def _pooled(config: ModernBertConfig, hidden: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
    if config.classifier_pooling == "cls":
        return hidden[:, 0]
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class ModernBertForSequenceClassification(ModernBertPreTrainedModel):
    """Pooled ([CLS] or mean) -> head -> dropout -> classifier; num_labels 1 is regression (MSE). forward returns
    (loss or None, logits [B, num_labels]) as BertForSequenceClassification does."""

    def __init__(self, config: ModernBertConfig, num_labels: int) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = Linear(config.hidden_size, num_labels)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None,
                labels: Optional[Tensor] = None) -> tuple[Optional[Tensor], Tensor]:
        hidden = self.model(input_ids, attention_mask)
        logits = self.classifier(self.drop(self.head(_pooled(self.config, hidden, attention_mask)))).float()
        loss = None if labels is None else classification_loss(logits, labels)
        return loss, logits


class ModernBertForQuestionAnswering(ModernBertPreTrainedModel):
    """Span extraction: head -> dropout -> classifier (2 outputs) at every position. forward returns
    (loss or None, start_logits [B, S], end_logits [B, S]) as BertForQuestionAnswering does."""

    def __init__(self, config: ModernBertConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: Tensor, token_type_ids: Optional[Tensor] = None,
                attention_mask: Optional[Tensor] = None, start_positions: Optional[Tensor] = None,
                end_positions: Optional[Tensor] = None) -> tuple[Optional[Tensor], Tensor, Tensor]:
        hidden = self.model(input_ids, attention_mask)
        start_logits, end_logits = self.classifier(self.drop(self.head(hidden))).float().unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return loss, start_logits, end_logits
