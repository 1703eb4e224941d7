"""The student: its projection to the teacher's width, its start from the teacher's layers (DistilBERT) and the
module that trains it (DistillationStudent), whose checkpoints are the student's own with known extras."""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig, is_modern_config
from bertrecipe.model.weights import DISTILLATION_PREFIX

# A layer's weights: BERT's (bert.)encoder.layer.<i>.* and the modern family's (model.)layers.<i>.*, 0-based.
_LAYER_KEY = re.compile(r"^(?P<stem>(?:.+\.)?(?:encoder\.layer|layers))\.(?P<index>\d+)\.(?P<rest>.+)$")
# What must agree for the teacher's embeddings, layers and heads to fit the student: every shape, and how the
# width is cut into heads (same shapes, other attention otherwise).
_SHAPE_KEYS = {
    False: ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "max_position_embeddings",
            "type_vocab_size"),
    True: ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "norm_bias", "attention_bias",
           "mlp_bias", "decoder_bias", "classifier_bias"),
}
# The widths a BERT student may narrow (its heads stay the teacher's, each narrower).
_NARROWER_KEYS = ("hidden_size", "intermediate_size")
PROJECTION_PREFIX = DISTILLATION_PREFIX + "projection."


class Projection(nn.Module):
    """The one learned map of the student's hidden and embedding states to the teacher's width (a linear layer,
    TinyBERT's), initialised as BERT's layers are (N(0, 0.02) weights, zero bias); the identity, with no
    parameters, where the widths are equal."""

    def __init__(self, student_width: int, teacher_width: int, initializer_range: float = 0.02) -> None:
        super().__init__()
        self.student_width, self.teacher_width = student_width, teacher_width
        if student_width == teacher_width:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        else:
            self.weight = nn.Parameter(torch.empty(teacher_width, student_width).normal_(0.0, initializer_range))
            self.bias = nn.Parameter(torch.zeros(teacher_width))

    def forward(self, states: Tensor) -> Tensor:
        return states if self.weight is None else F.linear(states, self.weight, self.bias)


def _fit_problem(teacher_config: ModelConfig, student_config: ModelConfig, teacher_layers: list[int]) -> str:
    modern = is_modern_config(teacher_config)
    if is_modern_config(student_config) != modern:
        families = ("ModernBERT", "BERT") if modern else ("BERT", "ModernBERT")
        return (f"the teacher is a {families[0]} and the student config a {families[1]}; a student started from "
                "the teacher's layers must be of the teacher's family")
    for key in _SHAPE_KEYS[modern]:
        student, teacher = getattr(student_config, key), getattr(teacher_config, key)
        if key in _NARROWER_KEYS and not modern and student != teacher:
            if student > teacher:  # a narrower one takes an evenly spaced share of the teacher's coordinates
                return (f"the student config's {key} {student} exceeds the teacher's {teacher}; a student started "
                        f"from the teacher's layers is at most as wide (or start it from random weights)")
        elif student != teacher:
            return (f"the student config's {key} {student} differs from the teacher's {teacher}; a student started "
                    f"from the teacher's layers needs the teacher's {key} (or start it from random weights)")
    if len(teacher_layers) != student_config.num_hidden_layers:
        return (f"{len(teacher_layers)} teacher layers given for a student of {student_config.num_hidden_layers} "
                "layers; give one per student layer")
    beyond = [layer for layer in teacher_layers if not 1 <= layer <= teacher_config.num_hidden_layers]
    if beyond:
        return (f"teacher layer {beyond[0]} asked of a teacher of {teacher_config.num_hidden_layers} layers "
                "(numbered from 1)")
    return ""


def student_weights_from_teacher(teacher_state: dict[str, Tensor], teacher_config: ModelConfig,
                                 student_config: ModelConfig, teacher_layers: list[int]) -> dict[str, Tensor]:
    """A student's state dict (in the teacher state's names) started as DistilBERT starts one: the teacher's
    embeddings, heads and final norm, and as student layer s (1-based) the teacher's layer teacher_layers[s - 1].
    InputError when the configs' family or heads differ, a width does not fit or the layers do not fit. A BERT
    student narrower than the teacher (hidden or intermediate size) keeps the same evenly spaced share of every
    width's coordinates in every tensor (WidthSelection). The tensors are otherwise the teacher's own
    (load_state_dict copies them). Modern family: the student's first layer has no attention norm
    (its input is the normed embeddings), and a later student layer taken from the teacher's first starts its
    attention norm at 1 (and 0)."""
    problem = _fit_problem(teacher_config, student_config, teacher_layers)
    if problem:
        raise InputError(problem)
    state: dict[str, Tensor] = {}
    layers: dict[int, dict[tuple[str, str], Tensor]] = defaultdict(dict)
    for name, tensor in teacher_state.items():
        match = _LAYER_KEY.match(name)
        if name.startswith(DISTILLATION_PREFIX):
            continue  # a teacher that was once a student: its training extras are no weights
        if match is None:
            state[name] = tensor
        else:
            layers[int(match["index"])][match["stem"], match["rest"]] = tensor
    if student_config.hidden_size != teacher_config.hidden_size or (
            student_config.intermediate_size != teacher_config.intermediate_size):
        selection = WidthSelection(teacher_config, student_config)
        state = {name: selection.cut(name, tensor) for name, tensor in state.items()}
        layers = defaultdict(dict, {index: {key: selection.cut(key[1], tensor) for key, tensor in layer.items()}
                                    for index, layer in layers.items()})
    for student_index, teacher_layer in enumerate(teacher_layers):
        if not layers[teacher_layer - 1]:
            raise InputError(f"the teacher's weights hold no layer {teacher_layer} (numbered from 1)")
        for (stem, rest), tensor in layers[teacher_layer - 1].items():
            state[f"{stem}.{student_index}.{rest}"] = tensor
        if is_modern_config(student_config):
            _fit_attention_norm(state, stem, student_index, teacher_layer, student_config.hidden_size)
    return state


