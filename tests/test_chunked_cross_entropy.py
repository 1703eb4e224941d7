"""The masked-LM loss a chunk of rows at a time (model/chunked_cross_entropy.py) against the usual path written
here (F.linear, a float32 copy, F.cross_entropy): the loss and the gradients of the hidden states, the weight and
the bias, in float32 and under bf16 autocast, across chunk boundaries; and the modern family trains through it
and so does BERT's, only where they may (not in fp16, not without gradients)."""
import pytest
import torch
import torch.nn.functional as F

from bertrecipe.model import chunked_cross_entropy
from bertrecipe.model.bert import BertForPreTraining
from bertrecipe.model.chunked_cross_entropy import CHUNK_ROWS, chunked_linear_cross_entropy
from bertrecipe.model.families import config_from_dict
from bertrecipe.model.modern import ModernBertForMaskedLM


def inputs(rows, bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 32, generator=generator).requires_grad_()
    weight = (torch.randn(500, 32, generator=generator) * 0.3).requires_grad_()
    b = (torch.randn(500, generator=generator) * 0.1).requires_grad_() if bias else None
    labels = torch.randint(0, 500, (rows,), generator=generator)
    return hidden, weight, b, labels


def usual(hidden, weight, bias, labels, dtype):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        logits = F.linear(hidden, weight, bias)
    return F.cross_entropy(logits.float(), labels)


def loss_and_grads(loss_of, rows, bias, dtype):
    hidden, weight, b, labels = inputs(rows, bias)
    loss = loss_of(hidden, weight, b, labels, dtype)
    (loss * 3.0).backward()  # a scale on the loss reaches every gradient
    return [loss.detach()] + [t.grad for t in (hidden, weight, b) if t is not None]


@pytest.mark.parametrize("rows", [1, CHUNK_ROWS, 2 * CHUNK_ROWS + 37])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_loss_and_gradients_equal_the_usual_path(rows, bias, dtype, tolerance):
    ours = loss_and_grads(chunked_linear_cross_entropy, rows, bias, dtype)
    theirs = loss_and_grads(usual, rows, bias, dtype)
    assert len(ours) == len(theirs) == (4 if bias else 3)
    assert torch.allclose(ours[0], theirs[0], rtol=1e-5, atol=0)  # the softmax is float32 in both
    for got, expected in zip(ours[1:], theirs[1:], strict=True):
        scale = float(expected.abs().max())
        assert float((got - expected).abs().max()) <= tolerance * scale


def test_fp16_and_no_rows_are_refused():
    hidden, weight, bias, labels = inputs(4)
    for args in ((hidden, weight, bias, labels, torch.float16), (hidden[:0], weight, bias, labels[:0], torch.float32)):
        with pytest.raises(ValueError, match="not for fp16"):
            chunked_linear_cross_entropy(*args)


def tiny_model(family):
    torch.manual_seed(0)
    if family == "modern":
        return ModernBertForMaskedLM(config_from_dict({
            "model_type": "modernbert", "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 3,
            "num_attention_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64, "local_attention": 16,
            "pad_token_id": 0}))
    # BERT's embeddings are padded to a multiple of 8 (318 -> 320): the two padding rows stay out of the softmax.
    return BertForPreTraining(config_from_dict({"vocab_size": 318, "hidden_size": 32, "num_hidden_layers": 2,
                                                "num_attention_heads": 2, "intermediate_size": 48,
                                                "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
                                                "attention_probs_dropout_prob": 0.0}))


@pytest.mark.parametrize("family", ["modern", "bert"])
@pytest.mark.parametrize("dtype, chunked", [(torch.float32, True), (torch.bfloat16, True), (torch.float16, False)])
def test_both_families_train_through_it_where_they_may(monkeypatch, family, dtype, chunked):
    """The loss and every gradient of a training step equal the usual path's (the same model without gradients
    gives the loss; the gradients come from the logits the usual path returns)."""
    model = tiny_model(family)
    calls = []
    original = chunked_cross_entropy.chunked_linear_cross_entropy
    monkeypatch.setattr(chunked_cross_entropy, "chunked_linear_cross_entropy",
                        lambda *a: calls.append(a) or original(*a))
    ids = torch.randint(5, 318, (2, 40), generator=torch.Generator().manual_seed(1))
    labels = torch.where(torch.rand(2, 40, generator=torch.Generator().manual_seed(2)) < 0.3, ids, -1)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = model(ids, masked_lm_labels=labels)
        with torch.no_grad():
            evaluated = model(ids, masked_lm_labels=labels)
    assert len(calls) == int(chunked) and (out.prediction_logits is None) == chunked
    assert evaluated.prediction_logits is not None  # without gradients: the logits, for the accuracy
    assert evaluated.prediction_logits.shape[-1] == 318 or family == "modern"
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    assert torch.allclose(out.loss.float(), evaluated.loss.float(), rtol=tolerance)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    monkeypatch.setattr(chunked_cross_entropy, "compute_dtype", lambda x: torch.float16)  # the usual path
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        usual = model(ids, masked_lm_labels=labels)
    monkeypatch.undo()
    assert usual.prediction_logits is not None
    usual.loss.backward()
    # Against each gradient's own scale, floored at a thousandth of the largest (some are zero in exact
    # arithmetic, a key bias's: only rounding noise to compare).
    largest = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for name, p in model.named_parameters():
        if name in grads:
            scale = max(float(p.grad.abs().max()), largest * 1e-3)
            assert float((grads[name] - p.grad).abs().max()) <= 2 * tolerance * scale, name
