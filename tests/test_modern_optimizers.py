"""The modern encoders' optimizers and schedule in run_pretraining.py: AdamW and StableAdamW against references
written here from their definitions, the warmup-stable-decay schedule against its formula, state that round-trips,
and short runs that train, resume bit for bit and refuse a resume with another --optimizer."""
import copy
import io
import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

from bertrecipe.cli import run_pretraining
from bertrecipe.common.errors import InputError
from bertrecipe.pretraining.startup import ResumePoint, build_scheduler, load_optimizer_state
from bertrecipe.training.optimization import (
    PolyWarmUpScheduler,
    StableAdamW,
    TimeBudgetWsdScheduler,
    WarmupStableDecayScheduler,
    build_adam_optimizer,
    restart_optimizer_steps,
    weight_decay_groups,
)
from helpers import REPO_ROOT, final_record, pretrain, run_command, step_records

REQUIRED = ["--input_dir", "in", "--config_file", "c.json", "--output_dir", "out", "--do_train"]


# --- references, in float64 numpy, one tensor at a time -------------------------------------------------------

def reference_adam_step(w, g, state, lr, betas, eps, wd, stable):
    """One AdamW step of one tensor (torch's formula: decoupled decay w *= 1 - lr wd, bias-corrected moments);
    `stable`: StableAdamW's lr / max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))) for the decay and the update.
    Returns the new weights and the RMS (1 when not stable)."""
    beta1, beta2 = betas
    state["t"] = state.get("t", 0) + 1
    state["m"] = beta1 * state.get("m", 0.0) + (1 - beta1) * g
    state["v"] = beta2 * state.get("v", 0.0) + (1 - beta2) * g * g
    m_hat = state["m"] / (1 - beta1 ** state["t"])
    v_hat = state["v"] / (1 - beta2 ** state["t"])
    rms = math.sqrt(np.mean(g * g / np.maximum(v_hat, eps * eps))) if stable else 1.0
    lr_t = lr / max(1.0, rms)
    w = w * (1 - lr_t * wd)
    return w - lr_t * m_hat / (np.sqrt(v_hat) + eps), rms


def make_groups(seed):
    """Three groups of float64 tensors: decayed weights, plain ones, and a group with its own lr and betas."""
    g = torch.Generator().manual_seed(seed)
    shapes = [[(6, 4), (9,)], [(5,), (2, 3)], [(3, 3, 2)]]
    tensors = [[nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64)) for s in group] for group in shapes]
    return [{"params": tensors[0], "weight_decay": 0.1}, {"params": tensors[1], "weight_decay": 0.0},
            {"params": tensors[2], "weight_decay": 0.05, "lr": 0.02, "betas": (0.8, 0.95)}]


def gradients(steps, groups, seed=1, spike_at=(4, 9)):
    """Per step, one gradient per tensor; 50x larger at the `spike_at` steps, where update clipping kicks in."""
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=g, dtype=torch.float64) * (50.0 if step in spike_at else 1.0)
             for group in groups for p in group["params"]] for step in range(steps)]


def run_against_reference(kind, steps=12):
    groups = make_groups(0)
    ref = [[p.detach().numpy().copy() for p in group["params"]] for group in groups]
    optimizer = build_adam_optimizer(kind, groups, lr=0.05, betas=(0.9, 0.98), eps=1e-6)
    states = [[{} for _ in group["params"]] for group in groups]
    rms_seen = []
    for grads in gradients(steps, groups):
        flat = iter(grads)
        for group, group_ref, group_states in zip(optimizer.param_groups, ref, states, strict=True):
            for i, p in enumerate(group["params"]):
                p.grad = next(flat).clone()
                group_ref[i], rms = reference_adam_step(group_ref[i], p.grad.numpy(), group_states[i], group["lr"],
                                                        group["betas"], group["eps"], group["weight_decay"],
                                                        stable=kind == "stable_adamw")
                rms_seen.append(rms)
        optimizer.step()
        for group, group_ref in zip(optimizer.param_groups, ref, strict=True):
            for p, expected in zip(group["params"], group_ref, strict=True):
                np.testing.assert_allclose(p.detach().numpy(), expected, rtol=1e-10, atol=1e-12)
    return optimizer, rms_seen


def test_stable_adamw_equals_reference_with_and_without_update_clipping():
    optimizer, rms_seen = run_against_reference("stable_adamw")
    assert isinstance(optimizer, StableAdamW)
    assert any(r > 1.5 for r in rms_seen) and any(r < 1.0 for r in rms_seen)  # both sides of the clip were taken


def test_adamw_equals_torchs_formula_by_hand():
    optimizer, _ = run_against_reference("adamw")
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"]  # the kernel that ran


