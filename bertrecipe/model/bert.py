"""BERT (Devlin et al., 2018) in PyTorch: configuration, encoder and the pre-training and task heads.

Parameter names equal Hugging Face transformers' BERT names, so state dicts move between the two unchanged
(see docs/interfaces.md, section 3). Attention runs through `scaled_dot_product_attention`, and the
masked-LM head runs only on the positions that are predicted. The dense layers skip padding: they run on the
real tokens of the batch only (attention still sees the padded layout), wherever padded positions cannot
change a result (see `BertModel.skip_padding`).
"""
from __future__ import annotations

import difflib
import json
import math
import numbers
from collections.abc import Callable, Collection, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_text_file
from bertrecipe.model.autocast import compute_dtype
from bertrecipe.model.chunked_cross_entropy import masked_lm_loss
from bertrecipe.model.documents import document_attention_bias, document_runs, positions_within_documents
from bertrecipe.model.fast_dropout import Dropout, dropout

VOCAB_PAD_MULTIPLE = 8  # tensor cores and AMX tiles want matrix sides that are multiples of 8


class ConfigError(InputError):
    """A BERT config that cannot build a model; the message names the file (when known), the key and the fix."""


# Every size must fit a torch dimension; "whole number" excludes floats and booleans such as 12.0 or true.
_SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")
_MAX_SIZE = 2**31 - 1
_PROBABILITY_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
_NON_NEGATIVE_KEYS = ("initializer_range", "layer_norm_eps")

# The keys that shape the model: a config file must give them (Google's, NVIDIA's and Hugging Face's published
# bert_config.json files always do), so that a forgotten one never builds a BERT-base-sized layer silently.
# type_vocab_size may be left out: every BERT has the two segments A and B (a checkpoint of another size is
# refused when its weights load), and layer_norm_eps is absent from Google's and NVIDIA's files.
BERT_REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                      "max_position_embeddings")
# Keys any transformers config may carry, whatever its model, written out here (the package never imports
# transformers; test_model.py compares this list with the installed PretrainedConfig). Both families accept them
# and keep them in `extra`. Besides these, every key ending in _token_id is one (is_token_id_key).
TRANSFORMERS_COMMON_KEYS = frozenset({
    # PretrainedConfig (5.x): its fields, the keyword arguments its constructor reads, its settable properties
    "_commit_hash", "_name_or_path", "allow_global_per_layer_attribute_access", "architectures",
    "attn_implementation", "chunk_size_feed_forward", "dtype", "experts_implementation", "id2label",
    "is_encoder_decoder", "label2id", "model_type", "name_or_path", "num_labels", "output_attentions",
    "output_hidden_states", "per_layer_config", "problem_type", "return_dict", "serialize_explicit_per_layer_config",
    "torch_dtype", "transformers_version",
    # internals that saved configs carry and PretrainedConfig skips on reading
    "_attn_implementation_autoset", "_attn_implementation_internal", "_experts_implementation_internal",
    # PretrainedConfig of the 4.x releases, whose config.json files are still about
    "add_cross_attention", "bos_token_id", "cross_attention_hidden_size", "decoder_start_token_id",
    "eos_token_id", "finetuning_task", "gradient_checkpointing", "is_decoder", "pad_token_id", "prefix",
    "pruned_heads", "sep_token_id", "task_specific_params", "tf_legacy_loss", "tie_encoder_decoder",
    "tie_word_embeddings", "tokenizer_class", "torchscript", "use_bfloat16",
    # the generation settings that 4.x wrote into config.json (transformers drops them on reading)
    "assistant_confidence_threshold", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
    "diversity_penalty", "do_sample", "early_stopping", "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty", "epsilon_cutoff", "eta_cutoff", "exponential_decay_length_penalty",
    "forced_bos_token_id", "forced_eos_token_id", "length_penalty", "max_length", "min_length",
    "no_repeat_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_scores", "remove_invalid_values", "repetition_penalty",
    "return_dict_in_generate", "suppress_tokens", "target_lookbehind", "temperature", "top_k", "top_p", "typical_p",
    "use_cache",
})
# transformers takes any attribute whose name ends so as a special token's id (it validates them by the suffix):
# bos/eos/pad/sep/cls/mask/unk_token_id, decoder_start_token_id, forced_bos_token_id, a model's own ones.
TOKEN_ID_SUFFIX = "_token_id"


