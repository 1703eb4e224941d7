"""--fp16 on a CPU: fp16 autocast with torch's dynamic loss scaling (GradScaler("cpu")), checked against
independent references: the fp16 overflow limit, a plain-Python model of the scaling rule, the same training in
fp32, and, for DDP's fp16 all-reduce, the fp16-rounded mean of the two ranks' gradients."""
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.training.optimization import PolyWarmUpScheduler, build_lamb, weight_decay_groups
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.stepper import Precision, Stepper, make_precision, wrap_ddp
from helpers import FP16_MAX, LR, X, sum_of_outputs

CPU = torch.device("cpu")


def linear_stepper(precision):
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = PolyWarmUpScheduler(optimizer, warmup=0.0, total_steps=100)
    return model, scheduler, Stepper(model, optimizer, scheduler, precision, sum_of_outputs)


def test_fp16_on_cpu_is_fp16_autocast_with_nvidias_dynamic_scaling():
    precision = make_precision(CPU, fp16=True, bf16=False, init_loss_scale=2.0**10)
    assert (precision.name, precision.device_type) == ("fp16", "cpu")
    with precision.autocast():
        assert nn.Linear(3, 2)(X).dtype == torch.float16
    scaler = precision.scaler
    assert scaler.get_scale() == 2.0**10 and scaler._device == "cpu"
    # apex/NVIDIA: halve on overflow, double after a window of 2000 steps without one.
    assert (scaler.get_backoff_factor(), scaler.get_growth_factor(), scaler.get_growth_interval()) == (0.5, 2.0, 2000)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_a_loss_scale_that_cannot_scale_is_refused(scale):
    with pytest.raises(InputError, match="--init_loss_scale"):
        make_precision(CPU, fp16=True, bf16=False, init_loss_scale=scale)


def test_fp16_overflow_skips_the_step_keeps_the_weights_and_schedule_and_halves_the_scale():
    precision = make_precision(CPU, fp16=True, bf16=False, init_loss_scale=2.0**16)
    model, scheduler, stepper = linear_stepper(precision)
    before = model.weight.detach().clone()
    result = stepper.step([X])
    assert not result.applied and stepper.skipped_steps == 1 and scheduler.last_step == 0
    assert torch.equal(model.weight, before)
    assert precision.scaler.get_scale() == 2.0**15
    result = stepper.step([X])  # 2**15 fits in fp16: this step goes through with the unscaled gradient
    assert result.applied and stepper.skipped_steps == 1 and scheduler.last_step == 1
    lr = LR * (1 - 1 / 100) ** 0.5  # the scheduler's lr of step 1
    expected = before - lr * X.sum(0).expand(2, 3)  # d sum(W x) / dW: every row is the sum of the inputs
    assert torch.allclose(model.weight, expected, atol=1e-7)


def test_the_same_scale_does_not_overflow_in_fp32():
    # Control for the test above: the overflow came from fp16 autocast, not from the scale or the model.
    precision = Precision("cpu", None, torch.amp.GradScaler("cpu", init_scale=2.0**16))
    model, scheduler, stepper = linear_stepper(precision)
    assert stepper.step([X]).applied and precision.scaler.get_scale() == 2.0**16


def test_the_scale_grows_and_backs_off_as_a_plain_model_of_dynamic_scaling_predicts():
    precision = make_precision(CPU, fp16=True, bf16=False, init_loss_scale=2.0**13)
    precision.scaler.set_growth_interval(2)
    model, scheduler, stepper = linear_stepper(precision)
    scale, good_in_a_row, applied_steps = 2.0**13, 0, 0
    history = []
    for _ in range(10):
        fits = scale <= FP16_MAX  # the gradient entering backward is the scale itself
        result = stepper.step([X])
        if fits:
            applied_steps += 1
            good_in_a_row += 1
            if good_in_a_row == 2:
                scale, good_in_a_row = scale * 2, 0
        else:
            scale, good_in_a_row = scale / 2, 0
        history.append(precision.scaler.get_scale())
        assert result.applied == fits and precision.scaler.get_scale() == scale
    assert history[:6] == [2.0**13, 2.0**14, 2.0**14, 2.0**15, 2.0**15, 2.0**16]  # grew, twice per 2 good steps
    assert stepper.skipped_steps == 2 and scheduler.last_step == applied_steps == 8