@pytest.mark.parametrize("kind", ["adamw", "stable_adamw"])
def test_state_dict_round_trips_and_the_step_restarts_with_moments_kept(kind):
    groups_a, groups_b = make_groups(0), make_groups(0)
    a = build_adam_optimizer(kind, groups_a, lr=0.05, betas=(0.9, 0.98), eps=1e-6)
    grads = gradients(8, groups_a)

    def step(optimizer, step_grads):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.clone()
        optimizer.step()

    for step_grads in grads[:4]:
        step(a, step_grads)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)  # as a checkpoint holds it, read back with weights_only
    buffer.seek(0)
    with torch.no_grad():
        for p, q in zip([p for g in groups_a for p in g["params"]], [p for g in groups_b for p in g["params"]],
                        strict=True):
            q.copy_(p)
    b = build_adam_optimizer(kind, groups_b, lr=0.05, betas=(0.9, 0.98), eps=1e-6)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    for step_grads in grads[4:]:
        step(a, step_grads)
        step(b, step_grads)
    for p, q in zip([p for g in groups_a for p in g["params"]], [p for g in groups_b for p in g["params"]],
                    strict=True):
        assert torch.equal(p, q)
    moments = copy.deepcopy([s["exp_avg"] for s in b.state.values()])
    restart_optimizer_steps(b)  # the phase-2 hand-off
    assert all(float(s["step"]) == 0 for s in b.state.values())
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, b.state.values(), strict=True))


def test_a_resume_keeps_the_flags_hyperparameters_not_the_checkpoints():
    saved = build_adam_optimizer("adamw", make_groups(0), lr=0.05, betas=(0.9, 0.999), eps=1e-6).state_dict()
    ours = build_adam_optimizer("adamw", make_groups(0), lr=0.05, betas=(0.9, 0.98), eps=1e-8)
    load_optimizer_state(ours, saved)
    assert [g["betas"] for g in ours.param_groups] == [(0.9, 0.98), (0.9, 0.98), (0.8, 0.95)]
    assert [g["eps"] for g in ours.param_groups] == [1e-8] * 3


def test_weight_decay_groups_leave_every_layer_norm_alone_whatever_its_name_or_bias():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.LayerNorm(8, bias=False)
            self.mlp_norm = nn.LayerNorm(8)
            self.Wqkv = nn.Linear(8, 24, bias=False)
            self.mlp = nn.Linear(8, 8)

    model = nn.Module()
    model.norm, model.layers, model.final_norm = nn.LayerNorm(8, bias=False), nn.ModuleList([Block()]), \
        nn.LayerNorm(8, bias=False)
    decay, plain = weight_decay_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == ["layers.0.Wqkv.weight", "layers.0.mlp.weight"]
    assert len(plain["params"]) == 6 and plain["weight_decay"] == 0.0


# --- the warmup-stable-decay schedule -----------------------------------------------------------------------------

def wsd_reference(step, total, warmup, decay, min_ratio, shape):
    """The schedule in steps: warm-up to step warmup*total, peak until total - decay*total, then the decay."""
    warm_steps, decay_steps = warmup * total, decay * total
    if step < warm_steps:
        return step / warm_steps
    if step <= total - decay_steps:
        return 1.0
    x = (step - (total - decay_steps)) / decay_steps
    return min_ratio + (1 - min_ratio) * (1 - (x if shape == "linear" else math.sqrt(x)))


@pytest.mark.parametrize("shape, min_ratio, warmup, decay", [("linear", 0.0, 0.05, 0.2), ("1-sqrt", 0.0, 0.1, 0.3),
                                                             ("1-sqrt", 0.1, 0.0, 0.25), ("linear", 0.3, 0.2, 0.8),
                                                             ("1-sqrt", 0.0, 0.1, 0.0)])
def test_wsd_schedule_equals_its_formula_at_every_step(shape, min_ratio, warmup, decay):
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=4e-3)
    scheduler = WarmupStableDecayScheduler(optimizer, warmup, 400, decay=decay, min_ratio=min_ratio, shape=shape)
    for step in range(1, 401):
        scheduler.step()
        expected = 4e-3 * wsd_reference(step, 400, warmup, decay, min_ratio, shape)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, abs=1e-15), step
    # The last step: decayed to min_ratio, or (no decay: phase 1 of the modern recipe) still at the peak.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(4e-3 * (min_ratio if decay else 1.0), abs=1e-15)