def is_token_id_key(key: Any) -> bool:
    """Whether `key` names a special token's id, which a config of either family may carry (kept in `extra`)."""
    return isinstance(key, str) and key.endswith(TOKEN_ID_SUFFIX)


def accepts_config_key(key: Any, known: Collection[str]) -> bool:
    """Whether a config of the family whose keys are `known` may carry `key`: one of them, or a token id."""
    return key in known or is_token_id_key(key)


def per_layer_config_problem(given: dict[str, Any]) -> str:
    """"" unless the config asks for per-layer overrides (transformers' per_layer_config), which our models, whose
    layers are all built from the one config, would silently ignore."""
    overrides = given.get("per_layer_config")
    if overrides is None or overrides == {}:
        return ""
    return (f"per_layer_config is {_short(overrides)}, expected null or {{}} (every layer of this recipe's models "
            "takes the config's one setting)")


# BERT keys our model has no use for: transformers' BertConfig (position_embedding_type is checked to be
# "absolute"), NVIDIA's BertConfig (output_all_encoded_layers) and Google's multilingual and Chinese files.
BERT_UNUSED_KEYS = frozenset({
    "classifier_dropout", "position_embedding_type", "output_all_encoded_layers", "directionality",
    "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers", "pooler_size_per_head", "pooler_type",
})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."  # a pasted blob must not flood the one-line error


def size_problem(config: Any, keys: tuple[str, ...]) -> str:
    """The first of `keys` whose value on `config` is not a whole number from 1 to 2**31 - 1, as "<key> is ...,
    expected ..." ("" when all are); valid ones become plain ints, so that the config writes as JSON."""
    for key in keys:
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value <= _MAX_SIZE:
            return f"{key} is {_short(value)}, expected a whole number from 1 to {_MAX_SIZE}"
        setattr(config, key, int(value))
    return ""


def unknown_keys_problem(keys: Iterable[Any], known: Collection[str], family: str, own_fields: Collection[str],
                         other_fields: Collection[str], other_family: str) -> str:
    """"" when every key is known, else "unknown <family> config key A (did you mean B?), ...; <fix>". A misspelling
    is named with the closest key: of this family's model settings, else the other family's, else any known one."""
    unknown = [str(key) for key in keys if not accepts_config_key(key, known)]
    if not unknown:
        return ""
    described = []
    for key in unknown:
        name = key if key.isidentifier() and len(key) <= 60 else _short(key)  # never a newline in the line
        if key in other_fields:
            described.append(f"{name} (a {other_family} key)")
            continue
        # A looser match within this family's settings than elsewhere: "notes" is no misspelt norm_eps.
        for candidates, whose, cutoff in ((own_fields, "", 0.6), (other_fields, f", a {other_family} key", 0.75),
                                          (known, "", 0.75)):
            close = difflib.get_close_matches(key, sorted(candidates), n=1, cutoff=cutoff)
            if close:
                described.append(f"{name} (did you mean {close[0]}{whose}?)")
                break
        else:
            described.append(name)
    many = len(unknown) > 1
    return (f"unknown {family} config key{'s' if many else ''} {', '.join(described)}; correct the spelling or "
            f"remove {'them' if many else 'it'}")


def missing_keys_problem(values: Collection[str], required: tuple[str, ...], family: str, example: str) -> str:
    """"" when `values` holds every required key, else the missing ones and the fix."""
    missing = [key for key in required if key not in values]
    if not missing:
        return ""
    return (f"{', '.join(missing)} {'are' if len(missing) > 1 else 'is'} missing; a {family} config must give "
            f"the keys that shape the model ({', '.join(required)}): add {'them' if len(missing) > 1 else 'it'}, "
            f"as {example} does")


