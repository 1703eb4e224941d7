"""The configuration of the modern encoder family (ModernBERT, 2024): read from a Hugging Face ModernBERT
`config.json` in either the keys the pinned transformers writes (`layer_types`, `rope_parameters`) or the older keys
of the released checkpoints (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`), checked on
construction, and written back in the current keys so that transformers loads what we save. Every key must be known,
the keys that shape the model present, and two spellings of one setting agree: a mismatch names the key as the file
spells it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bertrecipe.model.bert import (
    ACTIVATIONS,
    BERT_FIELDS,
    TRANSFORMERS_COMMON_KEYS,
    ConfigError,
    _short,
    accepts_config_key,
    missing_keys_problem,
    per_layer_config_problem,
    size_problem,
    unknown_keys_problem,
)

MODEL_TYPE = "modernbert"
LAYER_TYPES = ("full_attention", "sliding_attention")
# Keys only a modern config has: a config file without model_type that has one of them builds this family.
MODERN_ONLY_KEYS = ("layer_types", "rope_parameters", "global_attn_every_n_layers", "global_rope_theta",
                    "local_rope_theta", "local_attention", "norm_bias", "mlp_bias", "hidden_activation")
_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings", "local_attention")
_PROBABILITY_KEYS = ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout")
_POSITIVE_KEYS = ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                  "local_rope_theta")
_FLAG_KEYS = ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias")
# As BERT's (bert.BERT_REQUIRED_KEYS); the released ModernBERT config.json files always give them.
MODERN_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "max_position_embeddings")
# Other spellings of our fields (read, checked to agree, written back as the fields): transformers' older keys, its
# current rope_parameters, sliding_window (half of local_attention, a property transformers sets from the file) and
# a single rope_theta (which transformers' ModernBERT ignores: accepted only where it equals both bases).
SPELLINGS = frozenset({"global_attn_every_n_layers", "rope_parameters", "rope_scaling", "rope_theta",
                       "sliding_window", "model_type"})
# ModernBERT keys our model has no use for: transformers' ModernBertConfig (current and 4.x) and the keys of the
# released checkpoints' config.json (their norms take norm_eps; layer_norm_eps and position_embedding_type are
# leftovers that transformers never reads).
MODERN_UNUSED_KEYS = frozenset({"cls_token_id", "deterministic_flash_attn", "sparse_prediction",
                                "sparse_pred_ignore_index", "reference_compile", "repad_logits_with_grad",
                                "layer_norm_eps", "position_embedding_type"})
MAX_LAYERS = 10_000  # a layer pattern is a list per layer: far more than any model has, far less than memory
ROPE_KINDS = {"global_rope_theta": "full_attention", "local_rope_theta": "sliding_attention"}


def is_modern(values: dict[str, Any]) -> bool:
    """Whether parsed config JSON describes the modern family (else it is a BERT config): its model_type says so,
    or, where it has none, a key only ModernBERT has."""
    if "model_type" in values:
        return values["model_type"] == MODEL_TYPE
    return any(key in values for key in MODERN_ONLY_KEYS)


@dataclass
class ModernBertConfig:
    """ModernBERT's settings (defaults: ModernBERT-base, for code; a file must give MODERN_REQUIRED_KEYS). Keys of
    transformers' configs that the model does not use are kept in `extra` and written back."""

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
        problem = self._problem()
        if problem:
            raise ConfigError(problem)

    def _problem(self) -> str:
        """The first invalid value as "<key> is <value>, expected ...", or ""; numbers become plain Python ones."""
        problem = size_problem(self, _SIZE_KEYS)
        if problem:
            return problem
        if self.num_hidden_layers > MAX_LAYERS:
            return f"num_hidden_layers is {self.num_hidden_layers}, expected at most {MAX_LAYERS}"
        if isinstance(self.layer_types, (list, tuple)) and not self.layer_types:  # sizes first: a valid count
            self.layer_types = every_nth_global(self.num_hidden_layers, 3)
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
    def from_dict(cls, values: Any, source: str | Path = "config", strict: bool = True) -> "ModernBertConfig":
        """A config from parsed JSON in current or older transformers keys, every key known, the required ones
        present and no two spellings disagreeing; ConfigError naming source and key. `strict=False` is for a
        checkpoint's own record: keys that older versions kept there without using them are dropped."""
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: holds a JSON {type(values).__name__}, expected an object of ModernBERT "
                              "settings such as bert_configs/modernbert-base.json")
        values = {k: v for k, v in values.items() if strict or accepts_config_key(k, MODERN_KEYS)}
        problem = unknown_keys_problem(values, MODERN_KEYS, "ModernBERT", MODERN_SETTINGS, BERT_FIELDS, "BERT") or \
            missing_keys_problem(values, MODERN_REQUIRED_KEYS, "ModernBERT", "bert_configs/modernbert-base.json")
        if problem:
            raise ConfigError(f"{source}: {problem}")
        try:
            kwargs = _normalized_keys(values)
        except ConfigError as error:  # its messages end with their own fix
            raise ConfigError(f"{source}: {error}") from None
        try:
            return cls(**{k: v for k, v in kwargs.items() if k in MODERN_FIELDS},
                       extra={k: v for k, v in kwargs.items() if k not in MODERN_FIELDS})
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}; fix it in the config") from None

    def to_dict(self) -> dict[str, Any]:
        """transformers' current keys (model_type, layer_types, rope_parameters) and the kept unused ones."""
        values = asdict(self)
        extra = values.pop("extra")
        global_theta, local_theta = values.pop("global_rope_theta"), values.pop("local_rope_theta")
        values["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": global_theta},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}
        return {**extra, **values, "model_type": MODEL_TYPE}