def test_wsd_state_round_trips_and_continues_exactly_with_a_new_peak():
    def fresh():
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
        return optimizer, WarmupStableDecayScheduler(optimizer, 0.1, 50, decay=0.4, shape="1-sqrt")

    opt_a, a = fresh()
    for _ in range(27):
        a.step()
    opt_b, b = fresh()
    b.load_state_dict(a.state_dict())
    assert b.last_step == 27 and b.get_last_lr() == a.get_last_lr()
    for _ in range(23):
        a.step()
        b.step()
        assert a.get_last_lr() == b.get_last_lr()
    b.set_peak_lr(0.5)  # a resume with a new --learning_rate: same step, half the rate
    assert b.get_last_lr()[0] == pytest.approx(0.5 * a.get_last_lr()[0])


def test_wsd_over_a_time_budget_measures_progress_in_seconds():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    scheduler = TimeBudgetWsdScheduler(optimizer, warmup=0.1, budget_seconds=100, decay=0.5, shape="1-sqrt")
    for seconds in (0.0, 5.0, 30.0, 50.0, 62.5, 99.0, 100.0, 130.0):
        scheduler.elapsed_seconds = seconds
        scheduler.step()
        expected = 2.0 * wsd_reference(min(seconds, 100.0), 100.0, 0.1, 0.5, 0.0, "1-sqrt")
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, abs=1e-15), seconds


@pytest.mark.parametrize("extra, kind", [
    ([], PolyWarmUpScheduler),
    (["--lr_schedule", "wsd"], WarmupStableDecayScheduler),
    (["--lr_schedule", "wsd", "--train_budget_minutes", "2"], TimeBudgetWsdScheduler),
])
def test_the_flags_pick_the_schedule_and_a_resume_continues_it(extra, kind):
    args = run_pretraining.parse_args(REQUIRED + ["--max_steps", "100", "--learning_rate", "1e-3", *extra])
    first = build_scheduler(args, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3), ResumePoint())
    assert type(first) is kind
    for _ in range(95):
        first.elapsed_seconds = 1.2 * first.last_step  # read by the budget's schedule only
        first.step()
    resumed = build_scheduler(args, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3),
                              ResumePoint(scheduler=first.state_dict(), train_seconds=first.elapsed_seconds))
    assert resumed.get_last_lr() == first.get_last_lr() and 0 < first.get_last_lr()[0] < 1e-3


# --- the flags ------------------------------------------------------------------------------------------------

def test_defaults_leave_lamb_and_poly_as_they_were():
    args = run_pretraining.parse_args(REQUIRED)
    assert (args.optimizer, args.lr_schedule, args.weight_decay) == ("lamb", "poly", 0.01)
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.999, 1e-6)
    assert (args.decay_proportion, args.min_lr_ratio, args.decay_shape) == (0.1, 0.0, "linear")
    modern = run_pretraining.parse_args(REQUIRED + ["--optimizer", "stable_adamw", "--adam_beta2", "0.98",
                                                    "--lr_schedule", "wsd", "--decay_shape", "1-sqrt"])
    assert (modern.adam_beta2, modern.decay_shape) == (0.98, "1-sqrt")


@pytest.mark.parametrize("extra, fragment", [
    (["--adam_beta2", "0.98"], "--adam_beta2 go with --optimizer adamw or stable_adamw"),
    (["--decay_proportion", "0.2"], "--decay_proportion go with --lr_schedule wsd"),
    (["--optimizer", "adamw", "--compile_optimizer"], "it goes with --optimizer lamb"),
    (["--optimizer", "adamw", "--adam_beta1", "1"], "--adam_beta1 must lie in [0, 1)"),
    (["--optimizer", "adamw", "--adam_epsilon", "0"], "--adam_epsilon must lie in (0, 1]"),
    (["--weight_decay", "nan"], "--weight_decay must be a number >= 0"),
    (["--lr_schedule", "wsd", "--min_lr_ratio", "1.5"], "--min_lr_ratio must lie in [0, 1]"),
    (["--lr_schedule", "wsd", "--warmup_proportion", "0.5", "--decay_proportion", "0.6"], "overlap"),
])
def test_bad_optimizer_flags_are_one_line_errors(extra, fragment):
    with pytest.raises(InputError) as error:
        run_pretraining.parse_args(REQUIRED + extra)
    assert fragment in str(error.value) and "\n" not in str(error.value)


# --- run_pretraining.py end to end ------------------------------------------------------------------------------

def assert_one_line_refusal(result, *fragments):
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert all(fragment in lines[0] for fragment in fragments), lines[0]


@pytest.mark.parametrize("flags", [["--optimizer", "adamw", "--lr_schedule", "wsd", "--decay_proportion", "0.5"],
                                   ["--optimizer", "stable_adamw", "--adam_beta2", "0.98", "--lr_schedule", "wsd",
                                    "--decay_proportion", "0.5", "--decay_shape", "1-sqrt"]],
                         ids=["adamw-wsd", "stable_adamw-wsd-1-sqrt"])
