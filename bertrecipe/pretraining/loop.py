"""The pre-training loop, as fine-tuning has its own (finetuning/loop.py: LoopSettings, pretraining_loop): the steps of
a run from its resume point on, each followed by what is due after it (the log record, an evaluation, a
checkpoint), then the run's closing record. The command (cli/run_pretraining.py) checks the flags and inputs,
sets up the model and optimizer (startup.py) and calls pretraining_loop with:

- a TrainingSetup: the model, LAMB, its schedule, precision, the process group, the log, --output_dir's lock;
- the sample stream, data.PretrainingData (stateful: a checkpoint keeps its state_dict());
- the loss, data.BertPretrainingCriterion, handed to the Stepper (training/stepper.py) that takes each step;
- LoopSettings: how often to log, evaluate and checkpoint.
"""
from __future__ import annotations

import itertools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NoReturn, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from bertrecipe.common.errors import InputError
from bertrecipe.common.hardware import detect, host_record
from bertrecipe.model.families import ModelConfig
from bertrecipe.pretraining.data import BertPretrainingCriterion, PretrainingData, evaluation_batches
from bertrecipe.pretraining.masking import IGNORE_INDEX
from bertrecipe.pretraining.shard_schema import ShardInfo
from bertrecipe.pretraining.startup import ResumePoint
from bertrecipe.pretraining.token_budget import BatchRamp, count_tokens, tokens_of_all_processes
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.model_flops import batch_shape, device_peak_tflops, training_flops
from bertrecipe.training.optimization import TimeBudgetScheduler, local_part
from bertrecipe.training.process_group import DistributedContext, all_gather_objects, all_reduce_sum, any_process
from bertrecipe.training.run_lock import RunLock
from bertrecipe.training.sharding import is_sharded
from bertrecipe.training.stepper import (
    MAX_CONSECUTIVE_NON_FINITE,
    Precision,
    Stepper,
    StepResult,
    StopSignal,
    TrainingFailure,
    batches_to_device,
    outlive_job_sigterm,
    take,
    unwrap,
)


@dataclass(frozen=True)
class LoopSettings:
    """How the loop runs: run_pretraining's flags of the same names (the defaults are its defaults)."""

    output_dir: str
    eval_batch_size: int  # --eval_batch_size, or the training micro-batch
    flags: dict[str, Any] = field(default_factory=dict)  # every flag, as each checkpoint records them ("args")
    tokenizer: Optional[dict[str, Any]] = None  # the run's tokenizer (vocab_files' record), None when unknown
    num_workers: int = 0  # DataLoader workers per process
    log_freq: int = 1
    num_steps_per_checkpoint: int = 100
    skip_checkpoint: bool = False
    phase2: bool = False
    phase1_end_step: int = 7038  # with phase2: phase 2's steps are logged and saved after phase 1's
    do_eval: bool = False  # evaluate at the end (with eval_shards)
    eval_steps: int = 0  # also evaluate every N steps
    eval_interval_minutes: float = 0.0  # also evaluate every N minutes of training time
    train_budget_minutes: float = 0.0  # stop with a checkpoint once the phase has trained this long
    max_tokens: int = 0  # stop with a checkpoint once the phase has consumed this many real tokens (0: no budget)
    batch_ramp: Optional[BatchRamp] = None  # the batch-size warm-up's micro-batches per step (None: always full)
    progress_bar: bool = True
    peak_tflops: Optional[float] = None  # --peak_tflops: the device's peak that mfu is against (None: looked up)
    objective: dict[str, Any] = field(default_factory=dict)  # its checkpoint record (objective.py); {}: masked LM

    @property
    def step_offset(self) -> int:
        """Global step = phase step + step_offset."""
        return self.phase1_end_step if self.phase2 else 0

    @property
    def steps_read_tokens(self) -> bool:
        """True when every step needs the all-process token count (a token budget or a batch-size warm-up);
        otherwise the count is summed over the processes only when a record or a checkpoint reports it."""
        return bool(self.max_tokens) or self.batch_ramp is not None


@dataclass
class TrainingSetup:
    """What the loop trains and evaluates with, set up by the command once every input is checked."""

    ctx: DistributedContext
    config: ModelConfig  # the config file's, which checkpoints keep (whatever --pretrain_dropout the model has)
    model: torch.nn.Module  # wrapped for DDP when there is more than one process
    optimizer: torch.optim.Optimizer
    scheduler: Any  # PolyWarmUpScheduler, TimeBudgetScheduler (--train_budget_minutes), TokenBudgetScheduler, ...
    precision: Precision
    log: MetricLogger
    eval_shards: list[ShardInfo]
    lock: Optional[RunLock]  # --output_dir's, held by the main process
    start_time: float  # time.time() when the run began, for e2e_train_time
    evaluate_nsp: bool = False  # the run trains the next-sentence head: evaluation scores it too