@dataclass
class BertConfig:
    """Google's `bert_config.json` fields (defaults: BERT-base, for code; a file must give BERT_REQUIRED_KEYS). Keys
    of transformers', NVIDIA's and Google's configs that the model does not use are kept in `extra` and written back.
    Values are checked on construction: ConfigError names the first key that cannot build a model."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ConfigError(problem)

    def _problem(self) -> str:
        """The first invalid value as "<key> is <value>, expected ...", or "" when every value can build a model;
        valid sizes become plain ints and valid probabilities and constants floats on the way."""
        problem = size_problem(self, _SIZE_KEYS)
        if problem:
            return problem
        for key in _PROBABILITY_KEYS + _NON_NEGATIVE_KEYS:
            value = getattr(self, key)
            upper = 1 if key in _PROBABILITY_KEYS else math.inf
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < upper:
                wanted = "a probability in [0, 1)" if upper == 1 else "a finite number >= 0"
                return f"{key} is {_short(value)}, expected {wanted}"
            setattr(self, key, float(value))
        if self.hidden_size % self.num_attention_heads:
            return (f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                    f"{self.num_attention_heads}, expected heads that divide it")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACTIVATIONS:
            return f"hidden_act is {_short(self.hidden_act)}, expected one of {', '.join(sorted(ACTIVATIONS))}"
        if not isinstance(self.extra, dict):
            return f"extra is {type(self.extra).__name__}, expected an object"
        return ""

    @property
    def padded_vocab_size(self) -> int:
        return math.ceil(self.vocab_size / VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    @classmethod
    def from_dict(cls, values: Any, source: str | Path = "config", strict: bool = True,
                  modern_keys: Collection[str] = ()) -> "BertConfig":
        """A config from parsed JSON whose every key is known, whose required keys are present and whose values
        can build a model; ConfigError "<source>: <problem>; <fix>" otherwise. `strict=False` is for a checkpoint's
        own record: keys that older versions kept there without using them are dropped rather than refused.
        `modern_keys` (families.py passes them) names a ModernBERT key met here as one."""
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: holds a JSON {type(values).__name__}, expected an object of BERT settings "
                              "such as bert_configs/base.json")
        extra = values.get("extra", {})  # the dataclass's own field, as asdict() writes it
        if not isinstance(extra, dict):
            raise ConfigError(f"{source}: extra is {type(extra).__name__}, expected an object; fix it in the config")
        given = {**extra, **{k: v for k, v in values.items() if k != "extra"}}
        if not strict:
            given = {k: v for k, v in given.items() if accepts_config_key(k, BERT_KEYS)}
        problem = unknown_keys_problem(given, BERT_KEYS, "BERT", BERT_FIELDS, modern_keys, "ModernBERT") or \
            missing_keys_problem(given, BERT_REQUIRED_KEYS, "BERT", "bert_configs/base.json")
        if problem:
            raise ConfigError(f"{source}: {problem}")
        problem = _unused_key_problem(given)
        if problem:
            raise ConfigError(f"{source}: {problem}; fix it in the config")
        try:
            return cls(**{k: v for k, v in given.items() if k in BERT_FIELDS},
                       extra={k: v for k, v in given.items() if k not in BERT_FIELDS})
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}; fix it in the config") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> "BertConfig":
        """A `bert_config.json` or Hugging Face `config.json`; ConfigError naming the file for any bad content."""
        return cls.from_dict(read_config_json(path), source=path)

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        extra = values.pop("extra")
        return {**extra, **values}

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


BERT_FIELDS = frozenset(f.name for f in fields(BertConfig)) - {"extra"}
BERT_KEYS = BERT_FIELDS | BERT_UNUSED_KEYS | TRANSFORMERS_COMMON_KEYS


def _unused_key_problem(given: dict[str, Any]) -> str:
    """A key our BERT does not use that asks for a model it is not: "" when there is none."""
    if given.get("model_type", "bert") != "bert":
        return f"model_type is {_short(given['model_type'])}, expected bert (or modernbert for the modern family)"
    if given.get("position_embedding_type", "absolute") != "absolute":
        return (f"position_embedding_type is {_short(given['position_embedding_type'])}, expected absolute (the "
                "only position embeddings this BERT has)")
    for key in ("is_decoder", "add_cross_attention"):
        if given.get(key):
            return f"{key} is {_short(given[key])}, expected false (this BERT is a bidirectional encoder)"
    return per_layer_config_problem(given)


def read_config_json(path: str | Path) -> Any:
    """The parsed JSON of a model config file; ConfigError naming the file when it cannot be read or parsed."""
    try:
        text = read_text_file(path, "BERT config file")
    except InputError as error:
        raise ConfigError(str(error)) from None
    try:
        return json.loads(text.removeprefix("\ufeff"))  # editors on Windows may write a byte-order mark
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: malformed JSON ({error.msg} at line {error.lineno} column {error.colno}); "
                          "fix the config file") from None
    except (ValueError, RecursionError) as error:  # integers of over 4300 digits, nesting deeper than the stack
        raise ConfigError(f"{path}: unusable JSON ({str(error).splitlines()[0][:120]}); fix the config file"
                          ) from None


def _gelu_erf(x: Tensor) -> Tensor:
    return F.gelu(x)  # the exact erf form, as Google's BERT


ACTIVATIONS = {
    "gelu": _gelu_erf,
    "bias_gelu": _gelu_erf,  # NVIDIA's name for the same function fused with the bias add
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "swish": F.silu,
    "silu": F.silu,
    "tanh": torch.tanh,
}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, positions: Optional[Tensor] = None) -> Tensor:
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(positions)
        return self.dropout(self.LayerNorm(x))


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) that, outside autograd under autocast, keeps its weight cast to the
    autocast dtype until the weight changes: inference then casts each weight once, not on every call."""

    _cast: Optional[tuple[Any, Tensor, Optional[Tensor]]] = None

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or not torch.is_autocast_enabled(x.device.type) or \
                torch.jit.is_tracing() or torch.compiler.is_compiling():
            return super().forward(x)
        dtype = torch.get_autocast_dtype(x.device.type)
        params = (self.weight,) if self.bias is None else (self.weight, self.bias)
        key = (dtype, tuple((p.data_ptr(), p._version) for p in params))
        if self._cast is None or self._cast[0] != key:
            bias = None if self.bias is None else self.bias.to(dtype)
            self._cast = (key, self.weight.to(dtype), bias)
        return F.linear(x, self._cast[1], self._cast[2])

    def train(self, mode: bool = True) -> "Linear":
        self._cast = None  # training changes the weights: no stale copy is kept alive meanwhile
        return super().train(mode)


