"""optimization.py against plain per-tensor references written here from the definitions."""
import copy
import math

import pytest
import torch
from torch import nn

from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.training.optimization import (
    Lamb,
    LinearWarmUpScheduler,
    PolyWarmUpScheduler,
    build_adamw,
    build_lamb,
    weight_decay_groups,
)


def reference_lamb_step(groups, states, step, lr, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=1.0):
    """One LAMB step, tensor by tensor, in float64, as NVIDIA's recipe defines it."""
    all_grads = [p.grad.double() for group in groups for p in group["params"]]
    global_norm = math.sqrt(sum(float((g * g).sum()) for g in all_grads))
    divisor = max(global_norm / max_grad_norm, 1.0)
    beta1, beta2 = betas
    for group in groups:
        for p in group["params"]:
            g = p.grad.double() / divisor
            state = states.setdefault(p, {"m": torch.zeros_like(g), "v": torch.zeros_like(g)})
            state["m"] = beta1 * state["m"] + (1 - beta1) * g
            state["v"] = beta2 * state["v"] + (1 - beta2) * g * g
            m_hat = state["m"] / (1 - beta1**step)
            v_hat = state["v"] / (1 - beta2**step)
            update = m_hat / (v_hat.sqrt() + eps) + group["weight_decay"] * p.double()
            ratio = 1.0
            if group["weight_decay"] != 0:
                w_norm, u_norm = float(p.double().norm()), float(update.norm())
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            p.copy_((p.double() - lr * ratio * update).to(p.dtype))


def make_params(seed):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(7, 5, generator=g), torch.randn(33, generator=g), torch.zeros(4, 3)]  # a zero tensor too
    no_decay = [torch.randn(5, generator=g), torch.randn(3, 3, generator=g)]
    return [nn.Parameter(t) for t in weights], [nn.Parameter(t) for t in no_decay]


@pytest.mark.parametrize("compiled", [False, True], ids=["foreach", "compiled"])
@pytest.mark.slow
def test_lamb_equals_per_tensor_reference_over_many_steps(compiled):
    ours_decay, ours_plain = make_params(0)
    ref_decay, ref_plain = make_params(0)
    ours_groups = [{"params": ours_decay, "weight_decay": 0.01}, {"params": ours_plain, "weight_decay": 0.0}]
    ref_groups = [{"params": ref_decay, "weight_decay": 0.01}, {"params": ref_plain, "weight_decay": 0.0}]
    optimizer = Lamb(ours_groups, lr=0.01, compiled=compiled)
    states = {}
    g = torch.Generator().manual_seed(1)
    clipped_steps = 0
    for step in range(1, 26):
        grads = [torch.randn(p.shape, generator=g) * (3.0 if step % 2 else 0.05) for p in ours_decay + ours_plain]
        clipped_steps += math.sqrt(sum(float((x * x).sum()) for x in grads)) > 1.0
        with torch.no_grad():
            for p, q, grad in zip(ours_decay + ours_plain, ref_decay + ref_plain, grads, strict=True):
                p.grad, q.grad = grad.clone(), grad.clone()
            lr = 0.01 * (1 - step / 30)  # a changing lr, as under a schedule
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.step()
            reference_lamb_step(ref_groups, states, step, lr=lr)
    assert 5 < clipped_steps < 25  # both regimes, with and without clipping, were exercised
    for p, q in zip(ours_decay + ours_plain, ref_decay + ref_plain, strict=True):
        assert (p - q).abs().max().item() < 1e-6
    assert optimizer.param_groups[0]["step"] == 25


def test_lamb_leaves_gradients_untouched_and_skips_params_without_grad():
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    optimizer = Lamb([{"params": [p, q], "weight_decay": 0.01}], lr=0.1)
    p.grad = torch.full((3,), 10.0)
    optimizer.step()
    assert torch.equal(p.grad, torch.full((3,), 10.0))
    assert torch.equal(q, torch.ones(2)) and q not in optimizer.state


def test_lamb_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a = Lamb(weight_decay_groups(a, 0.01), lr=0.01)
    grads = [[torch.randn_like(p) for p in a.parameters()] for _ in range(6)]

    def apply(model, opt, step_grads):
        for p, grad in zip(model.parameters(), step_grads, strict=True):
            p.grad = grad.clone()
        opt.step()

    for step_grads in grads[:3]:
        apply(a, opt_a, step_grads)
    b.load_state_dict(a.state_dict())
    opt_b = Lamb(weight_decay_groups(b, 0.01), lr=0.01)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as through a file: no shared tensors
    for step_grads in grads[3:]:
        apply(a, opt_a, step_grads)
        apply(b, opt_b, step_grads)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_weight_decay_groups_exclude_biases_and_layer_norms():
    model = BertForPreTraining(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32))
    decay, no_decay = weight_decay_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "cls.predictions.bias" in no_decay_names and "bert.embeddings.LayerNorm.weight" in no_decay_names
    assert "bert.encoder.layer.0.attention.self.query.weight" in decay_names
    assert not any("bias" in n or "LayerNorm" in n for n in decay_names)
    assert len(decay_names) + len(no_decay_names) == len(list(model.parameters()))
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)


def test_build_lamb_uses_our_lamb_on_cpu_and_adamw_has_two_groups():
    model = nn.Linear(3, 3)
    assert isinstance(build_lamb(weight_decay_groups(model, 0.01), lr=1e-3), Lamb)
    adamw = build_adamw(model, lr=1e-3)
    assert isinstance(adamw, torch.optim.AdamW) and [g["weight_decay"] for g in adamw.param_groups] == [0.01, 0.0]


def poly_reference(step, total, warmup, base):
    progress = step / total
    return base * progress / warmup if progress < warmup else base * (1 - progress) ** 0.5


def test_poly_warmup_schedule_values():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=6e-3)
    scheduler = PolyWarmUpScheduler(optimizer, warmup=0.2843, total_steps=100)
    assert optimizer.param_groups[0]["lr"] == 0.0
    for step in range(1, 101):
        scheduler.step()  # just before the optimizer step it sets the lr for
        assert optimizer.param_groups[0]["lr"] == pytest.approx(poly_reference(step, 100, 0.2843, 6e-3), abs=1e-12)
    assert optimizer.param_groups[0]["lr"] == 0.0


def test_skipped_steps_do_not_advance_the_schedule_and_state_round_trips():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = PolyWarmUpScheduler(optimizer, warmup=0.1, total_steps=50)
    finite = [True, False, True, True, False, True]
    for ok in finite:
        if ok:  # a step the loss scaler skips never calls the scheduler
            scheduler.step()
    assert scheduler.last_step == 4
    assert scheduler.get_last_lr()[0] == pytest.approx(poly_reference(4, 50, 0.1, 1.0))
    other = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    restored = PolyWarmUpScheduler(other, warmup=0.1, total_steps=50)
    restored.load_state_dict(scheduler.state_dict())
    assert restored.get_last_lr() == scheduler.get_last_lr()


def test_linear_warmup_schedule_values():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=3e-5)
    scheduler = LinearWarmUpScheduler(optimizer, warmup=0.1, total_steps=200)
    lrs = []
    for _ in range(200):
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs[9] == pytest.approx(3e-5 * 10 / 20)
    assert lrs[19] == pytest.approx(3e-5)
    assert lrs[109] == pytest.approx(3e-5 * (1 - 110 / 200) / 0.9)
    assert lrs[-1] == 0.0