@dataclass
class LoopState:
    """Where the loop stands: what its steps are built from, the phase's step and clocks, and what the next
    records report. The phase step and the data's state are what a checkpoint keeps to resume exactly."""

    setup: TrainingSetup
    settings: LoopSettings
    data: PretrainingData
    batches: Iterator[dict[str, torch.Tensor]]  # the data's micro-batches, through the DataLoader
    stepper: Stepper
    stop: StopSignal
    bar: tqdm
    steps_left: int  # steps this run takes
    keep: Optional[Path]  # the checkpoint this run resumed from, which rotation must keep
    phase_step: int
    current_step: int  # the global step being taken, for the error line
    record_clock: float  # perf_counter() at the previous training record (evaluation time excluded)
    clock_start: float  # perf_counter() when this run's part of the phase began
    seconds_before: float  # training time of the runs this one continues
    train_seconds: float  # training time of the phase after the last step (evaluations excluded)
    next_evaluation: float  # train_seconds of the next --eval_interval_minutes evaluation
    tokens: int = 0  # real tokens of all processes the phase has consumed, through the last settled step
    unsettled_tokens: int = 0  # this process's real tokens of the steps since (settle_tokens)
    evaluation_seconds: float = 0.0  # time this run spent in evaluations between steps
    flops_since_record: float = 0.0  # this process's model FLOPs since the previous record
    input_wait_since_record: float = 0.0  # seconds this process waited for its micro-batches since then
    tokens_at_record: int = 0  # state.tokens at the previous record
    samples_since_record: int = 0  # samples of all processes since the previous record
    losses: list[float] = field(default_factory=list)  # this process's step losses since the previous record
    step_times: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)  # each step's samples of all processes
    last_loss: float = float("nan")
    result: dict[str, Any] = field(default_factory=dict)  # the newest evaluation
    stopped_by: Optional[str] = None  # "SIGTERM", "train_budget" or "max_tokens": why the run ended before its end

    @property
    def global_step(self) -> int:
        """The step the log and the checkpoint's name count: phase 2's after phase 1's."""
        return self.phase_step + self.settings.step_offset

    def micro_batches_of_next_step(self) -> int:
        """This process's micro-batches in the next step: the full accumulation, or the batch-size warm-up's."""
        ramp = self.settings.batch_ramp
        return ramp.micro_batches(self.tokens) if ramp is not None else self.data.shape.accumulation


def pretraining_loop(setup: TrainingSetup, data: PretrainingData, criterion: BertPretrainingCriterion,
               settings: LoopSettings, resume: ResumePoint, steps: int) -> dict[str, Any]:
    """Takes `steps` optimizer steps over `data` (at its resume position) from `resume` on, stopping early on a
    SIGTERM, a spent --train_budget_minutes or --max_tokens; returns the run's closing record (closing_record).
    A step that cannot go on (TrainingFailure) ends the process with one line and exit status 1."""
    state = start_loop(setup, data, criterion, settings, resume, steps)
    if budget_spent(state):
        setup.log.log("PARAMETER", {"train_budget_already_spent": state.train_seconds / 60})
        state.steps_left = 0
    try:
        for index in range(state.steps_left):
            if not train_one_step(state, last_of_run=index == state.steps_left - 1):
                break
    except TrainingFailure as error:
        state.bar.close()
        stop_with_error(state, error)
    finally:
        state.stop.restore()
    state.bar.close()
    return closing_record(state)