class WidthSelection:
    """Which of a BERT teacher's coordinates a narrower student keeps: evenly spaced indices of the hidden and of
    the intermediate width, the same in every tensor, so that the kept coordinates of the residual stream line up
    from layer to layer (weight selection: Xu et al. 2023, "Initializing Models with Larger Ones"). With the
    teacher's head count, the hidden indices keep the same share of every head (i * T // S never leaves its head's
    block). No tensor is rescaled."""

    # (name ending, the width along each axis); a tensor matching none cuts every axis of the hidden size
    _AXES = ((re.compile(r"attention\.output\.dense\.weight$"), ("hidden", "hidden")),
             (re.compile(r"intermediate\.dense\.weight$"), ("intermediate", "hidden")),
             (re.compile(r"intermediate\.dense\.bias$"), ("intermediate",)),
             (re.compile(r"(^|\.)output\.dense\.weight$"), ("hidden", "intermediate")),
             (re.compile(r"_embeddings\.weight$|decoder\.weight$"), (None, "hidden")))

    def __init__(self, teacher: ModelConfig, student: ModelConfig) -> None:
        self.teacher_hidden = teacher.hidden_size
        self.index = {"hidden": _evenly_spaced(teacher.hidden_size, student.hidden_size),
                      "intermediate": _evenly_spaced(teacher.intermediate_size, student.intermediate_size)}

    def cut(self, name: str, tensor: Tensor) -> Tensor:
        axes = next((axes for pattern, axes in self._AXES if pattern.search(name)), None)
        if axes is None:  # attention's products, norms, biases, the pooler, the heads' transform, classifiers
            axes = tuple("hidden" if size == self.teacher_hidden else None for size in tensor.shape)
        for axis, width in enumerate(axes):
            if width is not None:
                tensor = tensor.index_select(axis, self.index[width])
        return tensor


def _evenly_spaced(total: int, kept: int) -> Tensor:
    return torch.arange(kept) * total // kept


def _fit_attention_norm(state: dict[str, Tensor], stem: str, student_index: int, teacher_layer: int,
                        width: int) -> None:
    """The modern family's first layer has no attention norm: drop the teacher's where the student's layer is the
    first, start one at the identity's parameters where the teacher's layer was the first."""
    names = [f"{stem}.{student_index}.attn_norm.weight", f"{stem}.{student_index}.attn_norm.bias"]
    if student_index == 0:
        for name in names:
            state.pop(name, None)
    elif teacher_layer == 1:
        like = state[f"{stem}.{student_index}.mlp_norm.weight"]
        state[names[0]] = torch.ones(width, dtype=like.dtype)
        if f"{stem}.{student_index}.mlp_norm.bias" in state:  # norm_bias: every norm has one
            state[names[1]] = torch.zeros(width, dtype=like.dtype)


class DistillationStudent(nn.Module):
    """The student being distilled (`.student`, any of our models) and its `.projection` (or None). forward is
    the student's, so code that runs or evaluates a model takes it unchanged. Its state_dict is the student's own
    (same names) plus the projection's under `distillation.projection.`, which load_state_dict takes back and
    model/weights.py's readers drop: a checkpoint of it is an ordinary checkpoint of the student."""

    def __init__(self, student: nn.Module, projection: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.student = student
        self.projection = projection
        # The renaming hooks run inside any state_dict/load_state_dict call, also on a module that holds this one.
        self.register_state_dict_post_hook(_to_checkpoint_names)
        self.register_load_state_dict_pre_hook(_to_module_names)

    @property
    def config(self) -> ModelConfig:
        """The student's config (model/weights.py's export and the checkpoint record read it)."""
        return self.student.config

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.student(*args, **kwargs)


def _to_checkpoint_names(_module: nn.Module, state_dict: dict[str, Any], prefix: str, _metadata: Any) -> None:
    for name in [name for name in state_dict if name.startswith(prefix)]:
        inner = name[len(prefix):]
        if inner.startswith("student."):
            state_dict[prefix + inner.removeprefix("student.")] = state_dict.pop(name)
        elif inner.startswith("projection."):
            state_dict[prefix + DISTILLATION_PREFIX + inner] = state_dict.pop(name)


def _to_module_names(_module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    for name in [name for name in state_dict if name.startswith(prefix)]:
        inner = name[len(prefix):]
        if inner.startswith(DISTILLATION_PREFIX):
            state_dict[prefix + inner.removeprefix(DISTILLATION_PREFIX)] = state_dict.pop(name)
        else:
            state_dict[prefix + "student." + inner] = state_dict.pop(name)
