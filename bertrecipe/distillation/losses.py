"""The distillation terms (TinyBERT, MiniLM, as NVIDIA's recipe configures them) and their weighted sum.

Every term is computed in fp32 and counts only what the batch holds: padded tokens are left out of the hidden-state
and embedding terms and never count as queries; an attention distribution spans only the keys both models may
attend to (capture.MASKED_SCORE marks the others). NVIDIA's losses average over every position, padding included,
and zero the masked attention scores before the softmax (so padded keys keep a share of it); ours equal theirs on
batches without padding. docs/distillation.md gives each definition.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import DistillationConfig
from bertrecipe.model.capture import MASKED_SCORE, Captured

# A score at or below this is masked: capture writes MASKED_SCORE (the fp32 minimum); -inf counts too.
MASKED_BELOW = MASKED_SCORE / 2
TERMS = ("embedding_states", "hidden_states", "attention_scores", "value_states", "pred_states")


def _same_shape(term: str, student: Tensor, teacher: Tensor) -> None:
    if student.shape != teacher.shape:
        raise InputError(f"{term}: the student's {list(student.shape)} and the teacher's {list(teacher.shape)} "
                         "differ; the two models need the same attention heads for scores and value relations, "
                         "and a projection for hidden states of other widths")


def _mean_over(values: Tensor, selected: Tensor) -> Tensor:
    """The mean of `values` where `selected` (broadcast to its shape); 0 when nothing is selected."""
    selected = selected.expand_as(values)
    return torch.where(selected, values, 0).sum() / selected.sum().clamp(min=1)


def token_mse(student: Tensor, teacher: Tensor, token_mask: Tensor) -> Tensor:
    """Mean squared error of [B, S, H] states over the real tokens (token_mask [B, S] non-zero) and the features."""
    _same_shape("mse", student, teacher)
    squared = (student.float() - teacher.float()).pow(2)
    return _mean_over(squared, (token_mask != 0)[..., None])


def token_cosine(student: Tensor, teacher: Tensor, token_mask: Tensor) -> Tensor:
    """Mean over the real tokens of 1 - cos(student, teacher) of [B, S, H] states (CosineEmbeddingLoss, target 1)."""
    _same_shape("cosine", student, teacher)
    distance = 1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1)
    return _mean_over(distance, token_mask != 0)


def _attended(student_scores: Tensor, teacher_scores: Tensor) -> Tensor:
    """[B, heads, S, S] bool: the keys both models' queries may attend to."""
    return (student_scores > MASKED_BELOW) & (teacher_scores > MASKED_BELOW)


def attention_kld(student_scores: Tensor, teacher_scores: Tensor, token_mask: Tensor) -> Tensor:
    """KL(teacher || student) of each real query's attention distribution (softmax of [B, heads, S, S] scores over
    the keys both attend to), averaged over heads and real queries: sum / (heads x real tokens)."""
    _same_shape("kld", student_scores, teacher_scores)
    keys = _attended(student_scores, teacher_scores)
    log_p = teacher_scores.float().masked_fill(~keys, MASKED_SCORE).log_softmax(-1)
    log_q = student_scores.float().masked_fill(~keys, MASKED_SCORE).log_softmax(-1)
    divergence = torch.where(keys, log_p.exp() * (log_p - log_q), 0).sum(-1)
    return _mean_over(divergence, (token_mask != 0)[:, None, :])


def attention_mse(student_scores: Tensor, teacher_scores: Tensor, token_mask: Tensor) -> Tensor:
    """Mean squared error of the raw [B, heads, S, S] scores (TinyBERT) over the real queries' attended keys."""
    _same_shape("mse", student_scores, teacher_scores)
    keys = _attended(student_scores, teacher_scores) & (token_mask != 0)[:, None, :, None]
    return _mean_over((student_scores.float() - teacher_scores.float()).pow(2), keys)


