"""bertrecipe/distillation: the JSON config as NVIDIA writes it, the layer map, each loss term against a hand
computation in numpy, the student's projection, its start from teacher layers (DistilBERT) and its checkpoints, whose
training extras model/weights.py's readers and writers leave out."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import DistillationConfig, read_distillation_config
from bertrecipe.distillation.layer_map import layer_pairs
from bertrecipe.distillation.losses import (
    DistillationLoss,
    attention_kld,
    attention_mse,
    logit_mse,
    soft_cross_entropy,
    token_cosine,
    token_mse,
    value_relation,
)
from bertrecipe.distillation.student import DistillationStudent, Projection, student_weights_from_teacher
from bertrecipe.model.bert import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertrecipe.model.capture import MASKED_SCORE, Captured
from bertrecipe.model.modern import ModernBertForMaskedLM
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.model.weights import export_state_dict, load_weights_into, model_for_weights, read_weights
from bertrecipe.pretraining.startup import warn_of_partial_weights
from helpers import REPO_ROOT

NVIDIA_BACKBONE = {"distillation": True, "distillation_config": {
    "use_attention_scores": True, "use_hidden_states": True, "use_value_states": True,
    "use_embedding_states": False, "use_pred_states": False, "attention_loss": "kld", "hidden_state_loss": "cosine",
    "embedding_state_loss": "cosine", "value_state_loss": "kld", "student_teacher_layer_mapping": "last_layer"}}
BERT_TEACHER = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=48,
                    max_position_embeddings=32)
MODERN_TEACHER = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=48,
                      local_attention=8, max_position_embeddings=64, pad_token_id=0)


def write_config(tmp_path, values, name="distill.json"):
    path = tmp_path / name
    path.write_text(json.dumps(values))
    return path


def with_terms(**terms):
    return {"distillation": True, "distillation_config": {**NVIDIA_BACKBONE["distillation_config"], **terms}}


# The config --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["distillation_config_backbone.json", "distillation_config_heads.json"])
def test_nvidias_config_files_read_as_they_are(name):
    path = REPO_ROOT / "distillation" / name
    values = json.loads(path.read_text())
    config = read_distillation_config(path)
    assert {key: getattr(config, key) for key in values["distillation_config"]} == values["distillation_config"]
    assert config.source == str(path)
    if name.endswith("heads.json"):
        assert config.use_pred_states and not (config.use_hidden_states or config.use_attention_scores)
    else:
        assert values == NVIDIA_BACKBONE
    # our additions keep their defaults
    assert (config.attention_weight, config.pred_weight, config.temperature, config.pred_loss) == \
        (1.0, 1.0, 1.0, "soft_ce")


def test_our_additions_and_a_list_map_are_read(tmp_path):
    path = write_config(tmp_path, with_terms(student_teacher_layer_mapping=[3, 6], hidden_state_weight=0.5,
                                             temperature=2, pred_loss="mse", use_pred_states=True))
    config = read_distillation_config(path)
    assert config.student_teacher_layer_mapping == (3, 6)
    assert (config.hidden_state_weight, config.temperature, config.pred_loss) == (0.5, 2, "mse")
    hash(config)  # frozen and hashable, list map included


@pytest.mark.parametrize("values, expected", [
    (with_terms(attention_los="kld"), "unknown key distillation_config.attention_los (did you mean attention_loss?)"),
    ({**NVIDIA_BACKBONE, "distilation_extra": 1}, "unknown key distilation_extra"),
    (with_terms(use_hidden_states="yes"), "use_hidden_states is 'yes', expected true or false"),
    (with_terms(use_hidden_states=1), "use_hidden_states is 1, expected true or false"),
    (with_terms(attention_loss="kl"), "attention_loss is 'kl', expected 'kld' or 'mse'"),
    (with_terms(hidden_state_loss="kld"), "hidden_state_loss is 'kld', expected 'cosine' or 'mse'"),
    (with_terms(pred_loss="ce"), "pred_loss is 'ce', expected 'soft_ce' or 'mse'"),
    ({**NVIDIA_BACKBONE, "distillation": False}, "distillation is False, expected true"),
    (with_terms(use_attention_scores=False, use_hidden_states=False, use_value_states=False), "no term chosen"),
    (with_terms(temperature=0), "temperature is 0, expected a finite number > 0"),
    (with_terms(pred_weight=-1), "pred_weight is -1, expected a finite number >= 0"),
    (with_terms(attention_weight=True), "attention_weight is True, expected a finite number >= 0"),
    (with_terms(student_teacher_layer_mapping="every_other"), "student_teacher_layer_mapping is 'every_other'"),
    (with_terms(student_teacher_layer_mapping=[0, 2]), "student_teacher_layer_mapping is (0, 2)"),
    ({"distillation": True}, "distillation_config is None, expected an object"),
    ([1, 2], "holds a JSON list, expected an object"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_the_key(tmp_path, values, expected):
    path = write_config(tmp_path, values)
    with pytest.raises(InputError) as error:
        read_distillation_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message


def test_an_unreadable_config_file_is_one_line(tmp_path):
    with pytest.raises(InputError, match=r"missing.json: .*distillation config file"):
        read_distillation_config(tmp_path / "missing.json")
    path = tmp_path / "broken.json"
    path.write_text("{\"distillation\": true,")
    with pytest.raises(InputError, match="broken.json: malformed JSON"):
        read_distillation_config(path)


# The layer map -----------------------------------------------------------------------------------------------------

def test_layer_maps_pair_student_layers_with_teacher_layers_from_one():
    last = DistillationConfig(use_hidden_states=True)
    uniform = DistillationConfig(use_hidden_states=True, student_teacher_layer_mapping="uniform")
    listed = DistillationConfig(use_hidden_states=True, student_teacher_layer_mapping=[2, 3, 12])
    assert layer_pairs(last, 4, 12) == [(4, 12)]
    # NVIDIA's uniform map, 0-based: student i <- teacher i*k + k - 1, k = 3
    assert layer_pairs(uniform, 4, 12) == [(i + 1, i * 3 + 3 - 1 + 1) for i in range(4)] == \
        [(1, 3), (2, 6), (3, 9), (4, 12)]
    assert layer_pairs(uniform, 6, 12) == [(1, 2), (2, 4), (3, 6), (4, 8), (5, 10), (6, 12)]
    assert layer_pairs(listed, 3, 12) == [(1, 2), (2, 3), (3, 12)]


@pytest.mark.parametrize("mapping, student, teacher, expected", [
    ("uniform", 5, 12, "the teacher's 12 layers to be a multiple of the student's 5"),
    ([2, 4], 3, 12, "lists 2 teacher layers for a student of 3 layers"),
    ([2, 4, 13], 3, 12, "names teacher layer 13, but the teacher has 12 layers"),
])
def test_a_map_that_does_not_fit_the_models_is_one_line(tmp_path, mapping, student, teacher, expected):
    path = write_config(tmp_path, with_terms(student_teacher_layer_mapping=mapping))
    with pytest.raises(InputError) as error:
        layer_pairs(read_distillation_config(path), student, teacher)
    assert str(error.value).startswith(f"{path}: ") and expected in str(error.value)


# The loss terms against numpy --------------------------------------------------------------------------------------

def np_softmax(row):
    shifted = np.exp(row - row.max())
    return shifted / shifted.sum()


def small_batch(seed=0, heads=2, seq=4, width=3):
    """Student and teacher states of two rows, the second with one padded token."""
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).float()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    return draw(2, seq, width), draw(2, seq, width), draw(2, heads, seq, seq), draw(2, heads, seq, seq), mask


def masked_keys(scores, mask):
    return scores.masked_fill((mask == 0)[:, None, None, :], MASKED_SCORE)


def test_token_mse_and_cosine_count_the_real_tokens_only():
    student, teacher, _, _, mask = small_batch()
    s, t = student.double().numpy(), teacher.double().numpy()
    real = [(b, i) for b in range(2) for i in range(4) if mask[b, i]]
    expected_mse = sum(((s[b, i] - t[b, i]) ** 2).sum() for b, i in real) / (len(real) * 3)
    expected_cos = sum(1 - s[b, i] @ t[b, i] / (np.linalg.norm(s[b, i]) * np.linalg.norm(t[b, i]))
                       for b, i in real) / len(real)
    assert token_mse(student, teacher, mask).item() == pytest.approx(expected_mse, rel=1e-5)
    assert token_cosine(student, teacher, mask).item() == pytest.approx(expected_cos, rel=1e-5)
    changed = teacher.clone()
    changed[1, 3] += 100.0  # a padded token's state never counts
    assert token_mse(student, changed, mask).item() == pytest.approx(expected_mse, rel=1e-5)


def test_attention_kld_is_the_teachers_kl_over_real_keys_per_real_query_and_head():
    _, _, student, teacher, mask = small_batch()
    student, teacher = masked_keys(student, mask), masked_keys(teacher, mask)
    total, rows = 0.0, 0
    for b in range(2):
        keys = [k for k in range(4) if mask[b, k]]
        for h in range(2):
            for q in keys:  # real queries only
                p = np_softmax(teacher[b, h, q, keys].double().numpy())
                log_q = np.log(np_softmax(student[b, h, q, keys].double().numpy()))
                total += (p * (np.log(p) - log_q)).sum()
                rows += 1
    assert rows == 2 * 7
    assert attention_kld(student, teacher, mask).item() == pytest.approx(total / rows, rel=1e-5)


def test_attention_kld_leaves_out_a_key_either_model_masks():
    """A local window masks keys in one model that the other attends to: the distributions span the keys both
    attend to."""
    _, _, student, teacher, mask = small_batch(seed=3)
    mask = torch.ones_like(mask)
    student = student.clone()
    student[:, :, 0, 3] = MASKED_SCORE  # query 0 may not see key 3 in the student
    total = 0.0
    for b in range(2):
        for h in range(2):
            for q in range(4):
                keys = [0, 1, 2] if q == 0 else [0, 1, 2, 3]
                p = np_softmax(teacher[b, h, q, keys].double().numpy())
                log_q = np.log(np_softmax(student[b, h, q, keys].double().numpy()))
                total += (p * (np.log(p) - log_q)).sum()
    assert attention_kld(student, teacher, mask).item() == pytest.approx(total / 16, rel=1e-5)


def test_attention_mse_is_tinyberts_on_raw_scores_of_attended_keys():
    _, _, student, teacher, mask = small_batch(seed=1)
    student, teacher = masked_keys(student, mask), masked_keys(teacher, mask)
    squares = [(student[b, h, q, k].item() - teacher[b, h, q, k].item()) ** 2
               for b in range(2) for h in range(2) for q in range(4) for k in range(4) if mask[b, q] and mask[b, k]]
    assert len(squares) == 2 * (16 + 9)
    assert attention_mse(student, teacher, mask).item() == pytest.approx(sum(squares) / len(squares), rel=1e-5)


def test_value_relation_is_minilms_scaled_dot_products_of_values():
    generator = torch.Generator().manual_seed(2)
    values = torch.randn(2, 2, 4, 3, generator=generator)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    relation = value_relation(values, mask)
    v = values.double().numpy()
    for b in range(2):
        for h in range(2):
            expected = v[b, h] @ v[b, h].T / math.sqrt(3)
            keys = 4 if b == 0 else 3
            np.testing.assert_allclose(relation[b, h, :, :keys].double().numpy(), expected[:, :keys], rtol=1e-5)
    assert (relation[1, :, :, 3] == MASKED_SCORE).all()


def test_soft_cross_entropy_at_a_temperature_and_its_masks():
    generator = torch.Generator().manual_seed(4)
    student, teacher = torch.randn(3, 5, generator=generator), torch.randn(3, 5, generator=generator)

    def expected(rows, classes, temperature):
        total = 0.0
        for r in rows:
            p = np_softmax(teacher[r, classes].double().numpy() / temperature)
            log_q = np.log(np_softmax(student[r, classes].double().numpy() / temperature))
            total += -(p * log_q).sum()
        return total / len(rows)
    assert soft_cross_entropy(student, teacher, 2.0).item() == pytest.approx(expected([0, 1, 2], range(5), 2.0),
                                                                             rel=1e-5)
    rows = torch.tensor([1, 0, 1])  # a row mask: rank one less than the logits'
    assert soft_cross_entropy(student, teacher, 1.0, rows).item() == \
        pytest.approx(expected([0, 2], range(5), 1.0), rel=1e-5)
    classes = torch.tensor([[1, 1, 1, 0, 0]])  # a class mask (QA's padded positions), broadcast over the rows
    assert soft_cross_entropy(student, teacher, 1.0, classes).item() == \
        pytest.approx(expected([0, 1, 2], [0, 1, 2], 1.0), rel=1e-5)
    entropy = sum(-(p * np.log(p)).sum() for p in map(np_softmax, teacher.double().numpy())) / 3
    assert soft_cross_entropy(teacher, teacher).item() == pytest.approx(entropy, rel=1e-5)  # its least value
    squares = [(student[r, c].item() - teacher[r, c].item()) ** 2 for r in (0, 2) for c in range(5)]
    assert logit_mse(student, teacher, rows).item() == pytest.approx(sum(squares) / 10, rel=1e-5)


def captured_pair(seed=0):
    """(student, teacher) Captured states of two layers, the mask of the batch."""
    student_states, teacher_states, student_scores, teacher_scores, mask = small_batch(seed)
    generator = torch.Generator().manual_seed(seed + 10)
    made = []
    for states, scores in ((student_states, student_scores), (teacher_states, teacher_scores)):
        made.append(Captured(embeddings=states * 2, hidden={1: states, 2: states + 1},
                             scores={1: masked_keys(scores, mask), 2: masked_keys(scores * 2, mask)},
                             values={1: torch.randn(2, 2, 4, 3, generator=generator),
                                     2: torch.randn(2, 2, 4, 3, generator=generator)}))
    return made[0], made[1], mask


def test_the_total_is_the_weighted_sum_of_each_term_summed_over_the_layer_pairs():
    student, teacher, mask = captured_pair()
    config = DistillationConfig(use_attention_scores=True, use_hidden_states=True, use_value_states=True,
                                use_embedding_states=True, use_pred_states=True, hidden_state_loss="mse",
                                attention_weight=0.5, hidden_state_weight=2.0, embedding_state_weight=3.0,
                                value_state_weight=0.25, pred_weight=4.0, temperature=2.0,
                                student_teacher_layer_mapping=[1, 2])
    logits = torch.randn(2, 4), torch.randn(2, 4)
    loss = DistillationLoss(config, [(1, 1), (2, 2)])
    assert loss.captures == {"embeddings", "hidden", "scores", "values"}
    assert loss.student_layers == loss.teacher_layers == {1, 2}
    total, terms = loss(student, teacher, mask, *logits)
    expected = {
        "embedding_states": token_cosine(student.embeddings, teacher.embeddings, mask),
        "hidden_states": sum(token_mse(student.hidden[i], teacher.hidden[i], mask) for i in (1, 2)),
        "attention_scores": sum(attention_kld(student.scores[i], teacher.scores[i], mask) for i in (1, 2)),
        "value_states": sum(attention_kld(value_relation(student.values[i], mask),
                                          value_relation(teacher.values[i], mask), mask) for i in (1, 2)),
        "pred_states": soft_cross_entropy(*logits, 2.0)}
    assert terms.keys() == expected.keys()
    for name, value in expected.items():
        assert terms[name].item() == pytest.approx(value.item(), rel=1e-6), name
        assert value.item() > 1e-3  # every term is compared on a non-zero value
    weights = {"embedding_states": 3.0, "hidden_states": 2.0, "attention_scores": 0.5, "value_states": 0.25,
               "pred_states": 4.0}
    assert total.item() == pytest.approx(sum(weights[n] * v.item() for n, v in expected.items()), rel=1e-6)


def test_the_student_states_go_through_the_projection_and_widths_that_differ_need_one():
    student, teacher, mask = captured_pair()
    projection = Projection(3, 5)
    wide = Captured(embeddings=projection(teacher.embeddings).detach(), hidden={2: projection(teacher.hidden[2])})
    config = DistillationConfig(use_hidden_states=True, use_embedding_states=True)
    total, terms = DistillationLoss(config, [(2, 2)], projection)(teacher, wide, mask)
    assert total.item() == pytest.approx(0.0, abs=1e-6) and set(terms) == {"hidden_states", "embedding_states"}
    with pytest.raises(InputError, match=r"hidden states are 3 wide and the teacher's 5: give DistillationLoss a "
                                         r"Projection\(3, 5\)"):
        DistillationLoss(config, [(2, 2)])(teacher, wide, mask)


def test_a_prediction_term_without_logits_says_the_logit_loss_needs_a_head():
    student, teacher, mask = captured_pair()
    config = DistillationConfig(use_pred_states=True)
    loss = DistillationLoss(config, [(2, 2)])
    assert loss.captures == set() and loss.student_layers == set()
    with pytest.raises(InputError) as error:
        loss(student, teacher, mask, student_logits=torch.zeros(2, 3))
    assert "the logit loss needs a head" in str(error.value) and "the teacher gave no logits" in str(error.value)


def test_heads_that_differ_are_one_line_naming_the_term():
    student, teacher, mask = captured_pair()
    teacher.scores[2] = teacher.scores[2].repeat(1, 2, 1, 1)
    loss = DistillationLoss(DistillationConfig(use_attention_scores=True), [(2, 2)])
    with pytest.raises(InputError, match=r"kld: the student's \[2, 2, 4, 4\] and the teacher's \[2, 4, 4, 4\]"):
        loss(student, teacher, mask)


# The student -------------------------------------------------------------------------------------------------------

def test_a_projection_is_the_identity_without_parameters_where_the_widths_are_equal():
    same = Projection(8, 8)
    x = torch.randn(2, 3, 8)
    assert same(x) is x and list(same.state_dict()) == []
    wider = Projection(8, 12)
    assert wider(x).shape == (2, 3, 12) and set(wider.state_dict()) == {"weight", "bias"}
    assert abs(wider.weight.std().item() - 0.02) < 0.01 and not wider.bias.any()


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_a_student_starts_from_the_listed_teacher_layers_embeddings_and_heads(family):
    if family == "bert":
        teacher_config, student_config = BertConfig(**BERT_TEACHER), BertConfig(**{**BERT_TEACHER,
                                                                                    "num_hidden_layers": 2})
        teacher, student = BertForPreTraining(teacher_config), BertForPreTraining(student_config)
        layer = "bert.encoder.layer.{}.attention.self.query.weight"
    else:
        teacher_config = ModernBertConfig(**MODERN_TEACHER)
        student_config = ModernBertConfig(**{**MODERN_TEACHER, "num_hidden_layers": 2})
        teacher, student = ModernBertForMaskedLM(teacher_config), ModernBertForMaskedLM(student_config)
        layer = "model.layers.{}.attn.Wqkv.weight"
    state = student_weights_from_teacher(teacher.state_dict(), teacher_config, student_config, [2, 4])
    student.load_state_dict(state)  # strict: every weight of the student, nothing else
    own = teacher.state_dict()
    assert torch.equal(student.state_dict()[layer.format(0)], own[layer.format(1)])
    assert torch.equal(student.state_dict()[layer.format(1)], own[layer.format(3)])
    for name, tensor in student.state_dict().items():
        if ".layer.0." not in name and ".layers.0." not in name and ".1." not in name:
            assert torch.equal(tensor, own[name]), name  # embeddings and heads are the teacher's


def test_a_modern_student_from_the_teachers_first_layer_gets_an_attention_norm_of_its_own():
    teacher_config = ModernBertConfig(**MODERN_TEACHER)
    student_config = ModernBertConfig(**{**MODERN_TEACHER, "num_hidden_layers": 2})
    teacher, student = ModernBertForMaskedLM(teacher_config), ModernBertForMaskedLM(student_config)
    state = student_weights_from_teacher(teacher.state_dict(), teacher_config, student_config, [3, 1])
    student.load_state_dict(state)
    assert torch.equal(student.model.layers[1].attn_norm.weight, torch.ones(32))
    assert torch.equal(student.model.layers[1].attn.Wqkv.weight, teacher.model.layers[0].attn.Wqkv.weight)


def test_a_narrower_bert_student_keeps_the_same_evenly_spaced_coordinates_in_every_tensor():
    teacher_config = BertConfig(**BERT_TEACHER)  # 32 wide in 2 heads of 16, 48 inner; also 32 positions
    student_config = BertConfig(**{**BERT_TEACHER, "num_hidden_layers": 2, "hidden_size": 24,
                                   "intermediate_size": 12})
    teacher, student = BertForPreTraining(teacher_config), BertForPreTraining(student_config)
    student.load_state_dict(student_weights_from_teacher(teacher.state_dict(), teacher_config, student_config,
                                                         [2, 4]))  # strict, so every shape fits
    head = [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14]  # 12 of each head's 16 coordinates, evenly spaced
    hidden = head + [16 + i for i in head]  # and so of the 32, head by head
    inner = list(range(0, 48, 4))
    own, got = teacher.state_dict(), student.state_dict()
    every = slice(None)
    expected = {  # student name: (teacher name, kept rows, kept columns)
        "encoder.layer.0.attention.self.query.weight": ("encoder.layer.1.attention.self.query.weight", hidden, hidden),
        "encoder.layer.1.attention.self.key.bias": ("encoder.layer.3.attention.self.key.bias", hidden, None),
        "encoder.layer.1.attention.output.dense.weight": ("encoder.layer.3.attention.output.dense.weight", hidden,
                                                          hidden),
        "encoder.layer.1.intermediate.dense.weight": ("encoder.layer.3.intermediate.dense.weight", inner, hidden),
        "encoder.layer.1.intermediate.dense.bias": ("encoder.layer.3.intermediate.dense.bias", inner, None),
        "encoder.layer.0.output.dense.weight": ("encoder.layer.1.output.dense.weight", hidden, inner),
        "encoder.layer.0.output.LayerNorm.weight": ("encoder.layer.1.output.LayerNorm.weight", hidden, None),
        "embeddings.position_embeddings.weight": ("embeddings.position_embeddings.weight", every, hidden),
        "embeddings.word_embeddings.weight": ("embeddings.word_embeddings.weight", every, hidden),
        "pooler.dense.weight": ("pooler.dense.weight", hidden, hidden),
    }
    for name, (teacher_name, rows, columns) in expected.items():
        kept = own[f"bert.{teacher_name}"][rows]
        assert torch.equal(got[f"bert.{name}"], kept if columns is None else kept[:, columns]), name
    assert torch.equal(got["cls.predictions.bias"], own["cls.predictions.bias"])
    assert torch.equal(got["cls.seq_relationship.weight"], own["cls.seq_relationship.weight"][:, hidden])


@pytest.mark.parametrize("student_change, layers, expected", [
    ({"hidden_size": 64, "intermediate_size": 48}, [2, 4], "hidden_size 64 exceeds the teacher's 32"),
    ({"intermediate_size": 64}, [2, 4], "intermediate_size 64 exceeds the teacher's 48"),
    ({"num_attention_heads": 4}, [2, 4], "num_attention_heads 4 differs from the teacher's 2"),
    ({}, [2, 4, 4], "3 teacher layers given for a student of 2 layers"),
    ({}, [2, 5], "teacher layer 5 asked of a teacher of 4 layers"),
    ("modern", [2, 4], "the teacher is a BERT and the student config a ModernBERT"),
    ("narrower modern", [2, 4], "hidden_size 16 differs from the teacher's 32; .* needs the teacher's hidden_size"),
])
def test_a_student_that_does_not_fit_the_teacher_is_one_line(student_change, layers, expected):
    teacher_config = BertConfig(**BERT_TEACHER)
    if student_change == "modern":
        student_config = ModernBertConfig(**{**MODERN_TEACHER, "num_hidden_layers": 2})
    elif student_change == "narrower modern":
        teacher_config = ModernBertConfig(**MODERN_TEACHER)
        student_config = ModernBertConfig(**{**MODERN_TEACHER, "num_hidden_layers": 2, "hidden_size": 16})
    else:
        student_config = BertConfig(**{**BERT_TEACHER, "num_hidden_layers": 2, **student_change})
    with pytest.raises(InputError, match=expected):
        teacher = (ModernBertForMaskedLM if student_change == "narrower modern" else BertForPreTraining)(teacher_config)
        student_weights_from_teacher(teacher.state_dict(), teacher_config, student_config, layers)


def distillation_student(num_labels=3):
    config = BertConfig(**{**BERT_TEACHER, "num_hidden_layers": 2})
    return DistillationStudent(BertForSequenceClassification(config, num_labels), Projection(32, 48))


def test_the_students_state_dict_is_its_own_plus_the_projection_under_distillation():
    wrapped = distillation_student()
    state = wrapped.state_dict()
    own = wrapped.student.state_dict()
    assert list(state)[: len(own)] == list(own)
    assert set(state) - set(own) == {"distillation.projection.weight", "distillation.projection.bias"}
    fresh = distillation_student()
    assert fresh.load_state_dict(state) is not None  # strict: every key taken back
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    del state["distillation.projection.weight"]
    with pytest.raises(RuntimeError, match="projection.weight"):
        fresh.load_state_dict(state)
    # forward is the student's: evaluation code calls it unchanged
    ids = torch.randint(1, 96, (2, 5))
    assert torch.equal(wrapped.eval()(ids)[1], wrapped.student(ids)[1])
    assert wrapped.config is wrapped.student.config


def test_a_students_checkpoint_loads_as_its_model_without_a_warning(tmp_path, capsys, recwarn):
    wrapped = distillation_student()
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"model": wrapped.state_dict(), "config": wrapped.config.to_dict()}, checkpoint)
    weights = read_weights(checkpoint)
    assert not [name for name in weights.state_dict if name.startswith("distillation.")]
    model = model_for_weights(weights, weights.config)
    assert isinstance(model, BertForSequenceClassification)
    assert load_weights_into(model, weights, checkpoint) == []
    warn_of_partial_weights(model, weights, [], str(checkpoint), no_nsp=False)  # pre-training's report of extras
    assert capsys.readouterr().err == "" and len(recwarn) == 0
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, wrapped.student.state_dict()[name]), name


def test_no_export_writes_a_students_training_extras(tmp_path):
    from bertrecipe.cli import convert_checkpoint

    wrapped = distillation_student()
    assert not [name for name in export_state_dict(wrapped) if name.startswith("distillation.")]
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"model": wrapped.state_dict(), "config": wrapped.config.to_dict()}, checkpoint)
    convert_checkpoint.main([str(checkpoint), str(tmp_path / "ours.pt")])
    written = torch.load(tmp_path / "ours.pt", weights_only=True)["model"]
    assert "bert.encoder.layer.1.output.dense.weight" in written
    assert not [name for name in written if name.startswith("distillation.")]