def start_loop(setup: TrainingSetup, data: PretrainingData, criterion: BertPretrainingCriterion,
               settings: LoopSettings, resume: ResumePoint, steps: int) -> LoopState:
    """Starts the loader over this rank's share of the stream and puts the dropout RNG where the checkpoint left
    it."""
    ctx = setup.ctx
    # A private generator for the loader, so that creating it draws nothing from the dropout RNG. Its rows are not
    # pinned: the micro-batches are cut from them afterwards, and those are (data.batches' pin_memory).
    loader = DataLoader(data.reader(), batch_size=None, num_workers=settings.num_workers,
                        generator=torch.Generator().manual_seed(data.seed),
                        persistent_workers=False, worker_init_fn=outlive_job_sigterm)
    # Before the loader starts: a SIGTERM from then on is a request to checkpoint and stop, never a crash
    # (the workers take theirs through outlive_job_sigterm).
    stop = StopSignal()
    batches = data.batches(iter(loader), pin_memory=ctx.device.type == "cuda")
    if resume.rng is not None:
        checkpointing.set_rng_state(resume.rng)
    stepper = Stepper(setup.model, setup.optimizer, setup.scheduler, setup.precision, criterion,
                      skipped_steps=resume.skipped_steps)
    bar = tqdm(total=steps, disable=not settings.progress_bar, desc="pre-training", unit="step", dynamic_ncols=True)
    setup.model.train()
    now, before = time.perf_counter(), resume.train_seconds
    return LoopState(setup, settings, data, batches, stepper, stop, bar, steps, keep=resume.path,
                     phase_step=resume.phase_step, current_step=resume.phase_step + settings.step_offset,
                     record_clock=now, clock_start=now, seconds_before=before, train_seconds=before,
                     next_evaluation=next_evaluation_after(before, settings.eval_interval_minutes),
                     tokens=resume.tokens, tokens_at_record=resume.tokens)


def train_one_step(state: LoopState, last_of_run: bool) -> bool:
    """One optimizer step, then whatever is due after it: the log record, an evaluation, a checkpoint. False when
    a SIGTERM (on any process) or a spent budget (time or tokens) ends the run after its checkpoint."""
    settings = state.settings
    outcome = apply_step(state)
    state.train_seconds = read_clock(state)
    if state.phase_step % settings.log_freq == 0 or last_of_run:
        log_training_record(state, outcome.loss)
    if evaluation_due(state):
        evaluate_between_steps(state)
    stopping = any_process(state.stop.requested, state.setup.ctx)
    spent = "train_budget" if budget_spent(state) else "max_tokens" if tokens_spent(state) else None
    ending = stopping or spent or last_of_run
    if ending or state.phase_step % settings.num_steps_per_checkpoint == 0:
        save(state, periodic=not ending)
    if (stopping and not last_of_run) or spent:  # a SIGTERM during the run's last step stops nothing
        state.stopped_by = "SIGTERM" if stopping and not last_of_run else spent
        state.setup.log.log("PARAMETER", {"stopped_by": state.stopped_by, "global_step": state.global_step})
    return not (stopping or spent)


def apply_step(state: LoopState) -> StepResult:
    """Feeds the step's micro-batches to the stepper (forward, loss, backward, optimizer step), after counting
    their real tokens over all processes (the token budget's schedule reads the count through this step)."""
    tick = time.perf_counter()
    count = state.micro_batches_of_next_step()  # the same on every process: a function of the all-reduced count
    state.data.next_step_micro_batches = count
    batches = take(state.batches, count)
    state.input_wait_since_record += time.perf_counter() - tick  # the loader's time this step waited for
    state.flops_since_record += sum(training_flops(state.setup.config, batch_shape(b)) for b in batches)
    state.unsettled_tokens += count_tokens(batches)
    if state.settings.steps_read_tokens:
        settle_tokens(state)
    micro = [batches_to_device(b, state.setup.ctx.device) for b in batches]
    state.current_step = state.global_step + 1
    if isinstance(state.setup.scheduler, TimeBudgetScheduler):
        state.setup.scheduler.elapsed_seconds = state.train_seconds  # the clock after the previous step
    if state.settings.max_tokens:
        state.setup.scheduler.tokens_seen = state.tokens
    outcome = state.stepper.step(micro)
    if not outcome.applied and state.setup.precision.scaler is None:
        print(f"warning: step {state.current_step}: the loss or gradients are not finite; step skipped "
              f"({state.stepper.consecutive_non_finite} in a row, stopping at {MAX_CONSECUTIVE_NON_FINITE})",
              file=sys.stderr, flush=True)
    state.phase_step += 1
    state.step_times.append(time.perf_counter() - tick)
    state.step_samples.append(count * state.data.shape.micro_batch * state.data.shape.world_size)
    state.losses.append(outcome.loss)
    state.samples_since_record += state.step_samples[-1]
    state.bar.update(1)
    return outcome


def settle_tokens(state: LoopState) -> None:
    """Adds the processes' unsettled tokens to the phase's count: one small all-reduce, which waits for the
    device, so it is done on every step only when the step needs the count; every process calls it alike."""
    state.tokens += tokens_of_all_processes(state.unsettled_tokens, state.setup.ctx)
    state.unsettled_tokens = 0


