"""The cuda tier (issue 30): the recipe's CUDA path, each result against an independent oracle: a CPU reference
computed here, torch's documented behaviour, or the same computation without the feature under test. Every test
is marked cuda (it takes conftest's cuda_device) and skipped, with the reason, where torch sees no GPU. Meant to
take under two minutes on one GPU, most of it in the subprocess runs of the entry points (sections 9 and 10)."""
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import h5py
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.parallel import DistributedDataParallel

from bertrecipe.cli import inference
from bertrecipe.deploy.onnx_export import TritonSignature, export_onnx
from bertrecipe.deploy.serving import INPUTS, OUTPUTS
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.finetuning.question_answering import load_qa_model
from bertrecipe.model.bert import BertConfig, BertForPreTraining, attend, attention_bias_from_mask
from bertrecipe.pretraining import loop
from bertrecipe.pretraining.data import BertPretrainingCriterion, PretrainingData, StepShape, make_batch
from bertrecipe.pretraining.shard_schema import find_shards, inspect_shard
from bertrecipe.pretraining.startup import ResumePoint
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import MetricLogger, read_log
from bertrecipe.training.optimization import (
    Lamb,
    PolyWarmUpScheduler,
    build_lamb,
    compiled_lamb_works,
    weight_decay_groups,
)
from bertrecipe.training.process_group import DistributedContext, barrier, init_distributed, shutdown
from bertrecipe.training.stepper import (
    Precision,
    Stepper,
    allow_tf32,
    batches_to_device,
    make_precision,
    unwrap,
    wrap_ddp,
)
from helpers import (
    ENV,
    EXCERPT,
    FP16_MAX,
    GLUE_EXCERPTS,
    LR,
    REPO_ROOT,
    SEQ,
    SHORT,
    SQUAD_EXCERPT,
    TINY,
    X,
    feature_arrays,
    glue,
    held_ports,
    make_qa_checkpoint,
    squad_subset,
    step_records,
    subset,
    sum_of_outputs,
)

pytestmark = pytest.mark.cuda

CPU = torch.device("cpu")
NO_DROPOUT = {**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
SDPA_FUSED = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_cudnn_attention")
SDPA_MATH = "_scaled_dot_product_attention_math"


# --- Helpers ------------------------------------------------------------------------------------------------------
def corpus_batch(corpus: Path, rows: int = 8) -> dict[str, Tensor]:
    """The first rows of the corpus's first phase-1 shard as the loop's batch (int64, on the CPU); some of them
    are shorter than 64 tokens, so the attention bias masks padding."""
    with h5py.File(corpus / "p1" / "books_training_0.hdf5") as f:
        arrays = {k: f[k][:rows] for k in f}
    batch = {k: torch.from_numpy(v) for k, v in make_batch(arrays, np.arange(rows)).items()}
    assert (batch["input_mask"] == 0).any(), "the rows chosen hold no padding"
    return batch


def split_rows(batch: dict[str, Tensor], parts: int) -> list[dict[str, Tensor]]:
    size = len(batch["input_ids"]) // parts
    return [{k: v[i * size:(i + 1) * size] for k, v in batch.items()} for i in range(parts)]


def seeded_bert(device: torch.device, config: dict[str, Any] = NO_DROPOUT) -> BertForPreTraining:
    """The same initial weights on every device: drawn on the CPU from one seed, then moved."""
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig(**config)).to(device)


def bert_stepper(model: nn.Module, precision: Precision,
                 optimizer: Optional[Callable[[list[dict[str, Any]]], torch.optim.Optimizer]] = None) -> Stepper:
    """The recipe's Stepper on the pre-training loss; LAMB unless `optimizer` (groups -> optimizer) says else."""
    groups = weight_decay_groups(unwrap(model), 0.01)
    opt = optimizer(groups) if optimizer is not None else Lamb(groups, lr=1e-2)
    return Stepper(model, opt, PolyWarmUpScheduler(opt, 0.0, 100), precision, BertPretrainingCriterion())