def value_relation(values: Tensor, token_mask: Tensor) -> Tensor:
    """MiniLM's value relation of [B, heads, S, head_dim] values: V V^T / sqrt(head_dim) per head, fp32, with the
    padded keys at MASKED_SCORE (a relation has no window: every real token is a key)."""
    values = values.float()
    with torch.autocast(values.device.type, enabled=False):  # the loss may run inside the step's autocast
        relation = torch.matmul(values, values.transpose(-1, -2)) * values.shape[-1] ** -0.5
    return relation.masked_fill((token_mask == 0)[:, None, None, :], MASKED_SCORE)


def _logit_selection(logits: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
    """(rows [...] bool, classes [..., C] bool or None) of a logit mask: one of logits' own rank marks the classes
    (e.g. QA's positions) that count, broadcast to the logits; one of a rank less marks the rows (e.g. MLM
    positions); None counts everything."""
    if mask is None:
        return torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device), None
    if mask.dim() == logits.dim():
        classes = (mask != 0).expand_as(logits)
        return classes.any(-1), classes
    if mask.dim() == logits.dim() - 1:
        return (mask != 0).expand(logits.shape[:-1]), None
    raise ValueError(f"a logit mask of shape {list(mask.shape)} fits neither the classes nor the rows of logits "
                     f"{list(logits.shape)}")


def soft_cross_entropy(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0,
                       mask: Optional[Tensor] = None) -> Tensor:
    """-softmax(teacher / t) . log_softmax(student / t) over the last dimension, mean over the rows (TinyBERT's
    prediction loss); `mask` as _logit_selection reads it (classes outside it are out of both softmaxes)."""
    _same_shape("soft_ce", student_logits, teacher_logits)
    rows, classes = _logit_selection(student_logits, mask)
    student, teacher = student_logits.float() / temperature, teacher_logits.float() / temperature
    if classes is not None:
        student, teacher = student.masked_fill(~classes, MASKED_SCORE), teacher.masked_fill(~classes, MASKED_SCORE)
    products = teacher.softmax(-1) * student.log_softmax(-1)
    if classes is not None:
        products = torch.where(classes, products, 0)
    return _mean_over(-products.sum(-1), rows)