def read_clock(state: LoopState) -> float:
    """Training seconds of the phase (earlier runs included, evaluations between steps not), the mean over the
    processes when a budget or an evaluation interval depends on it, so that every process decides alike."""
    settings, ctx = state.settings, state.setup.ctx
    seconds = state.seconds_before + time.perf_counter() - state.clock_start - state.evaluation_seconds
    if ctx.world_size > 1 and (settings.train_budget_minutes or settings.eval_interval_minutes):
        total = all_reduce_sum(torch.tensor([seconds], dtype=torch.float64, device=ctx.device), ctx)
        seconds = float(total[0]) / ctx.world_size
    return seconds


def budget_spent(state: LoopState) -> bool:
    """True once the phase has trained --train_budget_minutes (never without a budget)."""
    budget = state.settings.train_budget_minutes
    return bool(budget) and state.train_seconds >= budget * 60


def tokens_spent(state: LoopState) -> bool:
    """True once the phase has consumed --max_tokens real tokens (never without a token budget)."""
    return bool(state.settings.max_tokens) and state.tokens >= state.settings.max_tokens


def next_evaluation_after(seconds: float, interval_minutes: float) -> float:
    """The training second of the first --eval_interval_minutes mark after `seconds` (inf without an interval)."""
    interval = interval_minutes * 60
    return (math.floor(seconds / interval) + 1) * interval if interval else math.inf


def evaluation_due(state: LoopState) -> bool:
    """True after a step that --eval_steps or --eval_interval_minutes asks an evaluation of (with eval shards)."""
    if not state.setup.eval_shards:
        return False
    if state.settings.eval_steps and state.phase_step % state.settings.eval_steps == 0:
        return True
    return state.train_seconds >= state.next_evaluation


def log_training_record(state: LoopState, step_loss: float) -> None:
    """The losses averaged over processes, the lr, and the throughput since the previous record: sequences of
    all processes over the wall time, read once the loss all-reduce has synchronised them."""
    setup, ctx = state.setup, state.setup.ctx
    settle_tokens(state)
    sums = all_reduce_sum(torch.tensor([np.mean(state.losses), step_loss, state.flops_since_record,
                                        state.input_wait_since_record], dtype=torch.float64, device=ctx.device), ctx)
    state.last_loss = float(sums[1]) / ctx.world_size
    now = time.perf_counter()
    seconds = max(now - state.record_clock, 1e-9)
    record = {"average_loss": float(sums[0]) / ctx.world_size, "step_loss": state.last_loss,
              "learning_rate": setup.optimizer.param_groups[0]["lr"], "skipped_steps": state.stepper.skipped_steps,
              "training_sequences_per_second": state.samples_since_record / seconds, "tokens": state.tokens,
              **utilisation(state, float(sums[2]), float(sums[3]) / ctx.world_size, seconds)}
    if state.settings.batch_ramp is not None:  # the record's step's samples: the warm-up's batch size
        record["batch_samples"] = state.step_samples[-1]
    if state.data.mask_schedule is not None:  # dynamic masking: the share masked in the record's step
        record["masked_lm_prob"] = state.data.mask_schedule.rate(state.phase_step - 1)
    state.samples_since_record, state.record_clock = 0, now
    state.flops_since_record, state.input_wait_since_record, state.tokens_at_record = 0.0, 0.0, state.tokens
    if setup.precision.scaler is not None:
        record["loss_scale"] = setup.precision.scaler.get_scale()
    setup.log.log([state.data.epoch(), state.global_step], record)
    state.bar.set_postfix(loss=f"{state.last_loss:.4f}")
    state.losses.clear()


def utilisation(state: LoopState, flops: float, input_wait: float, seconds: float) -> dict[str, float]:
    """Real tokens of all processes per second, model FLOPs utilisation against the processes' peak (where it is
    known), and the share of the time a process waited for its input, since the previous record."""
    figures = {"tokens_per_second": (state.tokens - state.tokens_at_record) / seconds,
               "input_wait_share": min(input_wait / seconds, 1.0)}
    setup = state.setup
    if setup.ctx.is_main:  # the only process that logs; after the all-reduce, so that no collective waits for it
        peak = device_peak_tflops(setup.ctx.device, setup.precision.dtype or torch.float32,
                                  state.settings.peak_tflops)
        if peak:
            figures["mfu"] = flops / seconds / (peak * 1e12 * setup.ctx.world_size)
    return figures