def tiny_bert_batch():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 128, (8, 16), generator=generator)
    labels = torch.full_like(ids, -1)
    labels[:, 2:5] = ids[:, 2:5]
    masked = ids.clone()
    masked[:, 2:5] = 3
    return {"input_ids": masked, "segment_ids": torch.zeros_like(ids), "input_mask": torch.ones_like(ids),
            "masked_lm_labels": labels, "next_sentence_labels": torch.randint(0, 2, (8,), generator=generator)}


def pretraining_loss(model, batch):
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                 masked_lm_labels=batch["masked_lm_labels"], next_sentence_labels=batch["next_sentence_labels"]).loss


def overfit(precision, steps=25):
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=32, vocab_size=128, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config)
    optimizer = build_lamb(weight_decay_groups(model, 0.01), lr=5e-2)
    stepper = Stepper(model, optimizer, PolyWarmUpScheduler(optimizer, 0.0, 100), precision, pretraining_loss)
    batch = tiny_bert_batch()
    return [stepper.step([batch]).loss for _ in range(steps)], stepper


@pytest.mark.slow
def test_fp16_bert_on_cpu_overfits_a_batch_like_fp32():
    fp16, stepper = overfit(make_precision(CPU, fp16=True, bf16=False, init_loss_scale=2.0**12))
    fp32, _ = overfit(make_precision(CPU, fp16=False, bf16=False))
    assert stepper.skipped_steps == 0 and all(math.isfinite(loss) for loss in fp16)
    assert fp16[-1] < 0.5 * fp16[0]
    assert max(abs(a - b) for a, b in zip(fp16, fp32, strict=True)) < 5e-3  # the fp32 run is the reference
    assert fp16 != fp32  # and the fp16 run did compute in fp16


def _ddp_gradients(rank, store, out):
    """One worker of two (gloo): the gradient of each rank's own loss, all-reduced by DDP in fp32 and in fp16."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ctx = DistributedContext(rank, rank, 2, CPU)
        grads = {}
        for name, compress in (("fp32", None), ("fp16", torch.float16)):
            model = seeded_linear()
            ddp = wrap_ddp(model, ctx, compress)  # kept: a DDP object freed before backward all-reduces nothing
            ddp(rank_input(rank)).pow(2).sum().backward()
            grads[name] = model.weight.grad.clone()
            # Freed while the group lives and both ranks are past their reducers: gloo aborts (SIGABRT) when a
            # reducer outlives the group it was built on or one rank tears down while the other still sends.
            del ddp
            dist.barrier()
        torch.save(grads, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def seeded_linear():
    torch.manual_seed(0)
    return nn.Linear(64, 8, bias=False)


def rank_input(rank):
    return torch.randn(4, 64, generator=torch.Generator().manual_seed(rank + 1))


@pytest.mark.slow
def test_fp16_compressed_allreduce_gives_the_fp16_rounded_mean(tmp_path):
    mp.spawn(_ddp_gradients, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2)
    local = []
    for rank in range(2):  # each rank's gradient, computed here without any process group
        model = seeded_linear()
        model(rank_input(rank)).pow(2).sum().backward()
        local.append(model.weight.grad)
    # fp16_compress_hook: cast to fp16, divide by the world size, sum in fp16, cast back.
    fp16_mean = ((local[0].half() / 2) + (local[1].half() / 2)).float()
    mean = (local[0] + local[1]) / 2
    for rank in range(2):
        grads = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.allclose(grads["fp32"], mean, rtol=1e-6, atol=0)
        assert torch.equal(grads["fp16"], fp16_mean)
        assert (grads["fp16"] != mean).float().mean() > 0.5  # the fp16 rounding shows in most elements