class TokenPacking:
    """The real (attention_mask 1) tokens of a padded [B, S] batch: moves [B, S, H] <-> [T, H]. `seq` is S
    without the trailing columns that are padding in every row (attention runs on [B, seq] only)."""

    def __init__(self, attention_mask: Tensor) -> None:
        self.batch, self.seq = attention_mask.shape
        self.index = attention_mask.reshape(-1).nonzero().squeeze(1)

    @classmethod
    def of(cls, attention_mask: Optional[Tensor]) -> Optional["TokenPacking"]:
        """None when there is nothing to skip (or no token at all)."""
        if attention_mask is None or attention_mask.dim() != 2:
            return None
        occupied = attention_mask.any(0).nonzero()
        if occupied.numel() == 0:
            return None
        packing = cls(attention_mask[:, : int(occupied[-1]) + 1])
        return packing if packing.index.numel() < attention_mask.numel() else None

    def pack(self, x: Tensor) -> Tensor:
        return x.reshape(self.batch * self.seq, x.shape[-1]).index_select(0, self.index)

    def unpack(self, x: Tensor) -> Tensor:
        """Zeros at the padded positions."""
        full = x.new_zeros(self.batch * self.seq, x.shape[-1]).index_copy(0, self.index, x)
        return full.view(self.batch, self.seq, x.shape[-1])


def attend(q: Tensor, k: Tensor, v: Tensor, attention_bias: Optional[Tensor], dropout_prob: float,
           training: bool) -> Tensor:
    """Scaled dot-product attention of [batch, heads, seq, head_dim] queries, keys and values with an additive
    bias (broadcast to [batch, heads, seq, seq]); dropout on the probabilities while training."""
    if training and torch.is_grad_enabled() and q.device.type == "cpu":
        # On CPUs SDPA's backward (and its dropout) is about 2.5x slower than these explicit steps.
        return attend_step_by_step(q * q.shape[-1] ** -0.5, k, v, attention_bias, dropout_prob)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias,
                                          dropout_p=dropout_prob if training else 0.0)


def attend_step_by_step(scaled_q: Tensor, k: Tensor, v: Tensor, attention_bias: Optional[Tensor],
                        dropout_prob: float) -> Tensor:
    """attend's steps written out, for queries already scaled by 1 / sqrt(head_dim); dropout_prob 0: none."""
    scores = torch.matmul(scaled_q, k.transpose(-1, -2))
    if attention_bias is not None:
        scores = scores + attention_bias
    return torch.matmul(dropout(torch.softmax(scores, dim=-1), dropout_prob, training=True), v)