def evaluate_between_steps(state: LoopState) -> None:
    """Evaluates and logs the result; its time counts neither as training time nor in the throughput."""
    evaluation_start = time.perf_counter()
    state.result = evaluate(state.setup, state.settings.eval_batch_size)
    state.setup.log.log([state.data.epoch(), state.global_step],
                        {**state.result, "train_minutes": state.train_seconds / 60})
    state.next_evaluation = next_evaluation_after(state.train_seconds, state.settings.eval_interval_minutes)
    spent = time.perf_counter() - evaluation_start  # not training time
    state.record_clock += spent
    state.evaluation_seconds += spent


def save(state: LoopState, periodic: bool) -> None:
    """Writes ckpt_<global step>.pt from the first process (a sharded model: ckpt_<global step>.dcp from every
    process), with every rank's RNG; every rank stops if it fails."""
    setup, ctx, output_dir = state.setup, state.setup.ctx, state.settings.output_dir
    # A periodic checkpoint never rotates a good one out during a run of non-finite (not fp16-overflow)
    # steps; the SIGTERM and end-of-run ones are always written (skipped steps left the weights good).
    if state.settings.skip_checkpoint or (
            periodic and setup.precision.scaler is None and state.stepper.consecutive_non_finite):
        return
    if not weights_are_finite(setup.model, ctx):
        raise TrainingFailure("the weights are no longer finite numbers; no checkpoint written")
    settle_tokens(state)
    rng_per_rank = all_gather_objects(checkpointing.rng_state(), ctx)
    payload = checkpoint_payload(state, rng_per_rank)
    failure = None
    if ctx.is_main and setup.lock is not None and not setup.lock.still_held():
        failure = InputError(f"{setup.lock.path}: another run took over this --output_dir's lock; this run stops "
                             f"without writing its step-{state.global_step} checkpoint")
    if any_process(failure is not None, ctx):
        raise failure or InputError(f"{output_dir}: the first process stopped the checkpoint (see its line)")
    if is_sharded(setup.model):  # every process writes its shards, in parallel
        checkpointing.save_sharded_checkpoint(output_dir, state.global_step, payload, unwrap(setup.model),
                                              setup.optimizer, ctx, keep=state.keep)
        return
    if ctx.is_main:
        try:
            checkpointing.save_checkpoint(output_dir, state.global_step, payload, keep=state.keep)
        except InputError as error:  # e.g. disk full: every rank stops, the earlier checkpoints are intact
            failure = error
    if any_process(failure is not None, ctx):
        raise failure or InputError(f"{output_dir}: the first process could not write the checkpoint")


