"""training.py: the optimizer step shared by every loop, against direct computations."""
import pytest
import torch
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.training import stepper as training
from bertrecipe.training.optimization import PolyWarmUpScheduler
from bertrecipe.training.stepper import MAX_CONSECUTIVE_NON_FINITE, Precision, Stepper, TrainingFailure, make_precision


def squared_error(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def make_stepper(precision=None, lr=0.1):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = PolyWarmUpScheduler(optimizer, warmup=0.0, total_steps=100)
    return model, optimizer, scheduler, Stepper(model, optimizer, scheduler, precision or Precision("cpu"),
                                                squared_error)


def test_accumulated_micro_batches_equal_one_step_on_their_mean_loss():
    model, optimizer, scheduler, stepper = make_stepper()
    reference = nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]
    result = stepper.step(batches)
    expected_loss = sum(squared_error(reference, b) for b in batches) / 4
    expected_loss.backward()
    with torch.no_grad():
        lr = 0.1 * (1 - 1 / 100) ** 0.5  # the scheduler set the lr of step 1 before the optimizer step
        for p in reference.parameters():
            p -= lr * p.grad
    assert result.applied and result.loss == pytest.approx(float(expected_loss))
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    assert scheduler.last_step == 1 and all(p.grad is None for p in model.parameters())


def test_overflow_with_loss_scaling_skips_the_step_and_keeps_the_schedule():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    model, optimizer, scheduler, stepper = make_stepper(Precision("cpu", torch.float16, scaler))
    before = [p.detach().clone() for p in model.parameters()]
    bad = (torch.full((2, 3), float("inf")), torch.zeros(2, 1))
    result = stepper.step([bad])
    assert not result.applied and stepper.skipped_steps == 1 and scheduler.last_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scaler.get_scale() == 2.0**7  # dynamic scaling backed off
    result = stepper.step([(torch.randn(2, 3), torch.randn(2, 1))])
    assert result.applied and scheduler.last_step == 1


def test_ten_non_finite_steps_in_a_row_stop_training_without_touching_the_weights():
    model, optimizer, scheduler, stepper = make_stepper()
    before = [p.detach().clone() for p in model.parameters()]
    bad = (torch.full((2, 3), float("nan")), torch.zeros(2, 1))
    for _ in range(MAX_CONSECUTIVE_NON_FINITE - 1):
        assert not stepper.step([bad]).applied
    stepper.step([(torch.randn(2, 3), torch.randn(2, 1))])  # a good step resets the count
    assert stepper.consecutive_non_finite == 0
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(MAX_CONSECUTIVE_NON_FINITE - 1):
        stepper.step([bad])
    with pytest.raises(TrainingFailure, match="10 steps in a row"):
        stepper.step([bad])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_precision_flags():
    assert make_precision(torch.device("cpu"), fp16=False, bf16=True).dtype == torch.bfloat16
    assert make_precision(torch.device("cpu"), fp16=False, bf16=False).name == "fp32"
    # fp16 runs on a CPU too (tests/test_fp16_cpu.py checks its loss scaling).
    assert make_precision(torch.device("cpu"), fp16=True, bf16=False).dtype == torch.float16
    with pytest.raises(InputError, match="exclude"):
        make_precision(torch.device("cpu"), fp16=True, bf16=True)


def test_tf32_switch_turns_tf32_matmuls_and_convolutions_on_and_off():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        training.allow_tf32(False)
        assert not torch.backends.cuda.matmul.allow_tf32
        training.allow_tf32(True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        training.allow_tf32(False)  # a process that turned them on can turn them off again
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