@pytest.mark.slow
def test_modern_optimizers_train_and_resume_bit_for_bit(corpus, tmp_path, flags):
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--train_batch_size", 8, "--max_steps", 8, "--num_steps_per_checkpoint", 4, "--learning_rate", 2e-3,
              *flags]
    pretrain(corpus, straight, *common)
    pretrain(corpus, split, *common, "--steps_this_run", 3)
    pretrain(corpus, split, *common, "--resume_from_checkpoint")
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    assert sorted(a) == sorted(b) == [(0, s) for s in range(1, 9)]
    assert all(math.isfinite(a[key]["step_loss"]) for key in a)
    for step in range(4, 9):
        assert a[(0, step)]["step_loss"] == b[(0, step)]["step_loss"]
    # Warm-up to step 1 of 8 (10 %), the peak to step 4, then half of the run decays to 0.
    assert a[(0, 4)]["learning_rate"] == pytest.approx(2e-3) and a[(0, 8)]["learning_rate"] == 0.0
    end_a = torch.load(straight / "ckpt_8.pt", weights_only=True)
    end_b = torch.load(split / "ckpt_8.pt", weights_only=True)
    assert all(torch.equal(end_a["model"][k], end_b["model"][k]) for k in end_a["model"])
    assert end_a["args"]["optimizer"] == flags[1]
    groups = end_a["optimizer"]["param_groups"]
    assert ("amsgrad" in groups[0]) == (flags[1] == "adamw")  # torch's AdamW, or ours
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    result = pretrain(corpus, split, "--train_batch_size", 8, "--max_steps", 10, "--resume_from_checkpoint",
                      check=False)  # LAMB, the default
    assert_one_line_refusal(result, "ckpt_8.pt", f"--optimizer {flags[1]}", "this run has lamb")
    # Betas may change on a resume: the run says so and the optimizer takes them.
    result = pretrain(corpus, split, *common, "--adam_beta2", 0.95, "--max_steps", 10, "--resume_from_checkpoint")
    assert "resume: --adam_beta2" in result.stderr and "-> 0.95" in result.stderr
    groups = torch.load(split / "ckpt_10.pt", weights_only=True)["optimizer"]["param_groups"]
    assert all(tuple(g["betas"]) == (0.9, 0.95) for g in groups)


@pytest.mark.slow
def test_adamw_phase1_hands_over_to_phase2_and_another_optimizer_is_refused(corpus, tmp_path):
    adamw = ["--optimizer", "adamw", "--num_steps_per_checkpoint", 2]
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 4, *adamw)
    evaluated = run_command(  # evaluation needs the weights only: any --optimizer will do
        [sys.executable, str(REPO_ROOT / "run_pretraining.py"), "--input_dir", str(corpus / "p1"), "--config_file",
         str(corpus / "bert_config.json"), "--output_dir", str(tmp_path), "--do_eval", "--eval_dir",
         str(corpus / "eval"), "--resume_from_checkpoint", "--max_seq_length", "64", "--max_predictions_per_seq",
         "10", "--json-summary", str(tmp_path / "eval.json"), "--disable_progress_bar"])
    assert evaluated.returncode == 0, evaluated.stderr
    assert math.isfinite(final_record(tmp_path / "eval.json")["eval_loss"])
    result = pretrain(corpus, tmp_path, "--train_batch_size", 4, "--max_steps", 2, "--num_steps_per_checkpoint", 2,
                      "--resume_from_checkpoint", "--phase2", "--phase1_end_step", 4, phase=2, check=False)
    assert_one_line_refusal(result, "ckpt_4.pt", "--optimizer adamw", "this run has --optimizer lamb")
    assert not (tmp_path / "ckpt_6.pt").exists()
    pretrain(corpus, tmp_path, "--train_batch_size", 4, "--max_steps", 4, "--resume_from_checkpoint", "--phase2",
             "--phase1_end_step", 4, "--learning_rate", 8e-3, *adamw, phase=2)
    steps = step_records(tmp_path / "log.json")
    assert steps[(0, 5)]["learning_rate"] == pytest.approx(8e-3 * (1 - 1 / 4) ** 0.5)  # phase 2's own schedule
    phase1 = torch.load(tmp_path / "ckpt_4.pt", weights_only=True)["optimizer"]
    phase2 = torch.load(tmp_path / "ckpt_8.pt", weights_only=True)["optimizer"]
    assert {float(s["step"]) for s in phase1["state"].values()} == {4.0}
    assert {float(s["step"]) for s in phase2["state"].values()} == {4.0}  # restarted at the hand-off
    assert all(math.isfinite(data["step_loss"]) for data in steps.values())
