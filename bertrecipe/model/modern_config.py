"""The configuration of the modern encoder family (ModernBERT, 2024): read from a Hugging Face ModernBERT
`config.json` in either the keys the pinned transformers writes (`layer_types`, `rope_parameters`) or the older keys
of the released checkpoints (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`), checked on
construction, and written back in the current keys so that transformers loads what we save.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bertrecipe.model.bert import ACTIVATIONS, ConfigError, _short, size_problem

MODEL_TYPE = "modernbert"
LAYER_TYPES = ("full_attention", "sliding_attention")
# Keys only a modern config has: a config file with one of them builds this family even without model_type.
MODERN_ONLY_KEYS = ("layer_types", "rope_parameters", "global_attn_every_n_layers", "global_rope_theta",
                    "local_rope_theta", "local_attention", "norm_bias", "mlp_bias", "hidden_activation")
_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings", "local_attention")
_PROBABILITY_KEYS = ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout")
_POSITIVE_KEYS = ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                  "local_rope_theta")
_FLAG_KEYS = ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias")


def is_modern(values: dict[str, Any]) -> bool:
    """Whether parsed config JSON describes the modern family (else it is a BERT config)."""
    return values.get("model_type") == MODEL_TYPE or any(key in values for key in MODERN_ONLY_KEYS)


@dataclass
class ModernBertConfig:
    """ModernBERT's settings (defaults: ModernBERT-base). Unknown keys are kept in `extra` and written back."""

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0
    mlp_dropout: float = 0.0
    layer_types: list = field(default_factory=list)  # empty: a global layer every 3rd, from the first
    local_attention: int = 128  # the whole window: a local layer sees local_attention // 2 tokens on each side
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    pad_token_id: int = 50283
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.layer_types, (list, tuple)) and not self.layer_types:
            self.layer_types = every_nth_global(self.num_hidden_layers, 3)
        problem = self._problem()
        if problem:
            raise ConfigError(problem)

    def _problem(self) -> str:
        """The first invalid value as "<key> is <value>, expected ...", or ""; numbers become plain Python ones."""
        problem = size_problem(self, _SIZE_KEYS)
        if problem:
            return problem
        for key in _PROBABILITY_KEYS + _POSITIVE_KEYS:
            value = getattr(self, key)
            probability = key in _PROBABILITY_KEYS
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                    or not (0 <= value < 1 if probability else value > 0):
                wanted = "a probability in [0, 1)" if probability else "a finite number > 0"
                return f"{key} is {_short(value)}, expected {wanted}"
            setattr(self, key, float(value))
        for key in _FLAG_KEYS:
            if not isinstance(getattr(self, key), bool):
                return f"{key} is {_short(getattr(self, key))}, expected true or false"
        return self._structure_problem()

    def _structure_problem(self) -> str:
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            return (f"hidden_size {self.hidden_size} over num_attention_heads {self.num_attention_heads} is not an "
                    "even whole head size, expected heads that divide it into even sizes (rotary positions)")
        for key in ("hidden_activation", "classifier_activation"):
            if getattr(self, key) not in ACTIVATIONS:
                return f"{key} is {_short(getattr(self, key))}, expected one of {', '.join(sorted(ACTIVATIONS))}"
        if not isinstance(self.layer_types, (list, tuple)) or len(self.layer_types) != self.num_hidden_layers \
                or any(kind not in LAYER_TYPES for kind in self.layer_types):
            return (f"layer_types is {_short(self.layer_types)}, expected a list of {self.num_hidden_layers} entries "
                    f"(num_hidden_layers), each one of {', '.join(LAYER_TYPES)}")
        self.layer_types = list(self.layer_types)
        if self.local_attention % 2:
            return f"local_attention is {self.local_attention}, expected an even window (half on each side)"
        if self.classifier_pooling not in ("cls", "mean"):
            return f"classifier_pooling is {_short(self.classifier_pooling)}, expected cls or mean"
        if isinstance(self.pad_token_id, bool) or not isinstance(self.pad_token_id, numbers.Integral):
            return f"pad_token_id is {_short(self.pad_token_id)}, expected a token id"
        if not isinstance(self.extra, dict):
            return f"extra is {type(self.extra).__name__}, expected an object"
        return ""

    @property
    def padded_vocab_size(self) -> int:
        return self.vocab_size  # the config's own size: ModernBERT pads its vocab itself (to a multiple of 64)

    @property
    def type_vocab_size(self) -> int:
        return 2  # no segment embeddings: the segment ids 0 and 1 of NVIDIA-style shards are accepted and unused

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str | Path = "config") -> "ModernBertConfig":
        """A config from parsed JSON in current or older transformers keys; ConfigError naming source and key."""
        values = dict(values)
        try:
            kwargs = _normalized_keys(values)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}; fix it in the config") from None
        known = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: v for k, v in kwargs.items() if k not in known}
        try:
            return cls(**{k: v for k, v in kwargs.items() if k in known}, extra=extra)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}; fix it in the config") from None

    def to_dict(self) -> dict[str, Any]:
        """transformers' current keys (model_type, layer_types, rope_parameters) and the kept unknown ones."""
        values = asdict(self)
        extra = values.pop("extra")
        global_theta, local_theta = values.pop("global_rope_theta"), values.pop("local_rope_theta")
        values["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": global_theta},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}
        return {**extra, **values, "model_type": MODEL_TYPE}


def every_nth_global(layers: int, every: int) -> list[str]:
    """ModernBERT's pattern: layer i is global when i is a multiple of `every`, local otherwise."""
    return ["sliding_attention" if i % every else "full_attention" for i in range(layers)]


def _normalized_keys(values: dict[str, Any]) -> dict[str, Any]:
    """The older keys of the released checkpoints turned into the current ones; rope variants this model does not
    implement (scaling) refused."""
    every = values.pop("global_attn_every_n_layers", None)
    if every is not None and not values.get("layer_types"):
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ConfigError(f"global_attn_every_n_layers is {_short(every)}, expected a whole number >= 1")
        layers = values.get("num_hidden_layers", ModernBertConfig.num_hidden_layers)
        if isinstance(layers, numbers.Integral) and not isinstance(layers, bool) and 1 <= layers <= 10_000:
            values["layer_types"] = every_nth_global(int(layers), int(every))
    if values.get("rope_scaling") is not None:
        raise ConfigError(f"rope_scaling is {_short(values['rope_scaling'])}, expected null (only plain rotary "
                          "positions are implemented)")
    values.pop("rope_scaling", None)
    rope = values.pop("rope_parameters", None)
    if rope is not None:
        if not isinstance(rope, dict):
            raise ConfigError(f"rope_parameters is {_short(rope)}, expected an object per layer type")
        for kind, key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
            params = rope.get(kind) or {}
            if not isinstance(params, dict) or params.get("rope_type", "default") != "default":
                raise ConfigError(f"rope_parameters.{kind} is {_short(params)}, expected rope_type default")
            if "rope_theta" in params:
                values[key] = params["rope_theta"]
    values.pop("model_type", None)
    return values