def sgd(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    # SGD's update is linear in the gradient: a wrongly averaged or scaled gradient shows in the weights (LAMB's
    # normalised update would hide a factor).
    return torch.optim.SGD(groups, lr=0.1)


def cpu_state(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def assert_states_close(a: dict[str, Tensor], b: dict[str, Tensor], rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=rtol, atol=atol, msg=lambda m, key=key: f"{key}: {m}")


def on_gpu_launcher() -> tuple[str, ...]:
    """`python -c ...` that runs the script given after it as __main__ (imports from the working directory: run it
    in the checkout) and, at exit, prints the process's peak CUDA memory to stderr (proof that the run used the
    GPU)."""
    code = ("import atexit, runpy, sys, torch\n"
            "atexit.register(lambda: print(f'peak CUDA bytes: {torch.cuda.max_memory_allocated()}', "
              "file=sys.stderr))\n"
              "sys.argv = sys.argv[1:]\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    return (sys.executable, "-c", code)


def peak_cuda_bytes(stderr: str) -> int:
    lines = [line for line in stderr.splitlines() if line.startswith("peak CUDA bytes: ")]
    assert lines, stderr[-2000:]
    return int(lines[-1].split(": ")[1])


# --- 1. fp16: autocast and GradScaler("cuda") through the recipe's stepper ----------------------------------------
def linear_stepper(precision: Precision, device: torch.device) -> tuple[nn.Linear, PolyWarmUpScheduler, Stepper]:
    """test_fp16_cpu's one-layer model on `device`: the gradient entering fp16 backward is the loss scale."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2, bias=False).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = PolyWarmUpScheduler(optimizer, warmup=0.0, total_steps=100)
    return model, scheduler, Stepper(model, optimizer, scheduler, precision, sum_of_outputs)


def infinite_loss(model: nn.Module, x: Tensor) -> Tensor:
    return sum_of_outputs(model, x) * float("inf")


@pytest.mark.parametrize("first_loss", [sum_of_outputs, infinite_loss], ids=["fp16-overflow", "injected-inf"])
def test_fp16_overflow_on_cuda_skips_the_step_and_halves_the_scale(cuda_device, first_loss):
    """fp16 overflow or an inf loss skips the step (weights, schedule kept), halves the scale; the next step applies."""
    precision = make_precision(cuda_device, fp16=True, bf16=False, init_loss_scale=2.0**16)
    assert precision.scaler._device == "cuda"
    model, scheduler, stepper = linear_stepper(precision, cuda_device)
    x = X.to(cuda_device)
    with precision.autocast():
        assert model(x).dtype == torch.float16
    before = model.weight.detach().clone()
    stepper.compute_loss = first_loss
    result = stepper.step([x])
    assert not result.applied and stepper.skipped_steps == 1 and scheduler.last_step == 0
    assert torch.equal(model.weight, before)
    assert precision.scaler.get_scale() == 2.0**15
    stepper.compute_loss = sum_of_outputs
    assert stepper.step([x]).applied  # 2**15 fits in fp16
    lr = LR * (1 - 1 / 100) ** 0.5  # the scheduler's lr of step 1
    expected = before.cpu() - lr * X.sum(0).expand(2, 3)  # d sum(W x) / dW: every row is the sum of the inputs
    torch.testing.assert_close(model.weight.detach().cpu(), expected, rtol=0, atol=1e-7)


def test_fp16_scale_on_cuda_grows_and_backs_off_as_a_plain_model_predicts(cuda_device):
    """GradScaler("cuda") doubles after 2 good steps and halves per overflow, as a plain model of the rule says."""
    precision = make_precision(cuda_device, fp16=True, bf16=False, init_loss_scale=2.0**13)
    precision.scaler.set_growth_interval(2)
    model, scheduler, stepper = linear_stepper(precision, cuda_device)
    x = X.to(cuda_device)
    scale, good_in_a_row = 2.0**13, 0
    for _ in range(10):
        fits = scale <= FP16_MAX  # the gradient entering backward is the scale itself
        result = stepper.step([x])
        good_in_a_row = good_in_a_row + 1 if fits else 0
        if not fits:
            scale /= 2
        elif good_in_a_row == 2:
            scale, good_in_a_row = scale * 2, 0
        assert result.applied == fits and precision.scaler.get_scale() == scale
    assert stepper.skipped_steps == 2 and scheduler.last_step == 8


def test_fp16_scale_on_cuda_is_checkpointed_and_restored_on_resume(cuda_device, tmp_path):
    """The checkpointed scale, restored as on resume, makes the next step and scale those of the straight run."""
    precision = make_precision(cuda_device, fp16=True, bf16=False, init_loss_scale=2.0**16)
    precision.scaler.set_growth_interval(3)
    model, scheduler, stepper = linear_stepper(precision, cuda_device)
    x = X.to(cuda_device)
    for _ in range(3):  # an overflow (2**16 -> 2**15), then two good steps
        stepper.step([x])
    path = checkpointing.save_checkpoint(tmp_path, 3, {
        "model": model.state_dict(), "optimizer": stepper.optimizer.state_dict(),
        "scheduler": scheduler.state_dict(), "scaler": precision.scaler.state_dict()})
    payload = checkpointing.load_checkpoint(path)
    assert payload["scaler"] == {"scale": 2.0**15, "growth_factor": 2.0, "backoff_factor": 0.5,
                                 "growth_interval": 3, "_growth_tracker": 2}
    resumed = make_precision(cuda_device, fp16=True, bf16=False)  # NVIDIA's 2**20 until the state is loaded
    resumed.scaler.load_state_dict(payload["scaler"])
    model_b, scheduler_b, stepper_b = linear_stepper(resumed, cuda_device)
    model_b.load_state_dict(payload["model"])
    stepper_b.optimizer.load_state_dict(payload["optimizer"])
    scheduler_b.load_state_dict(payload["scheduler"])
    # The third good step in a row doubles the scale; from 2**20 the resumed step would overflow and be skipped.
    assert stepper.step([x]).applied and stepper_b.step([x]).applied
    assert precision.scaler.get_scale() == resumed.scaler.get_scale() == 2.0**16
    assert torch.equal(model.weight, model_b.weight)


# --- 2. bf16 autocast ---------------------------------------------------------------------------------------------
def pretraining_losses(device: torch.device, precision: Precision, batch: dict[str, Tensor], steps: int = 4
                       ) -> list[float]:
    stepper = bert_stepper(seeded_bert(device), precision)
    on_device = batches_to_device(batch, device)
    return [stepper.step([on_device]).loss for _ in range(steps)]


def test_bf16_training_on_cuda_follows_fp32_training_on_the_cpu(cuda_device, corpus):
    """Four bf16 LAMB steps on the GPU: finite losses within bf16's precision of the same steps in fp32 on a CPU."""
    batch = corpus_batch(corpus)
    bf16 = pretraining_losses(cuda_device, make_precision(cuda_device, fp16=False, bf16=True), batch)
    fp32 = pretraining_losses(CPU, make_precision(CPU, fp16=False, bf16=False), batch)
    assert all(math.isfinite(loss) for loss in bf16)
    assert fp32[-1] < fp32[0]  # the reference learns: the comparison is of training, not of a constant
    assert max(abs(a - b) for a, b in zip(bf16, fp32, strict=True)) < 1e-2  # a CPU in bf16 differs by 3e-4
    assert bf16 != fp32  # and the GPU run did compute in bf16


# --- 3. TF32 ------------------------------------------------------------------------------------------------------
@pytest.fixture
def tf32_flags_restored():
    """torch's two TF32 flags as they were before the test, whatever it set."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def matmul_relative_error(device: torch.device) -> float:
    """||A B - exact|| / ||exact|| of a 512^3 fp32 matmul on `device`, the exact product computed in fp64."""
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(512, 512, generator=generator, dtype=torch.float64) for _ in range(2))
    exact = a.float().double() @ b.float().double()  # the fp32 inputs' product: only the matmul's error remains
    got = (a.float().to(device) @ b.float().to(device)).double().cpu()
    return float((got - exact).norm() / exact.norm())


def test_tf32_flag_turns_on_tf32_matmuls_and_off_is_full_fp32(cuda_device, tf32_flags_restored):
    """allow_tf32(True) sets both flags and fp32 matmuls then err at TF32's precision; allow_tf32(False) turns
    them off again, back to fp32's."""
    allow_tf32(True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    tf32_error = matmul_relative_error(cuda_device)
    allow_tf32(False)
    fp32_error = matmul_relative_error(cuda_device)
    print(f"fp32 matmul relative error {fp32_error:.2e}, TF32 {tf32_error:.2e}")
    assert fp32_error < 1e-5
    assert 1e-4 < tf32_error < 1e-2


# --- 4. The attention kernel SDPA picks -------------------------------------------------------------------------
def attention_inputs(device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v [2, 4, 64, 16] and the model's additive bias for a second row padded after 40 tokens."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=generator).to(device, dtype) for _ in range(3))
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 40:] = 0
    return q, k, v, attention_bias_from_mask(mask.to(device), dtype)


def attention_in_float64(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    q, k, v, bias = (t.double().cpu() for t in (q, k, v, bias))
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias, dim=-1) @ v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_flash_refuses_the_additive_bias_and_memory_efficient_attention_takes_it(cuda_device, dtype):
    """Flash refuses attend's additive bias; memory-efficient attention takes it and equals attention in fp64."""
    q, k, v, bias = attention_inputs(cuda_device, dtype)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        attend(q, k, v, None, 0.0, training=False)  # flash runs these shapes: what it refuses below is the bias
        with pytest.raises(RuntimeError):  # sdp_utils: "Flash Attention does not support non-null attn_mask"
            attend(q, k, v, bias, 0.0, training=False)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = attend(q, k, v, bias, 0.0, training=False)
    atol = 2e-2 if dtype == torch.bfloat16 else 3e-3
    torch.testing.assert_close(out.double().cpu(), attention_in_float64(q, k, v, bias), rtol=0, atol=atol)


def sdpa_ops_of(run: Callable[[], Any]) -> set[str]:
    """The scaled-dot-product-attention aten ops that `run` called (torch.profiler, host-side op names)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        run()
    return {event.key for event in profile.key_averages() if "scaled_dot_product" in event.key}


@pytest.mark.parametrize("fp16", [False, True], ids=["bf16", "fp16"])
def test_a_training_step_runs_on_a_fused_attention_kernel(cuda_device, corpus, fp16):
    """A BERT training step runs without SDPA's math backend and, by default, on a fused kernel, never on math."""
    precision = make_precision(cuda_device, fp16=fp16, bf16=not fp16)
    stepper = bert_stepper(seeded_bert(cuda_device, TINY), precision)
    batch = batches_to_device(corpus_batch(corpus), cuda_device)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        assert math.isfinite(stepper.step([batch]).loss)  # a fall-back to math would raise here
    ops = sdpa_ops_of(lambda: stepper.step([batch]))
    print(f"SDPA ops of a default {precision.name} training step: {sorted(ops)}")
    assert any(name in op for op in ops for name in SDPA_FUSED), ops
    assert not any(SDPA_MATH in op for op in ops), ops


# --- 5. LAMB on CUDA ----------------------------------------------------------------------------------------------
LAMB_SHAPES = ((64, 32), (32,), (16, 8, 4), (40,))


def lamb_after_steps(device: torch.device, make: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
                     steps: int = 4) -> list[Tensor]:
    """Parameters after `steps` optimizer steps on fixed gradients: two with weight decay (one of them all zero:
    trust ratio 1) and two without; the first steps' gradients exceed max_grad_norm (clipped), the last not."""
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(shape, generator=generator) for shape in LAMB_SHAPES]
    values[1].zero_()
    params = [nn.Parameter(value.to(device)) for value in values]
    optimizer = make([{"params": params[:2], "weight_decay": 0.01}, {"params": params[2:], "weight_decay": 0.0}])
    for step in range(steps):
        scale = 1.0 if step < steps // 2 else 1e-3
        for param in params:
            param.grad = (scale * torch.randn(param.shape, generator=generator)).to(device)
        optimizer.step()
    return [param.detach().cpu() for param in params]


def test_multi_tensor_lamb_on_cuda_equals_lamb_on_the_cpu(cuda_device):
    """Our multi-tensor LAMB on the GPU equals the same optimizer on the CPU after four steps, to fp32 precision."""
    on_gpu = lamb_after_steps(cuda_device, lambda groups: Lamb(groups, lr=1e-2))
    on_cpu = lamb_after_steps(CPU, lambda groups: Lamb(groups, lr=1e-2))
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        torch.testing.assert_close(gpu, cpu, rtol=1e-6, atol=1e-7)
    assert not torch.equal(on_cpu[0], lamb_after_steps(CPU, lambda groups: Lamb(groups, lr=1e-2), steps=0)[0])


def test_compiled_lamb_on_cuda_equals_multi_tensor_lamb_on_the_cpu(cuda_device):
    """--compile_optimizer's LAMB update, compiled for the GPU, equals the multi-tensor LAMB on the CPU."""
    problem = compiled_lamb_works(cuda_device)
    if problem is not None:
        pytest.skip(f"torch.compile cannot build the fused LAMB update on this GPU ({problem}); the recipe then "
                    "falls back to the multi-tensor LAMB")
    compiled = lamb_after_steps(cuda_device, lambda groups: Lamb(groups, lr=1e-2, compiled=True))
    reference = lamb_after_steps(CPU, lambda groups: Lamb(groups, lr=1e-2))
    for gpu, cpu in zip(compiled, reference, strict=True):
        torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-6)


def test_apex_fused_lamb_that_build_lamb_picks_on_cuda_equals_our_lamb(cuda_device):
    """Where apex imports, build_lamb gives FusedLAMB for CUDA parameters, and its steps equal our LAMB's."""
    apex_optimizers = pytest.importorskip("apex.optimizers", reason="apex is not installed here: build_lamb gives "
                                                                    "our LAMB on CUDA, tested above")

    def factory(groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        optimizer = build_lamb(groups, lr=1e-2)
        assert isinstance(optimizer, apex_optimizers.FusedLAMB)
        return optimizer

    fused = lamb_after_steps(cuda_device, factory)
    ours = lamb_after_steps(cuda_device, lambda groups: Lamb(groups, lr=1e-2))
    for a, b in zip(fused, ours, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --- 6. DDP over NCCL ---------------------------------------------------------------------------------------------
def sgd_steps(model: nn.Module, micro_batches: list[dict[str, Tensor]], steps: int = 2) -> None:
    device = next(model.parameters()).device
    stepper = bert_stepper(model, make_precision(device, fp16=False, bf16=False), sgd)
    for _ in range(steps):
        stepper.step(micro_batches)


def test_one_rank_ddp_over_nccl_steps_as_the_model_without_ddp(cuda_device, corpus):
    """DDP over a one-rank NCCL group, accumulating with no_sync, takes the steps the model takes without DDP."""
    micro = split_rows(batches_to_device(corpus_batch(corpus), cuda_device), 2)
    plain = seeded_bert(cuda_device)
    sgd_steps(plain, micro)
    with held_ports() as [port]:  # until the group's store listens on it
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = seeded_bert(cuda_device)
        # wrap_ddp leaves a world of one unwrapped: these are the arguments it gives DDP for more ranks.
        ddp = DistributedDataParallel(model, device_ids=[cuda_device.index], gradient_as_bucket_view=True)
        sgd_steps(ddp, micro)
        del ddp  # before the group goes: a reducer must not outlive it
    finally:
        dist.destroy_process_group()
    assert_states_close(cpu_state(model), cpu_state(plain), rtol=1e-5, atol=1e-6)
    initial = cpu_state(seeded_bert(CPU))
    assert any(not torch.equal(value, initial[key]) for key, value in cpu_state(model).items())  # it stepped


def _two_rank_worker(rank: int, port: int, batch_file: str, out: str) -> None:
    """One of two ranks: the recipe's init_distributed (NCCL from torchrun's variables) and wrap_ddp, one SGD step
    on this rank's half of the batch."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ctx = init_distributed()
    try:
        half = split_rows(torch.load(batch_file, weights_only=True), 2)[rank]
        model = seeded_bert(ctx.device)
        ddp = wrap_ddp(model, ctx)
        sgd_steps(ddp, [batches_to_device(half, ctx.device)], steps=1)
        torch.save(cpu_state(model), f"{out}/rank{rank}.pt")
        del ddp
        barrier(ctx)
    finally:
        shutdown(ctx)


def test_two_rank_ddp_over_nccl_steps_on_the_mean_gradient_of_the_ranks(cuda_device, corpus, tmp_path):
    """Two NCCL ranks of a half-batch each step as one process accumulating both halves (the mean gradient)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"two-rank NCCL needs 2 GPUs; torch sees {torch.cuda.device_count()}")
    batch = corpus_batch(corpus)
    torch.save(batch, tmp_path / "batch.pt")
    with held_ports() as [port]:
        mp.spawn(_two_rank_worker, args=(port, str(tmp_path / "batch.pt"), str(tmp_path)), nprocs=2)
    single = seeded_bert(cuda_device)
    sgd_steps(single, [batches_to_device(half, cuda_device) for half in split_rows(batch, 2)], steps=1)
    for rank in range(2):
        assert_states_close(torch.load(tmp_path / f"rank{rank}.pt", weights_only=True), cpu_state(single),
                            rtol=1e-5, atol=1e-6)


# --- 7. Pinned memory and non-blocking copies -------------------------------------------------------------------
@pytest.fixture
def started_loop(cuda_device, corpus, tmp_path, monkeypatch):
    """The pre-training loop started as run_pretraining starts it on the GPU (start_loop over the corpus's phase-1
    shards, 4 samples a step, 2 steps), and the DataLoaders it built."""
    built = []

    class RecordedLoader(loop.DataLoader):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(loop, "DataLoader", RecordedLoader)
    config = BertConfig(**TINY)
    model = seeded_bert(cuda_device, TINY)
    optimizer = Lamb(weight_decay_groups(model, 0.01), lr=1e-3)
    setup = loop.TrainingSetup(DistributedContext(0, 0, 1, cuda_device), config, model, optimizer,
                               PolyWarmUpScheduler(optimizer, 0.0, 10), make_precision(cuda_device, False, False),
                               MetricLogger(None, enabled=False), [], None, time.time())
    shards = [inspect_shard(path, config.vocab_size, config.max_position_embeddings, 64, 10)
              for path in find_shards(corpus / "p1", "training")]
    data = PretrainingData(shards, 42, StepShape(4, 1, 1, 0), 4, config.vocab_size, max_steps=2)
    settings = loop.LoopSettings(output_dir=str(tmp_path), eval_batch_size=4, progress_bar=False)
    state = loop.start_loop(setup, data, BertPretrainingCriterion(), settings, ResumePoint(), 2)
    try:
        yield state, built
    finally:
        state.stop.restore()  # start_loop took SIGTERM


def assert_non_blocking_copy_is_exact(batch: dict[str, Tensor], device: torch.device) -> None:
    moved = batches_to_device(batch, device)  # the stepper's move: .to(device, non_blocking=True)
    blocking = {k: v.to(device) for k, v in batch.items()}
    torch.cuda.synchronize(device)
    for key, value in batch.items():
        assert moved[key].device.type == "cuda"
        assert torch.equal(moved[key], blocking[key]) and torch.equal(moved[key].cpu(), value)


def test_the_pretraining_loop_pins_its_micro_batches_on_cuda_and_non_blocking_copies_are_exact(cuda_device,
                                                                                               started_loop):
    """The micro-batches the loop copies to the GPU are in pinned memory (the loader's rows, turned into numpy
    and cut after it, need not be); non-blocking copies equal blocking ones; a loop step is finite."""
    state, loaders = started_loop
    [loader] = loaders
    assert not loader.pin_memory
    batch = next(state.batches)
    assert batch and all(v.is_pinned() for v in batch.values())
    assert_non_blocking_copy_is_exact(batch, cuda_device)
    assert math.isfinite(loop.apply_step(state).loss)


# --- 8. Checkpoints between GPU and CPU -------------------------------------------------------------------------
def test_a_checkpoint_written_on_the_gpu_loads_on_the_cpu_and_back(cuda_device, corpus, tmp_path):
    """A GPU checkpoint (weights, LAMB state, RNGs) loads on the CPU and, re-saved there, back on the GPU, equal."""
    model = seeded_bert(cuda_device)
    stepper = bert_stepper(model, make_precision(cuda_device, False, False))
    stepper.step([batches_to_device(corpus_batch(corpus), cuda_device)])
    rng = checkpointing.rng_state()
    assert "cuda" in rng
    path = checkpointing.save_checkpoint(tmp_path / "gpu", 1, {"model": model.state_dict(),
                                                               "optimizer": stepper.optimizer.state_dict(),
                                                               "rng": rng})
    loaded = checkpointing.load_checkpoint(path)
    assert_states_close(loaded["model"], cpu_state(model), rtol=0, atol=0)
    cpu_model = seeded_bert(CPU)
    cpu_model.load_state_dict(loaded["model"])
    cpu_optimizer = Lamb(weight_decay_groups(cpu_model, 0.01), lr=1e-2)
    cpu_optimizer.load_state_dict(loaded["optimizer"])
    back = checkpointing.load_checkpoint(checkpointing.save_checkpoint(tmp_path / "cpu", 1, {
        "model": cpu_model.state_dict(), "optimizer": cpu_optimizer.state_dict()}))
    gpu_model = seeded_bert(cuda_device)
    gpu_model.load_state_dict(back["model"])
    gpu_optimizer = Lamb(weight_decay_groups(gpu_model, 0.01), lr=1e-2)
    gpu_optimizer.load_state_dict(back["optimizer"])
    assert_states_close(cpu_state(gpu_model), cpu_state(model), rtol=0, atol=0)
    restored_params = [p for group in gpu_optimizer.param_groups for p in group["params"]]
    saved_params = [p for group in stepper.optimizer.param_groups for p in group["params"]]
    for theirs, ours in zip(restored_params, saved_params, strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            restored = gpu_optimizer.state[theirs][key]
            assert restored.device.type == "cuda" and torch.equal(restored, stepper.optimizer.state[ours][key])
    torch.cuda.manual_seed(123)  # moves the generator away, then the checkpoint's state brings it back
    checkpointing.set_rng_state(loaded["rng"])
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), rng["cuda"], strict=True))


# --- 9. Bit-exact resume on the GPU -------------------------------------------------------------------------------
def pretrain_on_gpu(corpus: Path, out: Path, *extra: Any) -> subprocess.CompletedProcess:
    """run_pretraining.py --deterministic (deterministic algorithms, cuBLAS's deterministic workspace) on the
    corpus's phase-1 shards; the GPU is picked as the recipe picks it (CUDA when available)."""
    args = ["--input_dir", str(corpus / "p1"), "--config_file", str(corpus / "bert_config.json"),
            "--output_dir", str(out), "--max_seq_length", "64", "--max_predictions_per_seq", "10",
            "--learning_rate", "2e-2", "--warmup_proportion", "0.1", "--do_train", "--disable_progress_bar",
            "--json-summary", str(out / "log.json"), "--deterministic", *map(str, extra)]
    env = {k: v for k, v in ENV.items() if k != "CUBLAS_WORKSPACE_CONFIG"}  # the flag sets it
    result = subprocess.run([*on_gpu_launcher(), str(REPO_ROOT / "run_pretraining.py"), *args],
                            env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert peak_cuda_bytes(result.stderr) > 0
    return result


def test_fp16_pretraining_on_the_gpu_resumes_bit_for_bit(corpus, tmp_path, cuda_device):
    """Deterministic run_pretraining.py --fp16 on the GPU: 6 steps straight equal 3 + a resume, to the last bit."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["--train_batch_size", 8, "--gradient_accumulation_steps", 2, "--max_steps", 6,
              "--num_steps_per_checkpoint", 3, "--fp16", "--init_loss_scale", 2.0**20]
    pretrain_on_gpu(corpus, straight, *common)
    pretrain_on_gpu(corpus, split, *common, "--steps_this_run", 3)
    pretrain_on_gpu(corpus, split, *common, "--resume_from_checkpoint")
    a, b = step_records(straight / "log.json"), step_records(split / "log.json")
    assert sorted(a) == sorted(b) == [(0, s) for s in range(1, 7)]
    for step in range(4, 7):
        assert (a[(0, step)]["step_loss"], a[(0, step)]["loss_scale"]) == \
            (b[(0, step)]["step_loss"], b[(0, step)]["loss_scale"])
    end_a = torch.load(straight / "ckpt_6.pt", weights_only=True)
    end_b = torch.load(split / "ckpt_6.pt", weights_only=True)
    middle = torch.load(split / "ckpt_3.pt", weights_only=True)
    assert end_a["scaler"] == end_b["scaler"]
    assert all(torch.equal(end_a["model"][k], end_b["model"][k]) for k in end_a["model"])
    assert any(not torch.equal(end_a["model"][k], middle["model"][k]) for k in end_a["model"])  # it trained on


# --- 10. Fine-tuning, inference and export on the GPU -----------------------------------------------------------
def test_squad_fine_tuning_on_the_gpu_in_fp16_ends_with_a_finite_loss(tiny_bert, tmp_path, cuda_device):
    """run_squad.py --fp16 on the GPU trains three steps and predicts, with a finite final loss."""
    train = squad_subset(EXCERPT / "dev-v1.1.json", tmp_path / "train.json", ["Jacksonville,_Florida"], 3)
    predict = squad_subset(EXCERPT / "dev-v1.1.json", tmp_path / "predict.json", ["1973_oil_crisis"], 1)
    out = tmp_path / "out"
    command = [*on_gpu_launcher(), str(REPO_ROOT / "run_squad.py"), "--output_dir", str(out), "--vocab_file",
               str(tiny_bert / "vocab.txt"), "--do_lower_case", "--disable_progress_bar", "--json-summary",
               str(out / "dllogger.json"), *SHORT, "--init_checkpoint", str(tiny_bert), "--train_file", str(train),
               "--predict_file", str(predict), "--do_train", "--do_predict", "--train_batch_size", "8",
               "--max_steps", "3", "--log_freq", "1", "--fp16"]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert peak_cuda_bytes(result.stderr) > 0
    final = read_log(out / "dllogger.json")[-1]["data"]
    assert final["train_steps"] == 3 and math.isfinite(final["final_loss"])
    assert json.loads((out / "predictions.json").read_text())


def test_glue_fine_tuning_on_the_gpu_in_bf16_ends_with_a_finite_loss(tiny_bert, vocab_file, tmp_path, cuda_device):
    """run_glue.py --bf16 on the GPU trains three SST-2 steps and evaluates, with a finite final loss."""
    data = subset(GLUE_EXCERPTS / "SST-2", tmp_path / "SST-2", 40, 40)
    result = glue(vocab_file, data, tmp_path / "out", "--task_name", "SST-2", "--init_checkpoint", str(tiny_bert),
                  "--do_train", "--do_eval", "--max_seq_length", "64", "--train_batch_size", "16", "--max_steps", "3",
                  "--bf16", launcher=on_gpu_launcher())
    assert peak_cuda_bytes(result.stderr) > 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert math.isfinite(results["final_loss"]) and results["eval_examples"] == 40


QUESTION = "Who won Super Bowl 50?"
CONTEXT = ("Super Bowl 50 was an American football game to determine the champion of the National Football League "
           "(NFL) for the 2015 season. The American Football Conference (AFC) champion Denver Broncos defeated the "
           "National Football Conference (NFC) champion Carolina Panthers 24–10 to earn their third Super Bowl title.")


def test_inference_on_the_gpu_answers_as_on_the_cpu(tiny_bert, capsys, cuda_device):
    """inference.py's answer and n-best list from the GPU equal those from the CPU, logits within 1e-4."""
    args = ["--init_checkpoint", str(tiny_bert), "--vocab_file", str(tiny_bert / "vocab.txt"), "--do_lower_case",
            "--question", QUESTION, "--context", CONTEXT, "--max_seq_length", "128", "--doc_stride", "64",
            "--n_best_size", "5"]
    torch.cuda.reset_peak_memory_stats()
    inference.main(args)
    assert torch.cuda.max_memory_allocated() > 0  # the model ran on the GPU
    on_gpu = json.loads(capsys.readouterr().out)
    on_cpu = subprocess.run([sys.executable, str(REPO_ROOT / "inference.py"), *args], capture_output=True, text=True,
                            env={**ENV, "CUDA_VISIBLE_DEVICES": ""}, cwd=REPO_ROOT, timeout=300)
    assert on_cpu.returncode == 0, on_cpu.stderr[-3000:]
    on_cpu = json.loads(on_cpu.stdout)
    assert on_gpu["answer"] == on_cpu["answer"]
    assert [e["text"] for e in on_gpu["nbest"]] == [e["text"] for e in on_cpu["nbest"]]
    for gpu, cpu in zip(on_gpu["nbest"], on_cpu["nbest"], strict=True):
        assert abs(gpu["start_logit"] - cpu["start_logit"]) < 1e-4 and abs(gpu["end_logit"] - cpu["end_logit"]) < 1e-4


def test_onnx_export_of_a_gpu_model_gives_onnx_runtime_the_models_logits(tiny_bert, tmp_path, cuda_device):
    """ONNX exported from the QA model on the GPU gives ONNX Runtime (CPU) the GPU model's logits within 1e-4."""
    import onnxruntime

    tokenizer = load_tokenizer(tiny_bert / "vocab.txt", True)
    model = load_qa_model(make_qa_checkpoint(tiny_bert, tmp_path / "finetuned"), None, tokenizer.vocab, SEQ)
    module = TritonSignature(model.to(cuda_device)).eval()
    ids, segments, mask = feature_arrays({"predict": SQUAD_EXCERPT, "tokenizer": tokenizer})
    example = tuple(torch.from_numpy(a[:2].astype(np.int64)).to(cuda_device) for a in (ids, segments, mask))
    export_onnx(module, example, tmp_path / "model.onnx", "squad", opset=17)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    for rows, length in ((slice(0, 2), SEQ), (slice(2, 9), SEQ), (slice(9, 12), 96)):
        arrays = [np.ascontiguousarray(a[rows, :length], dtype=np.int64) for a in (ids, segments, mask)]
        got = session.run(list(OUTPUTS), dict(zip(INPUTS, arrays, strict=True)))
        with torch.no_grad():
            expected = module(*(torch.from_numpy(a).to(cuda_device) for a in arrays))
        for g, e in zip(got, expected, strict=True):
            assert g.shape == tuple(e.shape) == (arrays[0].shape[0], length)
            assert float(np.abs(g - e.cpu().numpy()).max()) < 1e-4