def logit_mse(student_logits: Tensor, teacher_logits: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Mean squared error of the logits over the entries `mask` selects (as _logit_selection reads it)."""
    _same_shape("mse", student_logits, teacher_logits)
    rows, classes = _logit_selection(student_logits, mask)
    selected = classes if classes is not None else rows[..., None]
    return _mean_over((student_logits.float() - teacher_logits.float()).pow(2), selected)


STATE_LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"mse": token_mse, "cosine": token_cosine}
SCORE_LOSSES: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {"mse": attention_mse, "kld": attention_kld}


class DistillationLoss:
    """The config's terms between a student's and a teacher's Captured states: each term's loss summed over the
    layer pairs (student layer, teacher layer; 1-based, layer_map.layer_pairs), weighted into the total.
    `projection` maps the student's hidden and embedding states to the teacher's width (None: widths equal)."""

    def __init__(self, config: DistillationConfig, pairs: list[tuple[int, int]],
                 projection: Optional[nn.Module] = None) -> None:
        self.config = config
        self.pairs = list(pairs)
        self.projection = projection
        if not self.pairs and self.captures - {"embeddings"}:
            raise ValueError("the layer terms need at least one (student layer, teacher layer) pair")

    @property
    def captures(self) -> set[str]:
        """What capture.capturing must record of both models for these terms."""
        config = self.config
        wanted = {"embeddings": config.use_embedding_states, "hidden": config.use_hidden_states,
                  "scores": config.use_attention_scores, "values": config.use_value_states}
        return {name for name, used in wanted.items() if used}

    @property
    def student_layers(self) -> set[int]:
        return {student for student, _ in self.pairs} if self.captures - {"embeddings"} else set()

    @property
    def teacher_layers(self) -> set[int]:
        return {teacher for _, teacher in self.pairs} if self.captures - {"embeddings"} else set()

    def __call__(self, student: Captured, teacher: Captured, attention_mask: Tensor,
                 student_logits: Optional[Tensor] = None, teacher_logits: Optional[Tensor] = None,
                 logit_mask: Optional[Tensor] = None) -> tuple[Tensor, dict[str, Tensor]]:
        """(weighted total, {term: its unweighted value}) for the batch whose attention_mask [B, S] both models
        ran; the logits (and logit_mask, see soft_cross_entropy) for the prediction term."""
        config, terms = self.config, {}
        if config.use_embedding_states:
            terms["embedding_states"] = STATE_LOSSES[config.embedding_state_loss](
                *self._projected(_state(student.embeddings, "student", "embeddings"),
                                 _state(teacher.embeddings, "teacher", "embeddings")), attention_mask)
        if config.use_hidden_states:
            terms["hidden_states"] = self._over_pairs(
                lambda s, t: STATE_LOSSES[config.hidden_state_loss](
                    *self._projected(_layer(student.hidden, s, "student", "hidden"),
                                     _layer(teacher.hidden, t, "teacher", "hidden")), attention_mask))
        if config.use_attention_scores:
            terms["attention_scores"] = self._over_pairs(
                lambda s, t: SCORE_LOSSES[config.attention_loss](
                    _layer(student.scores, s, "student", "scores"), _layer(teacher.scores, t, "teacher", "scores"),
                    attention_mask))
        if config.use_value_states:
            terms["value_states"] = self._over_pairs(
                lambda s, t: SCORE_LOSSES[config.value_state_loss](
                    value_relation(_layer(student.values, s, "student", "values"), attention_mask),
                    value_relation(_layer(teacher.values, t, "teacher", "values"), attention_mask),
                    attention_mask))
        if config.use_pred_states:
            terms["pred_states"] = self._prediction(student_logits, teacher_logits, logit_mask)
        weights = {"embedding_states": config.embedding_state_weight, "hidden_states": config.hidden_state_weight,
                   "attention_scores": config.attention_weight, "value_states": config.value_state_weight,
                   "pred_states": config.pred_weight}
        total = sum(weights[name] * value for name, value in terms.items())
        return total, terms

    def _over_pairs(self, term: Callable[[int, int], Tensor]) -> Tensor:
        return sum(term(student, teacher) for student, teacher in self.pairs)

    def _projected(self, student: Tensor, teacher: Tensor) -> tuple[Tensor, Tensor]:
        """The student's states at the teacher's width (through the projection), and the teacher's."""
        if self.projection is not None:
            return self.projection(student), teacher
        if student.shape[-1] != teacher.shape[-1]:
            raise InputError(f"the student's hidden states are {student.shape[-1]} wide and the teacher's "
                             f"{teacher.shape[-1]}: give DistillationLoss a Projection({student.shape[-1]}, "
                             f"{teacher.shape[-1]})")
        return student, teacher

    def _prediction(self, student_logits: Optional[Tensor], teacher_logits: Optional[Tensor],
                    logit_mask: Optional[Tensor]) -> Tensor:
        lacking = [name for name, logits in (("teacher", teacher_logits), ("student", student_logits))
                   if logits is None]
        if lacking:
            raise InputError(f"{self.config.where}use_pred_states: the logit loss needs a head on both models, and "
                             f"the {' and the '.join(lacking)} gave no logits; load the {lacking[0]} with its task "
                             "head or set use_pred_states false")
        if self.config.pred_loss == "mse":
            return logit_mse(student_logits, teacher_logits, logit_mask)
        return soft_cross_entropy(student_logits, teacher_logits, self.config.temperature, logit_mask)


def _state(states: Optional[Tensor], model: str, what: str) -> Tensor:
    if states is None:
        raise ValueError(f"the {model}'s Captured holds no {what}: capture DistillationLoss.captures")
    return states


def _layer(states: dict[int, Tensor], layer: int, model: str, what: str) -> Tensor:
    if layer not in states:
        raise ValueError(f"the {model}'s Captured holds no {what} of layer {layer}: capture the layers "
                         f"DistillationLoss.{model}_layers names")
    return states[layer]
