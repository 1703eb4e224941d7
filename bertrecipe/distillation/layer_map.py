"""Which student layer learns from which teacher layer (hidden states, attention scores, value relations).

Layers are numbered from 1, as transformers' hidden_states index them: layer k's output is hidden_states[k]
(hidden_states[0], the embeddings, is the embedding term's, never a layer's)."""
from __future__ import annotations

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import LAST_LAYER, UNIFORM, DistillationConfig


def layer_pairs(config: DistillationConfig, student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs, 1-based. "last_layer": the last of each (MiniLM). "uniform": student
    layer s <- teacher layer s * k, k = teacher_layers / student_layers (TinyBERT; 0-based, i <- i*k + k - 1).
    A list: student layer s <- the list's s-th entry. InputError for a map that does not fit the two models."""
    mapping = config.student_teacher_layer_mapping
    if mapping == LAST_LAYER:
        return [(student_layers, teacher_layers)]
    if mapping == UNIFORM:
        if teacher_layers % student_layers:
            raise InputError(f"{config.where}student_teacher_layer_mapping \"{UNIFORM}\" needs the teacher's "
                             f"{teacher_layers} layers to be a multiple of the student's {student_layers}; use "
                             f"\"{LAST_LAYER}\" or list one teacher layer per student layer")
        step = teacher_layers // student_layers
        return [(s, s * step) for s in range(1, student_layers + 1)]
    if len(mapping) != student_layers:
        raise InputError(f"{config.where}student_teacher_layer_mapping lists {len(mapping)} teacher layers for a "
                         f"student of {student_layers} layers; list one per student layer")
    beyond = [layer for layer in mapping if layer > teacher_layers]
    if beyond:
        raise InputError(f"{config.where}student_teacher_layer_mapping names teacher layer {beyond[0]}, but the "
                         f"teacher has {teacher_layers} layers (numbered from 1)")
    return list(zip(range(1, student_layers + 1), mapping, strict=True))