def attend_by_three_products(x: Tensor, projections: Iterable[tuple[Tensor, Optional[Tensor]]], num_heads: int,
                             attention_bias: Optional[Tensor],
                             position: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """Attention of [batch, seq, width] states as an ONNX export computes it: Q, K and V each a product of its own
    (weight, bias), the first already holding the softmax scale; `position` (rotary) applied to Q and K."""
    batch, seq, _ = x.shape
    q, k, v = (F.linear(x, weight, bias).view(batch, seq, num_heads, -1).transpose(1, 2)
               for weight, bias in projections)
    if position is not None:
        q, k = position(q), position(k)
    context = attend_step_by_step(q, k, v, attention_bias, dropout_prob=0.0)
    return context.transpose(1, 2).reshape(batch, seq, -1)


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob
        self._fused_cache: Optional[tuple[Any, Tensor, Tensor]] = None

    def fused_qkv(self, device_type: str) -> tuple[Tensor, Tensor]:
        """Q, K and V weights (and biases) stacked for one GEMM; the weights stay separate parameters so names
        and LAMB trust ratios match. Without autograd the stack (cast to the autocast dtype) is kept until a
        parameter changes, so inference does not rebuild it on every call."""
        params = (self.query.weight, self.key.weight, self.value.weight, self.query.bias, self.key.bias,
                  self.value.bias)
        if torch.is_grad_enabled() or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return torch.cat(params[:3]), torch.cat(params[3:])
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
        key = (dtype, tuple((p.data_ptr(), p._version) for p in params))
        if self._fused_cache is None or self._fused_cache[0] != key:
            weight, bias = torch.cat(params[:3]), torch.cat(params[3:])
            if dtype is not None:
                weight, bias = weight.to(dtype), bias.to(dtype)
            self._fused_cache = (key, weight, bias)
        return self._fused_cache[1], self._fused_cache[2]

    def forward(self, x: Tensor, attention_bias: Optional[Tensor], packing: Optional[TokenPacking] = None) -> Tensor:
        hidden = x.shape[-1]
        if torch.onnx.is_in_onnx_export() and packing is None and not self.training:
            return self._three_products(x, attention_bias)
        qkv = F.linear(x, *self.fused_qkv(x.device.type))
        if packing is not None:
            qkv = packing.unpack(qkv)  # attention needs the [B, S] layout; padded rows are zeros
        batch, seq = qkv.shape[:2]
        qkv = qkv.view(batch, seq, 3, self.num_heads, hidden // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [batch, heads, seq, head_dim]
        context = attend(q, k, v, attention_bias, self.dropout_prob, self.training)
        context = context.transpose(1, 2).reshape(batch, seq, hidden)
        return packing.pack(context) if packing is not None else context

    def _three_products(self, x: Tensor, attention_bias: Optional[Tensor]) -> Tensor:
        """forward in an ONNX export: Q, K and V each its own product, and the softmax scale folded into Q's weights
        (constants in the graph). ONNX Runtime copies a fused product's three parts apart (a Split) where three
        products need none, and its int8 graph quantizes x once a product either way; SDPA's exported scale is a
        product of the activations at every call."""
        scale = (self.query.out_features // self.num_heads) ** -0.5  # a number, not a traced shape: folded
        projections = ((self.query.weight * scale, self.query.bias * scale), (self.key.weight, self.key.bias),
                       (self.value.weight, self.value.bias))
        return attend_by_three_products(x, projections, self.num_heads, attention_bias)


class BertResidualOutput(nn.Module):
    """dense -> dropout -> LayerNorm(x + residual): the output block after attention and after the MLP."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, config.hidden_size)

    def forward(self, x: Tensor, attention_bias: Optional[Tensor], packing: Optional[TokenPacking] = None) -> Tensor:
        return self.output(self.self(x, attention_bias, packing), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACTIVATIONS[config.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, config.intermediate_size)

    def forward(self, x: Tensor, attention_bias: Optional[Tensor], packing: Optional[TokenPacking] = None) -> Tensor:
        x = self.attention(x, attention_bias, packing)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.checkpoint_activations = False

    def forward(self, x: Tensor, attention_bias: Optional[Tensor], packing: Optional[TokenPacking] = None) -> Tensor:
        """x: [B, S, H], or the packed [T, H] real tokens when `packing` is given."""
        for layer in self.layer:
            if self.checkpoint_activations and self.training and torch.is_grad_enabled():
                # Recompute each layer in backward: memory of one layer's activations instead of all of them.
                x = checkpoint(layer, x, attention_bias, packing, use_reentrant=False)
            else:
                x = layer(x, attention_bias, packing)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: Tensor) -> Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))


def attention_bias_from_mask(attention_mask: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """[batch, seq] mask of 1 (token) / 0 (padding) -> additive bias [batch, 1, 1, seq] for SDPA, or None."""
    if attention_mask is None:
        return None
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    bias.masked_fill_(attention_mask == 0, torch.finfo(dtype).min)
    return bias[:, None, None, :]


class BertModel(nn.Module):
    """The encoder. forward(input_ids [B, S] long, token_type_ids [B, S], attention_mask [B, S] 1/0)
    returns (sequence_output [B, S, H], pooled_output [B, H] or None).

    With `skip_padding` (the default) and a padded batch, every layer's dense parts run on the real tokens only
    and sequence_output is 0 at padded positions; real positions are unchanged (padded keys are masked out of
    attention either way). Callers that need the padded positions computed as a dense BERT does (the SQuAD loss
    takes its softmax over them) pass keep_padded_positions=True. Set skip_padding False for graph export.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.skip_padding = True

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        keep_padded_positions: bool = False,
        document_ids: Optional[Tensor] = None,
    ) -> tuple[Tensor, Optional[Tensor]]:
        """document_ids (documents.py), when given, make each row several documents: attention stays inside each,
        positions restart at each, and attention_mask is taken from them (0 at padding)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if document_ids is not None:
            document_ids = document_runs(document_ids)  # the one rule of what a document is (documents.py)
        positions = None if document_ids is None else positions_within_documents(document_ids)
        if document_ids is not None:
            attention_mask = (document_ids != 0).long()
        x = self.embeddings(input_ids, token_type_ids, positions)
        # Under autocast the attention scores are in the autocast dtype; the bias must match it.
        bias_dtype = compute_dtype(x)

        def bias_for(columns: int) -> Optional[Tensor]:
            if document_ids is not None:
                return document_attention_bias(document_ids[:, :columns], bias_dtype)
            return attention_bias_from_mask(None if attention_mask is None else attention_mask[:, :columns],
                                            bias_dtype)

        packing = TokenPacking.of(attention_mask) if self.skip_padding and not keep_padded_positions else None
        if packing is None:
            x = self.encoder(x, bias_for(x.shape[1]))
        else:
            full_length, seq = x.shape[1], packing.seq
            attention_bias = bias_for(seq)
            x = packing.unpack(self.encoder(packing.pack(x[:, :seq]), attention_bias, packing))
            x = F.pad(x, (0, 0, 0, full_length - seq))
        pooled = self.pooler(x) if self.pooler is not None else None
        return x, pooled


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.activation(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """transform -> decoder whose weight is the word-embedding matrix, plus a bias of its own."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def token_rows(self) -> tuple[Tensor, Tensor]:
        """The decoder's weight and bias rows of the vocab's tokens: the padding rows past them never stand for a
        token, so they stay out of the logits and the softmax."""
        return self.decoder.weight[: self.vocab_size], self.bias[: self.vocab_size]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(self.transform(x), *self.token_rows())

    def loss(self, x: Tensor, labels: Tensor) -> tuple[Optional[Tensor], Tensor]:
        """(logits or None, masked-LM cross-entropy in fp32) of the predicted positions' hidden states x [rows, H]
        (chunked_cross_entropy.masked_lm_loss: no logits while training in bf16 or fp32)."""
        return masked_lm_loss(self.transform(x), *self.token_rows(), labels)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = Linear(config.hidden_size, 2)


class BertPreTrainedModel(nn.Module):
    """Google's initialization: N(0, initializer_range) weights, zero biases, LayerNorm 1/0."""

    config: BertConfig

    def init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, BertLMPredictionHead):
                nn.init.zeros_(module.bias)

    def set_checkpoint_activations(self, enabled: bool) -> None:
        self.bert.encoder.checkpoint_activations = enabled


class PreTrainingOutput(NamedTuple):
    loss: Optional[Tensor]  # masked_lm_loss + next_sentence_loss, when labels are given
    masked_lm_loss: Optional[Tensor]
    next_sentence_loss: Optional[Tensor]
    # [n_predicted, vocab_size], or [B, S, vocab_size] when every position is predicted; None when the loss was
    # computed with gradients (bf16/fp32) by chunked_cross_entropy, which makes no logits
    prediction_logits: Optional[Tensor]
    seq_relationship_logits: Tensor  # [B, 2]


class BertForPreTraining(BertPreTrainedModel):
    """Masked-LM and next-sentence heads on the encoder.

    masked_lm_labels: [B, S] long, the original token id at predicted positions and a negative number (-1 as
    NVIDIA and bertrecipe.pretraining.masking.IGNORE_INDEX, or -100 as transformers) elsewhere. The MLM head runs
    only where the label is >= 0. Without labels it runs where `predict_positions` ([B, S] bool) is true, or
    everywhere when that is None too. The losses (the pre-training criterion's) are cross-entropies in fp32:
    a softmax over the vocab in fp16 or bf16 would lose the loss's precision.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        masked_lm_labels: Optional[Tensor] = None,
        next_sentence_labels: Optional[Tensor] = None,
        predict_positions: Optional[Tensor] = None,
        document_ids: Optional[Tensor] = None,
    ) -> PreTrainingOutput:
        sequence_output, pooled = self.bert(input_ids, token_type_ids, attention_mask, document_ids=document_ids)
        nsp_logits = self.cls.seq_relationship(pooled)
        if masked_lm_labels is not None:
            predict_positions = masked_lm_labels >= 0
        if predict_positions is not None:
            sequence_output = sequence_output[predict_positions]
        mlm_logits = mlm_loss = nsp_loss = loss = None
        if masked_lm_labels is not None:
            mlm_logits, mlm_loss = self.cls.predictions.loss(sequence_output, masked_lm_labels[predict_positions])
            loss = mlm_loss
        else:
            mlm_logits = self.cls.predictions(sequence_output)
        if next_sentence_labels is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_labels.view(-1).long())
            loss = nsp_loss if loss is None else loss + nsp_loss
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits)


def classification_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """GLUE's loss of [B, num_labels] logits: mean squared error for one label (regression), else cross-entropy."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.view(-1), labels.float().view(-1))
    return F.cross_entropy(logits, labels.view(-1).long())


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor, end_positions: Tensor) -> Tensor:
    """SQuAD's loss, (CE(start) + CE(end)) / 2 over [B, S] logits; positions past the window (truncated answers)
    point at an ignored index."""
    seq_len = start_logits.shape[1]
    start, end = start_positions.clamp(0, seq_len), end_positions.clamp(0, seq_len)
    return (F.cross_entropy(start_logits, start, ignore_index=seq_len)
            + F.cross_entropy(end_logits, end, ignore_index=seq_len)) / 2


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction. forward returns (start_logits [B, S], end_logits [B, S]) and, given start and end
    positions [B], the loss as (CE(start) + CE(end)) / 2 with positions outside the sequence ignored."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        start_positions: Optional[Tensor] = None,
        end_positions: Optional[Tensor] = None,
    ) -> tuple[Optional[Tensor], Tensor, Tensor]:
        # The loss's softmax runs over every position, padded ones included, as in Google's and NVIDIA's code.
        needs_padding = start_positions is not None
        sequence_output, _ = self.bert(input_ids, token_type_ids, attention_mask,
                                       keep_padded_positions=needs_padding)
        start_logits, end_logits = self.qa_outputs(sequence_output).float().unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = span_loss(start_logits, end_logits, start_positions, end_positions)
        return loss, start_logits, end_logits


class BertForSequenceClassification(BertPreTrainedModel):
    """Sentence (pair) classification on the pooled [CLS] output; num_labels 1 means regression (MSE).
    forward returns (loss or None, logits [B, num_labels])."""

    def __init__(self, config: BertConfig, num_labels: int) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.classifier = Linear(config.hidden_size, num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Optional[Tensor] = None,
        attention_mask: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
    ) -> tuple[Optional[Tensor], Tensor]:
        _, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.classifier(self.dropout(pooled)).float()
        loss = None if labels is None else classification_loss(logits, labels)
        return loss, logits
