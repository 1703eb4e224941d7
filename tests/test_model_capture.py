"""bertrecipe/model/capture.py against its oracle, transformers (eager attention, hidden states and attention
probabilities) with the same weights, for BERT and ModernBERT on padded batches (local windows included, padding
skipped inside the model or not); only the asked layers are hooked; packed batches are refused; a student with the
teacher's own weights has zero distillation loss in every term, and gradients reach the student through the hooks,
with activation checkpointing too."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.config import DistillationConfig
from bertrecipe.distillation.layer_map import layer_pairs
from bertrecipe.distillation.losses import TERMS, DistillationLoss
from bertrecipe.distillation.student import DistillationStudent, Projection
from bertrecipe.model.bert import BertConfig, BertForPreTraining, BertForQuestionAnswering
from bertrecipe.model.capture import MASKED_SCORE, capturing, encoder_layers
from bertrecipe.model.modern import ModernBertForMaskedLM, ModernBertForSequenceClassification
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.model.weights import export_state_dict

ALL = {"embeddings", "hidden", "scores", "values"}
BERT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# Four layers, the first and the last global; rows of 40 tokens span more than three local reaches of 4, so the
# model's local layers take the banded path and the window masks most keys.
MODERN = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, num_hidden_layers=4, intermediate_size=48,
              local_attention=8, global_attn_every_n_layers=3, max_position_embeddings=64, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
SEQ = 40


def padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows, two of them padded and the last three columns padding in every row (a model that skips padding
    leaves them out altogether)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 96, (3, SEQ), generator=generator)
    lengths = torch.tensor([SEQ - 3, 29, 6])
    mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
    segments = (torch.arange(SEQ)[None] >= lengths[:, None] // 2).long() * mask
    return ids * mask, segments, mask


def bert_pair() -> tuple[BertForPreTraining, transformers.BertModel]:
    torch.manual_seed(0)
    ours = BertForPreTraining(BertConfig(**BERT)).eval()
    with torch.no_grad():  # biases and LayerNorms away from their init, so every path shows
        for param in ours.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**BERT, attn_implementation="eager")).eval()
    missing, unexpected = theirs.load_state_dict(export_state_dict(ours), strict=False)
    assert set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} and not unexpected
    return ours, theirs


def modern_pair(model_class=ModernBertForMaskedLM, their_class=transformers.ModernBertForMaskedLM, **extra):
    torch.manual_seed(0)
    theirs = their_class(transformers.ModernBertConfig(**MODERN, attn_implementation="eager")).eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.normal_(0.0, 0.3)
    config = ModernBertConfig.from_dict(theirs.config.to_dict())
    ours = model_class(config, **extra).eval()
    ours.load_state_dict(theirs.state_dict(), strict=False)
    return ours, theirs


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = theirs.abs().max().item()
    assert scale > 0.01  # never compares near-zero tensors, which any two models would match
    assert (ours - theirs).abs().max().item() <= 2e-5 * max(scale, 1.0)


def check_against_transformers(captured, their_output, their_layers, value_of, mask):
    real = mask.bool()
    assert_close(captured.embeddings[real], their_output.hidden_states[0][real])
    for layer in range(1, len(their_layers) + 1):
        assert_close(captured.hidden[layer][real], their_output.hidden_states[layer][real])
        probabilities = captured.scores[layer].softmax(-1)  # [B, heads, S, S]
        their_probabilities = their_output.attentions[layer - 1]
        for row in range(mask.shape[0]):
            queries = real[row]
            assert_close(probabilities[row][:, queries], their_probabilities[row][:, queries])
        values = captured.values[layer]
        expected = value_of(their_layers[layer - 1], their_output.hidden_states[layer - 1])
        expected = expected.view(*expected.shape[:2], values.shape[1], -1).transpose(1, 2)
        assert_close(values.transpose(1, 2)[real], expected.transpose(1, 2)[real])


@pytest.mark.parametrize("skip_padding", [True, False])
def test_bert_states_equal_transformers_hidden_states_and_attentions(skip_padding):
    ours, theirs = bert_pair()
    ours.bert.skip_padding = skip_padding
    ids, segments, mask = padded_batch()
    with torch.no_grad(), capturing(ours, {1, 2, 3}, ALL) as captured:
        ours(ids, segments, mask)
        their_output = theirs.bert(input_ids=ids, token_type_ids=segments, attention_mask=mask,
                                   output_hidden_states=True, output_attentions=True)
    assert captured.scores[2].shape == (3, 4, SEQ, SEQ) and captured.scores[2].dtype == torch.float32
    assert (captured.scores[2][1, :, :, 29:] == MASKED_SCORE).all()  # padded keys carry the mask
    check_against_transformers(captured, their_output, theirs.bert.encoder.layer,
                               lambda layer, x: layer.attention.self.value(x), mask)


@pytest.mark.parametrize("skip_padding", [True, False])
def test_modern_states_equal_transformers_with_rotary_positions_and_local_windows(skip_padding):
    ours, theirs = modern_pair()
    ours.model.skip_padding = skip_padding
    assert ours.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    ids, _, mask = padded_batch()
    with torch.no_grad(), capturing(ours, {1, 2, 3, 4}, ALL) as captured:
        ours(ids, attention_mask=mask)
        their_output = theirs.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                                    output_attentions=True)
    window = captured.scores[2][0, 0, 20]  # a local layer: keys 16..24 only
    assert (window[16:25] > MASKED_SCORE).all() and (window[:16] == MASKED_SCORE).all()
    assert (window[25:] == MASKED_SCORE).all()

    def values(layer, x):
        return layer.attn.Wqkv(layer.attn_norm(x)).chunk(3, dim=-1)[2]
    check_against_transformers(captured, their_output, theirs.model.layers, values, mask)


def test_task_models_and_a_distillation_student_are_captured_through_their_encoder():
    ours, theirs = modern_pair(ModernBertForSequenceClassification, transformers.ModernBertForSequenceClassification,
                               num_labels=2)
    ids, _, mask = padded_batch()
    with torch.no_grad(), capturing(DistillationStudent(ours), {3}, {"hidden"}) as captured:
        ours(ids, attention_mask=mask)
        expected = theirs.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[3]
    assert_close(captured.hidden[3][mask.bool()], expected[mask.bool()])
    torch.manual_seed(0)
    qa = BertForQuestionAnswering(BertConfig(**BERT)).eval()
    assert encoder_layers(qa) == 3
    with torch.no_grad(), capturing(qa, {3}, {"hidden"}) as captured:
        _, start_logits, _ = qa(ids, mask * 0, mask)
    direct = qa.qa_outputs(captured.hidden[3]).unbind(-1)[0]
    assert_close(direct[mask.bool()], start_logits[mask.bool()])


def test_only_the_asked_layers_and_states_are_hooked_and_the_hooks_go_on_leaving():
    ours, _ = bert_pair()
    ids, segments, mask = padded_batch()
    layers = ours.bert.encoder.layer
    with torch.no_grad(), capturing(ours, {2}, {"hidden", "values"}) as captured:
        assert not layers[0]._forward_hooks and not layers[2]._forward_hooks
        assert not layers[0].attention.self._forward_pre_hooks and layers[1].attention.self._forward_pre_hooks
        ours(ids, segments, mask)
        ours(ids[:2], segments[:2], mask[:2])  # a second batch replaces the first's states
    assert set(captured.hidden) == set(captured.values) == {2} and not captured.scores
    assert captured.embeddings is None and captured.hidden[2].shape == (2, SEQ, 32)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in ours.modules())
    with pytest.raises(ValueError, match=r"layers \[4\] asked of an encoder of 3 layers"):
        with capturing(ours, {4}, {"hidden"}):
            pass


def test_packed_batches_are_refused_in_one_line():
    ours, _ = bert_pair()
    ids, segments, mask = padded_batch()
    with capturing(ours, {1}, {"hidden"}), pytest.raises(InputError, match="run without --pack_sequences"):
        ours(ids, segments, document_ids=mask)


def zero_and_nonzero_losses(teacher, student_changed, run, logits_of, layers):
    """The loss of a copy of the teacher (identity map, every term; the logits' by mse, as soft cross-entropy's
    least value is the teacher's entropy) and of a changed copy."""
    config = DistillationConfig(use_attention_scores=True, use_hidden_states=True, use_value_states=True,
                                use_embedding_states=True, use_pred_states=True, pred_loss="mse",
                                student_teacher_layer_mapping=list(range(1, layers + 1)))
    loss = DistillationLoss(config, layer_pairs(config, layers, layers), Projection(32, 32))
    ids, segments, mask = padded_batch()
    results = []
    for student in (copy.deepcopy(teacher), student_changed):
        with torch.no_grad(), capturing(teacher, loss.teacher_layers, loss.captures) as seen_teacher, \
                capturing(student, loss.student_layers, loss.captures) as seen_student:
            teacher_logits, student_logits = logits_of(run(teacher, ids, segments, mask)), \
                logits_of(run(student, ids, segments, mask))
            results.append(loss(seen_student, seen_teacher, mask, student_logits, teacher_logits))
    return results


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_a_student_with_the_teachers_own_weights_has_zero_loss_in_every_term(family):
    teacher = bert_pair()[0] if family == "bert" else modern_pair()[0]
    changed = copy.deepcopy(teacher)
    with torch.no_grad():
        for param in changed.parameters():
            param.add_(torch.randn_like(param) * 0.05)

    def run(model, ids, segments, mask):
        return model(ids, segments, mask, predict_positions=mask.bool())
    (total, terms), (changed_total, changed_terms) = zero_and_nonzero_losses(
        teacher, changed, run, lambda output: output.prediction_logits, encoder_layers(teacher))
    assert set(terms) == set(TERMS)
    for name in TERMS:
        assert abs(terms[name].item()) < 1e-6, name
        assert changed_terms[name].item() > 1e-4, name  # the terms do see a different student
    assert abs(total.item()) < 1e-5 and changed_total.item() > 1e-3


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_under_bf16_autocast_the_scores_and_the_terms_stay_fp32(family):
    """Inside a training step's autocast the recomputed scores and the value relations are fp32 products (autocast
    would make them bf16, where the mask's fp32 minimum does not fit)."""
    teacher = bert_pair()[0] if family == "bert" else modern_pair()[0]
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    config = DistillationConfig(use_attention_scores=True, use_hidden_states=True, use_value_states=True,
                                use_embedding_states=True, student_teacher_layer_mapping="uniform")
    layers = encoder_layers(teacher)
    loss = DistillationLoss(config, layer_pairs(config, layers, layers))
    ids, segments, mask = padded_batch()
    with torch.autocast("cpu", torch.bfloat16), \
            capturing(teacher, loss.teacher_layers, loss.captures) as seen_teacher, \
            capturing(student, loss.student_layers, loss.captures) as seen_student:
        with torch.no_grad():
            teacher(ids, segments, mask)
        student(ids, segments, mask)
        total, terms = loss(seen_student, seen_teacher, mask)
    assert seen_student.values[1].dtype == torch.bfloat16  # the model's projections did run in bf16
    assert all(scores.dtype == torch.float32 for scores in seen_student.scores.values())
    assert all(value.dtype == torch.float32 and 0 < value.item() < 10 for value in terms.values())
    total.backward()


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_gradients_reach_the_student_through_the_hooks_with_checkpointing_too(family):
    teacher = bert_pair()[0] if family == "bert" else modern_pair()[0]
    config = DistillationConfig(use_attention_scores=True, use_hidden_states=True, use_value_states=True,
                                student_teacher_layer_mapping="uniform")
    ids, segments, mask = padded_batch()
    student = copy.deepcopy(teacher)
    with torch.no_grad():
        for param in student.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    layers = encoder_layers(teacher)
    loss = DistillationLoss(config, layer_pairs(config, layers, layers))
    with torch.no_grad(), capturing(teacher, loss.teacher_layers, loss.captures) as seen_teacher:
        teacher(ids, segments, mask)
    gradients = []
    for checkpointing in (False, True):
        model = copy.deepcopy(student).train()
        model.set_checkpoint_activations(checkpointing)
        with capturing(model, loss.student_layers, loss.captures) as seen:
            model(ids, segments, mask, predict_positions=mask.bool())
            total, _ = loss(seen, seen_teacher, mask)
            total.backward()
        gradients.append({name: param.grad for name, param in model.named_parameters() if param.grad is not None})
    first_query = "bert.encoder.layer.0.attention.self.query.weight" if family == "bert" \
        else "model.layers.0.attn.Wqkv.weight"
    assert gradients[0][first_query].abs().max() > 0  # the scores' recomputed Q reaches the student's weights
    assert gradients[0].keys() == gradients[1].keys()
    for name, grad in gradients[0].items():
        assert torch.allclose(grad, gradients[1][name], rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_on_a_gpu_in_bf16_the_states_are_the_cpus(family, cuda_device):
    """The path a GPU run takes: padding skipped inside the model and, for ModernBERT in bf16, the varlen kernel fed
    the packed tokens, whose rotary angles and masks the hooks do not read (they make their own)."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**BERT)) if family == "bert" else \
        ModernBertForMaskedLM(ModernBertConfig.from_dict(MODERN))
    model.eval()
    ids, segments, mask = padded_batch()
    layers = set(range(1, encoder_layers(model) + 1))
    with torch.no_grad(), capturing(model, layers, ALL) as on_cpu:
        model(ids, segments, mask)
    on_gpu_model = copy.deepcopy(model).to(cuda_device)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16), capturing(on_gpu_model, layers, ALL) as on_gpu:
        on_gpu_model(ids.to(cuda_device), segments.to(cuda_device), mask.to(cuda_device))
    real = mask.bool()

    def close(gpu, cpu, tolerance):
        gpu, cpu = gpu.float().cpu(), cpu.float()
        assert cpu.abs().max() > 0.01 and (gpu - cpu).abs().max() <= tolerance * max(cpu.abs().max().item(), 1.0)
    close(on_gpu.embeddings[real], on_cpu.embeddings[real], 3e-2)
    for layer in layers:
        close(on_gpu.hidden[layer][real], on_cpu.hidden[layer][real], 5e-2)
        close(on_gpu.values[layer].transpose(1, 2)[real], on_cpu.values[layer].transpose(1, 2)[real], 5e-2)
        assert on_gpu.scores[layer].dtype == torch.float32
        assert torch.equal(on_gpu.scores[layer].cpu() == MASKED_SCORE, on_cpu.scores[layer] == MASKED_SCORE)
        for row in range(mask.shape[0]):
            close(on_gpu.scores[layer][row][:, real[row]].softmax(-1), on_cpu.scores[layer][row][:, real[row]]
                  .softmax(-1), 3e-2)
