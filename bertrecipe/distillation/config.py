"""What a distillation run learns from the teacher: NVIDIA's `distillation_config_*.json` (which terms, which loss for
each, which student layer learns from which teacher layer) and our additions (a weight per term, the prediction
term's loss and temperature). docs/distillation.md describes every key."""
from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union

from bertrecipe.common.errors import InputError
from bertrecipe.common.files import read_json_file

LAST_LAYER = "last_layer"  # MiniLM: the student's last layer learns from the teacher's last layer
UNIFORM = "uniform"  # TinyBERT: student layer s learns from teacher layer s * (teacher layers / student layers)
# The losses each term accepts (losses.py defines them): NVIDIA's names, and ours for the prediction term.
TERM_LOSSES = {
    "attention_loss": ("kld", "mse"),
    "hidden_state_loss": ("cosine", "mse"),
    "embedding_state_loss": ("cosine", "mse"),
    "value_state_loss": ("kld", "mse"),
    "pred_loss": ("soft_ce", "mse"),
}
TERM_FLAGS = ("use_attention_scores", "use_hidden_states", "use_value_states", "use_embedding_states",
              "use_pred_states")
TERM_WEIGHTS = ("attention_weight", "hidden_state_weight", "embedding_state_weight", "value_state_weight",
                "pred_weight")

# A student layer's teacher layer: 1-based, as transformers' hidden_states index (layer k's output is
# hidden_states[k]; 0 would be the embeddings, which no layer maps to).
LayerMapping = Union[str, tuple[int, ...]]


@dataclass(frozen=True)
class DistillationConfig:
    """The terms a student learns from (NVIDIA's five use_* flags), the loss of each, the layer map
    ("last_layer", "uniform" or one 1-based teacher layer per student layer), each term's weight in the total and
    the prediction term's loss and temperature. InputError on construction for a value that cannot be used;
    `source` (the file it was read from, when any) only names it in error messages."""

    use_attention_scores: bool = False
    use_hidden_states: bool = False
    use_value_states: bool = False
    use_embedding_states: bool = False
    use_pred_states: bool = False
    attention_loss: str = "kld"
    hidden_state_loss: str = "cosine"
    embedding_state_loss: str = "cosine"
    value_state_loss: str = "kld"
    student_teacher_layer_mapping: LayerMapping = LAST_LAYER
    attention_weight: float = 1.0
    hidden_state_weight: float = 1.0
    embedding_state_weight: float = 1.0
    value_state_weight: float = 1.0
    pred_weight: float = 1.0
    pred_loss: str = "soft_ce"
    temperature: float = 1.0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.student_teacher_layer_mapping, list):  # as JSON gives it; a tuple keeps it frozen
            object.__setattr__(self, "student_teacher_layer_mapping", tuple(self.student_teacher_layer_mapping))
        problem = _value_problem(self)
        if problem:
            raise InputError(f"{self.where}{problem}")
        for key in (*TERM_WEIGHTS, "temperature"):
            object.__setattr__(self, key, float(getattr(self, key)))  # JSON's 2 and 2.0 are one setting

    @property
    def where(self) -> str:
        """The prefix of an error message about this config: "<file>: " when it was read from one."""
        return f"{self.source}: " if self.source else ""


CONFIG_KEYS = tuple(f.name for f in fields(DistillationConfig) if f.name != "source")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."  # a pasted blob must not flood the one-line error


def _value_problem(config: DistillationConfig) -> str:
    """The first value that cannot be used, as "<key> is <value>, expected ...", or ""."""
    for key in TERM_FLAGS:
        if not isinstance(getattr(config, key), bool):
            return f"{key} is {_short(getattr(config, key))}, expected true or false"
    for key, accepted in TERM_LOSSES.items():
        if getattr(config, key) not in accepted:
            return f"{key} is {_short(getattr(config, key))}, expected {' or '.join(map(repr, accepted))}"
    for key in (*TERM_WEIGHTS, "temperature"):
        value = getattr(config, key)
        least = "> 0" if key == "temperature" else ">= 0"
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                or value < 0 or (key == "temperature" and value == 0):
            return f"{key} is {_short(value)}, expected a finite number {least}"
    problem = _mapping_problem(config.student_teacher_layer_mapping)
    if problem:
        return problem
    if not any(getattr(config, key) for key in TERM_FLAGS):
        return f"no term chosen: set at least one of {', '.join(TERM_FLAGS)} to true"
    return ""


def _mapping_problem(mapping: Any) -> str:
    if mapping in (LAST_LAYER, UNIFORM):
        return ""
    if isinstance(mapping, tuple) and mapping and all(
            isinstance(layer, int) and not isinstance(layer, bool) and layer >= 1 for layer in mapping):
        return ""
    return (f"student_teacher_layer_mapping is {_short(mapping)}, expected \"{LAST_LAYER}\", \"{UNIFORM}\" or a "
            "list of teacher layers (1-based), one per student layer")


def read_distillation_config(path: str | Path) -> DistillationConfig:
    """The config of a JSON file laid out as NVIDIA's distillation_config_*.json ({"distillation": true,
    "distillation_config": {...}}); InputError naming the file and the key for an unknown key, a value of the
    wrong type or kind, "distillation": false or no term chosen."""
    values = read_json_file(path, "distillation config file")
    if not isinstance(values, dict):
        raise InputError(f"{path}: holds a JSON {type(values).__name__}, expected an object such as "
                         "distillation/distillation_config_backbone.json")
    problem = _unknown_key_problem(values, ("distillation", "distillation_config"), "")
    if problem:
        raise InputError(f"{path}: {problem}")
    if values.get("distillation", True) is not True:
        raise InputError(f"{path}: distillation is {_short(values['distillation'])}, expected true (a file for a "
                         "distillation run; leave it out to train without a teacher)")
    terms = values.get("distillation_config")
    if not isinstance(terms, dict):
        raise InputError(f"{path}: distillation_config is {_short(terms)}, expected an object of the terms "
                         "(use_hidden_states, ...)")
    problem = _unknown_key_problem(terms, CONFIG_KEYS, "distillation_config.")
    if problem:
        raise InputError(f"{path}: {problem}")
    return DistillationConfig(**terms, source=str(path))


def _unknown_key_problem(values: dict[str, Any], known: tuple[str, ...], prefix: str) -> str:
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f"; the keys are {', '.join(known)}"
            return f"unknown key {prefix}{_short(key) if not str(key).isidentifier() else key}{hint}"
    return ""