def every_nth_global(layers: int, every: int) -> list[str]:
    """ModernBERT's pattern: layer i is global when i is a multiple of `every`, local otherwise."""
    return ["sliding_attention" if i % every else "full_attention" for i in range(layers)]


FIX = "; fix it in the config"
MODERN_FIELDS = frozenset(f.name for f in fields(ModernBertConfig)) - {"extra"}
MODERN_SETTINGS = MODERN_FIELDS | SPELLINGS  # what a misspelt key most likely meant
MODERN_KEYS = MODERN_SETTINGS | MODERN_UNUSED_KEYS | TRANSFORMERS_COMMON_KEYS


def _normalized_keys(values: dict[str, Any]) -> dict[str, Any]:
    """The fields, each from whichever spelling the file uses; ConfigError naming the key as the file spells it for
    a bad value, and both keys for two spellings that disagree. Rope variants this model does not implement
    (scaling) are refused."""
    values = dict(values)
    model_type = values.pop("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise ConfigError(f"model_type is {_short(model_type)}, expected {MODEL_TYPE}{FIX}")
    if values.get("rope_scaling") is not None:
        raise ConfigError(f"rope_scaling is {_short(values['rope_scaling'])}, expected null (only plain rotary "
                          f"positions are implemented){FIX}")
    values.pop("rope_scaling", None)
    problem = per_layer_config_problem(values)
    if problem:
        raise ConfigError(problem + FIX)
    _layer_pattern(values)
    _local_window(values)
    _rotary_bases(values)
    return values


def _whole_number(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{key} is {_short(value)}, expected a whole number >= 1{FIX}")
    return int(value)


def _rotary_base(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{key} is {_short(value)}, expected a finite number > 0{FIX}")


def _layer_pattern(values: dict[str, Any]) -> None:
    """layer_types from global_attn_every_n_layers where the file gives only that; both must name the same
    layers (transformers would silently take layer_types)."""
    if values.get("layer_types") is None:
        values.pop("layer_types", None)  # null, as transformers reads it: the default pattern
    if "global_attn_every_n_layers" not in values:
        return
    every = _whole_number("global_attn_every_n_layers", values.pop("global_attn_every_n_layers"))
    layers = values["num_hidden_layers"]
    if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or not 1 <= layers <= MAX_LAYERS:
        return  # the size check names num_hidden_layers
    pattern = every_nth_global(int(layers), every)
    listed = values.get("layer_types")
    if not listed:
        values["layer_types"] = pattern
    elif isinstance(listed, (list, tuple)) and len(listed) == layers and list(listed) != pattern \
            and all(kind in LAYER_TYPES for kind in listed):
        raise ConfigError(f"layer_types (global layers {_short(_global_layers(listed))}) contradicts "
                          f"global_attn_every_n_layers {every} (global layers {_short(_global_layers(pattern))}); "
                          "keep one of the two in the config")


def _global_layers(layer_types: list[str]) -> list[int]:
    return [i for i, kind in enumerate(layer_types) if kind == "full_attention"]


def _local_window(values: dict[str, Any]) -> None:
    """local_attention from sliding_window (half the window on each side) where the file gives only that; both
    must agree."""
    if "sliding_window" not in values:
        return
    half = _whole_number("sliding_window", values.pop("sliding_window"))
    window = values.setdefault("local_attention", 2 * half)
    if window != 2 * half:
        raise ConfigError(f"local_attention {_short(window)} contradicts sliding_window {half} (half the window: "
                          f"local_attention {2 * half}); keep one of the two in the config")


def _rotary_bases(values: dict[str, Any]) -> None:
    """global_rope_theta and local_rope_theta from rope_parameters or the older keys; two spellings of one base,
    and a single rope_theta, must agree with it."""
    nested = _nested_thetas(values.pop("rope_parameters", None))
    given: dict[str, list[tuple[str, Any]]] = {}  # our key -> [(the key as the file spells it, its value)]
    for name, kind in ROPE_KINDS.items():
        given[name] = [(f"rope_parameters.{kind}.rope_theta", nested[kind])] if kind in nested else []
        if name in values:
            given[name].append((name, values.pop(name)))
        for spelling, theta in given[name]:
            _rotary_base(spelling, theta)
        if len(given[name]) == 2 and given[name][0][1] != given[name][1][1]:
            (first, a), (second, b) = given[name]
            raise ConfigError(f"{first} {a} contradicts {second} {b}; keep one of the two in the config")
        if given[name]:
            values[name] = given[name][0][1]
    _single_rope_theta(values, given)


def _single_rope_theta(values: dict[str, Any], given: dict[str, list[tuple[str, Any]]]) -> None:
    """A flat rope_theta, which transformers' ModernBERT ignores, is accepted only where it equals both bases."""
    single = values.pop("rope_theta", None)
    if single is None:
        return
    _rotary_base("rope_theta", single)
    for name, kind in ROPE_KINDS.items():
        base = values.get(name, getattr(ModernBertConfig, name))
        if single != base:
            spelled = given[name][0][0] if given[name] else f"the {kind} layers' default"
            raise ConfigError(f"rope_theta {single} contradicts {spelled} {base}: ModernBERT has one rotary base per "
                              f"layer type and transformers ignores rope_theta; give rope_parameters.{kind}.rope_theta "
                              "instead in the config")


def _nested_thetas(rope: Any) -> dict[str, Any]:
    """{layer kind: rope_theta} of transformers' rope_parameters, whose other settings must be plain rotary."""
    if rope is None:
        return {}
    if not isinstance(rope, dict) or not set(rope) <= set(LAYER_TYPES):
        raise ConfigError(f"rope_parameters is {_short(rope)}, expected an object per layer type "
                          f"({', '.join(LAYER_TYPES)}){FIX}")
    thetas = {}
    for kind in LAYER_TYPES:
        params = rope.get(kind) or {}
        if not isinstance(params, dict) or params.get("rope_type", "default") != "default" \
                or not set(params) <= {"rope_type", "rope_theta"}:
            raise ConfigError(f"rope_parameters.{kind} is {_short(params)}, expected rope_type default and a "
                              f"rope_theta{FIX}")
        if "rope_theta" in params:
            thetas[kind] = params["rope_theta"]
    return thetas