def checkpoint_payload(state: LoopState, rng_per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint's content (docs/interfaces.md, section 3): each component's state_dict and the loop's (a
    sharded model's and optimizer's tensors are this process's shards: DTensors)."""
    setup, settings = state.setup, state.settings
    return {
        "model": unwrap(setup.model).state_dict(),
        "optimizer": setup.optimizer.state_dict(),
        "scheduler": setup.scheduler.state_dict(),
        "scaler": setup.precision.scaler.state_dict() if setup.precision.scaler is not None else None,
        "epoch": state.data.epoch(),
        "data": state.data.state_dict(),
        "rng": rng_per_rank[0],
        "rng_per_rank": rng_per_rank,  # each rank's dropout stream, so that a multi-process resume is exact
        "phase2": settings.phase2,
        "phase1_end_step": settings.phase1_end_step if settings.phase2 else None,
        "phase_step": state.phase_step,
        "config": setup.config.to_dict(),
        "args": dict(settings.flags),
        "tokenizer": settings.tokenizer,  # fine-tuning, conversion and resumes compare theirs with it
        "skipped_steps": state.stepper.skipped_steps,  # the log's counter goes on after a resume
        "train_seconds": state.train_seconds,  # a --train_budget_minutes run goes on with what is left
        "tokens": state.tokens,  # so does a --max_tokens run, and the batch-size warm-up
        **({"objective": settings.objective} if settings.objective else {}),  # a resume compares it
        "hardware": run_hardware_record(setup.ctx, settings.flags),  # what a released model's card says it ran on
    }


def run_hardware_record(ctx: DistributedContext, flags: dict[str, Any]) -> dict[str, Any]:
    """The device the run trains on (CPU model or GPU name), its precision, torch and the number of processes."""
    precision = "fp16" if flags.get("fp16") else "bf16" if flags.get("bf16") else "fp32"
    return {**host_record(detect(ctx.device.type), precision), "processes": ctx.world_size}


def stop_with_error(state: LoopState, error: TrainingFailure) -> NoReturn:
    """One line naming the step and the checkpoint to resume from, and exit status 1."""
    where = checkpointing.where_to_resume(state.settings.output_dir)
    print(f"error: step {state.current_step}: {error}; stopping, {where}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def closing_record(state: LoopState) -> dict[str, Any]:
    """The run's summary: times, throughput (the first two steps, which warm up, left out when there are more) and
    the final loss, with the final evaluation when --do_eval asks for one."""
    setup = state.setup
    settle_tokens(state)
    if setup.eval_shards and state.settings.do_eval:
        state.result = evaluate(setup, state.settings.eval_batch_size)
    skip = 2 if len(state.step_times) > 2 else 0
    timed, sequences = state.step_times[skip:], sum(state.step_samples[skip:])
    return {
        "e2e_train_time": time.time() - setup.start_time,
        "training_sequences_per_second": sequences / sum(timed) if timed and sum(timed) > 0 else 0.0,
        "final_loss": state.last_loss,
        "global_step": state.global_step,
        **({"stopped_by": state.stopped_by} if state.stopped_by else {}),
        "raw_train_time": sum(state.step_times),
        "train_minutes": state.train_seconds / 60,
        "tokens": state.tokens,
        **state.result,
    }


@torch.no_grad()
def evaluate(setup: TrainingSetup, batch_size: int) -> dict[str, float]:
    """MLPerf's metric over setup.eval_shards: masked-LM accuracy over all masked tokens, and the mean masked-LM
    cross-entropy (eval_mlm_accuracy, eval_loss), each rank reading its share; with setup.evaluate_nsp, the share of
    sequences whose next-sentence label the head predicts (eval_nsp_accuracy)."""
    ctx = setup.ctx
    bare = unwrap(setup.model)
    was_training = bare.training
    bare.eval()
    # loss sum, correct, masked tokens, next-sentence labels right, sequences
    sums = torch.zeros(5, dtype=torch.float64, device=ctx.device)
    for batch in in_step_with_other_ranks(
            evaluation_batches(setup.eval_shards, bare.config.vocab_size, batch_size, ctx.rank, ctx.world_size),
            bare, setup):
        batch = batches_to_device(batch, ctx.device)
        labels = batch["masked_lm_labels"]
        predicted = labels != IGNORE_INDEX
        with setup.precision.autocast():
            output = bare(batch["input_ids"], batch["segment_ids"], batch["input_mask"], predict_positions=predicted)
        logits, targets = output.prediction_logits.float(), labels[predicted]
        sums[0] += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").double()
        sums[1] += (logits.argmax(-1) == targets).sum()
        sums[2] += targets.numel()
        if setup.evaluate_nsp:
            sums[3] += (output.seq_relationship_logits.argmax(-1) == batch["next_sentence_labels"].view(-1)).sum()
            sums[4] += len(batch["next_sentence_labels"])
    sums = all_reduce_sum(sums, ctx)
    bare.train(was_training)
    count = max(float(sums[2]), 1.0)
    result = {"eval_loss": float(sums[0]) / count, "eval_mlm_accuracy": float(sums[1]) / count}
    if setup.evaluate_nsp:
        result["eval_nsp_accuracy"] = float(sums[3]) / max(float(sums[4]), 1.0)
    return result


def in_step_with_other_ranks(batches: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module,
                             setup: TrainingSetup) -> Iterator[dict[str, torch.Tensor]]:
    """The batches, unchanged for a model that is not sharded. A sharded model's forward gathers every layer's
    parameters from every process, so all must run as many: while any process has a batch left, one that has
    none (the batches are split into contiguous runs, one longer than another) runs a forward of one dummy row,
    whose outputs are dropped."""
    if not is_sharded(model):
        yield from batches
        return
    row = torch.zeros((1, 8), dtype=torch.long, device=setup.ctx.device)
    for batch in itertools.chain(batches, itertools.repeat(None)):
        if not any_process(batch is not None, setup.ctx):
            return
        if batch is not None:
            yield batch
            continue
        with setup.precision.autocast():
            model(row, row, torch.ones_like(row))


def weights_are_finite(model: torch.nn.Module, ctx: DistributedContext) -> bool:
    """True when no parameter holds a NaN or an infinity (every process's shard, when the model is sharded)."""
    finite = bool(torch.stack([local_part(p.detach()).isfinite().all() for p in unwrap(model).parameters()]).all())
    return not any_process(not finite, ctx) if is_sharded(model) else finite
