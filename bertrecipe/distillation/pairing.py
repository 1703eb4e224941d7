"""What a teacher and a student must share before a distillation run writes anything (a family, a vocabulary, the
head count the attention terms compare, a layer map that fits both), and the student as the run trains it:
started from the teacher's layers where asked, wrapped with the projection its state terms need. General and task
distillation (general.py, task.py) and embedding distillation share it."""
from __future__ import annotations

from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import DistillationConfig
from bertrecipe.distillation.layer_map import layer_pairs
from bertrecipe.distillation.student import DistillationStudent, Projection, student_weights_from_teacher
from bertrecipe.model.families import ModelConfig, is_modern_config
from bertrecipe.model.weights import LoadedWeights


def checked_pairs(config: DistillationConfig, student: ModelConfig, teacher: ModelConfig, source: str,
                  student_name: str = "the student") -> list[tuple[int, int]]:
    """The (student layer, teacher layer) pairs of the config's layer map; InputError naming `source` (the teacher)
    where the two models differ in family, vocabulary or, for attention terms, heads."""
    if is_modern_config(student) != is_modern_config(teacher):
        raise InputError(f"{source}: the teacher is of the {family(teacher)} family and {student_name} of the "
                         f"{family(student)}; distil within one family")
    if student.vocab_size != teacher.vocab_size:
        raise InputError(f"{source}: the teacher's vocab_size is {teacher.vocab_size} and {student_name} has "
                         f"{student.vocab_size}: teacher and student share one vocabulary; give the student the "
                         "teacher's vocab_size")
    heads = (student.num_attention_heads, teacher.num_attention_heads)
    if (config.use_attention_scores or config.use_value_states) and heads[0] != heads[1]:
        raise InputError(f"{config.source}: attention scores and value relations are compared head by head, and "
                         f"{student_name} has {heads[0]} heads, the teacher {heads[1]}; give the student the "
                         "teacher's head count (a narrower head) or turn those terms off")
    return layer_pairs(config, student.num_hidden_layers, teacher.num_hidden_layers)


def student_from_teacher(teacher: LoadedWeights, teacher_config: ModelConfig, student: ModelConfig,
                         source: str) -> tuple[LoadedWeights, str]:
    """A student's weights started as DistilBERT starts one (the teacher's embeddings, heads and the last layer of
    each block), and what to call them in messages."""
    layers = teacher_layers_for(student.num_hidden_layers, teacher_config.num_hidden_layers)
    state = student_weights_from_teacher(teacher.state_dict, teacher_config, student, layers)
    return (LoadedWeights(state, student, "ours", teacher.tokenizer),
            f"{source} (its layers {', '.join(map(str, layers))})")


def teacher_layers_for(student_layers: int, teacher_layers: int) -> list[int]:
    """The teacher layers (1-based) a student started from the teacher takes, the last of each of student_layers
    blocks (uniform, as NVIDIA's layer map; rounded where the counts do not divide)."""
    if student_layers > teacher_layers:
        raise InputError(f"a student of {student_layers} layers cannot start from a teacher of {teacher_layers}; "
                         "pass --student_init random")
    return [round(s * teacher_layers / student_layers) for s in range(1, student_layers + 1)]


def with_projection(model: nn.Module, config: DistillationConfig, teacher: ModelConfig) -> DistillationStudent:
    """The student as trained: with a projection to the teacher's width where its state terms compare widths
    that differ."""
    projects = config.use_hidden_states or config.use_embedding_states
    widths = (model.config.hidden_size, teacher.hidden_size)
    return DistillationStudent(model, Projection(*widths) if projects and widths[0] != widths[1] else None)


def student_module(model: nn.Module) -> DistillationStudent:
    """The DistillationStudent inside DDP's (or torch.compile's) wrapper."""
    while not isinstance(model, DistillationStudent):
        model = getattr(model, "module", None) or model._orig_mod
    return model


def family(config: ModelConfig) -> str:
    return "modern (ModernBERT)" if is_modern_config(config) else "BERT"

